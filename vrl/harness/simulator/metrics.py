"""What a simulation measures, in the definitions the devnet calibration shares (bench/devnet.py costs):

* checks: Check actions a node carries out (one full verification of a group), per round;
* verify-seconds: the model-thread time those checks were charged (spec.CostModel);
* bytes_in / bytes_out: application payload bytes of gossip messages received (each delivery
  once per receiving node) and sent (the origin's copies to its mesh peers, and every mesh
  forward), plus request/response payload bytes: blob fetches (weights, step state), reported
  apart too as ``blob_bytes``; messages likewise. ``bytes_by_kind`` splits bytes in and out by
  what carried them: a gossip topic, ``direct <topic>`` (a direct send, or the answer to a
  fetch by digest), ``fetch`` (those fetches' requests), ``blob`` and ``backfill``: what grows
  with N is read there;
* rounds to quarantine, per adversary kind: from a cheat's first bad group (or pass of one, or
  lazy pass) to the trainer's quarantine of it and to the median honest view's; and
  ``honest_views_missing``, the honest views that never quarantined a cheat the trainer did;
* groups lost: honest groups of a measured round the trainer never held; groups pending apart,
  those still open at the stop (in the committee design, of a round not closed by a manifest
  yet and still fresh; in the ticket design, published after the trainer's last announcement):
  a run ends as the trainer announces its last version, while the newest rounds' groups are on
  their way. ``rounds_never_closed``: measured rounds with honest groups, gone stale without a
  manifest (their groups were never checked by a committee, nor trained);
* round: the interval between two of the trainer's policy announcements. Per-round figures are
  differences of the counters between the announcement of version ``warmup`` and the last one
  measured, divided by the rounds between them, then averaged over the nodes.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, Protocol, TypedDict

import msgpack

from p2p.blobs import CHUNK_BYTES
from vrl.node.committee import Refusal
from vrl.node.config import TRAINER_ADVERSARIES
from vrl.node.messages import Batch, Group, Outcome, SignedVerdict

from .nodes import Msg, SimNode, TrainerProtocol
from .payloads import Truth
from .spec import LAZY, SPOOFS, CostModel, SimConfig

#: Claim refusals (specs/committee.md §4) that come after the verdict's signature was checked.
SIGNED_REFUSALS = frozenset({Refusal.BAD_SIGNATURE, Refusal.BAD_PROOF, Refusal.NOT_DRAWN})
# A chunk's request body on /vrl/blob/1 (p2p.blobs.fetch_blob): msgpack [digest, index], 36
# bytes (as the devnet's request_out of /vrl/blob/1 counts them, bench/results/devnet-costs.json).
BLOB_REQUEST_BYTES = len(msgpack.packb([bytes(32), 0]))
BY_KIND = "bytes:"  # the prefix of the counters of bytes by kind (Metrics.sent, received)
COUNTERS = ("checks", "verify_seconds", "bytes_in", "bytes_out", "messages_in", "messages_out", "blob_bytes",
            "backfill_bytes", "protocol_cpu_seconds", "step_replays")

#: The run's report (Metrics.finish), as bench/simulate.py prints and writes it: a JSON map.
Summary = dict[str, Any]
#: Per-node figures of a set of nodes (Metrics.finish's per_round): counters per round, and
#: ``bytes_by_kind``, the bytes per round of each kind.
PerNode = dict[str, float | dict[str, float]]
#: A manifest's workers list: (worker, groups listed).
Workers = tuple[tuple[bytes, int], ...]


class Run(Protocol):
    """What the metrics read of the simulation (driver.Simulation): the clock, the nodes, the
    ground truth of each group and the trainer's protocol."""

    @property
    def now(self) -> float: ...
    @property
    def nodes(self) -> list[SimNode]: ...
    @property
    def truth(self) -> Mapping[bytes, Truth]: ...
    @property
    def trainer_version(self) -> int: ...
    @property
    def trainer_protocol(self) -> TrainerProtocol: ...


class QuarantineRow(TypedDict):
    """Rounds to quarantine of one adversary kind (Metrics.finish's ``rounds_to_quarantine``)."""

    nodes: int
    cheated: int
    quarantined_by_trainer: int
    rounds_trainer: list[int]
    rounds_median_honest: list[int]
    honest_views_missing: int
    median_rounds_trainer: NotRequired[float | None]
    median_rounds_median_honest: NotRequired[float | None]
    weight_share: NotRequired[float]  # the kind's share of the draw weight in the trainer's last manifest


@dataclass
class Metrics:
    config: SimConfig
    nodes: list[SimNode]
    cost: CostModel
    counters: dict[str, list[float]] = field(default_factory=dict)
    snapshots: dict[int, tuple[float, dict[str, list[float]]]] = field(default_factory=dict)
    unhandled: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
    first_bad: dict[int, float] = field(default_factory=dict)  # adversary node -> when it first cheated
    quarantined_at: dict[tuple[int, bytes], float] = field(default_factory=dict)  # (observer, subject) -> when
    trained_bad: Counter[str] = field(default_factory=Counter)
    trained_by_kind: Counter[str] = field(default_factory=Counter)  # by the group's truth
    trained_by_maker: Counter[str] = field(default_factory=Counter)  # honest groups, by their maker's kind
    honest_groups: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # digest -> (maker, version)
    verdicts_of_honest: list[tuple[bytes, bytes]] = field(default_factory=list)  # (group, verifier) checked
    withheld: int = 0
    sybil_keys: int = 0
    sybil_bytes: int = 0
    sybil_messages: int = 0
    # What the flood cost honest receivers (specs/committee.md §7): per delivery, bytes, the
    # signature checks it reached, and which claim step refused it, if one did.
    sybil_cost: Counter[str] = field(default_factory=Counter)
    checks_of_sybil_groups: list[int] = field(default_factory=list)  # the checker of each
    left: int = 0
    joined: int = 0
    partitioned: int = 0
    lost_to_backfill: int = 0
    stopped: str = ""
    cpu_seconds: float = 0.0
    maker_cpu_seconds: float = 0.0  # the processes that made groups ahead (making.Maker), if any
    summary: Summary = field(default_factory=dict)
    manifests: list[Workers] = field(default_factory=list)  # each manifest the trainer published: its workers
    closed_rounds: set[int] = field(default_factory=set)  # the rounds those manifests closed
    published_at: dict[bytes, float] = field(default_factory=dict)  # honest group -> when

    def __post_init__(self) -> None:
        self.counters = {name: [0.0] * len(self.nodes) for name in COUNTERS}
        self.index_of = {n.key.node_id: n.index for n in self.nodes}

    def grow(self, node: SimNode) -> None:
        for values in self.counters.values():
            values.append(0.0)
        self.index_of[node.key.node_id] = node.index

    # -- counting --------------------------------------------------------------------------------
    def sent(self, i: int, size: int, copies: int, kind: str) -> None:
        self.counters["bytes_out"][i] += size
        self.counters["messages_out"][i] += copies
        self._by_kind(kind)[i] += size

    def received(self, i: int, size: int, kind: str) -> None:
        self.counters["bytes_in"][i] += size
        self.counters["messages_in"][i] += 1
        self._by_kind(kind)[i] += size

    def _by_kind(self, kind: str) -> list[float]:
        """The per-node bytes (in and out) of one kind: a counter made when the kind first comes."""
        name = BY_KIND + kind
        values = self.counters.get(name)
        if values is None:
            values = self.counters[name] = [0.0] * len(self.counters["bytes_in"])
        return values

    def blob(self, receiver: int, server: int, size: int) -> None:
        """A blob fetch (p2p.blobs): one request and one response per chunk of at most
        CHUNK_BYTES; the responses' bytes in for one, out for the other, the requests' the
        other way (the devnet's transport counts both, as /vrl/blob/1, p2p.traffic)."""
        chunks = max(1, math.ceil(size / CHUNK_BYTES))
        for i, name, other in ((receiver, "bytes_in", "bytes_out"), (server, "bytes_out", "bytes_in")):
            self.counters[name][i] += size
            self.counters[other][i] += chunks * BLOB_REQUEST_BYTES
            self.counters["blob_bytes"][i] += size + chunks * BLOB_REQUEST_BYTES
            self._by_kind("blob")[i] += size + chunks * BLOB_REQUEST_BYTES
        for i in (receiver, server):
            self.counters["messages_in"][i] += chunks
            self.counters["messages_out"][i] += chunks

    def backfilled(self, requester: int, server: int, size: int, pages: int, request_bytes: int = 0) -> None:
        """One backfill pass of one peer: its pages in for one, out for the other; each page
        asked by a request (``request_bytes`` in all), out for the one, in for the other: the
        devnet's transport counts both bodies and both messages (p2p.traffic)."""
        for i, name, other in ((requester, "bytes_in", "bytes_out"), (server, "bytes_out", "bytes_in")):
            self.counters[name][i] += size
            self.counters[other][i] += request_bytes
            self.counters["backfill_bytes"][i] += size + request_bytes
            self._by_kind("backfill")[i] += size + request_bytes
        self.counters["messages_in"][requester] += pages
        self.counters["messages_out"][server] += pages
        if request_bytes:
            self.counters["messages_out"][requester] += pages
            self.counters["messages_in"][server] += pages

    def protocol_cpu(self, i: int, seconds: float) -> None:
        self.counters["protocol_cpu_seconds"][i] += seconds

    def checked(self, i: int, seconds: float, sybil: bool = False) -> None:
        if sybil:
            self.checks_of_sybil_groups.append(i)
        self.counters["checks"][i] += 1
        self.counters["verify_seconds"][i] += seconds

    def published_group(self, node: SimNode, group: Group, truth: Truth | None, now: float) -> None:
        if truth is not None and (truth.bad or truth.cheat in SPOOFS) and node.kind:
            self.first_bad.setdefault(node.index, now)
        elif node.kind in ("", "withhold", "lazy", "lazy-verifier") or node.kind in TRAINER_ADVERSARIES:
            self.honest_groups[group.digest] = (node.index, group.version)
            self.published_at[group.digest] = now

    def published_verdict(self, sim: Run, node: SimNode, verdict: SignedVerdict) -> None:
        if not verdict.checked:
            return
        truth = sim.truth.get(verdict.group)
        if (node.kind in LAZY or (node.kind == "collude" and truth is not None and truth.cheat == "collude"
                                  and verdict.outcome == Outcome.PASS)
                or (node.kind == "accuse" and (truth is None or not truth.bad) and verdict.outcome != Outcome.PASS)):
            self.first_bad.setdefault(node.index, sim.now)
        if node.kind == "":
            self.verdicts_of_honest.append((verdict.group, verdict.verifier))

    def trained(self, sim: Run, batch: Batch) -> None:
        for digest, _ in batch:
            truth = sim.truth.get(digest)
            kind = "" if truth is None else truth.cheat
            self.trained_by_kind[kind or "honest"] += 1
            if (made := self.honest_groups.get(digest)) is not None:  # by its maker's kind, as published
                self.trained_by_maker[sim.nodes[made[0]].kind or "honest"] += 1
            if truth is not None and truth.bad:
                self.trained_bad[truth.cheat] += 1

    def quarantines(self, sim: Run, observer: SimNode, quarantined: set[bytes]) -> None:
        for subject in quarantined:
            self.quarantined_at.setdefault((observer.index, subject), sim.now)

    def sybil_message(self, msg: Msg) -> None:
        self.sybil_messages += 1
        self.sybil_bytes += msg.size

    def sybil_delivery(self, node: SimNode, msg: Msg, refusal: Refusal | None, group_size: int) -> None:
        if node.kind:
            return  # an honest receiver's cost only
        cost = self.sybil_cost
        cost["deliveries"] += 1
        cost["bytes"] += msg.size
        if msg.topic == "vrl/groups/1" or hasattr(msg.obj, "rollouts"):
            cost["group_deliveries"] += 1
            cost["signature_checks"] += group_size  # one per record, as decode_group verifies them
        else:
            cost["verdict_deliveries"] += 1
            if refusal is None or refusal in SIGNED_REFUSALS:
                cost["signature_checks"] += 1
            cost[f"verdicts_refused_{refusal or 'not'}"] += 1

    def round_ended(self, sim: Run, version: int) -> None:
        self.snapshots[version] = (sim.now, {k: list(v) for k, v in self.counters.items()})

    # -- the report ------------------------------------------------------------------------------
    def version_at(self, t: float) -> int:
        """The round a moment falls in: the newest version announced by then."""
        return max((v for v, (at, _) in self.snapshots.items() if at <= t), default=0)

    def finish(self, sim: Run, wall_seconds: float) -> None:
        c = self.config
        versions = sorted(self.snapshots)
        start = c.warmup if c.warmup in self.snapshots else versions[0]
        end = versions[-1]
        rounds = end - start
        protocol_nodes = [n.index for n in sim.nodes if n.protocol is not None]

        def per_round(indices: list[int]) -> PerNode:
            if rounds <= 0 or not indices:
                return {}
            before, after = self.snapshots[start][1], self.snapshots[end][1]
            out: dict[str, float] = {}
            for name in (*COUNTERS, *(name for name in after if name.startswith(BY_KIND))):
                earlier = before.get(name, [])
                values = [(after[name][i] - (earlier[i] if i < len(earlier) else 0.0)) / rounds
                          for i in indices if i < len(after[name])]
                out[name] = statistics.fmean(values)
            return {"checks_per_round": out["checks"], "verify_seconds_per_round": out["verify_seconds"],
                    "bytes_per_round": out["bytes_in"] + out["bytes_out"], "bytes_in": out["bytes_in"],
                    "bytes_out": out["bytes_out"],
                    "messages_per_round": out["messages_in"] + out["messages_out"],
                    "blob_bytes": out["blob_bytes"], "backfill_bytes": out["backfill_bytes"],
                    "protocol_cpu_seconds_per_round": out["protocol_cpu_seconds"],
                    "step_replays_per_round": out["step_replays"],
                    "bytes_per_round_without_blobs": out["bytes_in"] + out["bytes_out"] - out["blob_bytes"],
                    "bytes_by_kind": {name.removeprefix(BY_KIND): value for name, value in sorted(out.items())
                                      if name.startswith(BY_KIND)}}

        rounds_table = []
        for a, b in zip(versions, versions[1:]):
            (t0, s0), (t1, s1) = self.snapshots[a], self.snapshots[b]
            rounds_table.append({"version": b, "seconds": t1 - t0, **{
                name: sum(s1[name][i] - (s0[name][i] if i < len(s0[name]) else 0.0) for i in protocol_nodes
                          if i < len(s1[name])) for name in ("checks", "verify_seconds", "bytes_in", "bytes_out",
                                                             "protocol_cpu_seconds")}})
        honest = [n for n in sim.nodes if n.protocol is not None and n.kind == ""]
        honest_ids = {n.key.node_id for n in honest}
        false = {(o, s) for (o, s) in self.quarantined_at if s in honest_ids and sim.nodes[o].kind == ""}
        trainer = sim.trainer_protocol
        counted = trainer.counted  # held or forgotten, over the whole run (nodes.TrainerProtocol)
        last_announced = self.snapshots[end][0]
        missing = [d for d, (maker, v) in self.honest_groups.items()
                   if counted(d) is None and start <= v < end
                   and sim.nodes[maker].key.node_id not in trainer.quarantined]
        # Still open at the stop: in the committee design a round the trainer has not closed yet
        # and could still close (fresh: within max_staleness of its version); in the ticket
        # design, which closes no round, a group published after the last announcement.
        fresh_from = end - trainer.config.max_staleness
        if trainer.design.manifests:
            pending = {d for d in missing
                       if (v := self.honest_groups[d][1]) >= fresh_from and v not in self.closed_rounds}
        else:
            pending = {d for d in missing if self.published_at[d] >= last_announced}
        lost = [d for d in missing if d not in pending]
        made = {v for _, v in self.honest_groups.values()}  # a version no worker generated for has no round to close
        never_closed = (sorted((set(range(start, fresh_from)) & made) - self.closed_rounds)
                        if trainer.design.manifests else [])
        dropped = sum(1 for g, v in self.verdicts_of_honest if (who := counted(g)) is not None and v not in who)
        self.summary = {
            "design": c.design, "nodes": c.nodes, "rounds_requested": c.rounds, "warmup": c.warmup,
            "rounds_measured": rounds, "versions": [start, end], "seed": c.seed,
            "adversaries": {s.kind: s.share for s in c.adversaries},
            "simulated_seconds": sim.now, "wall_seconds": wall_seconds,
            "cpu_seconds": self.cpu_seconds, "maker_cpu_seconds": self.maker_cpu_seconds, "makers": c.makers,
            "stopped": self.stopped or "done",
            "per_node": per_round(protocol_nodes),
            "per_node_trainer": per_round([0]),
            "per_node_others": per_round(protocol_nodes[1:]),
            "max_node": _max_node(self, start, end, rounds, protocol_nodes),
            "per_round": rounds_table,
            # The whole run's counters, mean over nodes: what a run that ended inside a round shows.
            "totals_per_node": {name: statistics.fmean(values[i] for i in protocol_nodes)
                                for name, values in self.counters.items()},
            "trainer_version": sim.trainer_version,
            "rounds_to_quarantine": self._rounds_to_quarantine(sim, honest),
            "honest_false_quarantines": len({s for _, s in false}),
            "honest_false_quarantine_pairs": len(false),
            "bad_groups_trained": sum(self.trained_bad.values()),
            "bad_groups_trained_by_kind": dict(self.trained_bad),
            "trained_by_kind": dict(self.trained_by_kind),
            "groups_lost": len(lost), "groups_pending": len(pending), "rounds_never_closed": never_closed,
            "honest_groups_published": sum(1 for _, v in self.honest_groups.values() if start <= v < end),
            "withheld_groups": self.withheld,
            "honest_verdicts_not_counted_by_trainer": dropped,
            "trainer_waiting_verdicts": trainer.waiting_verdicts,
            "sybil": {"keys": self.sybil_keys, "messages": self.sybil_messages, "bytes_published": self.sybil_bytes,
                      "bytes_per_key_per_receiver": self.sybil_bytes / self.sybil_keys if self.sybil_keys else 0.0},
            "sybil_cost_at_honest_nodes": self._sybil_cost(sim, honest),
            "withholding": self._withholding(sim),
            "trainer_conviction": self._conviction(sim, honest),
            "churn": {"left": self.left, "joined": self.joined, "partitioned": self.partitioned,
                      "messages_past_backfill_window": self.lost_to_backfill},
            "unhandled": dict(self.unhandled),
            "actions": dict(self.actions),
            "cost_model": {"verify_ms_per_token": self.cost.verify_ms_per_token,
                           "generate_ms_per_token": self.cost.generate_ms_per_token,
                           "step_seconds": self.cost.step_seconds, "source": self.cost.source},
        }

    def _rounds_to_quarantine(self, sim: Run, honest: list[SimNode]) -> dict[str, QuarantineRow]:
        out: dict[str, QuarantineRow] = defaultdict(lambda: {"nodes": 0, "cheated": 0, "quarantined_by_trainer": 0,
                                                             "rounds_trainer": [], "rounds_median_honest": [],
                                                             "honest_views_missing": 0})
        for node in sim.nodes:
            if node.protocol is None or not node.kind or node.kind in TRAINER_ADVERSARIES:
                continue
            row = out[node.kind]
            row["nodes"] += 1
            if node.index not in self.first_bad:
                continue
            row["cheated"] += 1
            first = self.version_at(self.first_bad[node.index])
            at_trainer = self.quarantined_at.get((0, node.key.node_id))
            if at_trainer is not None:
                row["quarantined_by_trainer"] += 1
                row["rounds_trainer"].append(self.version_at(at_trainer) - first)
            views = sorted(self.quarantined_at.get((h.index, node.key.node_id), float("inf")) for h in honest)
            if at_trainer is not None:  # honest views that never saw a cheat the trainer quarantined
                row["honest_views_missing"] += sum(at == float("inf") for at in views)
            middle = views[len(views) // 2] if views else float("inf")
            if middle != float("inf"):
                row["rounds_median_honest"].append(self.version_at(middle) - first)
        for row in out.values():
            row["median_rounds_trainer"] = _median(row["rounds_trainer"])
            row["median_rounds_median_honest"] = _median(row["rounds_median_honest"])
        # The family's share of the draw weight W in the trainer's last manifest: the f of the
        # escape bound (specs/committee.md §5), as the trainer's view ended the run.
        rounds = sim.trainer_protocol.rounds
        if rounds.lists:
            weights = rounds.lists[max(rounds.lists)].content.weights.entries
            total = sum(w for _, w in weights) or 1
            kinds = {n.key.node_id: n.kind for n in sim.nodes}
            for kind, row in out.items():
                row["weight_share"] = sum(w for node, w in weights if kinds.get(node) == kind) / total
        return dict(out)

    def _sybil_cost(self, sim: Run, honest: list[SimNode]) -> dict[str, float]:
        """A flood's cost per fresh key at each honest node (means over the honest nodes): what
        specs/committee.md §7 bounds. ``state_*``: what the trainer keeps of the flood's keys."""
        keys = self.sybil_keys
        if not keys or not honest:
            return {}
        per = len(honest) * keys
        trainer = sim.trainer_protocol
        fresh = {n.key.node_id for n in sim.nodes if n.kind == "sybil"}  # (slots; the keys are minted per round)
        honest_ids = {n.key.node_id for n in sim.nodes if n.protocol is not None}
        stranger_verdicts = sum(1 for verdicts in trainer.verdicts.values() for v in verdicts
                                if v not in honest_ids and v not in fresh)
        stranger_groups = sum(1 for g in trainer.groups.values() if g.subject not in honest_ids)
        sybil_checks = sum(1 for d in self.checks_of_sybil_groups)
        listed = sum(c for workers in self.manifests for w, c in workers if w not in honest_ids)
        out = {name: value / per for name, value in self.sybil_cost.items()}
        out.update({
            "keys": keys, "honest_nodes": len(honest),
            "checks_per_key_network_wide": sybil_checks / keys,
            "state_trainer_verdicts_per_key": stranger_verdicts / keys,
            "state_trainer_groups_per_key": stranger_groups / keys,
            "sybil_groups_listed_in_manifests_per_key": listed / keys,
            "trainer_reports_by_strangers": sum(1 for r in trainer.reputation.reports()
                                                if r.reporter and r.reporter not in honest_ids),
        })
        return out

    def _withholding(self, sim: Run) -> dict[str, int | dict[str, float]]:
        """Withholding workers against honest ones at the trainer (specs/committee.md §7): the
        slots its manifests record as withheld, the score and failure evidence the trainer's view
        gives each kind (median over its nodes), and groups trained per group submitted."""
        trainer = sim.trainer_protocol
        records = trainer.reputation.withheld()
        # kind -> per node: its score, failures, passes, slots withheld, whether quarantined
        kinds: dict[str, list[tuple[float, float, float, int, bool]]] = defaultdict(list)
        for node in sim.nodes[1:]:
            if node.protocol is None or node.kind not in ("", "withhold"):
                continue
            standing = trainer.standing(node.key.node_id)
            slots = sum(r.missing for r in records if r.worker == node.key.node_id)
            kinds[node.kind or "honest"].append((standing.score, standing.failures, standing.passes, slots,
                                                 standing.quarantined))
        published: Counter[str] = Counter()
        for maker, _ in self.honest_groups.values():  # (withheld groups were never published)
            if maker > 0 and sim.nodes[maker].kind in ("", "withhold"):
                published[sim.nodes[maker].kind or "honest"] += 1
        out: dict[str, int | dict[str, float]] = {"withheld_slots_in_manifests": sum(r.missing for r in records),
               "manifests": len(self.manifests)}
        for kind, rows in kinds.items():
            # Counted as published is: by the maker's kind (a replayer's honest groups are neither).
            trained = self.trained_by_maker[kind]
            out[kind] = {"nodes": len(rows), "median_score": statistics.median(r[0] for r in rows),
                         "median_failures": statistics.median(r[1] for r in rows),
                         "median_passes": statistics.median(r[2] for r in rows),
                         "withheld_slots": sum(r[3] for r in rows), "quarantined": sum(r[4] for r in rows),
                         "groups_published": published[kind], "groups_trained": trained,
                         "trained_per_node": trained / len(rows)}
        return out

    def _conviction(self, sim: Run, honest: list[SimNode]) -> dict[str, str | int | None]:
        cheat = sim.nodes[0].kind
        if cheat not in TRAINER_ADVERSARIES:
            return {}
        times = [n.convicted_at for n in honest if n.convicted_at is not None]
        return {"cheat": cheat, "honest_nodes": len(honest), "convicted_by": len(times),
                "first_bad_version": _cheat_from() + 1,
                "versions_to_median_conviction": (self.version_at(sorted(times)[len(times) // 2]) - _cheat_from() - 1)
                if len(times) * 2 > len(honest) else None}


def _cheat_from() -> int:
    from vrl.harness.adversary import CHEAT_FROM

    return CHEAT_FROM


def _median(values: list[int]) -> float | None:
    return statistics.median(values) if values else None


def _max_node(metrics: Metrics, start: int, end: int, rounds: int, indices: list[int]) -> dict[str, float]:
    if rounds <= 0:
        return {}
    before, after = metrics.snapshots[start][1], metrics.snapshots[end][1]
    worst = {}
    for name in ("checks", "bytes_in", "bytes_out", "protocol_cpu_seconds"):
        values = [(after[name][i] - (before[name][i] if i < len(before[name]) else 0.0)) / rounds for i in indices
                  if i < len(after[name])]
        worst[name] = max(values) if values else 0.0
    return worst
