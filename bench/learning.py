"""Does GRPO on verified rollouts learn, and what does verification cost inside the loop?

    python bench/learning.py                      # base model, default TrainConfig, 15-minute budget
    python bench/learning.py --steps 40 --minutes 5

1. Learning: held-out accuracy (greedy and sampled) of the base model before and after GRPO
   steps on the arithmetic task, every rollout verified, stopped at --steps or --minutes.
   The curve is bench/out/learning/curves.png.
2. Overhead: the share of step time spent verifying, with every group verified and with a
   10% sample, from two short runs side by side from the same base model (``--overhead-only``
   runs just this part). The verifier checks the groups GRPO learns from against the
   trainer's own forward pass, so its share is the checks plus a prefill of the other groups.
Absolute times on a shared 2-core machine are noisy; the shares and the accuracy deltas are
the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import vrl
from vrl.rl.base_model import ensure_base_model
from vrl.rl.plots import plot_run
from vrl.rl.train import TrainConfig, Trainer

console = Console()


def learning(config: TrainConfig, out: Path, minutes: float) -> tuple[list[dict], dict]:
    shutil.rmtree(out, ignore_errors=True)
    trainer = Trainer(config, out, key=vrl.NodeKey.from_seed(b"bench-learning".ljust(32, b"\0")))
    with console.status("GRPO") as status:
        trainer.run(lambda r: status.update(f"GRPO step {r['step'] + 1}: reward {r['reward_mean']:.2f}"),
                    deadline=time.perf_counter() + minutes * 60)
    plot_run(out / "metrics.jsonl", out / "curves.png", title=f"GRPO on {config.task} from the base model")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], drawn(trainer)


def drawn(trainer: Trainer) -> dict:
    """What the run trained on, from its rollout files: how many distinct problems, and how
    many of them are in the held-out evaluation set (by prompt; assignment skips held-out
    problems, so this must be 0)."""
    files = sorted((trainer.run_dir / "rollouts").glob("*.vrl"))
    prompts = {r.prompt for path in files for r in vrl.read_rollouts(path)}
    return {"distinct_drawn": len(prompts), "held_out": len(trainer.evaluation),
            "held_out_drawn": sum(task.prompt in prompts for task in trainer.evaluation)}


def overhead(config: TrainConfig, out: Path, steps: int) -> dict[float, dict]:
    shares = {}
    for fraction in (1.0, 0.1):
        run = out / f"verify-{fraction}"
        shutil.rmtree(run, ignore_errors=True)
        trainer = Trainer(dataclasses.replace(config, steps=steps, verify_fraction=fraction, eval_every=10**6),
                          run, key=vrl.NodeKey.from_seed(b"bench-overhead".ljust(32, b"\0")))
        records, seconds = [], []
        for _ in range(steps):  # a step's time is all of Trainer.step, publishing the next version included
            started = time.perf_counter()
            records.append(trainer.step())
            seconds.append(time.perf_counter() - started)
        records, seconds = records[1:], seconds[1:]  # the first step warms caches up
        verify = sum(r["seconds_verify"] for r in records)
        shares[fraction] = {"verify_share": verify / sum(seconds),
                            "verified": statistics.mean(r["verified"] for r in records),
                            "rollouts": records[0]["rollouts"], "seconds_step": sum(seconds) / len(records)}
    return shares


def print_overhead(shares: dict[float, dict]) -> None:
    table = Table(title="verification inside the loop (share of the whole step's time)")
    for column in ("groups verified", "rollouts verified per step", "verify share", "s/step"):
        table.add_column(column, justify="right")
    for fraction, row in shares.items():
        table.add_row(f"{fraction:.0%}", f"{row['verified']:.1f} of {row['rollouts']}", f"{row['verify_share']:.1%}",
                      f"{row['seconds_step']:.2f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--overhead-steps", type=int, default=11)
    parser.add_argument("--overhead-only", action="store_true", help="skip the learning run")
    parser.add_argument("--out", type=Path, default=Path("bench/out/learning"))
    args = parser.parse_args()
    with console.status("the base model (built once, about 3 minutes, if it is not cached)"):
        ensure_base_model()
    config = TrainConfig(steps=args.steps)

    if args.overhead_only:
        print_overhead(overhead(config, args.out, args.overhead_steps))
        return
    started = time.perf_counter()
    records, trained_on = learning(config, args.out, args.minutes)
    seconds = time.perf_counter() - started
    evaluated = [r for r in records if "held_out_accuracy" in r]
    first, last = evaluated[0], evaluated[-1]
    table = Table(title=f"learning: {last['step']} GRPO steps in {seconds / 60:.1f} min "
                        f"({config.groups_per_step} groups x {config.group_size}, every rollout verified)")
    for column in ("held-out accuracy", "before", "after", "change"):
        table.add_column(column, justify="right")
    for key, label in (("held_out_accuracy", f"sampled, T={config.temperature}"),
                       ("held_out_accuracy_greedy", "greedy")):
        table.add_row(label, f"{first[key]:.1%}", f"{last[key]:.1%}", f"{100 * (last[key] - first[key]):+.1f} points")
    console.print(table)
    console.print(f"curve: {args.out / 'curves.png'}")
    console.print(f"the run trained on {trained_on['distinct_drawn']} distinct problems, "
                  f"{trained_on['held_out_drawn']} of them among the {trained_on['held_out']} held-out ones")

    shares = overhead(config, args.out, args.overhead_steps)
    print_overhead(shares)
    summary = {"steps": last["step"], "minutes": seconds / 60, "before": first, "after": last, "trained_on": trained_on,
               "overhead": {str(k): v for k, v in shares.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
