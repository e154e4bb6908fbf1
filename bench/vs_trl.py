"""Our GRPO trainer against TRL's GRPOTrainer, side by side in one run.

    pip install -e '.[bench]'           # trl, accelerate, datasets (bench-only)
    python bench/vs_trl.py              # 3 seeds x 60 steps each
    python bench/vs_trl.py --seeds 1 --steps 10

Same base model (scripts/build-base-model), same task distribution (the arithmetic
generator), same group size, completions per step, completion length, temperature, learning
rate, clip range (DAPO 0.2 / 0.28), advantages (group std), loss aggregation (token mean,
TRL's "dapo"), no KL (beta 0), linear warmup then a constant rate, fused AdamW without weight decay, gradient
clipping at 1.0. Ours verifies every rollout inside its step (TRL checks nothing); the
table shows ours with every rollout verified, with a 10% sample of the groups verified, and
with its verification time left out.

Reported: seconds per step (median over steps after the first), and held-out accuracy after
the same number of steps, sampled at the run's temperature and greedy, measured for both by
the same function (vrl.rl.evaluate.accuracy).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import shutil
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import vrl
from vrl.rl.base_model import ensure_base_model
from vrl.rl.evaluate import accuracy, held_out
from vrl.rl.train import TrainConfig, Trainer
from vrl.rollouts.generate import ARITHMETIC_MAX_NEW_TOKENS
from vrl.rollouts.model import Model
from vrl.rollouts.presets import base_model_dir
from vrl.tasks import Arithmetic, Task, is_held_out

console = Console()


def run_ours(config: TrainConfig, seed: int, out: Path) -> dict:
    """Our trainer; a step's time is the whole of ``Trainer.step``: generation, verification,
    the GRPO update, and publishing the next version (its model hash, the rollout file, the
    metrics line), as TRL's step time is the whole of its training step."""
    shutil.rmtree(out, ignore_errors=True)
    trainer = Trainer(dataclasses.replace(config, eval_every=10**6, track_kl=False), out,
                      key=vrl.NodeKey.from_seed(seed.to_bytes(32, "big")))
    seconds, verifying = [], []
    for _ in range(config.steps):
        started = time.perf_counter()
        record = trainer.step()
        seconds.append(time.perf_counter() - started)
        verifying.append(record["seconds_verify"])
    return {"seconds": seconds, "seconds_without_verify": [s - v for s, v in zip(seconds, verifying)],
            "model": trainer.policy()}


def run_trl(config: TrainConfig, seed: int, out: Path) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    directory = base_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tasks = Arithmetic.parse(config.task)
    # The same distribution our node draws its assignments from: indices hashed from the seed,
    # held-out problems skipped (vrl.tasks.assign).
    draws = (tasks.task(int.from_bytes(hashlib.sha256(b"trl" + seed.to_bytes(4, "big") + i.to_bytes(4, "big"))
                                       .digest()[:8], "big")) for i in itertools.count())
    rows = [{"prompt": t.prompt, "answer": t.answer, "id": t.id}
            for t in itertools.islice((t for t in draws if not is_held_out(t)), config.steps * config.groups_per_step)]
    spec = config.reward_spec

    def reward(prompts, completions, answer, id, **_):  # noqa: A002 (TRL passes dataset columns by name)
        return [spec.reward(Task(i, p, a), c) for p, c, a, i in zip(prompts, completions, answer, id)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.started)

    args = GRPOConfig(
        output_dir=str(out), seed=seed, max_steps=config.steps, use_cpu=True, bf16=False, fp16=False,
        num_generations=config.group_size, per_device_train_batch_size=config.group_size * config.groups_per_step,
        gradient_accumulation_steps=1, max_completion_length=config.max_new_tokens,
        temperature=config.temperature, top_p=1.0, top_k=0,
        learning_rate=config.learning_rate, lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.warmup_steps, weight_decay=0.0,
        max_grad_norm=config.grad_clip, optim="adamw_torch_fused",  # the kernel ours uses
        beta=config.grpo.kl_beta, epsilon=config.grpo.eps_low, epsilon_high=config.grpo.eps_high,
        loss_type="dapo", scale_rewards="group", num_iterations=1, gradient_checkpointing=False, use_vllm=False,
        logging_steps=10**6, save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0,
    )
    network = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    timer = StepTimer()
    trainer = GRPOTrainer(model=network, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    trained = trainer.model.eval()
    trained.requires_grad_(False)
    model = Model(name="trl", network=trained, tokenizer=tokenizer, dtype_name="float32")
    return {"seconds": timer.seconds, "model": model}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out/vs_trl"))
    args = parser.parse_args()
    with console.status("the base model (built once, about 3 minutes, if it is not cached)"):
        ensure_base_model()
    # max_new_tokens as the trainer chooses it for the arithmetic set (choose_max_new_tokens),
    # given here so that TRL's side and the evaluation use the same.
    config = TrainConfig(steps=args.steps, max_new_tokens=ARITHMETIC_MAX_NEW_TOKENS)
    evaluation = held_out(Arithmetic.parse(config.task), config.held_out)
    def scores(model) -> dict[str, float]:  # the trainer's own two held-out measures, for either trainer
        return {"sampled": accuracy(model, evaluation, config.reward_spec, temperature=config.temperature,
                                    max_new_tokens=config.max_new_tokens),
                "greedy": accuracy(model, evaluation, config.reward_spec, max_new_tokens=config.max_new_tokens)}

    base = scores(vrl.load_model("base"))
    sampled = dataclasses.replace(config, verify_fraction=0.1)
    trainers = (("vrl", run_ours, config), ("vrl-10pct", run_ours, sampled), ("trl", run_trl, config))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in trainers}
    for seed in range(args.seeds):
        for name, run, settings in trainers:  # interleaved: every trainer sees the same machine load
            with console.status(f"{name}, seed {seed}: {args.steps} steps"):
                result = run(settings, seed, args.out / f"{name}-{seed}")
            result["accuracy"] = scores(result.pop("model"))
            results[name].append(result)
            console.print(f"{name} seed {seed}: {statistics.median(result['seconds'][1:]):.3f} s/step, held-out "
                          f"{result['accuracy']['sampled']:.1%} sampled, {result['accuracy']['greedy']:.1%} greedy")

    table = Table(title=f"vrl vs TRL GRPOTrainer: {args.steps} steps x {config.groups_per_step} groups x "
                        f"{config.group_size}, {args.seeds} seeds; base model held-out {base['sampled']:.1%} sampled, "
                        f"{base['greedy']:.1%} greedy")
    for column in ("trainer", "s/step (median)", "held-out sampled, per seed", "mean ± sd", "greedy mean ± sd"):
        table.add_column(column, justify="right")

    def seconds(runs: list[dict], key: str) -> float:
        return statistics.median(s for r in runs for s in r[key][1:])

    def spread(values: list[float]) -> str:
        return f"{statistics.mean(values):.1%} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.1%}"

    def row(name: str, key: str, label: str) -> None:
        sampled = [r["accuracy"]["sampled"] for r in results[name]]
        greedy = [r["accuracy"]["greedy"] for r in results[name]]
        table.add_row(label, f"{seconds(results[name], key):.3f}", " ".join(f"{s:.1%}" for s in sampled),
                      spread(sampled), spread(greedy))

    row("vrl", "seconds", "vrl (every rollout verified)")
    row("vrl-10pct", "seconds", "vrl (10% of groups verified)")
    row("vrl", "seconds_without_verify", "vrl (its verification time left out)")
    row("trl", "seconds", "TRL GRPOTrainer (nothing verified)")
    console.print(table)
    summary = {name: [{k: v for k, v in r.items()} for r in runs] for name, runs in results.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"base_accuracy": base, **summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
