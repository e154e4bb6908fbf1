"""What private-answer reward proofs cost (specs/zk.md), measured side by side in one run.

    python bench/zk.py                 # 8 records of the base model, 2 minutes or so
    python bench/zk.py --records 16

For a batch of the base model's rollouts over a task set whose references are committed
(vrl commit-answers), it times, in this one run: generating them; verifying them by
re-execution (the eight stages, the rewards from the proofs); proving each record's
correctness (answer-match/v1, the dev SRS); checking those proofs; and the one-off circuit
build and key setup. It prints ratios, since the machine is shared and absolute times here
say little, and writes bench/results/zk.json with the sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import vrl  # noqa: E402
from proofs import zk  # noqa: E402
from proofs.circuits import ANSWER_MATCH  # noqa: E402
from vrl.rollouts.verify import Expectations, verify  # noqa: E402
from vrl.tasks import RewardSpec, TaskList, is_held_out  # noqa: E402
from vrl.zk import commit_answers, proven_correctness, prove_rewards  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=8, help="rollouts (groups of 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = vrl.load_model("base")
    tasks = [t for t in (vrl.Arithmetic(digits=2, operations="+").task(i) for i in range(256)) if not is_held_out(t)][:64]
    public, key = commit_answers(tasks)
    task_set = TaskList("private", tuple(public))
    node = vrl.NodeKey.from_seed(b"bench/zk".ljust(32, b"\0"))
    sampling = vrl.sampling_for(model, max_new_tokens=8)
    seed = bytes(32)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vrl-bench-zk-") as scratch:
        workdir = Path(scratch)
        started = time.perf_counter()
        srs = zk.dev_srs(workdir, ANSWER_MATCH.logrows)
        timings["dev SRS (once)"] = time.perf_counter() - started
        started = time.perf_counter()
        keys = zk.keys(zk.build(ANSWER_MATCH, workdir), srs)
        timings["build and setup (once per circuit and SRS)"] = time.perf_counter() - started
        pk_bytes = keys.pk.stat().st_size

        started = time.perf_counter()
        records = vrl.generate(model, task_set, node, round_seed=seed, sampling=sampling, groups=args.records // 4,
                               group_size=4, score=key.scorer(RewardSpec()))
        timings["generate"] = time.perf_counter() - started
        started = time.perf_counter()
        attachments = prove_rewards(records, key, model.decode, srs, workdir)
        timings["prove"] = time.perf_counter() - started
        started = time.perf_counter()
        proven = proven_correctness(records, attachments, model.decode, [srs], workdir, allow_dev=True)
        timings["check proofs"] = time.perf_counter() - started
        started = time.perf_counter()
        verdicts = verify(records, model, expect=Expectations(tasks=task_set, round_seed=seed), proven=proven)
        timings["re-execute (8 stages)"] = time.perf_counter() - started

    proofs = len(attachments)
    accepted = sum(v.accepted for v in verdicts)
    result = {
        "records": len(records), "proofs": proofs, "accepted": accepted,
        "rewards_1": sum(r.reward == 1.0 for r in records),
        "attachment_bytes": [len(a.to_bytes()) for a in attachments][:1],
        "proving_key_bytes": pk_bytes, "seconds": timings,
        "per_proof": {"prove": timings["prove"] / max(proofs, 1), "check": timings["check proofs"] / max(proofs, 1)},
        "ratios": {
            "prove / generate, per record": timings["prove"] / timings["generate"],
            "check proofs / re-execute, per record": timings["check proofs"] / timings["re-execute (8 stages)"],
            "prove / check, per proof": timings["prove"] / max(timings["check proofs"], 1e-9),
        },
        "ezkl": zk.EZKL_VERSION, "circuit": ANSWER_MATCH.id, "logrows": ANSWER_MATCH.logrows,
    }
    table = Table(title=f"{len(records)} records of the base model, {proofs} proofs, {accepted} accepted",
                  title_justify="left")
    table.add_column("ratio (same run)")
    table.add_column("value", justify="right")
    for name, value in result["ratios"].items():
        table.add_row(name, f"{value:.1f}x")
    console.print(table)
    console.print(f"attachment {result['attachment_bytes']} bytes, proving key {pk_bytes / 2**20:.0f} MiB; "
                  f"one-off: build and setup {timings['build and setup (once per circuit and SRS)']:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "zk.json").write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {RESULTS / 'zk.json'}")


if __name__ == "__main__":
    main()
