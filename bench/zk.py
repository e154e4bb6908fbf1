"""What zk proofs cost (specs/zk.md), each kind measured side by side in one run.

    python bench/zk.py                 # both kinds, about 3 minutes
    python bench/zk.py --records 16 --positions 4

Reward proofs (answer-match/v1, §5): for the base model's rollouts over a task set whose
references are committed (vrl commit-answers), it times generating them, verifying them by
re-execution (the eight stages, the rewards from the proofs), proving each record's
correctness and checking those proofs.

Sampling proofs (lm-logits/64x256/v1, §10): for base-micro's rollouts with hidden hashes, it
times generating them with and without the hashes, proving ``--positions`` challenged tokens
per record, checking them, and re-executing the records; and it measures, over every sampled
position, how far the circuit's logits are from the float64 product of the same row and
weights (what LOGIT_TOLERANCE must cover).

For both: the one-off build and key setup, proof, attachment and key sizes, and the peak
resident memory while proving (VmHWM, reset first; it includes the process's torch and
model). It prints ratios, since the machine is shared and absolute times here say little,
and writes bench/results/zk.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from process_memory import peak_bytes, reset_peak, rss_bytes  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import vrl  # noqa: E402
from proofs import zk  # noqa: E402
from proofs.circuits import ANSWER_MATCH, HIDDEN_SCALE, LM_LOGITS_MICRO, quantize_hidden  # noqa: E402
from vrl.rl.base_model import ensure_base_model  # noqa: E402
from vrl.rollouts.presets import BUILT  # noqa: E402
from vrl.rollouts.verify import Expectations, verify  # noqa: E402
from vrl.tasks import RewardSpec, TaskList, is_held_out  # noqa: E402
from vrl.zk import commit_answers, prove_rewards, proven_correctness, record_subject  # noqa: E402
from vrl.zk import sampling as sampling_proofs  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=8, help="rollouts (groups of 4)")
    parser.add_argument("--positions", type=int, default=2, help="sampling proofs per record")
    parser.add_argument("--sweep", type=int, default=64, help="base-micro records whose every position's logits "
                                                             "are compared with float64 (no proofs)")
    parser.add_argument("--kind", choices=("reward", "sampling"), help="one kind only, its JSON on stdout's last "
                                                                       "line (what the full run does per kind)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.kind:
        with tempfile.TemporaryDirectory(prefix="vrl-bench-zk-") as scratch:
            measured = {"reward": reward, "sampling": sampling}[args.kind](args, Path(scratch))
        print(json.dumps(measured))
        return
    # Each kind in a process of its own, so that its peak memory is its own.
    result = {"ezkl": zk.EZKL_VERSION}
    for kind in ("reward", "sampling"):
        child = subprocess.run([sys.executable, __file__, "--kind", kind, "--records", str(args.records),
                                "--positions", str(args.positions), "--sweep", str(args.sweep)],
                               stdout=subprocess.PIPE, text=True, check=True)
        lines = child.stdout.strip().splitlines()
        print("\n".join(lines[:-1]))
        result[kind] = json.loads(lines[-1])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "zk.json").write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {RESULTS / 'zk.json'}")


def _ratios(title: str, ratios: dict[str, float]) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("ratio (same run)")
    table.add_column("value", justify="right")
    for name, value in ratios.items():
        table.add_row(name, f"{value:.2f}x")
    console.print(table)


def reward(args, workdir: Path) -> dict:
    model = vrl.load_model("base")
    source = vrl.Arithmetic(digits=2, operations="+")
    tasks = [t for t in (source.task(i) for i in range(256)) if not is_held_out(t)][:64]
    public, key = commit_answers(tasks)
    task_set = TaskList("private", tuple(public))
    node = vrl.NodeKey.from_seed(b"bench/zk".ljust(32, b"\0"))
    sampling = vrl.sampling_for(model, max_new_tokens=8)
    seed = bytes(32)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    srs = zk.dev_srs(workdir, ANSWER_MATCH.logrows)
    timings["dev SRS (once)"] = time.perf_counter() - started
    started = time.perf_counter()
    keys = zk.keys(zk.build(ANSWER_MATCH, workdir), srs)
    timings["build and setup (once per circuit and SRS)"] = time.perf_counter() - started

    started = time.perf_counter()
    records = vrl.generate(model, task_set, node, round_seed=seed, sampling=sampling, groups=args.records // 4,
                           group_size=4, score=key.scorer(RewardSpec()))
    timings["generate"] = time.perf_counter() - started
    reset_peak()
    baseline = rss_bytes()
    started = time.perf_counter()
    attachments = prove_rewards(records, key, model.decode, srs, workdir)
    timings["prove"] = time.perf_counter() - started
    peak = peak_bytes()
    started = time.perf_counter()
    proven = proven_correctness(records, attachments, model.decode, [srs], workdir, allow_dev=True)
    timings["check proofs"] = time.perf_counter() - started
    started = time.perf_counter()
    verdicts = verify(records, model, expect=Expectations(tasks=task_set, round_seed=seed), proven=proven)
    timings["re-execute (8 stages)"] = time.perf_counter() - started

    proofs = len(attachments)
    accepted = sum(v.accepted for v in verdicts)
    result = {
        "circuit": ANSWER_MATCH.id, "logrows": ANSWER_MATCH.logrows,
        "records": len(records), "proofs": proofs, "accepted": accepted,
        "rewards_1": sum(r.reward == 1.0 for r in records),
        "proof_bytes": len(attachments[0].proof), "attachment_bytes": len(attachments[0].to_bytes()),
        "proving_key_bytes": keys.pk.stat().st_size, "verifying_key_bytes": keys.vk.stat().st_size,
        "prove_peak_rss_bytes": peak, "rss_before_proving_bytes": baseline, "seconds": timings,
        "per_proof": {"prove": timings["prove"] / max(proofs, 1), "check": timings["check proofs"] / max(proofs, 1)},
        "ratios": {
            "prove / generate, per record": timings["prove"] / timings["generate"],
            "check proofs / re-execute, per record": timings["check proofs"] / timings["re-execute (8 stages)"],
            "prove / check, per proof": timings["prove"] / max(timings["check proofs"], 1e-9),
        },
    }
    _ratios(f"reward proofs: {len(records)} records of the base model, {proofs} proofs, {accepted} accepted",
            result["ratios"])
    console.print(f"proof {result['proof_bytes']} B, attachment {result['attachment_bytes']} B, proving key "
                  f"{result['proving_key_bytes'] / 2**20:.0f} MiB, verifying key {result['verifying_key_bytes']} B; "
                  f"peak RSS proving {peak / 2**20:.0f} MiB ({baseline / 2**20:.0f} before)")
    return result


def sampling(args, workdir: Path) -> dict:
    model = vrl.load_model(str(ensure_base_model(BUILT["base-micro"])))
    node = vrl.NodeKey.from_seed(b"bench/zk-sampling".ljust(32, b"\0"))
    params = dict(round_seed=bytes(32), sampling=vrl.sampling_for(model, max_new_tokens=8), groups=args.records // 4,
                  group_size=4)
    tasks = vrl.Arithmetic(digits=2, operations="+")
    timings: dict[str, float] = {}
    started = time.perf_counter()
    srs = zk.dev_srs(workdir, LM_LOGITS_MICRO.logrows)
    built = zk.build(LM_LOGITS_MICRO, workdir)
    keys = zk.keys(built, srs)
    timings["build and setup (once per circuit and SRS)"] = time.perf_counter() - started
    started = time.perf_counter()
    commitment = sampling_proofs.head_commitment(model, srs, workdir)
    timings["weights commitment (once per policy version)"] = time.perf_counter() - started
    started = time.perf_counter()
    vrl.generate(model, tasks, node, **params)
    timings["generate"] = time.perf_counter() - started
    kept = []
    started = time.perf_counter()
    records = vrl.generate(model, tasks, node, **params, witness=lambda r, rows: kept.append((r, rows)))
    timings["generate with hidden hashes"] = time.perf_counter() - started
    rows = {record_subject(r): x.numpy() for r, x in kept}
    challenge = bytes(range(32))
    reset_peak()
    baseline = rss_bytes()
    started = time.perf_counter()
    openings = sampling_proofs.prove_sampling(model, records, rows, challenge, args.positions, srs, workdir)
    timings["prove"] = time.perf_counter() - started
    peak = peak_bytes()
    started = time.perf_counter()
    checks = sampling_proofs.check_openings(records, openings, model, [srs], workdir, challenge=challenge,
                                            count=args.positions, allow_dev=True)
    timings["check proofs"] = time.perf_counter() - started
    started = time.perf_counter()
    verdicts = verify(records, model)
    timings["re-execute (8 stages)"] = time.perf_counter() - started

    # The circuit's logits against the float64 product, at every sampled position of --sweep
    # further records (the circuit evaluated, no proof needed).
    swept = []
    vrl.generate(model, tasks, node, **{**params, "groups": max(1, args.sweep // 4), "round_seed": bytes([1]) * 32},
                 witness=lambda r, rows: swept.append(rows.numpy()))
    head = model.network.get_output_embeddings().weight.detach().double()
    module = sampling_proofs.head_module(model)
    errors = []
    for stacked in [*rows.values(), *swept]:
        for row in stacked:
            quantized = quantize_hidden(row[None])[0]
            proven = torch.tensor(zk.outputs(LM_LOGITS_MICRO, [quantized.tolist()], workdir, srs, params=module),
                                  dtype=torch.float64) / (1 << HIDDEN_SCALE)
            errors.append(float((proven - head @ torch.from_numpy(row).double()).abs().max()))
    proofs = len(openings)
    result = {
        "circuit": LM_LOGITS_MICRO.id, "logrows": LM_LOGITS_MICRO.logrows, "records": len(records),
        "tokens": sum(len(r.completion_tokens) for r in records), "proofs": proofs,
        "proofs_ok": sum(c.outcome == "ok" for c in checks), "accepted": sum(v.accepted for v in verdicts),
        "proof_bytes": len(openings[0].attachment.proof), "opening_bytes": len(openings[0].attachment.to_bytes())
        + len(openings[0].row) + 40, "weights_commitment_bytes": len(commitment),
        "proving_key_bytes": keys.pk.stat().st_size, "verifying_key_bytes": keys.vk.stat().st_size,
        "prove_peak_rss_bytes": peak, "rss_before_proving_bytes": baseline,
        "logit_error_max": max(errors), "logit_error_positions": len(errors),
        "tolerance": sampling_proofs.LOGIT_TOLERANCE,
        "race_margin_max": max(c.margin for c in checks), "seconds": timings,
        "per_position": {"prove": timings["prove"] / max(proofs, 1), "check": timings["check proofs"] / max(proofs, 1)},
        "ratios": {
            "generate with hidden hashes / without": timings["generate with hidden hashes"] / timings["generate"],
            "prove one position / generate one record": (timings["prove"] / max(proofs, 1))
            / (timings["generate"] / len(records)),
            "check one position / re-execute one record": (timings["check proofs"] / max(proofs, 1))
            / (timings["re-execute (8 stages)"] / len(records)),
            "prove / check, per position": timings["prove"] / max(timings["check proofs"], 1e-9),
        },
    }
    _ratios(f"sampling proofs: {len(records)} records of base-micro, {proofs} positions, "
            f"{result['proofs_ok']} proven", result["ratios"])
    console.print(f"proof {result['proof_bytes']} B, opening {result['opening_bytes']} B, proving key "
                  f"{result['proving_key_bytes'] / 2**20:.0f} MiB, verifying key {result['verifying_key_bytes']} B; "
                  f"peak RSS proving {peak / 2**20:.0f} MiB ({baseline / 2**20:.0f} before); logit error max "
                  f"{result['logit_error_max']:.2e} over {len(errors)} positions (tolerance {result['tolerance']})")
    return result


if __name__ == "__main__":
    main()
