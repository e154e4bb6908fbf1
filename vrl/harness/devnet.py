"""``vrl devnet``: N real node processes talking libp2p on 127.0.0.1, watched live.

Node 0 is the trainer (and a verifier); the others are workers and verifiers. The last
nodes can be told to cheat (``--adversaries fabricated-reward,lazy-verifier``). Each node is
a separate ``vrl node`` process with its own key, store, JSON log and Prometheus port; the
table is read from those metrics endpoints, as any operator would read them. The devnet stops
by itself once the trainer has published ``rounds`` new policy versions, at the deadline, or as
soon as the evidence shows it cannot work (:class:`Watch`): then its summary says why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES, NodeConfig
from vrl.rollouts.keys import NodeKey

POLL_SECONDS = 1.0
STOP_GRACE_SECONDS = 20.0
# After the last version, run this long so that gossip a node missed is backfilled (every
# vrl.node.daemon.BACKFILL_EVERY_SECONDS) before the books are closed.
DRAIN_SECONDS = 8.0
# A node exports its peer count once its bootstrap dials are over (vrl.node.daemon: run() dials,
# backfills, then loops): connect_bootstrap tries an address 20 times with back-off capped at
# 2 s, about 36 s for one that never answers, and plan() gives a node at most 2 addresses: 72 s,
# plus a margin for the backfill that follows. So a node that has shown no peer 90 s after the
# whole network came up is cut off, and the run stops there, not at its deadline (900 s by default).
REACH_SECONDS = 90.0
LOG_HEAD_BYTES = 1 << 18  # "node started" is among a node's first log lines


@dataclass
class DevnetNode:
    name: str
    key: NodeKey
    config: NodeConfig
    metrics_port: int
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    log_start: int = 0  # where this run's lines begin in the log (a reused --dir appends)

    @property
    def peer(self) -> str:
        return self.key.node_id.hex()[:8]


def plan(directory: Path, nodes: int, adversaries: list[str], base_port: int, verification: bool = True,
         rounds: int = 0, **settings: Any) -> list[DevnetNode]:
    """Keys, configs and ports for every node (written to ``directory/node-i/``).

    ``settings`` are node.toml's keys and tables (``work={"model": "tiny"}``), the same for
    every node; ``rounds`` is the trainer's last version. ``verification=False`` is the
    baseline the benchmarks compare against: no verifier role anywhere, no audits, no planted
    groups; the trainer admits whatever arrives."""
    from p2p.libp2p_transport import multiaddr_for

    # Every path is resolved here, once: a node reads its node.toml from its own folder and a
    # relative data_dir there would be taken relative to that folder (dn/node-1/dn/node-1).
    directory = Path(directory).resolve()
    settings = _within(_resolved(settings), protocol={"last_version": rounds})
    if nodes < 2:
        raise ValueError("a devnet needs at least 2 nodes (a trainer and a worker)")
    for kind in adversaries:
        if kind not in ADVERSARIES:
            raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(ADVERSARIES)}")
    # A trainer's cheat is node 0's, the trainer's; the others go to the last workers.
    trainer_cheats = [k for k in adversaries if k in TRAINER_ADVERSARIES]
    worker_cheats = [k for k in adversaries if k not in TRAINER_ADVERSARIES]
    if len(trainer_cheats) > 1:
        raise ValueError(f"a devnet has one trainer, so at most one trainer cheat, got {', '.join(trainer_cheats)}")
    if len(worker_cheats) > nodes - 1:
        raise ValueError(f"{len(worker_cheats)} cheating workers need at least {len(worker_cheats) + 1} nodes")
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
    cheats = dict(zip(range(nodes - len(worker_cheats), nodes), worker_cheats)) | (
        {0: trainer_cheats[0]} if trainer_cheats else {})
    out = []
    for i, key in enumerate(keys):
        kind = cheats.get(i, "")
        roles: tuple[str, ...] = ("trainer", "verifier") if i == 0 else ("worker", "verifier")
        if not verification:
            roles = tuple(r for r in roles if r != "verifier")
            # Nothing is checked, so no node ever earns trust: the naive trainer admits all.
            settings = _within(settings, protocol={"lazy_audit_rate": 0.0, "plant_every": 0},
                               admission={"trusted_share": 0.0})
        # A private task set's answer key is the trainer's alone (specs/zk.md §11).
        own = settings if i == 0 or "answers" not in settings.get("zk", {}) else {
            **settings, "zk": {k: v for k, v in settings["zk"].items() if k != "answers"}}
        if i == 0:  # the devnet's archive: its audit (vrl audit DEVNET) replays every step (specs/storage.md §4)
            own = {**own, "storage": {"tier": "archive", **own.get("storage", {})}}
        config = NodeConfig.from_dict(dict(
            data_dir=str(directory / f"node-{i}"), trainer=trainer.node_id.hex(), roles=roles,
            listen=f"/ip4/127.0.0.1/tcp/{base_port + i}",
            bootstrap=tuple(addresses[j] for j in sorted({0, i - 1}) if 0 <= j < i),
            metrics_port=base_port + 1000 + i, adversary=kind, **own))
        (directory / f"node-{i}" / "node.toml").write_text(config.to_toml(), encoding="utf-8")
        name = "trainer" if i == 0 else f"worker-{i}"
        out.append(DevnetNode(name, key, config, base_port + 1000 + i))
    return out


def _within(settings: dict[str, Any], **tables: dict[str, Any]) -> dict[str, Any]:
    """node.toml's ``settings`` with more keys in its tables."""
    return {**settings, **{name: {**settings.get(name, {}), **keys} for name, keys in tables.items()}}


def _resolved(settings: dict[str, Any]) -> dict[str, Any]:
    """``[work]``'s model and task made absolute when they name a local directory or file, as
    the node would read them (a preset, ``base`` or an arithmetic spec is a name, not a path),
    and ``[zk]``'s answer key and SRS file."""
    from vrl.rollouts.presets import PRESETS

    work = dict(settings.get("work", {}))
    model, task = work.get("model"), work.get("task")
    if isinstance(model, str) and model not in (*PRESETS, "base") and Path(model).expanduser().exists():
        work["model"] = str(Path(model).expanduser().resolve())
    if isinstance(task, str) and not (task == "arithmetic" or task.startswith("arithmetic:")) and Path(task).exists():
        work["task"] = str(Path(task).resolve())
    settings = {**settings, "work": work} if work else settings
    zk = {name: str(Path(value).expanduser().resolve()) if name in ("answers", "srs") and value else value
          for name, value in settings.get("zk", {}).items()}
    return {**settings, "zk": zk} if zk else settings


def start(nodes: list[DevnetNode]) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for node in nodes:
        node.log_path = node.config.path / "node.log"
        with open(node.log_path, "ab") as log:
            node.log_start = log.tell()
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


#: A node's metrics: (name, sorted label items) -> value.
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Metrics:
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


def total(metrics: Metrics, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items()
               if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))


def status_table(nodes: list[DevnetNode], scraped: list[Metrics]) -> tuple[Table, dict[str, Any]]:
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
        if node is nodes[0] and (judges := sum(total(m, "vrl_trainer_convicted") > 0 for m in scraped[1:])):
            state = f"[red]convicted by {judges}/{len(nodes) - 1}[/]"
        elif total(metrics, "vrl_trainer_convicted") > 0:
            state += f", [red]left the trainer at v{total(metrics, 'vrl_trainer_fraud_version'):.0f}[/]"
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
        "steps_replayed": {n.name: {o: total(m, "vrl_steps_replayed_total", outcome=o) for o in ("pass", "fraud")}
                           for n, m in zip(nodes, scraped) if n is not nodes[0]},
        "convicted_by": [n.name for n, m in zip(nodes, scraped) if total(m, "vrl_trainer_convicted") > 0],
    }
    return table, summary


def _last_line(path: Path | None) -> str:
    """A node's last log line, its "event" or "error" when it is JSON; for a failure message."""
    if path is None:  # a node not started has no log
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            line = next((x for x in reversed(handle.read().decode(errors="replace").splitlines()) if x.strip()), "")
    except (OSError, TypeError):
        return ""
    try:
        record = json.loads(line)
        line = record.get("error") or record.get("event") or line
    except (ValueError, AttributeError):
        pass
    return line.strip()[:300]


def _started_as(path: Path | None, offset: int = 0) -> str | None:
    """The node id a node's log says it started as (its "node started" line after ``offset``),
    if it got there."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            head = handle.read(LOG_HEAD_BYTES).decode(errors="replace")
    except (OSError, TypeError):
        return None
    for line in head.splitlines():
        if '"node started"' in line:
            try:
                return str(json.loads(line).get("id"))
            except (ValueError, AttributeError):
                return None
    return None


@dataclass
class Watch:
    """Decides, from what a devnet's nodes show, whether it is working: every check is on
    evidence (exit codes, the id a node started as, peer counts, the policy version), and
    each failure is one sentence saying which node and why."""

    nodes: list[DevnetNode]
    answered: set[str] = field(default_factory=set)  # names whose metrics endpoint has answered
    all_up: float | None = None  # when every node had answered (slow starters are waited for)
    up_since: dict[str, float] = field(default_factory=dict)  # name -> when its peer count became live
    reached: set[str] = field(default_factory=set)  # names that have shown a peer
    identified: set[str] = field(default_factory=set)  # names whose started id was checked

    def observe(self, now: float, scraped: list[Metrics]) -> str | None:
        """A failure seen at ``now`` (monotonic seconds) in one scrape of every node, or None."""
        for node, metrics in zip(self.nodes, scraped):
            code = node.process.poll() if node.process is not None else None
            if code is not None:
                return f"{node.name} exited with code {code} while the network ran: {_last_line(node.log_path)} " \
                       f"(log: {node.log_path})"
            if node.name not in self.identified and (started := _started_as(node.log_path, node.log_start)) is not None:
                self.identified.add(node.name)
                if started != node.key.node_id.hex():
                    return (f"{node.name} started as node {started[:8]}, not the planned {node.peer}: its config "
                            f"leads to another key than {node.config.path / node.config.key}, so its peers cannot "
                            f"reach it (log: {node.log_path})")
            if metrics:
                self.answered.add(node.name)
                if total(metrics, "vrl_peers") >= 1:
                    self.reached.add(node.name)
        if self.all_up is None and len(self.answered) == len(self.nodes):
            self.all_up = now
        if self.all_up is None:
            return None  # nobody is judged while another node is still starting
        for node, metrics in zip(self.nodes, scraped):
            # A worker's peer count counts from when every node is up (its bootstrap dials are
            # bounded by REACH_SECONDS); a trainer's once its first evaluation is done, which
            # its loop, the exporter of the count, follows.
            if metrics and (total(metrics, "vrl_step_seconds_count", kind="evaluate") >= 1
                            or "trainer" not in node.config.roles):
                self.up_since.setdefault(node.name, now)
            if node.name not in self.reached and node.name in self.up_since and (
                    now - self.up_since[node.name] >= REACH_SECONDS):
                return (f"nodes cannot reach each other: {node.name} has had no peer for {REACH_SECONDS:.0f} s "
                        f"since the network came up (log: {node.log_path})")
        return None

    def final(self, summary: dict[str, Any], scraped: list[Metrics]) -> str | None:
        """What the end of a run shows: a network that never got past version 0 failed."""
        if summary.get("policy_version", 0) >= 1:
            return None
        trainer: Metrics = scraped[0] if scraped else {}
        produced = sum(total(m, "vrl_rollouts_produced_total") for m in scraped[1:])
        peers = ", ".join(f"{n.name} {total(m, 'vrl_peers'):.0f}" for n, m in zip(self.nodes, scraped))
        return (f"the network never got past policy version 0 in {summary.get('seconds', 0):.0f} s (the trainer "
                f"received {total(trainer, 'vrl_groups_received_total'):.0f} groups, the workers produced "
                f"{produced:.0f} rollouts; peers: {peers or 'no node answered'})")


def run(directory: Path, nodes: int, adversaries: list[str], rounds: int, deadline_s: float, base_port: int,
        console: Console, verification: bool = True, **settings: Any) -> dict[str, Any]:
    """Start, watch until ``rounds`` versions, a failure or the deadline, stop; returns the
    summary. ``summary["failure"]`` is None for a run that worked, else why it did not: a node
    exited, nodes could not reach each other (:class:`Watch`), or the network never got past
    policy version 0."""
    network = plan(directory, nodes, adversaries, base_port, verification, rounds=rounds, **settings)
    start(network)
    started = time.monotonic()
    summary: dict[str, Any] = {}
    first: dict[str, Any] | None = None
    reached: float | None = None
    watch = Watch(network)
    # With a dishonest trainer, the run is over once every honest verifier has convicted it.
    judges = {n.name for n in network[1:] if not n.config.adversary} if network[0].config.adversary else set()
    failure: str | None = None
    scraped: list[Metrics] = []
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
                # A convicted trainer is followed by no honest node: nothing more will happen.
                if summary["policy_version"] >= rounds or (judges and set(summary["convicted_by"]) >= judges):
                    if reached is None:
                        reached = time.monotonic()
                    if time.monotonic() - reached >= DRAIN_SECONDS:
                        break
                failure = watch.observe(time.monotonic(), scraped)
                if failure is not None:
                    break
                time.sleep(POLL_SECONDS)
        console.line()
    finally:
        stop(network)
    summary.update(seconds=time.monotonic() - started, first_accuracy=(first or {}).get("held_out_accuracy"),
                   first_expected_accuracy=(first or {}).get("expected_accuracy"),
                   exit_codes={n.name: n.process.returncode if n.process is not None else None for n in network},
                   nodes={n.peer: {"name": n.name, "adversary": n.config.adversary} for n in network},
                   directory=str(network[0].config.path.parent))
    summary["failure"] = failure or watch.final(summary, scraped)
    if network[0].config.adversary:
        summary["trainer_fraud"] = trainer_fraud(network)
    return summary


def events(path: Path | None, offset: int, event: str) -> list[dict[str, Any]]:
    """A node's JSON log lines of one event, from ``offset`` (this run's part of the log)."""
    if path is None:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode(errors="replace").splitlines()
    except (OSError, TypeError):
        return []
    found = []
    for line in lines:
        if f'"{event}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def _seconds(timestamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def trainer_fraud(network: list[DevnetNode]) -> dict[str, Any]:
    """A dishonest trainer's run, from the logs: its first bad version and when it published
    it, and for each node that confirmed the fraud, the version and the seconds it took."""
    trainer = network[0]
    cheats = events(trainer.log_path, trainer.log_start, "cheating")
    first = min((c["version"] for c in cheats), default=None)
    published = {r["version"]: _seconds(r["timestamp"]) for r in events(
        trainer.log_path, trainer.log_start, "policy published")}
    start = published.get(first) if first is not None else None
    confirmed = {}
    for node in network[1:]:
        for record in events(node.log_path, node.log_start, "TRAINER FRAUD CONFIRMED: following none of its "
                                                              "versions from this one on")[:1]:
            seconds = None if start is None else round(_seconds(record["timestamp"]) - start, 1)
            confirmed[node.name] = {"version": record.get("version"), "reasons": record.get("reasons"),
                                    "seconds": seconds}
    return {"cheat": trainer.config.adversary, "first_bad_version": first, "confirmed": confirmed}





def outcome_line(summary: dict[str, Any]) -> str:
    """What a finished devnet did, in one line: versions, accuracy, cheats caught."""
    cheats = [node["name"] for node in summary["nodes"].values() if node["adversary"] and node["name"] != "trainer"]
    caught = [name for name in cheats if name in summary["quarantined"]]
    fraud = summary.get("trainer_fraud")
    convicted = "" if fraud is None else (
        f"dishonest trainer ({fraud['cheat']}, bad from version {fraud['first_bad_version']}) convicted by "
        f"{len(fraud['confirmed'])} of {len(summary['nodes']) - 1} nodes"
        + (f" within {max(c['seconds'] or 0 for c in fraud['confirmed'].values()):.0f} s" if fraud["confirmed"] else "")
        + "; ")
    return convicted + (
            f"{len(caught)} of {len(cheats)} cheating nodes quarantined; {summary['policy_version']:.0f} policy "
            f"versions in {summary['seconds']:.0f} s; held-out accuracy {summary['first_accuracy'] or 0:.1%} -> "
            f"{summary['held_out_accuracy']:.1%} sampled, {summary['first_expected_accuracy'] or 0:.2%} -> "
            f"{summary['expected_accuracy']:.2%} expected; logs, stores and configs in {summary['directory']}")
