"""``./scripts/demo``: generate rollouts with the built-in tiny model, verify them, and show
tampered copies rejected with their reasons. Everything is local; nothing is downloaded."""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from vrl import commit, generate, iter_records, load_model, sampling_for, verify, write_rollouts
from vrl.cli import _configure_logging, verdict_table
from vrl.keys import NodeKey
from vrl.tasks import Task

console = Console(width=None if Console().is_terminal else 150)

TASKS = [Task(f"add-{a}-{b}", f"{a}+{b}=", str(a + b)) for a, b in ((2, 3), (17, 25), (40, 2))]


def tampered_copies(honest: list, model) -> list:
    """One cheat per kind a verifier must catch, each re-signed by its own cheating node so the
    signature is valid, and completed with re-signed copies of its group's other members (a
    group is submitted whole) so the table shows the check that catches the cheat itself."""
    first, second, fourth = honest[0], honest[1], honest[3]
    tokens = list(second.completion_tokens)
    tokens[len(tokens) // 2] = (tokens[len(tokens) // 2] + 1) % 256
    cheats = [
        ("fabricated reward", dict(reward=1.0 - first.reward), first),
        ("token edited, commitment redone by prefill",
         dict(completion_tokens=tuple(tokens), commitment=commit(model, list(second.prompt_tokens), tokens)), second),
        ("replayed by another node", {}, second),
        ("seed grinding: sample 3 relabelled as 0", dict(sample_index=0), fourth),
        ("forged all-zero commitment", dict(commitment=bytes(len(first.commitment))), first),
    ]
    out = []
    for number, (name, changes, victim) in enumerate(cheats):
        key = NodeKey.from_seed(f"cheater-{number}".encode().ljust(32, b"\0"))
        cheat = victim.signed(key, **changes)
        rest = [r.signed(key) for r in honest if r.task_id == cheat.task_id and r.sample_index != cheat.sample_index]
        out.append((name, [cheat, *rest]))
    return out


def main() -> None:
    _configure_logging(json_mode=True)  # the tables are the output; logs only for warnings
    model = load_model("tiny")
    node = NodeKey.from_seed(b"honest-node".ljust(32, b"\0"))
    console.print(f"[bold]vrl demo[/]: preset [cyan]tiny[/] ({sum(p.numel() for p in model.network.parameters()):,} "
                  f"params), model hash {model.model_hash.hex()[:16]}…, node {node.node_id.hex()[:16]}…")
    started = time.perf_counter()
    rollouts = generate(model, TASKS, node, round_seed=bytes(32), sampling=sampling_for(model, max_new_tokens=48),
                        group_size=4, batch_size=12)
    console.print(f"generated {len(rollouts)} rollouts ({len(TASKS)} groups of 4) in "
                  f"{time.perf_counter() - started:.1f}s, each committed and signed")
    cheats = tampered_copies(rollouts, model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollouts.msgpack"
        write_rollouts(path, [*rollouts, *(r for _, group in cheats for r in group)])
        records = list(iter_records(path))
    verdicts = verify(records, model)
    honest = verdicts[: len(rollouts)]
    console.print(verdict_table(honest, f"honest node: {sum(v.accepted for v in honest)} of {len(honest)} accepted"))
    rows = []
    position = len(rollouts)
    for name, group in cheats:
        rows.append(replace(verdicts[position], task_id=f"{group[0].task_id}: {name}"))
        position += len(group)
    console.print(verdict_table(rows, "tampered copies, re-signed by a cheating node"))
    caught = sum(not v.accepted for v in rows)
    console.print(f"[bold]{caught} of {len(rows)} cheats rejected[/], "
                  f"{sum(v.accepted for v in honest)} of {len(honest)} honest rollouts accepted.")


if __name__ == "__main__":
    main()
