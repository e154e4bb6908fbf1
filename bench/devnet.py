"""Network numbers from real devnets: N `vrl node` processes on libp2p over 127.0.0.1, one
scenario a name.

    python bench/devnet.py throughput   # 5 honest nodes: rollouts/s, nothing lost, check latency
    python bench/devnet.py poisoning    # 25% cheating workers, verification on vs off
    python bench/devnet.py learning     # accuracy after N steps: all honest vs under attack (verified)
    python bench/devnet.py faults       # SIGKILL + restart, SIGSTOP + SIGCONT a worker mid-run
    python bench/devnet.py trainers     # each dishonest trainer: caught or not, and how fast
    python bench/devnet.py spoofing     # each decode-spoofing worker: tokens to detection, learning beside honest runs
    python bench/devnet.py zk           # base-micro, sampling proofs asked after every check, vs none:
                                        # latency, failures
    python bench/devnet.py private      # a private task set (trainer proves rewards) vs the same in the clear; a cheat
    python bench/devnet.py committee    # 12 nodes, verification = "committee" (specs/committee.md), cheats;
                                        # quarantines, bad groups trained, checks per round, the audit
                                        # (every committee re-derived) -> bench/results/devnet-committee.json
    python bench/devnet.py costs        # every node's per-round costs at N = 5 and 12, for the simulator's
                                        # calibration -> bench/results/devnet-costs.json
    python bench/devnet.py audit        # what `vrl audit` of a devnet costs -> bench/results/audit-<model>.json

Every number comes from the nodes' own SQLite stores after the run (what was acknowledged),
or from their Prometheus endpoints (costs), not from logs. Runs are bounded by a round count
and a deadline and stop by themselves. ``python bench/devnet.py SCENARIO --help`` says more.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from process_memory import available_bytes
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vrl.audit  # noqa: E402
from p2p import traffic as T  # noqa: E402
from p2p.blobs import BLOB_PROTOCOL, CHUNK_BYTES  # noqa: E402
from p2p.libp2p_transport import (  # noqa: E402
    GOSSIP_DEGREE,
    GOSSIP_DEGREE_HIGH,
    GOSSIP_DEGREE_LOW,
    HEARTBEAT_SECONDS,
)
from vrl.harness import devnet  # noqa: E402
from vrl.node.catchup import BACKFILL_PROTOCOL  # noqa: E402
from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES  # noqa: E402
from vrl.node.daemon import BACKFILL_EVERY_SECONDS, TICK_SECONDS  # noqa: E402
from vrl.node.messages import PolicyAnnouncement, SignedVerdict, StepVerdict, Submission  # noqa: E402
from vrl.node.params import ProtocolParams, Verification  # noqa: E402
from vrl.node.store import Store  # noqa: E402
from vrl.rl.base_model import ensure_base_model  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"
SPOOFS = sorted(kind for kind in ADVERSARIES if kind.startswith("spoof-"))
# node.toml's [work] table of the scenarios that do not set their own.
WORK = {"model": "base", "task": "arithmetic:digits=2,ops=+"}


def stores(directory: Path, nodes: int) -> list[Store]:
    return [Store(directory / f"node-{i}" / "node.sqlite") for i in range(nodes)]


def analyse(directory: Path, nodes: int, adversaries: list[str], seconds: float) -> dict:
    """What the stores say: produced vs received groups, check latency, what was trained on."""
    opened = stores(directory, nodes)
    try:
        trainer = opened[0]
        cheats = {devnet_peer(directory, i) for i in range(nodes - len(adversaries), nodes)}
        produced: dict[bytes, float] = {}  # group -> when its worker stored it (= submitted)
        producer: dict[bytes, bytes] = {}
        for i, store in enumerate(opened[1:], start=1):
            me = devnet_peer(directory, i)
            for kind, data, extra in store.replay():
                if kind == "group" and extra[0] == me:
                    digest = Submission.from_bytes(data).digest
                    produced[digest], producer[digest] = extra[2], me
        received = {Submission.from_bytes(d).digest for k, d, _ in trainer.replay() if k == "group"}
        # Once quarantined, a node's gossip is ignored by design: not a loss.
        quarantined = {row[0] for row in trainer.reputation() if row[4]}
        missing = set(produced) - received
        ignored = {g for g in missing if producer[g] in quarantined}
        latencies = []  # submission (worker stored its group) -> verdict (verifier stored its own)
        for i, store in enumerate(opened):
            me = devnet_peer(directory, i)
            for _verdict_id, data, at in store._rows("SELECT id, data, received FROM verdicts WHERE verifier=?", (me,)):
                verdict = SignedVerdict.from_bytes(data)
                if verdict.checked and verdict.group in produced:
                    latencies.append(at - produced[verdict.group])
        trained = [g for _, groups, _ in trainer.trained_versions() for g in groups]
        subjects = []
        for digest in trained:
            group = trainer.group(digest)
            subjects.append(group.rollouts()[0].node_id if group else b"")
        bad = sum(s in cheats for s in subjects)
        metrics = [json.loads(m) for _, _, m in trainer.trained_versions()]
        accuracy = [m["held_out_accuracy"] for m in metrics if "held_out_accuracy" in m]
        expected = [m["held_out_expected_accuracy"] for m in metrics if "held_out_expected_accuracy" in m]
        group_size = len(trainer.group(next(iter(received))).records) if received else 0
        # Time to quarantine: the cheat's first submission to the second agreeing hard fail the
        # trainer stored on one of its groups (what confirms fraud, specs/reputation.md §3).
        first_submission = min((produced[g] for g in produced if producer[g] in cheats), default=None)
        fails: dict[bytes, list[float]] = {}
        for data, at in trainer._rows(
                "SELECT data, received FROM verdicts WHERE outcome='hard_fail' ORDER BY received"):
            verdict = SignedVerdict.from_bytes(data)
            if verdict.subject in cheats:
                fails.setdefault(verdict.group, []).append(at)
        confirmed_at = min((times[1] for times in fails.values() if len(times) > 1), default=None)
        versions_by_worker = {
            i: sorted({extra[1] for kind, _, extra in store.replay() if kind == "group"
                       and extra[0] == devnet_peer(directory, i)}) for i, store in enumerate(opened) if i}
        integrity = all(store._rows("PRAGMA integrity_check")[0][0] == "ok" for store in opened)
        delivered = len(received & set(produced))
        return {
            "versions_generated_by_worker": versions_by_worker, "stores_intact": integrity, "seconds": seconds,
            "time_to_quarantine_s": (confirmed_at - first_submission) if (confirmed_at and first_submission) else None,
            "groups_produced": len(produced), "groups_received_by_trainer": delivered,
            "lost": len(missing - ignored), "ignored_after_quarantine": len(ignored),
            "rollouts_per_second": delivered * group_size / seconds, "check_latency_p50": _pct(latencies, 50),
            "check_latency_p90": _pct(latencies, 90), "checks": len(latencies), "groups_trained": len(trained),
            "bad_groups_trained": bad, "poisoned_share": bad / len(trained) if trained else 0.0,
            "accuracy_curve": accuracy, "expected_accuracy_curve": expected, "versions": len(metrics),
        }
    finally:
        for store in opened:
            store.close()


def spoof_detection(directory: Path, nodes: int) -> dict:
    """How the network caught the last node's decode spoofing (specs/verification.md §7), from
    the stores: each honest verifier's own signed verdicts on it in the order it signed them
    (the race evidence it had checked when its first hard fail came, and why), and the cheat's
    completion tokens produced before the first hard fail anywhere and before the second
    reporter's, which is when its fraud counts as confirmed (specs/reputation.md §3)."""
    opened = stores(directory, nodes)
    try:
        cheat = devnet_peer(directory, nodes - 1)
        produced = []
        for kind, data, extra in opened[-1].replay():
            if kind == "group" and extra[0] == cheat:
                rollouts = Submission.from_bytes(data).rollouts()
                produced.append((extra[2], sum(len(r.completion_tokens) for r in rollouts)))
        verifiers, fails = {}, []
        for i, store in enumerate(opened[:-1]):
            me = devnet_peer(directory, i)
            checked, caught = 0, None
            for data, at in store._rows("SELECT data, received FROM verdicts WHERE verifier=? ORDER BY received",
                                        (me,)):
                verdict = SignedVerdict.from_bytes(data)
                if verdict.subject != cheat or not verdict.checked or verdict.planted:
                    continue
                checked += verdict.race_tokens
                if verdict.outcome == "hard_fail":
                    caught = {"tokens_checked": checked, "reasons": list(verdict.reasons), "at": at}
                    fails.append((at, i))
                    break
            verifiers[f"node-{i}"] = caught
        fails.sort()
        # The trainer's own GRPO pass (specs/network.md §5.4): groups it refused to train.
        refused = sum(json.loads(m or "{}").get("groups_refused", 0) for _, _, m in opened[0].trained_versions())
        first = fails[0][0] if fails else None
        confirmed = fails[1][0] if len(fails) > 1 else None
        return {
            "cheat_tokens_produced": sum(t for _, t in produced),
            "cheat_tokens_before_first_fail": None if first is None else sum(t for at, t in produced if at <= first),
            "cheat_tokens_before_confirmed": (None if confirmed is None
                                              else sum(t for at, t in produced if at <= confirmed)),
            "verifiers": verifiers,
            "groups_refused_by_trainers_pass": refused,
        }
    finally:
        for store in opened:
            store.close()


def audited_changes(directory: Path, nodes: int) -> dict:
    """What the spoof changed that training saw: every admitted group re-verified by the audit
    (vrl audit --all, groups only). In float32 a changed token loses its race beyond honest
    drift, so a group of the cheat that fails re-verification is one whose tokens it changed."""
    cheat = devnet_peer(directory, nodes - 1).hex()
    with vrl.audit.open([directory]) as audit:
        report = audit.run(checks=("groups",), sample=1.0)
    failing = [f for f in report.findings if f.code == "bad_group" and f.subject == cheat]
    trained = [f for f in report.findings if f.code == "trained_bad_group"]
    return {"cheat_groups_failing_reverification": len(failing), "of_them_trained": len(trained),
            "reasons": sorted({r for f in failing for r in f.evidence.get("reasons", [])}),
            "groups_reverified": report.stats.get("groups", {}).get("re-verified")}


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def devnet_peer(directory: Path, i: int) -> bytes:
    from vrl.rollouts.keys import NodeKey

    return NodeKey.load(directory / f"node-{i}" / "node.pem").node_id


def one_run(name: str, nodes: int, adversaries: list[str], rounds: int, deadline: float, port: int,
            during=None, **options) -> dict:
    directory = Path(tempfile.mkdtemp(prefix=f"vrl-bench-{name}-"))
    console.print(f"[bold]{name}[/]: {nodes} nodes, adversaries {adversaries or 'none'}, "
                  f"{rounds} rounds -> {directory}")
    started = time.monotonic()
    if during is None:
        summary = devnet.run(directory, nodes, adversaries, rounds, deadline, port, console, **options)
    else:
        summary = run_with_faults(directory, nodes, adversaries, rounds, deadline, port, during, **options)
    result = analyse(directory, nodes, adversaries, time.monotonic() - started)
    result.update(name=name, quarantined=summary.get("quarantined", []), directory=str(directory))
    console.print_json(json.dumps({k: v for k, v in result.items() if not k.endswith("_curve")}))
    return result


def trainer_run(kind: str, rounds: int, deadline: float, port: int, **options) -> dict:
    """A 4-node devnet whose trainer cheats as ``kind`` from version CHEAT_FROM + 1 on: whether
    every honest node confirmed the fraud, at which version, and how many seconds after the
    first bad version was published (from the nodes' own logs: vrl.harness.devnet.trainer_fraud)."""
    directory = Path(tempfile.mkdtemp(prefix=f"vrl-bench-{kind}-"))
    console.print(f"[bold]{kind}[/]: 4 nodes, the trainer cheats, up to {rounds} rounds -> {directory}")
    summary = devnet.run(directory, 4, [kind], rounds, deadline, port, console, **options)
    fraud = summary["trainer_fraud"]
    seconds = [c["seconds"] for c in fraud["confirmed"].values() if c["seconds"] is not None]
    result = {"name": kind, "caught_by": len(fraud["confirmed"]), "honest_nodes": 3,
              "first_bad_version": fraud["first_bad_version"],
              "confirmed_at_versions": sorted({c["version"] for c in fraud["confirmed"].values()}),
              "reasons": sorted({r for c in fraud["confirmed"].values() for r in c["reasons"] or ()}),
              "seconds_to_first_confirmation": min(seconds, default=None),
              "seconds_to_all_confirmations": max(seconds, default=None),
              "steps_replayed": summary["steps_replayed"], "versions_published": summary["policy_version"],
              "failure": summary["failure"], "directory": str(directory)}
    # The audit afterwards, over every store, every step replayed (vrl audit --all).
    started = time.monotonic()
    srs = {}
    if options.get("zk", {}).get("dev_srs"):  # a private task set's proofs (specs/zk.md §11), made here
        from proofs import zk
        from proofs.circuits import ANSWER_MATCH
        from vrl.zk import work_directory

        srs = {"srs": [zk.dev_srs(work_directory(), ANSWER_MATCH.logrows)], "allow_dev_srs": True}
    with vrl.audit.open([directory]) as audit:
        report = audit.run(sample=1.0, **srs)
    trainer = next((node for node in report.verdicts_by_node().values() if node["role"] == "trainer"), {})
    result["audit"] = {"trainer": trainer.get("verdict"), "evidence": {**trainer.get("errors", {}),
                                                                      **trainer.get("warnings", {})},
                       "versions": sorted({f.evidence.get("version") for f in report.findings
                                           if f.subject == trainer.get("id") and "version" in f.evidence}),
                       "others_convicted": sorted(n["name"] for n in report.verdicts_by_node().values()
                                                  if n["verdict"] == "convicted" and n["role"] != "trainer"),
                       "seconds": round(time.monotonic() - started, 1)}
    console.print_json(json.dumps(result))
    return result


def run_with_faults(directory, nodes, adversaries, rounds, deadline, port, during, **options) -> dict:
    network = devnet.plan(directory, nodes, adversaries, port, rounds=rounds, **options)
    devnet.start(network)
    started = time.monotonic()
    try:
        during(network, started)
        while time.monotonic() - started < deadline:
            metrics = devnet.scrape(network[0].metrics_port)
            if devnet.total(metrics, "vrl_policy_version") >= rounds:
                break
            time.sleep(1.0)
    finally:
        devnet.stop(network)
    return {}


def faults(network: list, started: float) -> None:
    """SIGKILL worker 1 after its first groups, restart it 5 s later; SIGSTOP worker 2 for 8 s."""
    victim, frozen = network[1], network[2]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and devnet.total(devnet.scrape(victim.metrics_port),
                                                       "vrl_rollouts_produced_total") == 0:
        time.sleep(0.5)
    console.print(f"SIGKILL {victim.name} at {time.monotonic() - started:.0f} s")
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    os.kill(frozen.process.pid, signal.SIGSTOP)
    console.print(f"SIGSTOP {frozen.name}")
    time.sleep(5)
    devnet.start([victim])
    console.print(f"restarted {victim.name} at {time.monotonic() - started:.0f} s")
    time.sleep(3)
    os.kill(frozen.process.pid, signal.SIGCONT)
    console.print(f"SIGCONT {frozen.name}")


def zk_runs(args) -> list[dict]:
    """specs/network.md §3.4 on libp2p: 3 nodes of base-micro (a trainer and two workers, all
    verifiers), sampling proofs asked after every passing check (one position a record, the
    dev SRS), against the same network asking none, in one invocation. From the stores: check
    latency and verdicts; from the logs: proofs served and answers that failed."""
    from vrl.rollouts.presets import BUILT

    ensure_base_model(BUILT["base-micro"])
    work = {"model": "base-micro", "task": "arithmetic:digits=2,ops=+", "group_size": 2}
    # Two groups a round: each worker then proves at most 2 groups x 2 verifiers x 2 records a
    # round, about 26 s of its two cores at 3.2 s a position (bench/results/zk.json).
    protocol = {"groups_per_round": 2, "plant_every": 0}
    results = []
    for name, zk in (("zk-off", {}), ("zk-on", {"hidden_states": True, "sampling_positions": 1, "dev_srs": True})):
        result = one_run(name, 3, [], args.rounds, args.deadline, args.port + (50 if zk else 0), work=work,
                         protocol=protocol, admission={"batch_groups": 4}, **({"zk": zk} if zk else {}))
        directory = Path(result["directory"])
        logs = "".join((directory / f"node-{i}" / "node.log").read_text(errors="replace") for i in range(3))
        opened = stores(directory, 3)
        try:
            verdicts = [SignedVerdict.from_bytes(d) for store in opened for k, d, _ in store.replay() if k == "verdict"]
        finally:
            for store in opened:
                store.close()
        result["zk"] = {
            "proof_answers_sent": logs.count("sampling proofs sent"),
            "answers_missing": logs.count("no sampling proofs"),
            "verdicts": len(verdicts), "failed": sum(v.outcome in ("hard_fail", "soft_fail") for v in verdicts),
            "failure_reasons": sorted({r for v in verdicts for r in v.reasons}),
        }
        console.print_json(json.dumps(result["zk"]))
        results.append(result)
    off, on = results
    if off["check_latency_p50"] and on["check_latency_p50"]:
        console.print(f"check latency p50 with sampling proofs / without: "
                      f"{on['check_latency_p50'] / off['check_latency_p50']:.1f}x")
    return results


def private_tasks(directory: Path, count: int = 1024, spec: str = "arithmetic:digits=2,ops=+") -> dict[str, Path]:
    """The bench's task set written both ways (specs/zk.md §11): ``plain`` with its answers,
    ``public`` with them committed, and the trainer's answer ``key``."""
    from vrl.tasks import open_task_set
    from vrl.zk import commit_answers, write_key, write_task_file

    arithmetic, _ = open_task_set(spec)
    plain = [arithmetic.task(i) for i in range(count)]
    public, key = commit_answers(plain)
    paths = {"plain": directory / "plain.jsonl", "public": directory / "public.jsonl", "key": directory / "key.jsonl"}
    write_task_file(paths["plain"], plain)
    write_task_file(paths["public"], public)
    write_key(paths["key"], key)
    return paths


def private_settings(paths: dict[str, Path]) -> dict:
    """node.toml's tables for a private network of the bench's tasks: the base model, every
    node holding the public file and the dev SRS, the trainer the key (vrl.harness.devnet.plan)."""
    return {"work": {"model": "base", "task": str(paths["public"]), "group_size": 4},
            "zk": {"answers": str(paths["key"]), "dev_srs": True}}


def private_runs(args) -> list[dict]:
    """specs/zk.md §11 on libp2p: 3 nodes of the base model training on a task set whose
    answers only the trainer holds, every step replayed by every node from the proofs it binds
    (step_audit_rate 1), against the same tasks in the clear, in one invocation; then a trainer
    that proves honestly and trains as if every answer were correct (trainer-inflated-rewards)."""
    paths = private_tasks(Path(tempfile.mkdtemp(prefix="vrl-bench-private-tasks-")))
    # Batches of 4 groups of 4: a step proves at most 16 statements, about 75 s at 4.7 s each
    # (bench/results/zk.json) on one of the trainer's two cores.
    protocol = {"plant_every": 0, "step_audit_rate": 1.0, "groups_per_round": 2}
    admission = {"batch_groups": 4}
    secret = private_settings(paths)
    clear = {**secret, "work": {**secret["work"], "task": str(paths["plain"])}, "zk": {}}
    results = []
    for i, (name, settings) in enumerate((("tasks-in-the-clear", clear), ("tasks-private", secret))):
        result = one_run(name, 3, [], args.rounds, args.deadline, args.port + 50 * i, protocol=protocol,
                         admission=admission, **settings)
        directory = Path(result["directory"])
        proven = devnet.events(directory / "node-0" / "node.log", 0, "rewards proven")
        opened = stores(directory, 3)
        try:
            steps = [StepVerdict.from_bytes(d) for store in opened[1:] for k, d, _ in store.replay() if k == "step"]
        finally:
            for store in opened:
                store.close()
        result["private"] = {
            "steps_proven": len(proven), "records": sum(p["records"] for p in proven),
            "proofs": sum(p["proofs"] for p in proven),
            "proving_seconds": round(sum(p["seconds"] for p in proven), 1),
            "step_verdicts": len(steps), "step_frauds": sum(v.outcome == "fraud" for v in steps),
            "seconds_per_version": round(result["seconds"] / max(result["versions"], 1), 1),
        }
        console.print_json(json.dumps(result["private"]))
        results.append(result)
    clear, private = results
    console.print(f"seconds per version, private / in the clear: "
                  f"{private['private']['seconds_per_version'] / clear['private']['seconds_per_version']:.1f}x")
    results.append(trainer_run("trainer-inflated-rewards", args.rounds, args.deadline, args.port + 100,
                               protocol=protocol, admission=admission, **secret))
    return results


# The committee devnet's cheats (the last workers): one per kind of bad group a check finds;
# two of eleven workers, 18% of the verifier weight at most, under the design point f* = 0.45
# (specs/committee.md §5).
COMMITTEE_CHEATS = ["fabricated-reward", "tampered-tokens"]


def committee_run(args) -> dict:
    """``--nodes`` (12) real nodes of the committee design with COMMITTEE_CHEATS; then the audit
    of the folder (``--sample`` of the re-executing checks; every committee re-derived)."""
    nodes = args.nodes
    if args.reaudit is None:
        result = one_run(f"committee-{nodes}", nodes, COMMITTEE_CHEATS, args.rounds, args.deadline, args.port,
                         work=WORK,
                         protocol={"verification": Verification.COMMITTEE, "plant_every": 2})
    else:  # the books of a finished run closed again (the audit changed): what its stores say
        run = json.loads((RESULTS / "devnet-committee.json").read_text())[0]  # that run's own record
        result = analyse(args.reaudit, nodes, COMMITTEE_CHEATS, run["seconds"])
        result.update(name=run["name"], quarantined=run["quarantined"], directory=str(args.reaudit),
                      reaudited_with=f"python bench/devnet.py committee --reaudit {args.reaudit}")
    directory = Path(result["directory"])
    cheats = {devnet_peer(directory, i).hex() for i in range(nodes - len(COMMITTEE_CHEATS), nodes)}
    names = {devnet_peer(directory, i).hex(): f"node-{i}" for i in range(nodes)}
    opened = stores(directory, nodes)
    try:
        trainer = opened[0]
        manifests = trainer.manifests()
        checks = {}  # per node: its own checked verdicts per round (the trainer's version span)
        for i, store in enumerate(opened):
            me = devnet_peer(directory, i)
            own = [SignedVerdict.from_bytes(d) for (d,) in store._rows("SELECT data FROM verdicts WHERE verifier=?",
                                                                       (me,))]
            checks[f"node-{i}"] = {"checked": sum(v.checked for v in own),
                                   "draws": dict(sorted(Counter(str(v.draw) for v in own).items()))}
        quarantined_by = {f"node-{i}": sorted(names[row[0].hex()] for row in store.reputation()
                                              if row[4] and row[0].hex() in names) for i, store in enumerate(opened)}
    finally:
        for store in opened:
            store.close()
    logs = {f"node-{i}": (directory / f"node-{i}" / "node.log").read_text(errors="replace") for i in range(nodes)}
    failures = {"policy_fetch_failed": {n: log.count('"policy fetch failed"') for n, log in logs.items()
                                        if '"policy fetch failed"' in log},
                "step_fraud_reports": {n: log.count('"step reported as fraud"') for n, log in logs.items()
                                       if '"step reported as fraud"' in log},
                "trainer_fraud_confirmed": [n for n, log in logs.items() if "TRAINER FRAUD CONFIRMED" in log]}
    started = time.monotonic()
    with vrl.audit.open([directory]) as audit:
        report = audit.run(sample=args.sample)
    verdicts = report.verdicts_by_node()
    audit = {"sample": args.sample, "seconds": round(time.monotonic() - started, 1),
             "committees": report.stats.get("committees"),
             "committee_findings": [f.to_json() for f in report.findings if f.check == "committees"],
             "nodes": {names.get(n, n[:8]): {"verdict": info["verdict"], "errors": info["errors"],
                                            "warnings": info["warnings"], "cheat": n in cheats}
                       for n, info in verdicts.items() if n in names},
             "honest_clean": all(info["verdict"] == "clean" for n, info in verdicts.items()
                                 if n in names and n not in cheats),
             "cheats_convicted": all(verdicts.get(n, {}).get("verdict") == "convicted" for n in cheats)}
    result.update(cheats=sorted(names[c] for c in cheats), manifests=len(manifests),
                  committee_size=manifests[-1].committee_size if manifests else None,
                  eligible_per_round=[m.weights for m in manifests],
                  groups_per_manifest=[m.groups for m in manifests], checks=checks,
                  quarantined_by=quarantined_by, failures=failures, audit=audit,
                  command=f"python bench/devnet.py committee --nodes {nodes} --rounds {args.rounds} "
                          f"--deadline {args.deadline:g} --sample {args.sample:g}",
                  machine="x86_64, 2 cores shared with other jobs; timings noisy, counts not")
    console.print_json(json.dumps({k: v for k, v in result.items() if not k.endswith("_curve")}, default=str))
    return result


def plot_learning(results: list[dict], path: Path) -> None:
    """Expected held-out accuracy per policy version, honest runs against attacked ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for result in results:
        style = "-" if result["name"].startswith("honest") else "--"
        axis.plot([100 * a for a in result["expected_accuracy_curve"]], style, label=result["name"])
    axis.set_xlabel("policy version (one GRPO step each)")
    axis.set_ylabel("held-out expected accuracy (%)")
    axis.set_title("5-node libp2p devnet: all honest vs 1 of 4 workers cheating, verified")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)




# -- costs: every node's per-round costs, for the simulator's calibration ----------------------------

# The first announced version after version 0: by then every node has dialled, backfilled and
# loaded version 0's weights, costs a long-running node does not pay each round.
WARMUP_VERSIONS = 1
# The design of a recorded run that names none: runs recorded before --designs were of the ticket design.
BEFORE_DESIGNS = Verification.TICKETS
POLL_SECONDS = 0.25  # a round lasts seconds (bench/results/devnet-throughput.json: ~6 s at N = 5)
# Free memory a node process needs: the base model in torch, its store and libp2p; measured
# at ~0.45 GiB RSS per node on this machine kind; 0.6 leaves a margin.
GIB_PER_NODE = 0.6
MEMORY_WAIT_SECONDS = 600.0  # the machine is shared: wait for room rather than crowd others out

MODES = {"default": "the devnet's [admission] (batch_groups 12, node_cap 0.34: vrl.node.config.NODE_OVERRIDES)",
         "paced": "as default, but admission.batch_groups = groups_per_round x (nodes - 1): a batch of every "
                  "worker's round"}
IN_KINDS = (T.GOSSIP_IN, T.REQUEST_IN, T.RESPONSE_IN)
OUT_KINDS = (T.GOSSIP_OUT, T.REQUEST_OUT, T.RESPONSE_OUT)


def costs_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 12])
    shared(parser, rounds=5, deadline=1500, port=27300)
    parser.add_argument("--modes", nargs="+", choices=["default", "paced"], default=["default", "paced"],
                        help="default: the devnet's admission (batches of 12); paced: a batch of every worker's "
                             "groups, one generation a round")
    parser.add_argument("--designs", nargs="+", type=Verification, choices=tuple(Verification),
                        default=[ProtocolParams.verification],
                        help="the verification design (ProtocolParams.verification, its default) of each run")
    parser.add_argument("--set", nargs="+", default=[], metavar="TABLE.KEY=VALUE", dest="sets",
                        help="node.toml overrides of every node of every run (protocol.groups_per_round=2); "
                             "recorded in each run, and the simulator's comparison uses them")
    parser.add_argument("--out", type=Path, default=RESULTS / "devnet-costs.json")
    parser.add_argument("--append", action="store_true",
                        help="keep --out's other runs; a run of the same nodes, mode and design is replaced")
    parser.add_argument("--simulate", action="store_true",
                        help="after the runs, put the simulator beside each run of --nodes and --designs in --out "
                             "(bench/simulate.py --compare, that run's design), under the run's 'simulator'")
    parser.add_argument("--no-run", action="store_true", help="with --simulate: compare the runs --out holds")
    parser.add_argument("--keep", action="store_true",
                        help="keep each measured run's directory (its nodes' stores, blobs and logs); a failed "
                             "run's is always kept")
    parser.add_argument("--simulate-with", nargs="+", default=["", "--cores 2"],
                        help="with --simulate: the simulator's options of each comparison ('--cores 2': the 2 "
                             "cores the devnet's nodes share, processor sharing; '': a core per node)")


def costs(args: argparse.Namespace) -> None:
    """Per-node costs of the real libp2p devnet, for the simulator's calibration (issue 30 item 1).

        python bench/devnet.py costs                     # N = 5 and N = 12, 5 measured rounds each
        python bench/devnet.py costs --nodes 5 --rounds 4
        python bench/devnet.py costs --nodes 12 --modes default --designs tickets committee --append
        python bench/devnet.py costs --nodes 5 12 --modes paced --designs committee --append \\
            --set protocol.groups_per_round=2 protocol.submission_window=40 protocol.step_wait=120

    Runs `vrl devnet`'s network (vrl.harness.devnet.plan: node 0 the trainer and a verifier, the
    others workers and verifiers, every node honest, each worker dialling the trainer and the
    worker before it) of real `vrl node` processes on 127.0.0.1, with the protocol's default
    parameters and the base model, and reads every node's Prometheus endpoint:

    * checks: ``vrl_groups_checked_total`` (Check actions carried out, any outcome);
    * verify-seconds: ``vrl_work_seconds_total{kind="check"}``, the wall seconds checks ran on the
      model thread (without the queueing in ``vrl_step_seconds``), and
      ``vrl_work_cpu_seconds_total{kind="check"}``, that thread's CPU seconds: on this shared 2-core
      machine N processes share two cores, so wall seconds grow with N and CPU seconds are the cost;
    * payload messages and bytes: ``vrl_payload_{messages,bytes}_total{kind,name}``, the
      transport's counters (p2p.traffic): gossip delivered once per receiving node (``in``), every
      copy written to a peer including mesh forwards (``out``), request and response bodies on both
      sides; blobs (``/vrl/blob/1``, weights and step files) reported apart as well.

    A round is the interval between two policy announcements (vrl/harness/simulator/metrics.py's
    metric definitions). Every node is scraped as soon as the trainer's ``vrl_policy_version``
    reaches ``WARMUP_VERSIONS`` (the start-up's dials, first backfill and version 0 weights are
    behind us) and again when it reaches ``WARMUP_VERSIONS + rounds`` (each time the last scrape of
    every node before the trainer's announcement, at most POLL_SECONDS and one scrape before it, as
    the simulator counts from the announcement); per-round figures are the difference divided by
    ``rounds``. Whole-run totals are kept beside them. Writes bench/results/devnet-costs.json; the
    machine is shared, so seconds are noisy, counts are not.
    """
    result = {"settings": costs_settings(args.nodes, args.rounds), "runs": []}
    if args.append and args.out.exists():
        result = json.loads(args.out.read_text())
        result["settings"]["nodes"] = sorted(set(result["settings"]["nodes"]) | set(args.nodes))
        for run in result["runs"]:
            run.setdefault("design", BEFORE_DESIGNS)
        # A run of the same nodes, mode, design and overrides is replaced; others are kept.
        same = json.dumps(parse_sets(args.sets), sort_keys=True)
        result["runs"] = [r for r in result["runs"] if args.no_run or (
            r["nodes"], r["mode"], r["design"], json.dumps(r.get("overrides", {}), sort_keys=True)) not in {
            (n, m, d, same) for n in args.nodes for m in args.modes for d in args.designs}]
    result["settings"]["modes"] = {**result["settings"].get("modes", {}), **{mode: MODES[mode] for mode in args.modes}}
    result["settings"]["commands"] = [*result["settings"].get("commands", []),
                                      invocation(args)]
    args.out.parent.mkdir(exist_ok=True)
    shown = ("checks_per_round", "verify_seconds_per_round", "verify_cpu_seconds_per_round", "bytes_per_round",
             "blob_bytes_per_round", "messages_per_round")
    for run in result["runs"]:  # shapes a run from before they were read (its store still on this machine)
        if "per_node" in run and run.get("mean_commitment_bytes") is None and Path(run["directory"], "node-0").exists():
            run.update(stored_shapes(Path(run["directory"])))
    args.out.write_text(json.dumps(result, indent=1))
    plan = [] if args.no_run else [(mode, n, design) for design in args.designs for mode in args.modes
                                   for n in args.nodes]
    for i, (mode, n, design) in enumerate(plan):
        run = costs_run(n, args.rounds, args.deadline, args.port + 100 * i, mode, design, parse_sets(args.sets))
        result["runs"].append(run)
        # [work] max_new_tokens 0 means "chosen from the task set when the model loads": the value chosen.
        result["settings"]["max_new_tokens"] = next((r["max_new_tokens"] for r in result["runs"]
                                                     if r.get("max_new_tokens")), None)
        args.out.write_text(json.dumps(result, indent=1))  # after every run: a later failure loses nothing
        if "per_node" in run and not args.keep:
            # A measured run's nodes' stores, blobs and logs (~0.5-0.8 GB at N = 5-12) are not kept
            # unless asked: its numbers are in --out; a failed run keeps its logs for the why.
            shutil.rmtree(run["directory"], ignore_errors=True)
        if "per_node" in run:
            console.print(f"N={n} {mode} {design}: " + ", ".join(f"{k} {run['per_node'][k]:,.2f}" for k in shown)
                          + f"; groups/round {run['network']['groups_published_per_round']:.1f}")
    if args.simulate:
        for run in result["runs"]:
            if run["nodes"] in args.nodes and run.get("design", BEFORE_DESIGNS) in args.designs and "per_node" in run:
                run["simulator"] = {options or "(one core per node)": simulated(result["settings"], run, options)
                                    for options in args.simulate_with}
                args.out.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


def parse_sets(items: list[str]) -> dict[str, dict]:
    """``table.key=value`` node.toml overrides (``protocol.groups_per_round=2``), the same for
    every node: {table: {key: value}}, the value read as JSON (a number) or else kept as text."""
    out: dict[str, dict] = {}
    for item in items:
        name, sep, text = item.partition("=")
        table, dot, key = name.partition(".")
        if not sep or not dot or table not in ("protocol", "admission", "work", "reputation"):
            raise SystemExit(f"--set {item!r}: write table.key=value, table one of protocol, admission, work, "
                             "reputation")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out.setdefault(table, {})[key] = value
    return out


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a node's process so far (/proc/PID/stat), 0 if it is gone:
    beside the round's wall seconds, whether the devnet's nodes were starved of the 2 cores."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_memory(nodes: int) -> None:
    need = GIB_PER_NODE * nodes + 1.0
    deadline = time.monotonic() + MEMORY_WAIT_SECONDS
    while (free := available_bytes() / (1 << 30)) < need:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {free:.1f} GiB available after {MEMORY_WAIT_SECONDS:.0f} s; "
                             f"{nodes} nodes need about {need:.1f} GiB")
        console.print(f"{free:.1f} GiB available, {need:.1f} needed: waiting")
        time.sleep(15)


def node_costs(metrics: dict, pid: int | None = None) -> dict:
    """One node's cumulative counters, from one scrape (and its process's CPU seconds)."""
    payload: dict[str, dict[str, list[float]]] = {}
    for (name, labels), value in metrics.items():
        if name in ("vrl_payload_bytes_total", "vrl_payload_messages_total"):
            label = dict(labels)
            slot = payload.setdefault(label["kind"], {}).setdefault(label["name"], [0.0, 0.0])
            slot[0 if name == "vrl_payload_messages_total" else 1] = value
    return {"checks": devnet.total(metrics, "vrl_groups_checked_total"),
            "verify_seconds": devnet.total(metrics, "vrl_work_seconds_total", kind="check"),
            "verify_cpu_seconds": devnet.total(metrics, "vrl_work_cpu_seconds_total", kind="check"),
            "check_latency_seconds": devnet.total(metrics, "vrl_step_seconds_sum", kind="check"),
            "generate_seconds": devnet.total(metrics, "vrl_work_seconds_total", kind="generate"),
            "generate_cpu_seconds": devnet.total(metrics, "vrl_work_cpu_seconds_total", kind="generate"),
            "rollouts_produced": devnet.total(metrics, "vrl_rollouts_produced_total"),
            "process_cpu_seconds": process_cpu_seconds(pid),
            # Steps replayed (or judged by the rules): each replay fetches two optimizer states.
            "step_replays": devnet.total(metrics, "vrl_steps_replayed_total"),
            "payload": payload}


def difference(after: dict, before: dict) -> dict:
    payload = {}
    for kind, names in after["payload"].items():
        for name, (messages, size) in names.items():
            old = before["payload"].get(kind, {}).get(name, [0.0, 0.0])
            payload.setdefault(kind, {})[name] = [messages - old[0], size - old[1]]
    return {**{k: after[k] - before[k] for k in after if k != "payload"}, "payload": payload}


def per_round(window: dict, rounds: int, role: str, name: str) -> dict:
    """One node's costs per round, in the metric definitions the simulator shares."""
    payload = window["payload"]

    def total(kinds: tuple[str, ...], index: int, only: str | None = None) -> float:
        return sum(values[index] for kind in kinds for name_, values in payload.get(kind, {}).items()
                   if only is None or name_ == only)

    blob_in = total((T.REQUEST_IN, T.RESPONSE_IN), 1, BLOB_PROTOCOL)
    blob_out = total((T.REQUEST_OUT, T.RESPONSE_OUT), 1, BLOB_PROTOCOL)
    by_kind = {kind: {name_: {"messages": m / rounds, "bytes": b / rounds} for name_, (m, b) in names.items()}
               for kind, names in sorted(payload.items())}
    bytes_in, bytes_out = total(IN_KINDS, 1), total(OUT_KINDS, 1)
    return {
        "name": name, "role": role,
        "checks_per_round": window["checks"] / rounds,
        "verify_seconds_per_round": window["verify_seconds"] / rounds,
        "verify_cpu_seconds_per_round": window["verify_cpu_seconds"] / rounds,
        "check_latency_seconds_per_round": window["check_latency_seconds"] / rounds,
        "generate_seconds_per_round": window["generate_seconds"] / rounds,
        "generate_cpu_seconds_per_round": window["generate_cpu_seconds"] / rounds,
        "rollouts_per_round": window["rollouts_produced"] / rounds,
        "process_cpu_seconds_per_round": window.get("process_cpu_seconds", 0.0) / rounds,
        "step_replays_per_round": window.get("step_replays", 0.0) / rounds,
        "bytes_in_per_round": bytes_in / rounds,
        "bytes_out_per_round": bytes_out / rounds,
        "bytes_per_round": (bytes_in + bytes_out) / rounds,
        "blob_bytes_in_per_round": blob_in / rounds,
        "blob_bytes_out_per_round": blob_out / rounds,
        "blob_bytes_per_round": (blob_in + blob_out) / rounds,
        "bytes_per_round_without_blobs": (bytes_in + bytes_out - blob_in - blob_out) / rounds,
        "backfill_bytes_per_round": (total(IN_KINDS + OUT_KINDS, 1, BACKFILL_PROTOCOL)) / rounds,
        "gossip_bytes_in_per_round": total((T.GOSSIP_IN,), 1) / rounds,
        "gossip_bytes_out_per_round": total((T.GOSSIP_OUT,), 1) / rounds,
        "gossip_copy_bytes_in_per_round": total((T.GOSSIP_COPIES_IN,), 1) / rounds,
        "messages_in_per_round": total(IN_KINDS, 0) / rounds,
        "messages_out_per_round": total(OUT_KINDS, 0) / rounds,
        "messages_per_round": (total(IN_KINDS, 0) + total(OUT_KINDS, 0)) / rounds,
        "by_kind": by_kind,
    }


def means(rows: list[dict]) -> dict:
    keys = [k for k, v in rows[0].items() if isinstance(v, float | int) and not isinstance(v, bool)]
    return {k: statistics.fmean(row[k] for row in rows) for k in keys}


def message_sizes(rows: list[dict]) -> dict:
    """Mean payload bytes of one message per gossip topic and request protocol, over all nodes."""
    sizes: dict[str, list[float]] = {}
    for row in rows:
        for kind in (T.GOSSIP_IN, T.RESPONSE_IN, T.REQUEST_IN):
            for name, count in row["by_kind"].get(kind, {}).items():
                slot = sizes.setdefault(f"{kind}:{name}", [0.0, 0.0])
                slot[0] += count["messages"]
                slot[1] += count["bytes"]
    return {key: (b / m if m else 0.0) for key, (m, b) in sorted(sizes.items())}


def stored_shapes(directory: Path) -> dict:
    """From the trainer's store: the weights blob's size, the max_new_tokens the nodes chose
    ([work] max_new_tokens 0: from the task set), and the tokens per rollout the checks replay."""
    store = Store(directory / "node-0" / "node.sqlite")
    weights, max_new, prompt, completion, optimizer, delta = None, None, [], [], [], []
    commitment, task_id = [], []
    try:
        for kind, data, _ in store.replay():
            if kind == "policy":
                a = PolicyAnnouncement.from_bytes(data)
                weights = weights or a.size
                if a.version:  # version 0 has no step, no delta
                    optimizer.append(a.optimizer_size)
                    delta.append(a.delta_size)
            elif kind == "group":
                for rollout in Submission.from_bytes(data).rollouts():
                    max_new = rollout.sampling.max_new_tokens
                    prompt.append(len(rollout.prompt_tokens))
                    completion.append(len(rollout.completion_tokens))
                    commitment.append(len(rollout.commitment))
                    task_id.append(len(rollout.task_id))
    finally:
        store.close()
    return {"weights_bytes": weights, "max_new_tokens": max_new,
            # A step's optimizer state (a replay fetches two) and the weights delta a node that
            # holds the parent's file fetches instead of the file (specs/network.md §6.1): means.
            "optimizer_bytes": round(statistics.fmean(optimizer)) if optimizer else None,
            "delta_bytes": round(statistics.fmean(delta)) if delta else None,
            # A record's commitment bytes and task id length (the record's shape, beside its tokens).
            "mean_commitment_bytes": statistics.fmean(commitment) if commitment else None,
            "mean_task_id_chars": statistics.fmean(task_id) if task_id else None,
            "mean_prompt_tokens": statistics.fmean(prompt) if prompt else None,
            "mean_completion_tokens": statistics.fmean(completion) if completion else None}


def admission_for(mode: str, nodes: int, groups_per_round: int | None = None) -> dict:
    """The [admission] overrides of a mode: none for ``default`` (the node's devnet defaults,
    batches of 12 groups); for ``paced``, a batch of every worker's groups of a round
    (groups_per_round x workers), as the default's 12 is for `vrl devnet`'s 3 workers
    (vrl.node.config.NODE_OVERRIDES), so that a round is one generation of every worker."""
    if mode == "default":
        return {}
    return {"batch_groups": (groups_per_round or ProtocolParams().groups_per_round) * (nodes - 1)}


def costs_run(nodes: int, rounds: int, deadline: float, port: int, mode: str = "default",
            design: Verification = ProtocolParams.verification, sets: dict | None = None) -> dict:
    """``design``: ProtocolParams.verification (its default, committee, unless given);
    ``sets``: node.toml overrides ({table: {key: value}}, :func:`parse_sets`) of every node."""
    wait_for_memory(nodes)
    sets = sets or {}
    directory = Path(tempfile.mkdtemp(prefix=f"vrl-bench-costs-{design}-{mode}-{nodes}-"))
    last = WARMUP_VERSIONS + rounds
    admission = {**admission_for(mode, nodes, sets.get("protocol", {}).get("groups_per_round")),
                 **sets.get("admission", {})}
    protocol = {"verification": design, **sets.get("protocol", {})}
    tables = {name: values for name, values in sets.items() if name not in ("protocol", "admission", "work")}
    network = devnet.plan(directory, nodes, [], port, rounds=last, work={**WORK, **sets.get("work", {})},
                          **({"admission": admission} if admission else {}),
                          **({"protocol": protocol} if protocol else {}), **tables)
    console.print(f"[bold]{nodes} nodes, {mode}[/] {admission or ''}, versions {WARMUP_VERSIONS}..{last} "
                  f"measured -> {directory}")
    watch = devnet.Watch(network)
    snapshots: dict[int, tuple[float, list[dict]]] = {}  # version -> (when, each node's costs)
    previous: tuple[float, list[dict]] | None = None  # the last full scrape
    started = time.monotonic()
    devnet.start(network)
    failure = None
    try:
        while time.monotonic() - started < deadline:
            scraped = [devnet.scrape(n.metrics_port) for n in network]
            now = time.monotonic()
            version = int(devnet.total(scraped[0], "vrl_policy_version")) if scraped[0] else 0
            current = (now - started, [node_costs(m, n.process and n.process.pid) for m, n in zip(scraped, network)]
                       ) if all(scraped) else None
            for mark in (WARMUP_VERSIONS, last):
                if version >= mark and mark not in snapshots and (previous or current):
                    # The last full scrape before the trainer's version reached the mark: the
                    # simulator's boundary is the announcement itself, and a worker's weight fetch
                    # of the new version (~0.3 s for a 7 MB delta at N = 5) may finish before the
                    # scrape that sees the version, moving a fetch out of the window.
                    snapshots[mark] = previous or current
                    console.print(f"version {version} at {now - started:.0f} s: snapshot {mark}")
            previous = current or previous
            if last in snapshots:
                break
            failure = watch.observe(now, scraped)
            if failure is not None:
                break
            time.sleep(POLL_SECONDS)
        final = [node_costs(devnet.scrape(n.metrics_port), n.process and n.process.pid) for n in network]
    finally:
        devnet.stop(network)
    seconds = time.monotonic() - started
    if last not in snapshots or WARMUP_VERSIONS not in snapshots:
        # Kept in the results, not raised: the runs before it stand, and the why is a finding.
        reported = devnet.events(network[0].log_path, network[0].log_start, "step reported as fraud")
        why = (f"version {last} not reached in {seconds:.0f} s ({failure or 'deadline'}); "
               f"{len(reported)} step fraud reports against the trainer, reasons "
               f"{sorted({r for e in reported for r in e.get('reasons', [])})}; logs in {directory}")
        console.print(f"[red]{nodes} nodes, {mode}: {why}[/]")
        return {"nodes": nodes, "mode": mode, "design": design, "admission_overrides": admission, "rounds": rounds,
                "overrides": sets, "failure": why, "versions_reached": sorted(snapshots), "directory": str(directory)}
    (t0, before), (t1, after) = snapshots[WARMUP_VERSIONS], snapshots[last]
    detail = [per_round(difference(a, b), rounds, "trainer" if i == 0 else "worker", n.name)
              for i, (n, a, b) in enumerate(zip(network, after, before))]
    workers = detail[1:]
    shapes = stored_shapes(directory)
    config = dataclasses.asdict(network[1].config)
    group_size = config["work"]["group_size"]
    groups = sum(row["rollouts_per_round"] for row in workers) / group_size
    return {
        "nodes": nodes, "mode": mode, "design": design, "admission_overrides": admission, "rounds": rounds,
        # Every node.toml override of the run ({table: {key: value}}, --set): the simulator's
        # comparison (bench/simulate.py --compare) runs with the same; "tables" is what the nodes had.
        "overrides": sets,
        "tables": {name: {k: v for k, v in config[name].items() if k != "last_version"}
                   for name in ("work", "protocol", "reputation", "admission")},
        "versions": [WARMUP_VERSIONS, last],
        # What the network did per round, beside what each node paid: on 2 shared cores the
        # workers may not keep up with the trainer's versions (then fewer groups per round).
        "network": {"groups_published_per_round": groups,
                    "groups_nominal_per_round": (nodes - 1) * config["protocol"]["groups_per_round"],
                    # The nodes' CPU seconds a round, all processes together, and as a share of
                    # the machine's cores (near 1: the devnet was CPU-bound).
                    "process_cpu_seconds_per_round": sum(row["process_cpu_seconds_per_round"] for row in detail),
                    "cpu_share_of_cores": sum(row["process_cpu_seconds_per_round"] for row in detail)
                    / ((t1 - t0) / rounds) / (os.cpu_count() or 1),
                    "checks_per_round": sum(row["checks_per_round"] for row in detail),
                    "checks_per_group": (sum(row["checks_per_round"] for row in detail) / groups) if groups else None,
                    "weight_fetches_per_round": (sum(row["blob_bytes_in_per_round"] for row in workers)
                                                 / shapes["weights_bytes"]) if shapes["weights_bytes"] else None},
        "seconds_per_round": (t1 - t0) / rounds, "run_seconds": seconds,
        **shapes,
        "per_node": means(detail),
        "per_node_workers": means(workers),
        "per_node_trainer": {k: v for k, v in detail[0].items() if k != "by_kind"},
        "message_bytes": message_sizes(detail),
        "per_node_detail": detail,
        "whole_run_totals": [{k: v for k, v in c.items()} for c in final],
        "directory": str(directory),
    }


def costs_settings(nodes: list[int], rounds: int) -> dict:
    """Everything the simulator needs to reproduce a run: the node.toml tables every node had
    (defaults but [work]'s model and task), the topology, and the transport's gossip parameters."""
    plan = devnet.plan(Path(tempfile.mkdtemp(prefix="vrl-bench-costs-plan-")), 3, [], 1, rounds=1, work=WORK)
    config = dataclasses.asdict(plan[1].config)
    tables = {name: config[name] for name in ("work", "protocol", "reputation", "admission")}
    tables["protocol"].pop("last_version")
    return {
        "nodes": nodes, "rounds": rounds, "warmup_versions": WARMUP_VERSIONS,
        "model": WORK["model"], "task": WORK["task"],
        "groups_per_round": tables["protocol"]["groups_per_round"],
        "group_size": tables["work"]["group_size"], "max_new_tokens": tables["work"]["max_new_tokens"],
        "roles": {"node 0": ["trainer", "verifier"], "others": ["worker", "verifier"]},
        "honest": True,
        "topology": "node i > 0 dials node 0 and node i - 1 (vrl.harness.devnet.plan); gossipsub meshes over "
                    "those connections",
        "gossip": {"protocol": "meshsub/1.1 (py-libp2p)", "D": GOSSIP_DEGREE, "D_low": GOSSIP_DEGREE_LOW,
                   "D_high": GOSSIP_DEGREE_HIGH, "heartbeat_seconds": HEARTBEAT_SECONDS},
        "blob_chunk_bytes": CHUNK_BYTES, "backfill_every_seconds": BACKFILL_EVERY_SECONDS,
        "tick_seconds": TICK_SECONDS,
        "tables": tables,
        "definitions": {
            "round": "the interval between two policy announcements; per-round = (counter at the trainer's "
                     f"version {WARMUP_VERSIONS}+rounds - counter at version {WARMUP_VERSIONS}) / rounds, "
                     "each the last scrape of every node before the trainer's announcement (at most 0.25 s and "
                     "one scrape before it)",
            "checks": "Check actions carried out (vrl_groups_checked_total, every outcome)",
            "verify_seconds": "wall seconds checks ran on the model thread, queueing excluded "
                              "(vrl_work_seconds_total{kind=check}); verify_cpu_seconds: that thread's CPU seconds "
                              "in them (vrl_work_cpu_seconds_total), the cost without contention for the 2 cores",
            "bytes_in": "gossip payload delivered once per receiving node (own publishes excluded) + request and "
                        "response bodies received (blobs included)",
            "bytes_out": "gossip payload written to each peer (publishes and mesh forwards, IWANT answers) + "
                         "request and response bodies sent (blobs included)",
            "blob_bytes": f"the {BLOB_PROTOCOL} part of bytes_in + bytes_out",
            "messages": "payload messages in + out, as bytes",
            "not_counted": "transport framing, Noise, Yamux, gossipsub control (IHAVE, IWANT, GRAFT, PRUNE, "
                           "IDONTWANT, subscriptions), message signatures and protobuf fields around the payload",
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs",
    }


def simulated(settings: dict, run: dict, options: str = "") -> dict:
    """bench/simulate.py --compare on this one run, with its design and ``options``: its rows."""
    with tempfile.TemporaryDirectory() as scratch:
        one, out = Path(scratch) / "run.json", Path(scratch) / "compare.json"
        one.write_text(json.dumps({"settings": settings, "runs": [run]}))
        command = [sys.executable, str(Path(__file__).resolve().parent / "simulate.py"), "--compare", str(one),
                   "--design", run.get("design", BEFORE_DESIGNS), "--out", str(out), *options.split()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not out.exists():
            return {"failure": (done.stderr or done.stdout)[-2000:]}
        compared = json.loads(out.read_text())["runs"][0]
    return {"command": f"python bench/simulate.py --compare <this run> --design {run.get('design', BEFORE_DESIGNS)} "
                       f"{options}".strip(),
            "tolerance": 0.20, "rows": compared["rows"],
            "within": sum(r["within"] for r in compared["rows"]), "of": len(compared["rows"])}




# -- audit: what `vrl audit` of a devnet costs -------------------------------------------------------

LOG_CHECKS = ["signatures", "reputation", "duplicates", "lazy_verifiers", "admission", "quarantine"]


def audit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="audit this devnet folder instead of running one")
    parser.add_argument("--model", default="base")
    parser.add_argument("--task", default=WORK["task"])
    parser.add_argument("--nodes", type=int, default=5)
    shared(parser, rounds=20, deadline=1200, port=None)


def audit_costs(args: argparse.Namespace) -> None:
    """What an audit costs (issue 15 §4): a real devnet, then `vrl.audit` over its stores.

        python bench/devnet.py audit               # 5 nodes, 20 rounds, the base model (built first if needed)
        python bench/devnet.py audit --model tiny --task arithmetic:digits=1 --rounds 6   # a quick one
        python bench/devnet.py audit --dir DIR     # audit a devnet folder that already exists

    It prints and writes (bench/results/audit-<model>.json): the devnet's size; the whole audit
    at --all and at the default sample, each check's seconds; groups re-verified per second
    against the devnet's own checks per second on the same groups (the nodes' check latency is
    a different measure: it includes waiting); step replays per second; the HTML report's size
    and time; and the audit's peak traced memory on the whole log against on its first half,
    with the bytes of each log, to show what memory grows with. Times are wall-clock on this
    2-core machine, so read them as ratios measured side by side in one run.
    """
    scratch = Path(tempfile.mkdtemp(prefix="vrl-bench-audit-"))
    directory = args.dir or scratch / "dn"
    devnet_seconds = None
    if args.dir is None:
        if args.model == "base":
            with console.status("the base model (built once)"):
                ensure_base_model()
        started = time.perf_counter()
        summary = devnet.run(directory, args.nodes, ["fabricated-reward"], args.rounds, deadline_s=args.deadline,
                             base_port=args.port or random.Random().randrange(20000, 27000), console=console,
                             work={"model": args.model, "task": args.task}, protocol={"plant_every": 2})
        if summary["failure"]:
            raise SystemExit(f"the devnet failed: {summary['failure']}")
        devnet_seconds = time.perf_counter() - started

    everything, everything_seconds = timed_audit(directory, 1.0)
    sampled, sampled_seconds = timed_audit(directory, vrl.audit.DEFAULT_SAMPLE)
    started = time.perf_counter()
    page = everything.to_html()
    html_seconds = time.perf_counter() - started

    groups = everything.stats["groups"]
    steps = everything.series.get("steps", [])
    inputs = everything.inputs
    counts = {k: sum(i["counts"].get(k, 0) for i in inputs) for k in ("policies", "groups", "verdicts", "steps")}
    half = first_half(directory, scratch / "half")
    memory = {"whole": {"log_bytes": log_bytes(directory), "peak_bytes": peak_memory(directory)},
              "first_half": {"log_bytes": log_bytes(half), "peak_bytes": peak_memory(half)}}
    result = {
        "devnet": {"directory": str(directory), "nodes": len(inputs), "seconds": devnet_seconds,
                   "versions": max((i["counts"]["policies"] for i in inputs), default=0), "rows": counts,
                   "model": args.model},
        "audit_all": {"seconds": everything_seconds, "per_check": everything.seconds,
                      "findings": {str(s): len(everything.of(s)) for s in vrl.audit.Severity},
                      "clean_nodes": sorted(n["name"] for n in everything.verdicts_by_node().values()
                                            if n["verdict"] == "clean"),
                      "convicted_nodes": sorted(n["name"] or "?" for n in everything.verdicts_by_node().values()
                                                if n["verdict"] == "convicted")},
        "audit_default_sample": {"sample": vrl.audit.DEFAULT_SAMPLE, "seconds": sampled_seconds,
                                 "per_check": sampled.seconds},
        "groups_reverified_per_second": groups["re-verified"] / max(everything.seconds["groups"], 1e-9),
        "step_replays": {"count": len(steps), "seconds_mean": sum(s["seconds"] for s in steps) / max(len(steps), 1),
                         "per_second": len(steps) / max(everything.seconds["steps"], 1e-9)},
        "html": {"bytes": len(page.encode()), "seconds": html_seconds},
        "memory": memory,
    }
    table = Table(title=f"vrl audit of a {len(inputs)}-node, {result['devnet']['versions']}-version devnet "
                        f"({args.model})", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("log rows (policies, groups, verdicts, step verdicts)",
                  ", ".join(str(counts[k]) for k in ("policies", "groups", "verdicts", "steps")))
    table.add_row("whole audit, --all", f"{everything_seconds:.1f} s")
    table.add_row(f"whole audit, sample {vrl.audit.DEFAULT_SAMPLE}", f"{sampled_seconds:.1f} s")
    for name, seconds in everything.seconds.items():
        table.add_row(f"  {name} (--all)", f"{seconds:.2f} s")
    table.add_row("groups re-verified per second", f"{result['groups_reverified_per_second']:.2f}")
    table.add_row("step replays per second", f"{result['step_replays']['per_second']:.2f}")
    table.add_row("HTML report", f"{len(page.encode()) / 1024:.0f} KiB in {html_seconds:.2f} s")
    table.add_row("peak memory, whole log / first half",
                  f"{memory['whole']['peak_bytes'] / 2**20:.1f} / {memory['first_half']['peak_bytes'] / 2**20:.1f} MiB")
    table.add_row("log bytes, whole / first half",
                  f"{memory['whole']['log_bytes'] / 2**20:.1f} / {memory['first_half']['log_bytes'] / 2**20:.1f} MiB")
    table.add_row("findings (--all)", ", ".join(f"{k} {v}" for k, v in result["audit_all"]["findings"].items()))
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"audit-{args.model}.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    console.print(f"written to {out}; devnet folder kept at {directory}")


def log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("node-*/node.sqlite*"))


def first_half(directory: Path, target: Path) -> Path:
    """A copy of the devnet whose stores keep only the first half of the versions: a log half
    as long, to compare the audit's memory with."""
    shutil.copytree(directory, target, ignore=shutil.ignore_patterns("blobs", "trainer", "*.log"))
    for store in target.glob("node-*/node.sqlite"):
        db = sqlite3.connect(store, isolation_level=None)
        try:
            (last,) = db.execute("SELECT max(version) FROM policies").fetchone()
            half = (int.from_bytes(last, "big") // 2).to_bytes(8, "big")
            for table in ("policies", "groups", "verdicts", "steps", "trained"):
                db.execute(f"DELETE FROM {table} WHERE version > ?", (half,))  # noqa: S608 (fixed names)
            db.execute("VACUUM")
        finally:
            db.close()
    return target


def peak_memory(directory: Path) -> int:
    """The log checks' peak traced Python memory over one devnet folder."""
    tracemalloc.start()
    with vrl.audit.open([directory]) as audit:
        audit.run(checks=LOG_CHECKS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def timed_audit(directory: Path, sample: float) -> tuple[vrl.audit.Report, float]:
    started = time.perf_counter()
    with vrl.audit.open([directory]) as auditor:
        report = auditor.run(sample=sample)
    return report, time.perf_counter() - started


# -- the network scenarios: each writes bench/results/devnet-<scenario>.json -------------------------

NETWORK = {
    "throughput": "5 honest nodes: rollouts/s, nothing lost, check latency",
    "poisoning": "25% cheating workers (1 of 4), verification on vs off",
    "learning": "accuracy after N steps: all honest vs under attack (verified), 3 runs each",
    "faults": "SIGKILL + restart, SIGSTOP + SIGCONT a worker mid-run",
    "trainers": "each dishonest trainer (4 nodes): caught or not, and how fast; then the audit",
    "spoofing": "each decode-spoofing worker: tokens to detection, learning beside honest runs",
    "zk": "base-micro, sampling proofs asked after every check, vs none: latency, failures",
    "private": "a private task set (the trainer proves rewards) vs the same in the clear; a cheating trainer",
    "committee": "12 nodes, verification = \"committee\" (specs/committee.md), cheats: quarantines, bad groups "
                 "trained, checks per round, the audit (every committee re-derived)",
}


def network_options(scenario: str, parser: argparse.ArgumentParser) -> None:
    shared(parser, rounds=8, deadline=900, port=25000)
    if scenario == "spoofing":
        parser.add_argument("--repeat", type=int, default=1,
                            help="runs of each spoof (node keys, hence tasks and seeds, differ per run)")
    if scenario == "committee":
        parser.add_argument("--nodes", type=int, default=12, help="node processes")
        parser.add_argument("--sample", type=float, default=0.1, help="the audit's re-executed share")
        parser.add_argument("--reaudit", type=Path, default=None,
                            help="a finished run's folder, analysed and audited again (no new run)")


def network(args: argparse.Namespace) -> None:
    ensure_base_model()
    what, results = args.scenario, []
    if what == "zk":
        results = zk_runs(args)
    elif what == "private":
        results = private_runs(args)
    elif what == "committee":
        results = [committee_run(args)]
    elif what == "throughput":
        results.append(one_run("throughput", 5, [], args.rounds, args.deadline, args.port, protocol={"plant_every": 0},
                               work=WORK))
    elif what == "poisoning":
        # 25% adversarial: 1 of the 4 workers; verification on (verifiers + trainer re-checks) vs off.
        for kind in ("fabricated-reward", "tampered-tokens"):
            results.append(one_run(f"on-{kind}", 5, [kind], args.rounds, args.deadline, args.port, work=WORK))
            results.append(one_run(f"off-{kind}", 5, [kind], args.rounds, args.deadline, args.port + 50,
                                   verification=False, work=WORK))
    elif what == "learning":
        for seed in range(3):  # runs differ in node keys, hence in assigned tasks and seeds
            results.append(one_run(f"honest-{seed}", 5, [], args.rounds, args.deadline, args.port + 100 * seed,
                                   work=WORK))
            results.append(one_run(f"attacked-{seed}", 5, ["fabricated-reward"], args.rounds, args.deadline,
                                   args.port + 100 * seed + 50, work=WORK))
    elif what == "spoofing":
        # specs/verification.md §7: one decode-spoofing worker of 4, against honest runs with the
        # same node count and rounds; learning is compared with the honest runs' spread.
        for seed in range(2):
            results.append(one_run(f"honest-{seed}", 5, [], args.rounds, args.deadline, args.port + 100 * seed,
                                   work=WORK))
        for i, (kind, run) in enumerate((kind, run) for kind in SPOOFS for run in range(args.repeat)):
            result = one_run(kind if args.repeat == 1 else f"{kind}-{run}", 5, [kind], args.rounds, args.deadline,
                             args.port + 300 + 100 * i, work=WORK)
            result["detection"] = spoof_detection(Path(result["directory"]), 5)
            result["detection"]["audit"] = audited_changes(Path(result["directory"]), 5)
            console.print_json(json.dumps(result["detection"]))
            results.append(result)
    elif what == "faults":
        results.append(one_run("faults", 5, [], args.rounds, args.deadline, args.port, during=faults, work=WORK))
    elif what == "trainers":
        # Planted groups give the trainer groups it failed itself: without any, trainer-rejected-group
        # has nothing to cheat with (a run without plants never cheated).
        for i, kind in enumerate(sorted(TRAINER_ADVERSARIES)):
            # Inflating rewards is a cheat of a private task set's trainer (specs/zk.md §11).
            settings = private_settings(private_tasks(Path(tempfile.mkdtemp(prefix="vrl-bench-private-tasks-")))) \
                if kind == "trainer-inflated-rewards" else {"work": WORK}
            results.append(trainer_run(kind, args.rounds, args.deadline, args.port + 100 * i,
                                       protocol={"plant_every": 2}, **settings))
    RESULTS.mkdir(exist_ok=True)
    if what == "learning":
        plot_learning(results, RESULTS / "devnet-learning.png")
    (RESULTS / f"devnet-{what}.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"wrote {RESULTS / f'devnet-{what}.json'}")


# -- the command line ---------------------------------------------------------------------------------

def shared(parser: argparse.ArgumentParser, rounds: int, deadline: float, port: int | None) -> None:
    """The options every scenario takes, with its defaults (``port`` None: a random one)."""
    parser.add_argument("--rounds", type=int, default=rounds, help="policy versions a run goes to")
    parser.add_argument("--deadline", type=float, default=deadline, help="seconds a run may take")
    # Below the ephemeral range (32768+): a scenario's runs take ports from here up.
    parser.add_argument("--port", type=int, default=port, help="the first node's port" + (
        "" if port else " (default: a random one in 20000-27000)"))


def invocation(args: argparse.Namespace) -> str:
    """The command that ran: ``python bench/devnet.py SCENARIO ARGS``."""
    return " ".join(["python bench/devnet.py", args.scenario, *args.argv])


def parse(argv: list[str]) -> tuple[argparse.Namespace, object]:
    """The arguments of a command line and its scenario's runner."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenarios = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    runners = {}
    for name, line in NETWORK.items():
        network_options(name, scenarios.add_parser(name, help=line.replace("%", "%%"), description=line))
        runners[name] = network
    for name, add, runner in (("costs", costs_options, costs), ("audit", audit_options, audit_costs)):
        doc = inspect.cleandoc(runner.__doc__)
        add(scenarios.add_parser(name, help=doc.split("\n\n")[0].replace("%", "%%"), description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter))
        runners[name] = runner
    args = parser.parse_args(argv)
    args.argv = argv[1:]
    return args, runners[args.scenario]


def main(argv: list[str] | None = None) -> None:
    args, runner = parse(sys.argv[1:] if argv is None else argv)
    runner(args)


if __name__ == "__main__":
    main()
