"""Per-node costs of the real libp2p devnet, for the simulator's calibration (issue 30 item 1).

    python bench/devnet_costs.py                     # N = 5 and N = 12, 5 measured rounds each
    python bench/devnet_costs.py --nodes 5 --rounds 4
    python bench/devnet_costs.py --nodes 12 --modes default --designs tickets committee --append
    python bench/devnet_costs.py --nodes 5 12 --modes paced --designs committee --append \
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

A round is the interval between two policy announcements (vrl/harness/simulator/metrics.py's metric
definitions). Every node is scraped as soon as the trainer's ``vrl_policy_version`` reaches
``WARMUP_VERSIONS`` (the start-up's dials, first backfill and version 0 weights are behind us)
and again when it reaches ``WARMUP_VERSIONS + rounds`` (each time the last scrape of every node
before the trainer's announcement, at most POLL_SECONDS and one scrape before it, as the
simulator counts from the announcement); per-round figures are the difference divided by
``rounds``. Whole-run totals are kept beside them. Writes
bench/results/devnet-costs.json; the machine is shared, so seconds are noisy, counts are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
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
from vrl.node.daemon import BACKFILL_EVERY_SECONDS, TICK_SECONDS  # noqa: E402
from vrl.node.messages import PolicyAnnouncement, Submission  # noqa: E402
from vrl.node.store import Store  # noqa: E402
from vrl.rl.base_model import ensure_base_model  # noqa: E402

console = Console(stderr=True)
RESULTS = Path(__file__).resolve().parent / "results"

# The first announced version after version 0: by then every node has dialled, backfilled and
# loaded version 0's weights, costs a long-running node does not pay each round.
WARMUP_VERSIONS = 1
POLL_SECONDS = 0.25  # a round lasts seconds (bench/results/devnet-throughput.json: ~6 s at N = 5)
# Free memory a node process needs: the base model in torch, its store and libp2p; measured
# at ~0.45 GiB RSS per node on this machine kind; 0.6 leaves a margin.
GIB_PER_NODE = 0.6
MEMORY_WAIT_SECONDS = 600.0  # the machine is shared: wait for room rather than crowd others out
# node.toml's [work] table of the other devnet benchmarks (bench/devnet.py: common).
WORK = {"model": "base", "task": "arithmetic:digits=2,ops=+"}

MODES = {"default": "the devnet's [admission] (batch_groups 12, node_cap 0.34: vrl.node.config.NODE_OVERRIDES)",
         "paced": "as default, but admission.batch_groups = groups_per_round x (nodes - 1): a batch of every "
                  "worker's round"}
IN_KINDS = (T.GOSSIP_IN, T.REQUEST_IN, T.RESPONSE_IN)
OUT_KINDS = (T.GOSSIP_OUT, T.REQUEST_OUT, T.RESPONSE_OUT)


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
    return (int(fields[11]) + int(fields[12])) / __import__("os").sysconf("SC_CLK_TCK")


def available_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def wait_for_memory(nodes: int) -> None:
    need = GIB_PER_NODE * nodes + 1.0
    deadline = time.monotonic() + MEMORY_WAIT_SECONDS
    while (free := available_gib()) < need:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {free:.1f} GiB available after {MEMORY_WAIT_SECONDS:.0f} s; "
                             f"{nodes} nodes need about {need:.1f} GiB")
        console.print(f"{free:.1f} GiB available, {need:.1f} needed: waiting")
        time.sleep(15)


def costs(metrics: dict, pid: int | None = None) -> dict:
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
    from vrl.node.params import ProtocolParams

    return {"batch_groups": (groups_per_round or ProtocolParams().groups_per_round) * (nodes - 1)}


def one_run(nodes: int, rounds: int, deadline: float, port: int, mode: str = "default",
            design: str = "tickets", sets: dict | None = None) -> dict:
    """``design``: ProtocolParams.verification, "tickets" (the default) or "committee";
    ``sets``: node.toml overrides ({table: {key: value}}, :func:`parse_sets`) of every node."""
    wait_for_memory(nodes)
    sets = sets or {}
    directory = Path(tempfile.mkdtemp(prefix=f"vrl-bench-costs-{design}-{mode}-{nodes}-"))
    last = WARMUP_VERSIONS + rounds
    admission = {**admission_for(mode, nodes, sets.get("protocol", {}).get("groups_per_round")),
                 **sets.get("admission", {})}
    protocol = {**({"verification": design} if design != "tickets" else {}), **sets.get("protocol", {})}
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
            current = (now - started, [costs(m, n.process and n.process.pid) for m, n in zip(scraped, network)]
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
        final = [costs(devnet.scrape(n.metrics_port), n.process and n.process.pid) for n in network]
    finally:
        devnet.stop(network)
    seconds = time.monotonic() - started
    if last not in snapshots or WARMUP_VERSIONS not in snapshots:
        # Kept in the results, not raised: the runs before it stand, and the why is a finding.
        reported = devnet._events(network[0].log_path, network[0].log_start, "step reported as fraud")
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
                    / ((t1 - t0) / rounds) / (__import__("os").cpu_count() or 1),
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


def settings(nodes: list[int], rounds: int) -> dict:
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
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, shared with other jobs",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[5, 12])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=["default", "paced"], default=["default", "paced"],
                        help="default: the devnet's admission (batches of 12); paced: a batch of every worker's "
                             "groups, one generation a round")
    parser.add_argument("--deadline", type=float, default=1500, help="seconds per run")
    parser.add_argument("--port", type=int, default=27300)  # below the ephemeral range (32768+)
    parser.add_argument("--designs", nargs="+", choices=["tickets", "committee"], default=["tickets"],
                        help="the verification design (ProtocolParams.verification) of each run")
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
    args = parser.parse_args()
    ensure_base_model()
    result = {"settings": settings(args.nodes, args.rounds), "runs": []}
    if args.append and args.out.exists():
        result = json.loads(args.out.read_text())
        result["settings"]["nodes"] = sorted(set(result["settings"]["nodes"]) | set(args.nodes))
        for run in result["runs"]:
            run.setdefault("design", "tickets")  # runs from before --designs were of the ticket design
        # A run of the same nodes, mode, design and overrides is replaced; others are kept.
        same = json.dumps(parse_sets(args.sets), sort_keys=True)
        result["runs"] = [r for r in result["runs"] if args.no_run or (
            r["nodes"], r["mode"], r["design"], json.dumps(r.get("overrides", {}), sort_keys=True)) not in {
            (n, m, d, same) for n in args.nodes for m in args.modes for d in args.designs}]
    result["settings"]["modes"] = {**result["settings"].get("modes", {}), **{mode: MODES[mode] for mode in args.modes}}
    result["settings"]["commands"] = [*result["settings"].get("commands", []),
                                      "python bench/devnet_costs.py " + " ".join(sys.argv[1:])]
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
        run = one_run(n, args.rounds, args.deadline, args.port + 100 * i, mode, design, parse_sets(args.sets))
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
            if run["nodes"] in args.nodes and run.get("design", "tickets") in args.designs and "per_node" in run:
                run["simulator"] = {options or "(one core per node)": simulated(result["settings"], run, options)
                                    for options in args.simulate_with}
                args.out.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


def simulated(settings: dict, run: dict, options: str = "") -> dict:
    """bench/simulate.py --compare on this one run, with its design and ``options``: its rows."""
    import subprocess

    with tempfile.TemporaryDirectory() as scratch:
        one, out = Path(scratch) / "run.json", Path(scratch) / "compare.json"
        one.write_text(json.dumps({"settings": settings, "runs": [run]}))
        command = [sys.executable, str(Path(__file__).resolve().parent / "simulate.py"), "--compare", str(one),
                   "--design", run.get("design", "tickets"), "--out", str(out), *options.split()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not out.exists():
            return {"failure": (done.stderr or done.stdout)[-2000:]}
        compared = json.loads(out.read_text())["runs"][0]
    return {"command": f"python bench/simulate.py --compare <this run> --design {run.get('design', 'tickets')} "
                       f"{options}".strip(),
            "tolerance": 0.20, "rows": compared["rows"],
            "within": sum(r["within"] for r in compared["rows"]), "of": len(compared["rows"])}


if __name__ == "__main__":
    main()
