"""Disk under the storage tiers (issue 31 item 1, specs/storage.md): real GRPO steps of a model,
each published as a node's trainer publishes a version, pruned by the node's own code.

    python bench/storage.py --versions 1000              # the base model, default tier
    python bench/storage.py --versions 20 --model tiny   # a quick one
    python bench/storage.py --audit-rounds 8             # also: a devnet whose trainer is the archive,
                                                         # audited whole (vrl audit --all)
    python bench/storage.py --tier archive --versions 1000 --groups 2 --dir RUN   # part 1 as an archive's
                                                         # node folder, then every step replayed
    python bench/storage.py --audit-only RUN/archive --versions 0                 # audit such a folder
                                                         # (one stopped midway too)

Part 1 (the default tier). Each version is one real step of :class:`vrl.rl.train.Trainer`
(generate, verify, GRPO update, checkpoint: ``vrl train``'s step), then what
:meth:`vrl.node.training.Training.announce` does with it: the weights, optimizer state and step
config kept as blobs (:class:`vrl.node.blobs.Blobs`), the signed announcement put in the
node's store (:class:`vrl.node.store.Store`), and the node's prune
(:meth:`vrl.node.storage.Pruner.after`, what the daemon calls after each event). After every
version it measures the blob folder, the store (with its WAL) and the trainer's checkpoints,
and checks the bound: blobs within (K + 1) versions' worth, K = max_staleness. What is not the
node's: no gossip, no workers (the trainer makes its own groups, as ``vrl train`` does),
so nothing here times the network.

Part 2 (the archive tier): a real devnet (vrl.harness.devnet, its trainer on ``tier =
"archive"``, its workers on the default tier) audited at --all: every step replayed from the
archive; then the workers' folders alone, whose pruned steps the audit names.

Writes bench/results/storage.json. The machine is shared (2 cores, ~6 jobs): times are noisy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import structlog
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from p2p.loopback import LoopbackNetwork  # noqa: E402
from vrl.node.blobs import Blobs  # noqa: E402
from vrl.node.messages import PolicyAnnouncement  # noqa: E402
from vrl.node.params import ProtocolParams  # noqa: E402
from vrl.node.storage import Pruner, StorageConfig, blob_bytes  # noqa: E402
from vrl.node.store import Store  # noqa: E402
from vrl.node.weights import to_blob  # noqa: E402
from vrl.rl.config import TrainConfig  # noqa: E402
from vrl.rl.step import optimizer_bytes  # noqa: E402
from vrl.rl.train import Trainer  # noqa: E402
from vrl.rollouts.model import platform_tag  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"
MiB = 1 << 20


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def default_tier(directory: Path, args) -> dict:
    """Part 1: ``args.versions`` real steps, each published and pruned as a node does."""
    if args.model == "base":
        from vrl.rl.base_model import ensure_base_model

        ensure_base_model()
    keep = ProtocolParams().max_staleness + 1
    config = TrainConfig(model=args.model, task=args.task, steps=args.versions, groups_per_step=args.groups,
                         group_size=args.group_size, eval_every=10**9, checkpoint_every=1, held_out=8,
                         max_new_tokens=args.max_new_tokens)
    trainer = Trainer(config, directory / "trainer")
    key = trainer.key
    store = Store(directory / "node.sqlite")
    network = LoopbackNetwork()
    transport = network.transport(hashlib.sha256(b"bench/storage").digest())
    blobs = Blobs(directory / "blobs", transport, key.node_id, structlog.get_logger())
    pruner = Pruner(StorageConfig(), store, blobs.directory, blobs.pins, keep=keep)
    policies: dict[int, PolicyAnnouncement] = {}
    config_file = trainer.step_config.to_bytes()
    rows, worst, per_version, bound_ok = [], {}, 0, True
    ever: dict[bytes, int] = {}  # every blob any version named, by digest: what no pruning would keep
    step_seconds, publish_seconds, prune_seconds = [], [], []
    started_all = time.perf_counter()
    for version in range(args.versions + 1):
        if version > 0:
            started = time.perf_counter()
            before = optimizer_bytes(trainer.network, trainer.optimizer)
            before_hash = hashlib.sha256(before).digest()
            trainer.step()
            step_seconds.append(time.perf_counter() - started)
        else:
            before_hash = b""
        started = time.perf_counter()
        model = trainer.policy()
        weights, optimizer = to_blob(model), optimizer_bytes(trainer.network, trainer.optimizer)
        parent = policies.get(version - 1)
        announcement = PolicyAnnouncement(
            key.node_id, version, model.model_hash, blobs.keep(weights), len(weights),
            parent=parent.model_hash if parent is not None else b"", config=blobs.keep(config_file),
            optimizer_before=before_hash, optimizer=blobs.keep(optimizer), optimizer_size=len(optimizer),
            platform=platform_tag(model)).signed(key)
        store.put_policy(announcement, time.time())
        policies[version] = announcement
        ever.update({announcement.blob: len(weights), announcement.optimizer: len(optimizer),
                     announcement.config: len(config_file)})
        publish_seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        pruner.after(policies, version)
        prune_seconds.append(time.perf_counter() - started)
        per_version = max(per_version, len(weights) + len(optimizer))
        on_disk = blob_bytes(blobs.directory)
        store_bytes = sum(p.stat().st_size for p in directory.glob("node.sqlite*"))
        checkpoints = folder_bytes(directory / "trainer" / "checkpoints")
        # The bound: K + 1 versions of weights and optimizer state, plus the step config (one
        # file every version names), plus the store.
        bound = keep * per_version + len(config_file)
        bound_ok &= on_disk <= bound
        row = {"version": version, "blob_bytes": on_disk, "blob_files": sum(1 for _ in blobs.directory.iterdir()),
               "store_bytes": store_bytes, "checkpoint_bytes": checkpoints, "bound_bytes": bound}
        if not worst or on_disk > worst["blob_bytes"]:
            worst = row
        stopping = bool(args.deadline) and time.perf_counter() - started_all > args.deadline
        if version % max(1, args.versions // 20) == 0 or version == args.versions or stopping:
            rows.append(row)
            console.print(f"version {version}: blobs {on_disk / MiB:.1f} MiB in {row['blob_files']} files "
                          f"(bound {bound / MiB:.1f}), store {store_bytes / 1024:.0f} KiB, checkpoints "
                          f"{checkpoints / MiB:.1f} MiB, {time.perf_counter() - started_all:.0f} s")
        if stopping:
            console.print(f"[yellow]stopped at version {version}: --deadline {args.deadline} s reached[/]")
            break
    journal = store.pruned()
    result = {
        "model": args.model, "versions": version, "versions_asked": args.versions, "keep": keep,
        "max_staleness": keep - 1, "batch": {"groups": args.groups, "group_size": args.group_size,
                                              "max_new_tokens": config.max_new_tokens},
        "per_version_bytes": per_version, "step_config_bytes": len(config_file),
        "bound_held_every_version": bool(bound_ok), "worst": worst, "final": rows[-1],
        "blobs_pruned": sum(1 for _, state in journal.values() if state == "done"),
        "prune_intents_left": sum(1 for _, state in journal.values() if state == "intent"),
        # Steps whose groups all had equal rewards change nothing (no gradient): their version
        # names its parent's files, so without pruning the folder holds each distinct blob once.
        "without_pruning_bytes": sum(ever.values()), "distinct_weights": len({a.blob for a in policies.values()}),
        "seconds": {"step_median": _median(step_seconds), "publish_median": _median(publish_seconds),
                    "prune_median": _median(prune_seconds), "prune_max": max(prune_seconds),
                    "total": time.perf_counter() - started_all},
        "series": rows,
    }
    store.close()
    return result


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else 0.0


def archive_run(directory: Path, args) -> dict:
    """Part 1 on the archive tier: ``args.versions`` versions made by a node's own code paths,
    left as a devnet folder that ``vrl audit DIR --all`` replays whole.

    ``node-0`` is a trainer node's folder, as ``vrl node`` leaves it: its node.toml (archive
    tier), node.pem, store and blobs. Each version is what the node's duties do: a worker's
    round (:meth:`vrl.node.work.Work.generate`, signed by ``node-1``'s key, whose folder holds
    its own store of its groups, as a worker keeps what it publishes) stored in the trainer's
    store as the daemon stores a group it receives; the trainer's step on that batch
    (:meth:`vrl.node.work.PolicyTrainer.step`); its weights delta against the parent
    (:meth:`vrl.node.training.Training.delta_of`'s :func:`vrl.node.deltas.encode`); the
    announcement as :meth:`vrl.node.training.Training.announce` signs and stores it; the
    prune (:meth:`vrl.node.storage.Pruner.after`). No gossip, no verifiers, no admission: a
    batch is the round's groups, so nothing here times the network. Then the audit
    (:func:`vrl.audit.open`, the ``steps`` check at share 1, what ``vrl audit --all`` runs
    for it) replays every step from the folder."""
    from vrl.config import as_kwargs
    from vrl.node import deltas, startup
    from vrl.node.config import NodeConfig
    from vrl.node.work import PolicyTrainer, Work, WorkConfig
    from vrl.rollouts.keys import NodeKey
    from vrl.rollouts.record import round_seed
    from vrl.rollouts.verify import Expectations

    if args.model == "base":
        from vrl.rl.base_model import ensure_base_model

        ensure_base_model()
    folders = [directory / "node-0", directory / "node-1"]
    keys = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "node.pem").exists():
            NodeKey.generate().save(folder / "node.pem")
        keys.append(NodeKey.load(folder / "node.pem"))
    trainer_key, worker_key = keys
    settings = dict(trainer=trainer_key.node_id.hex(), transport="loopback",
                    work={"model": args.model, "task": args.task, "group_size": args.group_size,
                          "max_new_tokens": args.max_new_tokens},
                    protocol={"groups_per_round": args.groups, "last_version": args.versions},
                    admission={"batch_groups": args.groups},
                    # Held-out evaluation is not what this measures; a node evaluates at its eval_every.
                    train={"eval_every": 10**9, "held_out": 8})
    configs = [NodeConfig.from_dict(dict(data_dir=str(folders[0]), roles=("trainer", "verifier"),
                                         storage={"tier": "archive"}, **settings)),
               NodeConfig.from_dict(dict(data_dir=str(folders[1]), roles=("worker", "verifier"), **settings))]
    for folder, config in zip(folders, configs):
        (folder / "node.toml").write_text(config.to_toml(), encoding="utf-8")
    config = configs[0]
    log = structlog.get_logger("bench/storage")
    tasks, _ = startup.open_tasks(config, log)
    policies: dict[int, PolicyAnnouncement] = {}

    def expectations(version: int) -> Expectations:
        return Expectations(tasks=tasks, round_seed=round_seed(policies[version].model_hash, version),
                            sampling=work.sampling, reward_spec=config.work.reward_spec)

    work = Work(worker_key, WorkConfig(**as_kwargs(config.work), tasks=tasks,
                                       groups_per_round=config.protocol.groups_per_round, hidden_states=False),
                expectations)
    trainer = PolicyTrainer(startup.train_config(config, work.max_new_tokens), folders[0] / "trainer", trainer_key,
                            tasks=tasks)
    store, worker_store = Store(folders[0] / "node.sqlite"), Store(folders[1] / "node.sqlite")
    store.claim(trainer_key.node_id)
    worker_store.claim(worker_key.node_id)
    transport = LoopbackNetwork().transport(trainer_key.node_id)
    blobs = Blobs(folders[0] / "blobs", transport, trainer_key.node_id, log)
    keep = config.protocol.max_staleness + 1
    pruner = Pruner(config.storage, store, blobs.directory, blobs.pins, keep=keep, log=log)
    rows, started_all = [], time.perf_counter()
    for version in range(args.versions + 1):
        if version == 0:
            step = trainer.current()  # Training.bootstrap: version 0 announced as it is
        else:
            groups = work.generate(version - 1)
            now = time.time()
            for group in groups:  # the worker keeps what it publishes; the trainer stores what it receives
                worker_store.put_group(group.submission, group.subject, group.version, now)
                store.put_group(group.submission, group.subject, group.version, now)
            step, _ = trainer.step(groups, [1.0] * len(groups))
        parent = policies.get(version - 1)
        delta = None
        if parent is not None and (blobs.directory / parent.blob.hex()).exists():
            encoded = deltas.encode((blobs.directory / parent.blob.hex()).read_bytes(), step.blob)
            delta = (encoded, parent.blob) if len(encoded) < len(step.blob) else None
        shortcut = {} if delta is None else {"delta": blobs.keep(delta[0]), "delta_size": len(delta[0]),
                                             "delta_parent": delta[1]}
        announcement = PolicyAnnouncement(
            trainer_key.node_id, version, step.model.model_hash, blobs.keep(step.blob), len(step.blob),
            parent=parent.model_hash if parent is not None else b"", batch=step.batch,
            config=blobs.keep(trainer.config_file), optimizer_before=step.optimizer_before,
            optimizer=blobs.keep(step.optimizer), optimizer_size=len(step.optimizer),
            platform=platform_tag(step.model), **shortcut).signed(trainer_key)
        work.install(version, trainer.frozen_copy(step.model), keep)
        store.put_policy(announcement, time.time())
        worker_store.put_policy(announcement, time.time())
        store.put_trained(version, tuple(d for d, _ in step.batch), json.dumps(
            {k: v for k, v in step.metrics.items() if isinstance(v, (int, float))}, sort_keys=True))
        policies[version] = announcement
        pruner.after(policies, version)
        if version % max(1, args.versions // 20) == 0 or version == args.versions:
            on_disk = blob_bytes(blobs.directory)
            rows.append({"version": version, "blob_bytes": on_disk, "seconds": time.perf_counter() - started_all})
            console.print(f"archive version {version}: blobs {on_disk / MiB:.1f} MiB, "
                          f"{time.perf_counter() - started_all:.0f} s")
    store.close()
    worker_store.close()
    made = {"model": args.model, "tier": "archive", "keep": keep,
            "batch": {"groups": args.groups, "group_size": args.group_size, "max_new_tokens": work.max_new_tokens},
            **folder_figures(directory), "series": rows}
    (directory / "made.json").write_text(json.dumps(made))
    console.print(f"made {made['versions']} versions; blobs {made['disk_bytes']['blobs'] / MiB:.0f} MiB; auditing")
    return {**made, "audit": audit_folder(directory)}


def folder_figures(directory: Path) -> dict:
    """What an archive run's folder holds, read from the folder itself (so a run stopped midway
    is measured as it is): versions announced, blob bytes by kind (each distinct file once),
    stores, checkpoints, and the time between announcements (the store's received times)."""
    from vrl.audit.sources import StoreReader

    node = directory / "node-0"
    reader = StoreReader(node / "node.sqlite")
    announcements = [(PolicyAnnouncement.from_bytes(data), received) for _, data, received in reader.policies()]
    reader.close()
    kinds: dict[str, int] = {"weights": 0, "optimizer": 0, "delta": 0, "config": 0}
    seen: set[bytes] = set()
    for a, _ in announcements:
        for kind, digest in (("weights", a.blob), ("optimizer", a.optimizer), ("delta", a.delta),
                             ("config", a.config)):
            path = node / "blobs" / digest.hex()
            if digest and digest not in seen and path.is_file():
                seen.add(digest)
                kinds[kind] += path.stat().st_size
    times = [received for _, received in announcements]
    gaps = [b - a for a, b in zip(times, times[1:])]
    blobs = node / "blobs"
    return {"versions": announcements[-1][0].version if announcements else 0,
            "distinct_weights": len({a.blob for a, _ in announcements}),
            "disk_bytes": {"blobs": blob_bytes(blobs), "blob_files": sum(1 for _ in blobs.iterdir()), "by_kind": kinds,
                           "stores": sum(p.stat().st_size for p in directory.glob("node-*/node.sqlite*")),
                           "trainer_checkpoints": folder_bytes(node / "trainer"), "folder": folder_bytes(directory)},
            "seconds": {"version_median": _median(gaps), "make_total": times[-1] - times[0] if times else 0.0}}


def audit_folder(directory: Path) -> dict:
    """The ``steps`` check at share 1 over a folder (what ``vrl audit DIR --all --check steps``
    runs): how many steps replayed, from which inputs, in how long. Its progress is written to
    ``DIR/audit-progress.json`` as it goes, so a run stopped midway says how far it got."""
    import vrl.audit

    started = time.perf_counter()
    done = [0]

    def progress(check: str, n: int) -> None:
        if check == "steps":
            done[0] += n
            if done[0] % 10 == 0:
                elapsed = time.perf_counter() - started
                (directory / "audit-progress.json").write_text(json.dumps(
                    {"steps_replayed": done[0], "seconds": elapsed, "at": time.strftime("%H:%M:%S")}))
            if done[0] % 50 == 0:
                console.print(f"audit: {done[0]} steps replayed, {time.perf_counter() - started:.0f} s")

    with vrl.audit.open([directory]) as audit:
        report = audit.run(checks=["steps"], sample=1.0, progress=progress)
    seconds = time.perf_counter() - started
    series = report.series.get("steps", []) if isinstance(getattr(report, "series", None), dict) else []
    replay = [row["seconds"] for row in series if not row.get("missing")]
    return {"seconds": seconds, "steps": report.stats.get("steps", {}),
            "replay_seconds_median": _median(replay), "exact": sum(1 for row in series if row.get("exact")),
            "findings": sorted({f"{f.check}:{f.code}" for f in report.findings}),
            "errors": [f.sentence for f in report.findings if f.severity >= vrl.audit.Severity.ERROR][:5]}


def archive_audit(directory: Path, args) -> dict:
    """Part 2: a devnet whose trainer is the archive, audited whole; then its workers alone."""
    import vrl.audit
    from vrl.harness import devnet

    summary = devnet.run(directory, args.nodes, [], args.audit_rounds, deadline_s=args.audit_deadline,
                         base_port=random.Random().randrange(20000, 27000), console=console,
                         work={"model": args.audit_model, "task": args.task})
    if summary["failure"]:
        raise SystemExit(f"the devnet failed: {summary['failure']}")
    out = {"nodes": args.nodes, "rounds": args.audit_rounds, "model": args.audit_model,
           "blob_bytes": {p.name: blob_bytes(p / "blobs") for p in sorted(directory.glob("node-*"))}}
    for label, paths in (("whole devnet (trainer = archive)", [directory]),
                         ("workers only (default tier)", sorted(directory.glob("node-[1-9]*")))):
        started = time.perf_counter()
        with vrl.audit.open(paths) as audit:
            report = audit.run(checks=["steps"], sample=1.0)
        stats = report.stats.get("steps", {})
        out[label] = {"seconds": time.perf_counter() - started, "steps": stats,
                      "unreplayable": [f.evidence.get("version") for f in report.findings
                                       if f.code == "step_unreplayable"]}
        console.print(f"{label}: {stats}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1000)
    parser.add_argument("--model", default="base")
    parser.add_argument("--task", default="arithmetic:digits=1")
    parser.add_argument("--groups", type=int, default=2, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=0.0, help="seconds for part 1 (0: none)")
    parser.add_argument("--audit-rounds", type=int, default=0, help="part 2's devnet rounds (0: skip it)")
    parser.add_argument("--audit-model", default="base")
    parser.add_argument("--audit-deadline", type=float, default=900.0)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--tier", choices=("default", "archive"), default="default",
                        help="part 1's tier; archive: a node folder every step of which the audit replays")
    parser.add_argument("--audit-only", type=Path, default=None,
                        help="audit this folder of an earlier --tier archive run (kept with --dir) and stop")
    parser.add_argument("--dir", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="vrl-storage-"))
    out_path = RESULTS / "storage.json"
    results: dict = {}
    try:
        if args.audit_only:
            made = args.audit_only / "made.json"
            results["archive_run"] = {**(json.loads(made.read_text()) if made.exists() else {}),
                                      **folder_figures(args.audit_only), "audit": audit_folder(args.audit_only),
                                      "audit_command": " ".join(["python bench/storage.py", *sys.argv[1:]])}
        elif args.versions and args.tier == "archive":
            results["archive_run"] = archive_run(work / "archive", args)
            results["archive_run"]["command"] = " ".join(["python bench/storage.py", *sys.argv[1:]])
        elif args.versions:
            results["default_tier"] = default_tier(work / "default", args)
            results["default_tier"]["command"] = " ".join(["python bench/storage.py", *sys.argv[1:]])
        if args.audit_rounds and not args.audit_only:
            results["archive_tier"] = archive_audit(work / "devnet", args)
            results["archive_tier"]["command"] = " ".join(["python bench/storage.py", *sys.argv[1:]])
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    # The parts may run apart (two commands): each keeps the other's results.
    results = {**(json.loads(out_path.read_text()) if out_path.exists() else {}), **results,
               "machine": "2 cores shared with ~6 other jobs; times are noisy"}
    out_path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    console.print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
