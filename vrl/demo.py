"""``./scripts/demo``: first, one machine: rollouts from the built-in tiny model, verified, and
tampered copies rejected with their reasons; then the main job, a local devnet of four node
processes on libp2p, one of them cheating, running GRPO on what survives verification.
Everything is local; nothing is downloaded."""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from vrl import generate, iter_records, load_model, sampling_for, verify, write_rollouts
from vrl.node.work import tampered
from vrl.cli import configure_logging, verdict_table
from vrl.rollouts.keys import NodeKey
from vrl.tasks import Task, TaskList

console = Console(width=None if Console().is_terminal else 150)

TASKS = TaskList("demo", tuple(Task(f"add-{a}-{b}", f"{a}+{b}=", str(a + b)) for a, b in ((2, 3), (17, 25), (40, 2))))


def tampered_groups(honest: list, model, node: NodeKey) -> list[tuple[str, int, list]]:
    """One cheat per kind a verifier must catch, each inside its whole group (a group is
    submitted whole), re-signed so every signature is valid: (name, index of the cheat, group)."""
    thief = NodeKey.from_seed(b"thief".ljust(32, b"\0"))
    first, second, fourth = honest[0], honest[1], honest[3]
    edited = tampered(second, model, node, position=len(second.completion_tokens) // 2)
    cheats = [
        ("fabricated reward", node, dict(reward=1.0 - first.reward), first),
        ("token edited, commitment redone by prefill", node,
         dict(completion_tokens=edited.completion_tokens, commitment=edited.commitment), second),
        ("seed grinding: sample 3 relabelled as 0", node, dict(sample_index=0), fourth),
        ("forged all-zero commitment", node, dict(commitment=bytes(len(first.commitment))), first),
        ("replayed by another node", thief, {}, second),
    ]
    out = []
    for name, key, changes, victim in cheats:
        group = [r for r in honest if r.group_key == victim.group_key]
        if key is not node:  # a thief re-signs the whole group as its own
            group = [r.signed(key) for r in group]
        cheat = victim.signed(key, **changes)
        group[cheat.sample_index] = cheat  # the cheat takes the slot of the sample it claims to be
        out.append((name, cheat.sample_index, group))
    return out


def main() -> None:
    configure_logging(json_mode=True)  # the tables are the output; logs only for warnings
    model = load_model("tiny")
    node = NodeKey.from_seed(b"honest-node".ljust(32, b"\0"))
    console.print(f"[bold]vrl demo[/]: preset [cyan]tiny[/] ({sum(p.numel() for p in model.network.parameters()):,} "
                  f"params), model hash {model.model_hash.hex()[:16]}…, node {node.node_id.hex()[:16]}…")
    started = time.perf_counter()
    rollouts = generate(model, TASKS, node, round_seed=bytes(32), sampling=sampling_for(model, max_new_tokens=48),
                        groups=3, group_size=4, batch_size=12)
    console.print(f"generated {len(rollouts)} rollouts (3 groups of 4) in "
                  f"{time.perf_counter() - started:.1f}s, each committed and signed")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollouts.msgpack"
        write_rollouts(path, rollouts)
        records = list(iter_records(path))
    honest = verify(records, model)
    console.print(verdict_table(honest, f"honest node: {sum(v.accepted for v in honest)} of {len(honest)} accepted"))
    rows = []
    for name, index, group in tampered_groups(rollouts, model, node):
        verdict = verify(group, model)[index]
        rows.append(replace(verdict, task_id=f"{group[index].task_id}: {name}"))
    console.print(verdict_table(rows, "tampered copies (each verified inside its whole group)"))
    caught = sum(not v.accepted for v in rows)
    console.print(f"[bold]{caught} of {len(rows)} cheats rejected[/], "
                  f"{sum(v.accepted for v in honest)} of {len(honest)} honest rollouts accepted.")
    local_devnet()


def local_devnet(nodes: int = 4, rounds: int = 12) -> None:
    """The main job: a network of mutually distrusting nodes on 127.0.0.1, one of them cheating."""
    from vrl.node import devnet
    from vrl.rl.base_model import ensure_base_model
    from vrl.rollouts.presets import read_meta

    with console.status("the base model (built once: supervised fine-tuning on arithmetic, about 3 minutes)"):
        meta = read_meta(ensure_base_model())
    console.print(f"\n[bold]devnet[/]: {nodes} node processes on libp2p (127.0.0.1), base model "
                  f"{meta['model_hash'][:16]}…; node 0 trains and verifies, the others work and verify, "
                  f"the last one fabricates rewards; the trainer also plants a known-bad group every 2 rounds")
    directory = Path(tempfile.mkdtemp(prefix="vrl-demo-"))
    summary = devnet.run(directory, nodes, ["fabricated-reward"], rounds, deadline_s=900, base_port=29000,
                         console=console, work={"model": "base"}, protocol={"plant_every": 2})
    if summary.get("failure"):
        console.print(f"[red]error[/]: devnet failed: {summary['failure']}. Logs, stores and configs: {directory}",
                      highlight=False)
        raise SystemExit(1)
    console.print(devnet.outcome_line(summary), highlight=False)


if __name__ == "__main__":
    main()
