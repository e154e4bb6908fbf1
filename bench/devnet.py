"""Network numbers from real devnets: N `vrl node` processes on libp2p over 127.0.0.1.

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

Every number comes from the nodes' own SQLite stores after the run (what was acknowledged),
not from logs. Runs are bounded by a round count and a deadline and stop by themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vrl.audit  # noqa: E402
from vrl.harness import devnet  # noqa: E402
from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES  # noqa: E402
from vrl.node.messages import SignedVerdict, StepVerdict, Submission  # noqa: E402
from vrl.node.store import Store  # noqa: E402
from vrl.rl.base_model import ensure_base_model  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"
SPOOFS = sorted(kind for kind in ADVERSARIES if kind.startswith("spoof-"))


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
        proven = devnet._events(directory / "node-0" / "node.log", 0, "rewards proven")
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
                         work={"model": "base", "task": "arithmetic:digits=2,ops=+"},
                         protocol={"verification": "committee", "plant_every": 2})
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["throughput", "poisoning", "learning", "faults", "trainers", "spoofing", "zk",
                                         "private", "committee"])
    parser.add_argument("--nodes", type=int, default=12, help="committee: node processes")
    parser.add_argument("--sample", type=float, default=0.1, help="committee: the audit's re-executed share")
    parser.add_argument("--reaudit", type=Path, default=None, help="committee: a finished run's folder, analysed "
                                                                    "and audited again (no new run)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=900)
    parser.add_argument("--port", type=int, default=25000)  # below the ephemeral range (32768+)
    parser.add_argument("--repeat", type=int, default=1,
                        help="spoofing: runs of each spoof (node keys, hence tasks and seeds, differ per run)")
    args = parser.parse_args()
    ensure_base_model()
    common = dict(work={"model": "base", "task": "arithmetic:digits=2,ops=+"})  # node.toml's [work] table
    results = []
    if args.what == "zk":
        results = zk_runs(args)
    if args.what == "private":
        results = private_runs(args)
    if args.what == "committee":
        results = [committee_run(args)]
    if args.what == "throughput":
        results.append(one_run("throughput", 5, [], args.rounds, args.deadline, args.port, protocol={"plant_every": 0},
                               **common))
    elif args.what == "poisoning":
        # 25% adversarial: 1 of the 4 workers; verification on (verifiers + trainer re-checks) vs off.
        for kind in ("fabricated-reward", "tampered-tokens"):
            results.append(one_run(f"on-{kind}", 5, [kind], args.rounds, args.deadline, args.port, **common))
            results.append(one_run(f"off-{kind}", 5, [kind], args.rounds, args.deadline, args.port + 50,
                                   verification=False, **common))
    elif args.what == "learning":
        for seed in range(3):  # runs differ in node keys, hence in assigned tasks and seeds
            results.append(one_run(f"honest-{seed}", 5, [], args.rounds, args.deadline, args.port + 100 * seed,
                                   **common))
            results.append(one_run(f"attacked-{seed}", 5, ["fabricated-reward"], args.rounds, args.deadline,
                                   args.port + 100 * seed + 50, **common))
    elif args.what == "spoofing":
        # specs/verification.md §7: one decode-spoofing worker of 4, against honest runs with the
        # same node count and rounds; learning is compared with the honest runs' spread.
        for seed in range(2):
            results.append(one_run(f"honest-{seed}", 5, [], args.rounds, args.deadline, args.port + 100 * seed,
                                   **common))
        for i, (kind, run) in enumerate((kind, run) for kind in SPOOFS for run in range(args.repeat)):
            result = one_run(kind if args.repeat == 1 else f"{kind}-{run}", 5, [kind], args.rounds, args.deadline,
                             args.port + 300 + 100 * i, **common)
            result["detection"] = spoof_detection(Path(result["directory"]), 5)
            result["detection"]["audit"] = audited_changes(Path(result["directory"]), 5)
            console.print_json(json.dumps(result["detection"]))
            results.append(result)
    elif args.what == "faults":
        results.append(one_run("faults", 5, [], args.rounds, args.deadline, args.port, during=faults, **common))
    elif args.what == "trainers":
        # Planted groups give the trainer groups it failed itself: without any, trainer-rejected-group
        # has nothing to cheat with (a run without plants never cheated).
        for i, kind in enumerate(sorted(TRAINER_ADVERSARIES)):
            # Inflating rewards is a cheat of a private task set's trainer (specs/zk.md §11).
            settings = private_settings(private_tasks(Path(tempfile.mkdtemp(prefix="vrl-bench-private-tasks-")))) \
                if kind == "trainer-inflated-rewards" else common
            results.append(trainer_run(kind, args.rounds, args.deadline, args.port + 100 * i,
                                       protocol={"plant_every": 2}, **settings))
    RESULTS.mkdir(exist_ok=True)
    if args.what == "learning":
        plot_learning(results, RESULTS / "devnet-learning.png")
    (RESULTS / f"devnet-{args.what}.json").write_text(json.dumps(results, indent=1, default=str))
    console.print(f"wrote {RESULTS / f'devnet-{args.what}.json'}")


if __name__ == "__main__":
    main()
