"""Reputation: what spot checks say about each node, recomputable by anyone from the verdict log.

Everything here is a pure function of a set of :class:`Report`s (one per signed verdict) and
the current round; order of arrival does not matter. An auditor holding the same verdicts
gets the same scores, check rates, quarantines and batch. ``specs/reputation.md`` is the
normative text; the pieces are:

1. **Reporter trust** (EigenTrust, Kamvar et al. 2003 §4): local trust ``s_ij`` is what ``i``'s
   reports say of ``j`` (passes minus weighted failures), normalised per row; global trust
   ``t = (1-a) C^T t + a p`` teleports only to the pre-trusted set ``p``. A report counts
   with weight ``min(1, t_reporter / mean t_pretrusted)``, so a clique of fresh identities
   cannot smear or whitewash anyone: trust reaches it only through honest nodes' checks.
2. **Score** (Beta reputation, Josang & Ismail 2002): ``a = a0 + sum w*decay*pass``,
   ``b = b0 + sum w*decay*(w_soft*soft + w_hard*hard)``, decayed per round by
   ``0.5 ** (age / half_life)``; the score is the lower ``confidence`` quantile of
   ``Beta(a, b)``, so 3 passes are not 3,000.
3. **Confirmed fraud**: a group that failed hard in reports from at least two distinct
   reporters of nonzero weight, one of them pre-trusted (this node's own repeatable re-check,
   or a configured anchor's), whose weights sum to ``quarantine_weight``, quarantines its node (score 0, no
   admission). One check alone, even a trusted one, never evicts: it must be re-checked; and
   no number of other reporters' words evicts without a re-check of one's own. The exception
   is a group a pre-trusted node *planted* (made bad on purpose to test verifiers): its maker
   knows. The same rule applied to a node rather than a group convicts on *node-level*
   reports, the hard fails whose reporter's sequential test rejected the node's sampling
   (specs/verification.md §7); until it does they weigh nothing in the node's score. The
   committee design adds the *pooled* test (:mod:`vrl.node.pooling`, §7.1 there): every
   member's drawn race evidence on the node's groups in one test, a loss counting only where a
   pre-trusted check of the same group found it too.
4. **Verifiers are judged too**: a reporter that passed a group later confirmed bad, or whose
   recomputed commitment digest differs from a pre-trusted reporter's on the same platform,
   did not check (a *lazy verifier*: hard fail and quarantine). A reject that a pre-trusted re-check
   contradicts is a soft fail of its reporter (honest drift is possible; lies add up), and it
   no longer counts against the group's node: the re-check has shown it false.
5. **Check rate** ``p = floor + (1-floor) (1-R)^gamma``, 1 for newcomers.
6. **Admission** into a GRPO batch, by these scores: :mod:`vrl.node.admission`.
7. **Withheld slots** (the committee design, specs/committee.md §7): a worker listed in a round's
   manifest with fewer than its ``groups_per_round`` groups pays, per missing slot, as much
   failure evidence as one of its listed groups earned in passes (at least ``withheld_weight``),
   so its ``a / (a + b)`` follows the share of its slots it submits. This lowers its score, and
   with it its share of batches; it never quarantines and never moves a reporter weight
   (:class:`Withheld`, :func:`withholding`).

Each default's reason is beside it and in the tables of specs/reputation.md (§2, §5, §6).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.special import betaincinv

from vrl.config import U63, bounded, check_fields
from vrl.errors import VrlError, shown
from vrl.node.committee import CommitteeError, Draw, ManifestContent, PagedManifest
from vrl.node.messages import (
    ManifestLists,
    MessageError,
    Outcome,
    RoundManifest,
    SignedVerdict,
    Submission,
)
from vrl.node.params import ProtocolParams
from vrl.node.pooling import pooled_convictions
from vrl.rollouts.model import bit_exact_platform
from vrl.rollouts.sequential import RACE_LOSSES

CHECKED = frozenset({Outcome.PASS, Outcome.SOFT_FAIL, Outcome.HARD_FAIL})  # what a check can say

#: A reporter whose weight reaches this counts as a checker (specs/reputation.md §5): its
#: checks count toward a node's ``checked_groups``, and its pass decides a group at once
#: (specs/network.md §5.2). Half a pre-trusted node's weight: a reporter trust reaches only
#: through honest nodes' checks, never a fresh identity (weight 0, §7).
COUNTING_WEIGHT = 0.5


@dataclass(frozen=True)
class ReputationConfig:
    """The reputation formulas' parameters (specs/reputation.md §1): a node's ``[reputation]``
    table. Each value is checked where it is made (:func:`vrl.config.check_fields`)."""

    # a0, b0: a pessimistic newcomer prior, Beta(1, 3), whose 5% quantile is 0.017 (Beta
    # reputation: Jøsang and Ismail, 2002); specs/reputation.md §2
    prior_pass: float = field(default=1.0, metadata=bounded(0, open_low=True))
    prior_fail: float = field(default=3.0, metadata=bounded(0, open_low=True))  # b0
    # w_s: a soft fail may be honest drift, so one pass's worth
    soft_weight: float = field(default=1.0, metadata=bounded(0))
    hard_weight: float = field(default=50.0, metadata=bounded(0))  # w_h: one hard fail outweighs ~50 passes
    # old evidence fades; 200 rounds is about a day of training steps (specs/reputation.md §2)
    half_life_rounds: float = field(default=200.0, metadata=bounded(0, open_low=True))
    # the score is the 5% quantile of Beta(a, b), so 3 passes are not 3,000 (specs/reputation.md
    # §2); a quantile is inside (0, 1)
    confidence: float = field(default=0.05, metadata=bounded(0, 1, open_low=True, open_high=True))
    # trusted nodes still see 10% of groups checked (grail's rate)
    check_floor: float = field(default=0.1, metadata=bounded(0, 1))
    check_gamma: float = field(default=1.0, metadata=bounded(0))  # the rate falls linearly with the score
    # groups checked at 100% before the rate may fall: two rounds of a default worker's 4 groups
    # (a production network would want more; specs/reputation.md §2)
    newcomer_checks: int = field(default=8, metadata=bounded(0, U63))
    # EigenTrust teleport a, "typically 0.1-0.2" (Kamvar et al. §4.5); 0 would never reach the anchors
    damping: float = field(default=0.15, metadata=bounded(0, 1, open_low=True))
    # power iterations; (1-a)^60 < 1e-4 of the start vector remains. Each walks every report,
    # so 10,000 (past convergence for any a >= 0.001) keeps a recomputation's time bounded.
    iterations: int = field(default=60, metadata=bounded(1, 10_000))
    # distinct reporters that must agree on a hard fail (issue #4)
    quarantine_reporters: int = field(default=2, metadata=bounded(1, U63))
    # their summed trust weight: e.g. one pre-trusted re-check
    quarantine_weight: float = field(default=1.0, metadata=bounded(0))
    # w_withheld: the least failure evidence a withheld slot adds (specs/committee.md §7), one
    # soft fail's; a slot weighs more when the worker's listed groups earned more in passes.
    withheld_weight: float = field(default=1.0, metadata=bounded(0))

    def __post_init__(self) -> None:
        check_fields(self)


class ReputationError(VrlError, ValueError):
    """A reputation input that breaks specs/reputation.md (a withholding record out of range)."""


_U64 = 1 << 64


@dataclass(frozen=True, slots=True)
class Withheld:
    """What one round manifest says of one worker (specs/committee.md §7): ``listed`` of its
    groups are in manifest ``round`` and ``missing`` of its assigned slots are not. Implied by
    the trainer's signed manifest, so anyone holding the manifest derives the same record."""

    round: int
    worker: bytes
    listed: int  # 1 <= listed: a worker with no group listed is absent, not withholding
    missing: int  # 1 <= missing: groups_per_round - listed

    def __post_init__(self) -> None:
        if type(self.round) is not int or not 0 <= self.round < _U64:
            raise ReputationError(f"withheld: round must be a u64, got {shown(self.round)}")
        if type(self.worker) is not bytes or len(self.worker) != 32:
            raise ReputationError(f"withheld: worker must be a 32-byte node id, got {shown(self.worker)}")
        for name in ("listed", "missing"):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value < 1 << 32:
                raise ReputationError(f"withheld: {name} must be an int in [1, 2^32), got {shown(value)}")


def withheld_of(manifest: ManifestContent, groups_per_round: int) -> list[Withheld]:
    """The withheld records a round's lists imply: one per listed worker with fewer than
    ``groups_per_round`` groups in it (specs/committee.md §7). A manifest that lists a worker
    with more groups than a round holds is refused whole (ReputationError): it is not the
    network's."""
    if type(groups_per_round) is not int or groups_per_round < 1:
        raise ReputationError(f"withheld: groups_per_round must be a positive int, got {shown(groups_per_round)}")
    over = [node.hex()[:16] for node, count in manifest.workers if count > groups_per_round]
    if over:
        raise ReputationError(f"manifest of round {manifest.round} lists more than {groups_per_round} groups "
                              f"of {over[:4]}")
    return [Withheld(manifest.round, node, count, groups_per_round - count)
            for node, count in manifest.workers if count < groups_per_round]


# A report as its fields in order (Report.sort_key): what orders the reports a node holds.
ReportKey = tuple[int, bytes, bytes, bytes, str, bytes, str, bool, bool, int, int, bool]


@dataclass(frozen=True, slots=True)
class Report:
    """One verdict as reputation sees it: ``reporter`` checked ``group`` of ``subject``."""

    round: int
    reporter: bytes
    subject: bytes
    group: bytes  # the group's digest: which submission was checked
    outcome: Outcome  # a check's: PASS, SOFT_FAIL or HARD_FAIL (a skip is no report)
    digest: bytes = b""  # the reporter's recomputed commitment digest (empty for a skipped check)
    platform: str = ""  # digests are compared only between identical platforms
    planted: bool = False  # the reporter made this known-bad group itself to test verifiers
    # The reporter's sequential test of the subject failed at this group (race_losses,
    # specs/verification.md §7): a finding about the node's sampling, which the group's own
    # records need not show, so a pass of the group does not contradict it.
    node_level: bool = False
    # The check's race evidence (specs/verification.md §7), and whether its committee seat drew
    # it (no one chose the group): what the pooled test of item 3 reads (vrl.node.pooling).
    race_tokens: int = 0
    races_lost: int = 0
    drawn: bool = False

    def __post_init__(self) -> None:
        if self.outcome not in CHECKED:
            raise ValueError(f"report outcome must be one of {sorted(CHECKED)}, got {self.outcome!r}")

    def sort_key(self) -> ReportKey:
        return (self.round, self.reporter, self.subject, self.group, self.outcome, self.digest, self.platform,
                self.planted, self.node_level, self.race_tokens, self.races_lost, self.drawn)


@dataclass(frozen=True)
class Standing:
    """A node's standing as of one round."""

    score: float
    check_rate: float
    quarantined: bool
    trust: float  # weight of its own reports, in [0, 1]
    passes: float  # decayed, weighted evidence
    failures: float
    checked_groups: int


@dataclass
class Reputation:
    """The reputation state of one node's view; a function of ``reports`` and ``round``.

    ``pretrusted`` are the trust anchors (this node itself, and any configured bootstrap
    peers): their reports weigh 1 and their own score is 1.
    """

    pretrusted: frozenset[bytes]
    config: ReputationConfig = field(default_factory=ReputationConfig)
    _reports: set[Report] = field(default_factory=set)
    # (reports, withheld records, round) -> standings; (reports, round) -> the reports' evidence
    _cache: tuple[int, int, int, dict[bytes, Standing]] | None = None
    _evidence: tuple[int, int, _Evidence] | None = None
    _last: dict[bytes, Standing] | None = None  # the last recomputation's, kept when reports are added
    # The reports in sort_key order, kept sorted as they come (a merge of two sorted runs per
    # recomputation, not a sort of every report): at N = 1,000 a trainer holds ~10^6 of them.
    _ordered: list[tuple[ReportKey, Report]] = field(default_factory=list)
    _new: list[tuple[ReportKey, Report]] = field(default_factory=list)
    # (round, worker) -> its withheld record: one manifest per round, the first one held
    _withheld: dict[tuple[int, bytes], Withheld] = field(default_factory=dict)

    def add_withheld(self, record: Withheld) -> bool:
        """Record what a round manifest says a worker withheld; False if that round's record of
        the worker is already held (the first manifest of a round is the one used)."""
        if not isinstance(record, Withheld):
            raise ReputationError(f"add_withheld takes a Withheld record, got {shown(record)}")
        if (record.round, record.worker) in self._withheld:
            return False
        self._withheld[record.round, record.worker] = record
        return True

    def withheld(self) -> list[Withheld]:
        return [self._withheld[k] for k in sorted(self._withheld)]

    def add(self, report: Report) -> bool:
        """Record a report; False if it was already known (reports are idempotent)."""
        if report.reporter == report.subject or report in self._reports:
            return False
        self._reports.add(report)
        self._new.append((report.sort_key(), report))
        return True

    def __len__(self) -> int:
        return len(self._reports)

    def held(self) -> int:
        """Reports and withheld records held: both only grow, so a change of this count is new
        evidence, which an evaluation at batch boundaries must take in (specs/committee.md §8)."""
        return len(self._reports) + len(self._withheld)

    def reports(self) -> list[Report]:
        if self._new:
            self._new.sort(key=_first)
            self._ordered += self._new  # two sorted runs: Timsort merges them in one pass
            self._ordered.sort(key=_first)
            self._new = []
        return [r for _, r in self._ordered]

    def standing(self, node: bytes, version: int) -> Standing:
        return self.standings(version).get(node) or self._newcomer(node)

    def standings(self, version: int) -> dict[bytes, Standing]:
        """Every node's standing from every report and withheld record held: :func:`compute`,
        recomputed whenever either was added or the round moved (only the sums when only
        withheld records came: they move no reporter weight)."""
        key = (len(self._reports), len(self._withheld), version)
        if self._cache is None or self._cache[:3] != key:
            reports = self.reports()
            if self._evidence is None or self._evidence[:2] != (len(self._reports), version):
                self._evidence = (len(self._reports), version,
                                  _evidence(reports, self.pretrusted, version, self.config))
            self._cache = (*key, _settle(self._evidence[2], reports, self.withheld(), self.config))
            self._last = self._cache[3]
        return self._cache[3]

    def last(self, version: int) -> dict[bytes, Standing]:
        """The standings of the last recomputation, whatever was added since (a node that
        evaluates reputation at batch boundaries reads these between them, specs/committee.md
        §8); a recomputation only if there was none yet."""
        return self._last if self._last is not None else self.standings(version)

    def last_standing(self, node: bytes, version: int) -> Standing:
        return self.last(version).get(node) or self._newcomer(node)

    def _newcomer(self, node: bytes) -> Standing:
        if node in self.pretrusted:
            return Standing(1.0, self.config.check_floor, False, 1.0, 0.0, 0.0, 0)
        return _stranger(self.config)


@functools.lru_cache(maxsize=16)
def _stranger(config: ReputationConfig) -> Standing:
    """A node no report names: the prior's lower bound, checked fully (one betaincinv per config,
    not per look-up: at N = 1,000 a node looks up ~250 strangers' step verdicts a round)."""
    return Standing(_lower_bound(config.prior_pass, config.prior_fail, config.confidence), 1.0, False, 0.0, 0.0,
                    0.0, 0)


def _first(pair: tuple[ReportKey, Report]) -> ReportKey:
    return pair[0]


def _lower_bound(a: float, b: float, confidence: float) -> float:
    return float(betaincinv(a, b, confidence))


def _derived(reports: list[Report], pretrusted: frozenset[bytes], confirmed: set[bytes]) -> list[Report]:
    """Reports *about reporters*, implied by the log (item 4 of the module docstring); their
    reporter is the empty id, which stands for "the log itself" and weighs 1."""
    by_group: dict[bytes, list[Report]] = defaultdict(list)
    for report in reports:
        by_group[report.group].append(report)
    derived = []
    for group, group_reports in by_group.items():
        anchors = [r for r in group_reports if r.reporter in pretrusted]
        for report in group_reports:
            if report.reporter in pretrusted:
                continue
            if group in confirmed and report.outcome == Outcome.PASS:
                derived.append(Report(report.round, b"", report.reporter, group, Outcome.HARD_FAIL))
                continue
            same_platform = [a for a in anchors if a.platform == report.platform and a.digest and report.digest]
            if any(a.digest != report.digest or _races_differ(a, report) for a in same_platform):
                derived.append(Report(report.round, b"", report.reporter, group, Outcome.HARD_FAIL))
            elif ((report.outcome == Outcome.HARD_FAIL and group not in confirmed and not report.node_level
                   and any(a.outcome == Outcome.PASS for a in anchors))
                  or (report.drawn and anchors and report.races_lost > max(a.races_lost for a in anchors))):
                # A contradicted accusation, or lost races no pre-trusted check found (each one
                # asked the trainer for a check: vrl.node.rounds.committee_checks).
                derived.append(Report(report.round, b"", report.reporter, group, Outcome.SOFT_FAIL))
            elif same_platform:
                derived.append(Report(report.round, b"", report.reporter, group, Outcome.PASS))
    return derived


def _races_differ(anchor: Report, report: Report) -> bool:
    """Whether two passes of one group on one bit-exact platform (a CPU at one thread,
    vrl.rollouts.model.bit_exact_platform) state other race evidence: every record of a pass
    reached the race replay, which such a platform repeats bit for bit (specs/verification.md
    §7), so a difference is a check not made. Elsewhere near-ties may flip with drift the
    digest's values do not show, and a failed check replays only the records that got that far."""
    return (anchor.outcome == report.outcome == Outcome.PASS and bit_exact_platform(anchor.platform)
            and (anchor.race_tokens, anchor.races_lost) != (report.race_tokens, report.races_lost))


#: At most this many nodes in a view, the power iteration runs on a dense matrix. A scipy sparse
#: product costs ~15 us a call whatever its size, 60 calls a recomputation, while a member's view
#: holds a handful of nodes: at N = 1,000 EigenTrust was 18% of bench/simulate.py, ~1.5 ms a
#: recomputation over views of median 0 reports. bench/eigentrust.py times both side by side
#: (bench/results/eigentrust.json): dense takes 0.2 to 0.45 of sparse's time up to 128 nodes,
#: as long at 256, 4x as long at 1,024.
DENSE_NODES = 128


def _eigentrust(reports: list[Report], pretrusted: frozenset[bytes], decay: Callable[[int], float],
                config: ReputationConfig, dense_nodes: int = DENSE_NODES) -> dict[bytes, float]:
    """Each node's reporter weight in [0, 1]; pre-trusted nodes weigh 1.

    The power iteration runs on a sparse matrix (scipy), or a dense one for views of at most
    ``dense_nodes`` nodes: the same formulas as Kamvar et al., with sums in another order than a
    loop over dicts would take (agreement to ~1e-15, tests/test_reputation_scale.py); at
    N = 1,000 a trainer's view holds ~10^6 reports and the loop took ~20 s a recomputation
    (bench/simulate.py, issue 30). With no opinions at all the walk never leaves the anchors:
    only they are weighed, at 1."""
    index: dict[bytes, int] = {n: i for i, n in enumerate(sorted(pretrusted))}
    rows_, cols_, vals_ = [], [], []
    penalty = {Outcome.PASS: -1.0, Outcome.SOFT_FAIL: config.soft_weight, Outcome.HARD_FAIL: config.hard_weight}
    decays: dict[int, float] = {}
    for r in reports:
        if not r.reporter or r.node_level:  # an accusation of sampling is no local opinion (item 3)
            continue
        i = index.setdefault(r.reporter, len(index))
        j = index.setdefault(r.subject, len(index))
        d = decays.get(r.round)
        if d is None:
            d = decays[r.round] = decay(r.round)
        rows_.append(i)
        cols_.append(j)
        vals_.append(-penalty[r.outcome] * d)  # s_ij = sat - unsat (Kamvar §3)
    if not rows_:
        return {**dict.fromkeys(sorted(pretrusted), 1.0), b"": 1.0}
    # Ids in sorted order, as the formulas index them; the matrix in that order.
    order = sorted(index)
    position = np.empty(len(index), dtype=np.int64)
    for k, n in enumerate(order):
        position[index[n]] = k
    size = len(order)
    teleport = np.array([1.0 / len(pretrusted) if n in pretrusted else 0.0 for n in order])
    rows, cols = position[np.asarray(rows_, dtype=np.int64)], position[np.asarray(cols_, dtype=np.int64)]
    spread_by, opinionless = _transition(rows, cols, np.asarray(vals_, dtype=np.float64), size, size <= dense_nodes)
    trust, a = teleport.copy(), config.damping
    if size <= dense_nodes:
        # t' = (1-a) (C^T t + p (o . t)) + a p with o the opinionless nodes, folded into one
        # matrix: two numpy calls an iteration instead of five (bench/eigentrust.py).
        step = (1 - a) * (spread_by + np.outer(teleport, opinionless))
        for _ in range(config.iterations):
            trust = step @ trust + a * teleport
    else:
        for _ in range(config.iterations):
            spread = spread_by @ trust + teleport * trust[opinionless].sum()
            trust = (1 - a) * spread + a * teleport
    anchors = [k for k, n in enumerate(order) if n in pretrusted]
    anchor_mean = float(trust[anchors].sum()) / len(anchors)
    weights = {n: 1.0 if n in pretrusted else min(1.0, float(trust[k]) / anchor_mean) if anchor_mean > 0 else 0.0
               for k, n in enumerate(order)}
    weights[b""] = 1.0
    return weights


def _transition(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, size: int,
                dense: bool) -> tuple[np.ndarray | csr_matrix, np.ndarray]:
    """C^T from the local opinions s_ij (duplicates summed in report order), and which nodes hold
    no opinion: c_ij = max(s_ij, 0) / sum_j max(s_ij, 0); a node with none defers to p (Kamvar §4.5)."""
    if dense:
        local = np.zeros((size, size))
        np.add.at(local, (rows, cols), values)
        local = np.where(local > 0, local, 0.0)
        totals = local.sum(axis=1)
    else:
        sparse = csr_matrix((values, (rows, cols)), shape=(size, size))
        sparse.sum_duplicates()
        sparse.data = np.where(sparse.data > 0, sparse.data, 0.0)
        sparse.eliminate_zeros()
        totals = np.asarray(sparse.sum(axis=1)).ravel()
    opinionless = totals <= 0
    scale = np.where(opinionless, 0.0, 1.0 / np.where(opinionless, 1.0, totals))
    if dense:
        return (local * scale[:, None]).T.copy(), opinionless
    return csr_matrix(sparse.multiply(scale[:, None])).T.tocsr(), opinionless


def _confirmed(reports: list[Report], pretrusted: frozenset[bytes], weight: Mapping[bytes, float],
               config: ReputationConfig) -> set[bytes]:
    """Groups whose hard fail at least two distinct reporters, trusted enough together, agree
    on; and groups a pre-trusted reporter planted (it made them bad, it needs no second opinion)."""
    accusers: dict[bytes, set[bytes]] = defaultdict(set)
    planted = set()
    for r in reports:
        # Only reporters with some weight are accusers: a fresh key (weight 0, §7) cannot be
        # the second opinion that turns one check into a confirmation.
        if r.outcome == Outcome.HARD_FAIL and r.reporter and weight.get(r.reporter, 0.0) > 0:
            accusers[r.group].add(r.reporter)
            if r.planted and r.reporter in pretrusted:
                planted.add(r.group)
    return planted | {g for g, who in accusers.items() if _enough(who, pretrusted, weight, config)}


def _enough(accusers: set[bytes], pretrusted: frozenset[bytes], weight: Mapping[bytes, float],
            config: ReputationConfig) -> bool:
    """Item 3's rule: enough distinct accusers, one of them pre-trusted, trusted enough together."""
    return (len(accusers) >= config.quarantine_reporters and not accusers.isdisjoint(pretrusted)
            and sum(weight.get(w, 0.0) for w in accusers) >= config.quarantine_weight)


def _sequentially_convicted(reports: list[Report], pretrusted: frozenset[bytes], weight: Mapping[bytes, float],
                            config: ReputationConfig) -> set[bytes]:
    """Nodes whose sampling the sequential tests of enough reporters rejected, by item 3's rule
    applied to the node instead of one group: each reporter's test ran over the groups it
    checked itself, so the evidence of each is its own (specs/reputation.md §3)."""
    accusers: dict[bytes, set[bytes]] = defaultdict(set)
    for r in reports:
        if r.node_level and r.outcome == Outcome.HARD_FAIL and r.reporter and weight.get(r.reporter, 0.0) > 0:
            accusers[r.subject].add(r.reporter)
    return {node for node, who in accusers.items() if _enough(who, pretrusted, weight, config)}


def _cleared(reports: list[Report], pretrusted: frozenset[bytes], confirmed: set[bytes]) -> set[bytes]:
    """Groups a pre-trusted re-check passed and that are not confirmed bad: failure reports on
    them say nothing true about the group's node (they cost their reporters instead, §4)."""
    return {r.group for r in reports if r.outcome == Outcome.PASS and r.reporter in pretrusted} - confirmed


def _counts_against(report: Report, cleared: set[bytes], convicted: set[bytes]) -> bool:
    """Whether a report counts in its subject's score: a pass always; a failure not when a
    pre-trusted re-check cleared the group; a node-level one (about the node's sampling, not the
    group, item 3) only once the sequential tests convicted the node: an accusation alone,
    which no pass contradicts, must not lower an honest node's score."""
    if report.outcome == Outcome.PASS or not report.reporter:
        return True
    if report.node_level:
        return report.subject in convicted
    return report.group not in cleared


def withholding(reports: list[Report], withheld: Iterable[Withheld], weight: Mapping[bytes, float],
                decay: Callable[[int], float], config: ReputationConfig) -> dict[bytes, float]:
    """Each worker's failure evidence from its withheld slots (specs/committee.md §7): per record,
    ``decay(round) * missing * max(withheld_weight, P / listed)``, ``P`` the summed weight of
    the pass reports on the worker's groups of that round (by non-empty reporters). A missing
    slot so weighs what a listed one earned, and over a round ``a / (a + b)`` is the share of
    slots submitted. Separate from the score sums it feeds: withheld evidence is no report,
    moves no reporter weight and quarantines no one."""
    records = list(withheld)
    if not records:
        return {}
    wanted = {(w.round, w.worker) for w in records}
    earned: dict[tuple[int, bytes], float] = defaultdict(float)
    for r in reports:
        if r.outcome == Outcome.PASS and r.reporter and (r.round, r.subject) in wanted:
            earned[r.round, r.subject] += weight.get(r.reporter, 0.0)
    out: dict[bytes, float] = defaultdict(float)
    for w in records:
        out[w.worker] += decay(w.round) * w.missing * max(config.withheld_weight, earned[w.round, w.worker] / w.listed)
    return out


def compute(reports: list[Report], pretrusted: frozenset[bytes], version: int,
            config: ReputationConfig, withheld: Iterable[Withheld] = ()) -> dict[bytes, Standing]:
    """Every node's :class:`Standing` as of ``version``, from the reports and the withheld
    slots round manifests imply (item 7) alone."""
    return _settle(_evidence(reports, pretrusted, version, config), reports, withheld, config)


@dataclass(frozen=True)
class _Evidence:
    """What the reports alone give (EigenTrust, confirmations, the sums): a view keeps it while
    only withheld records come, which move no reporter weight (specs/committee.md §7.1)."""

    version: int
    pretrusted: frozenset[bytes]
    weight: dict[bytes, float]
    quarantined: set[bytes]
    passes: dict[bytes, float]
    failures: dict[bytes, float]
    checked: dict[bytes, set[bytes]]


def _decay(config: ReputationConfig, version: int) -> Callable[[int], float]:
    decay_rate = math.log(2) / config.half_life_rounds

    def decay(at: int) -> float:
        return math.exp(-decay_rate * max(version - at, 0))
    return decay


def _evidence(reports: list[Report], pretrusted: frozenset[bytes], version: int,
              config: ReputationConfig) -> _Evidence:
    if not pretrusted:
        raise ValueError("reputation needs at least one pre-trusted node (normally the node itself)")
    decay = _decay(config, version)
    # The first weights only say which accusers count (_confirmed): with no hard fail in the log
    # there is none to weigh, and this pass over every report (half the trainer's EigenTrust time
    # at N = 1,000, bench/simulate.py) would change nothing.
    accused = any(r.outcome == Outcome.HARD_FAIL and r.reporter for r in reports)
    weight = _eigentrust(reports, pretrusted, decay, config) if accused else {}
    confirmed = _confirmed(reports, pretrusted, weight, config)
    everything = reports + _derived(reports, pretrusted, confirmed)
    weight = _eigentrust(everything, pretrusted, decay, config)
    # A verifier caught not checking is quarantined too: its signed verdict contradicts a
    # confirmed fact (a planted or doubly-confirmed bad group, or a pre-trusted digest).
    quarantined = {r.subject for r in reports if r.group in confirmed}
    quarantined |= {r.subject for r in everything if not r.reporter and r.outcome == Outcome.HARD_FAIL}
    sequential = _sequentially_convicted(reports, pretrusted, weight, config) | pooled_convictions(
        reports, pretrusted, weight, excluded=quarantined)
    quarantined |= sequential

    cleared = _cleared(reports, pretrusted, confirmed)
    passes: dict[bytes, float] = defaultdict(float)
    failures: dict[bytes, float] = defaultdict(float)
    checked: dict[bytes, set[bytes]] = defaultdict(set)
    for r in everything:
        w = weight.get(r.reporter, 0.0) * decay(r.round)
        if not _counts_against(r, cleared, sequential):
            continue
        if r.outcome == Outcome.PASS:
            passes[r.subject] += w
        else:
            failures[r.subject] += w * (config.soft_weight if r.outcome == Outcome.SOFT_FAIL else config.hard_weight)
        if r.reporter and weight.get(r.reporter, 0.0) >= COUNTING_WEIGHT:
            checked[r.subject].add(r.group)
    return _Evidence(version, pretrusted, weight, quarantined, dict(passes), dict(failures), dict(checked))


def _settle(evidence: _Evidence, reports: list[Report], withheld: Iterable[Withheld],
            config: ReputationConfig) -> dict[bytes, Standing]:
    """The standings from the reports' evidence plus the withheld slots' failure evidence."""
    pretrusted, weight, quarantined = evidence.pretrusted, evidence.weight, evidence.quarantined
    passes = defaultdict(float, evidence.passes)
    failures = defaultdict(float, evidence.failures)
    checked = defaultdict(set, evidence.checked)
    decay = _decay(config, evidence.version)
    for worker, extra in withholding(reports, withheld, weight, decay, config).items():
        failures[worker] += extra

    standings = {}
    for node in sorted(set(weight) | set(passes) | set(failures)):
        if not node:
            continue
        if node in pretrusted:
            standings[node] = Standing(1.0, config.check_floor, False, 1.0, passes[node], failures[node],
                                       len(checked[node]))
            continue
        score = 0.0 if node in quarantined else _lower_bound(
            config.prior_pass + passes[node], config.prior_fail + failures[node], config.confidence)
        newcomer = len(checked[node]) < config.newcomer_checks
        rate = 1.0 if newcomer or node in quarantined else min(
            1.0, config.check_floor + (1 - config.check_floor) * (1 - score) ** config.check_gamma)
        standings[node] = Standing(score, rate, node in quarantined, weight.get(node, 0.0), passes[node],
                                   failures[node], len(checked[node]))
    return standings


def report_of(verdict: SignedVerdict, subject: bytes, version: int) -> Report | None:
    """What a verdict about a group of ``subject`` (its records' signer) at policy ``version``
    says to reputation; None for a skip, or when the verdict's own subject or version is not
    the group's: reports are about who signed the group, never about whom a message names."""
    if not verdict.checked or verdict.subject != subject or verdict.policy_version != version:
        return None
    return Report(version, verdict.verifier, subject, verdict.group, verdict.outcome, verdict.digest,
                  verdict.platform, verdict.planted,
                  node_level=verdict.outcome == Outcome.HARD_FAIL and RACE_LOSSES in verdict.reasons,
                  race_tokens=verdict.race_tokens, races_lost=verdict.races_lost,
                  drawn=verdict.draw == Draw.COMMITTEE and verdict.checked)


@dataclass(frozen=True)
class Recomputed:
    """Every node's reputation as a store's signed verdicts give it, recomputed as an auditor
    would (``vrl reputation``): the standings at ``round``, from ``reports`` reports, with the
    verdicts that were not counted (a bad signature, a subject or version not its group's, or
    bytes that do not decode)."""

    round: int
    standings: dict[bytes, Standing]
    reports: int
    invalid_verdicts: int

    def ranked(self) -> list[tuple[bytes, Standing]]:
        """Highest score first; equal scores by node id."""
        return sorted(self.standings.items(), key=lambda item: (-item[1].score, item[0]))


def recompute(log: Iterable[tuple[str, bytes, tuple[Any, ...]]], anchors: frozenset[bytes],
              at_version: int | None = None, groups_per_round: int = ProtocolParams.groups_per_round) -> Recomputed:
    """Reputation from a store's log (:meth:`vrl.node.store.Store.replay`, in the order it
    was written), trusting ``anchors``, as of ``at_version`` (default: the newest round a
    verdict names). Who a verdict is about is its group's signer, never the verdict's word.
    A round manifest (kind ``manifest``) signed by an anchor, with the lists behind it (the
    trainer's store holds them), adds the withheld slots they imply (specs/committee.md §7), the
    first one of its round only, as the protocol uses it."""
    view = Reputation(anchors)
    invalid = 0
    versions = [0]
    groups: dict[bytes, tuple[bytes, int]] = {}  # digest -> (signer of its records, policy version)
    manifests: set[int] = set()
    for kind, data, extra in log:
        try:
            if kind == "group":
                groups[Submission.from_bytes(data).digest] = extra[:2]
            if kind == "manifest" and len(extra) > 1 and extra[1] is not None:
                manifest = RoundManifest.from_bytes(data)
                lists = ManifestLists.from_bytes(extra[1]).content
                if (manifest.trainer in anchors and manifest.round not in manifests and manifest.valid()
                        and PagedManifest(lists).header == manifest.header):
                    manifests.add(manifest.round)
                    for record in withheld_of(lists, groups_per_round):
                        view.add_withheld(record)
            if kind != "verdict":
                continue
            verdict = SignedVerdict.from_bytes(data)
        except (MessageError, ReputationError, CommitteeError):  # the disk is trusted no more than the network was
            invalid += kind == "verdict"
            continue
        report = report_of(verdict, *groups[verdict.group]) if verdict.group in groups else None
        if not verdict.valid() or (verdict.checked and report is None):
            invalid += 1
            continue
        versions.append(verdict.policy_version)
        if report is not None:
            view.add(report)
    at = max(versions) if at_version is None else at_version
    return Recomputed(at, view.standings(at), len(view.reports()), invalid)
