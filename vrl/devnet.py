"""``vrl devnet``: N real node processes talking libp2p on 127.0.0.1, watched live.

Node 0 is the trainer (and a verifier); the others are workers and verifiers. The last
nodes can be told to cheat (``--adversaries fabricated-reward,lazy-verifier``). Each node is
a separate ``vrl node`` process with its own key, store, JSON log and Prometheus port; the
table is read from those metrics endpoints, as any operator would read them. The devnet stops
by itself once the trainer has published ``rounds`` new policy versions (or at the deadline).
"""

from __future__ import annotations


import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from vrl.keys import NodeKey
from vrl.node.config import NodeConfig
from vrl.node.work import ADVERSARIES

POLL_SECONDS = 1.0
STOP_GRACE_SECONDS = 20.0
# After the last version, run this long so that gossip a node missed is backfilled (every
# vrl.node.daemon.BACKFILL_EVERY_SECONDS) before the books are closed.
DRAIN_SECONDS = 8.0


@dataclass
class DevnetNode:
    name: str
    key: NodeKey
    config: NodeConfig
    metrics_port: int
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def peer(self) -> str:
        return self.key.node_id.hex()[:8]


def plan(directory: Path, nodes: int, adversaries: list[str], base_port: int, verification: bool = True,
         **node_options) -> list[DevnetNode]:
    """Keys, configs and ports for every node (written to ``directory/node-i/``).

    ``verification=False`` is the baseline the benchmarks compare against: no verifier role
    anywhere, no audits, no planted groups; the trainer admits whatever arrives."""
    from p2p.libp2p_transport import multiaddr_for

    if nodes < 2:
        raise ValueError("a devnet needs at least 2 nodes (a trainer and a worker)")
    if len(adversaries) > nodes - 1:
        raise ValueError(f"{len(adversaries)} adversaries need at least {len(adversaries) + 1} nodes")
    for kind in adversaries:
        if kind not in ADVERSARIES:
            raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(ADVERSARIES)}")
    keys = []
    for i in range(nodes):
        node_dir = directory / f"node-{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        if not (node_dir / "node.pem").exists():
            NodeKey.generate().save(node_dir / "node.pem")
        keys.append(NodeKey.load(node_dir / "node.pem"))
    trainer = keys[0]
    # Every worker dials the trainer and the worker before it: more than one path for gossip.
    addresses = [multiaddr_for(key.node_id, "127.0.0.1", base_port + i) for i, key in enumerate(keys)]
    cheats = dict(zip(range(nodes - len(adversaries), nodes), adversaries))
    out = []
    for i, key in enumerate(keys):
        kind = cheats.get(i, "")
        roles = ("trainer", "verifier") if i == 0 else ("worker", "verifier")
        if not verification:
            roles = tuple(r for r in roles if r != "verifier")
            # Nothing is checked, so no node ever earns trust: the naive trainer admits all.
            node_options = {**node_options, "lazy_audit_rate": 0.0, "plant_every": 0, "trusted_share": 0.0}
        config = NodeConfig(
            data_dir=str(directory / f"node-{i}"), trainer=trainer.node_id.hex(), roles=roles,
            listen=f"/ip4/127.0.0.1/tcp/{base_port + i}",
            bootstrap=tuple(addresses[j] for j in sorted({0, i - 1}) if 0 <= j < i),
            metrics_port=base_port + 1000 + i, adversary=kind, **node_options)
        (directory / f"node-{i}" / "node.toml").write_text(config.to_toml())
        name = "trainer" if i == 0 else f"worker-{i}"
        out.append(DevnetNode(name, key, config, base_port + 1000 + i))
    return out


def start(nodes: list[DevnetNode]) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for node in nodes:
        node.log_path = node.config.path / "node.log"
        with open(node.log_path, "ab") as log:
            node.process = subprocess.Popen(
                [sys.executable, "-m", "vrl.cli", "node", "--config", str(node.config.path / "node.toml"), "--json"],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(nodes: list[DevnetNode]) -> None:
    for node in nodes:
        if node.process and node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for node in nodes:
        if node.process is None:
            continue
        try:
            node.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait(5)


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """One node's metrics as ``{(name, sorted label items): value}``; empty if it is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def total(metrics: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in metrics.items()
               if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))


def status_table(nodes: list[DevnetNode], scraped: list[dict]) -> tuple[Table, dict]:
    trainer = scraped[0]
    table = Table(title="vrl devnet (reputation and state as the trainer sees them)", title_justify="left")
    for column in ("node", "role", "rollouts", "checked", "failed", "skipped", "reputation", "state"):
        table.add_column(column, justify="left" if column in ("node", "role", "state") else "right")
    for node, metrics in zip(nodes, scraped):
        peer = node.peer
        reputation = total(trainer, "vrl_reputation", peer=peer) if node is not nodes[0] else 1.0
        quarantined = total(trainer, "vrl_quarantined", peer=peer) > 0
        alive = node.process is not None and node.process.poll() is None
        state = "[red]quarantined[/]" if quarantined else ("up" if metrics else ("starting" if alive else "down"))
        failed = (total(metrics, "vrl_groups_checked_total", outcome="hard_fail")
                  + total(metrics, "vrl_groups_checked_total", outcome="soft_fail"))
        role = "trainer" if "trainer" in node.config.roles else "worker"
        table.add_row(f"{node.name} {peer}", role + (f" [yellow]{node.config.adversary}[/]" if node.config.adversary
                                                     else ""),
                      f"{total(metrics, 'vrl_rollouts_produced_total'):.0f}",
                      f"{total(metrics, 'vrl_groups_checked_total'):.0f}", f"{failed:.0f}",
                      f"{total(metrics, 'vrl_groups_skipped_total'):.0f}", f"{reputation:.3f}", state)
    summary = {
        "policy_version": total(trainer, "vrl_policy_version"),
        "held_out_accuracy": total(trainer, "vrl_held_out_accuracy"),
        "expected_accuracy": total(trainer, "vrl_held_out_expected_accuracy"),
        "groups_trained": {n.peer: total(trainer, "vrl_groups_trained_total", peer=n.peer) for n in nodes},
        "quarantined": [n.name for n in nodes if total(trainer, "vrl_quarantined", peer=n.peer) > 0],
        "backfilled_by_trainer": total(trainer, "vrl_backfilled_total"),
    }
    return table, summary


def run(directory: Path, nodes: int, adversaries: list[str], rounds: int, deadline_s: float, base_port: int,
        console: Console, verification: bool = True, **node_options) -> dict:
    """Start, watch until ``rounds`` versions or the deadline, stop; returns the summary."""
    network = plan(directory, nodes, adversaries, base_port, verification, rounds=rounds, **node_options)
    start(network)
    started = time.monotonic()
    summary: dict = {}
    first: dict | None = None
    reached: float | None = None
    try:
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while time.monotonic() - started < deadline_s:
                scraped = [scrape(n.metrics_port) for n in network]
                table, summary = status_table(network, scraped)
                if first is None and scraped[0] and summary["expected_accuracy"] > 0:
                    first = dict(summary)
                caption = (f"policy version {summary['policy_version']:.0f}/{rounds}; held-out accuracy "
                           f"{summary['held_out_accuracy']:.1%} sampled, {summary['expected_accuracy']:.2%} expected"
                           + (f" (version 0: {first['held_out_accuracy']:.1%}, {first['expected_accuracy']:.2%})"
                              if first else "") + f"; {time.monotonic() - started:.0f} s")
                live.update(Group(table, caption))
                if summary["policy_version"] >= rounds:
                    if reached is None:
                        reached = time.monotonic()
                    if time.monotonic() - reached >= DRAIN_SECONDS:
                        break
                if any(n.process.poll() is not None for n in network):
                    break
                time.sleep(POLL_SECONDS)
        console.line()
    finally:
        stop(network)
    summary.update(seconds=time.monotonic() - started, first_accuracy=(first or {}).get("held_out_accuracy"),
                   first_expected_accuracy=(first or {}).get("expected_accuracy"),
                   exit_codes={n.name: n.process.returncode for n in network},
                   nodes={n.peer: {"name": n.name, "adversary": n.config.adversary} for n in network})
    return summary



