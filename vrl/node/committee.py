"""VRF committees: who checks which group of a round (specs/committee.md).

Pure functions and frozen values, no I/O: the VRF input of a round (:func:`alpha`), the
weights table the trainer commits into its signed round manifest (:class:`WeightsTable`), a
round's lists (:class:`ManifestContent`) and what commits them (:class:`PagedManifest`, its
:class:`ManifestHeader`), the draw by position (:func:`seat_value`, :func:`seats`), a member's
check of the entries it fetched (:func:`check_entries`) and of a claim's paths
(:func:`check_seat`), the withholding count (:meth:`ManifestContent.withheld`) and the escape
bound that sizes the committees (:func:`escape_bound`, :func:`smallest_k`).

Every integer that decides membership is exact (no float reaches a threshold), so two
implementations agree bit for bit; the floats here only state the bound.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from proofs import merkle, vrf
from vrl.errors import VrlError, shown

__all__ = [
    "COMMITTEE_DOMAIN", "COMMITTEE_SIZE", "EPSILON", "F_STAR", "MANIFEST_SIGNING_DOMAIN", "MANIFEST_V2_DOMAIN",
    "MANIFEST_V3_DOMAIN", "MAX_COMMITTEE_SIZE", "MAX_ENTRIES_PER_REQUEST", "MAX_PAGED_ENTRIES", "RECHECK_DOMAIN",
    "SEATS", "SEAT_DOMAIN", "SEAT_RULE", "SEAT_RULES", "SEAT_V2_DOMAIN", "WEIGHT_SCALE", "CommitteeError", "Draw",
    "Entries", "List", "ManifestContent", "ManifestHeader", "PagedManifest", "Refusal", "WeightsTable", "alpha",
    "check_entries", "check_place", "check_seat", "check_weight", "entry_leaf", "escape_bound", "exact_escape",
    "quantize_weight", "seat_value", "seats", "smallest_k",
]

# Domain tags (specs/committee.md §2): each ends in the 0x00 separator of specs/README.md.
COMMITTEE_DOMAIN = b"vrl/committee/v1\x00"
RECHECK_DOMAIN = b"vrl/recheck/v1\x00"
#: What the trainer's signature over a manifest message covers (specs/committee.md §3.3).
MANIFEST_SIGNING_DOMAIN = b"vrl/round-manifest/v1\x00"
#: The round manifest's root (specs/committee.md §3.2) and the draw by position (§2), one pair a
#: seat rule: the root's domain names the rule, so a manifest's VRF inputs bind it.
MANIFEST_V2_DOMAIN = b"vrl/manifest/v2\x00"
SEAT_DOMAIN = b"vrl/seat/v1\x00"
MANIFEST_V3_DOMAIN = b"vrl/manifest/v3\x00"
SEAT_V2_DOMAIN = b"vrl/seat/v2\x00"
#: The seat rules a manifest may name (specs/committee.md §2), and the one a trainer writes.
#: Rule 1 hashes once a position (SHA-256); rule 2 reads 8 positions' seat values from one
#: SHA-512: a member's draw of n positions a round in a fifth of the time (bench/vrf.py,
#: bench/results/vrf.json: 29 against 144 ms at 2^18), where rule 1's loop was 7% of
#: bench/simulate.py at N = 1,000. Manifests of rule 1 are still read: an audit of an older
#: store, or a member of an older trainer.
SEAT_RULES = (1, 2)
SEAT_RULE = 2
_ROOT_DOMAINS = {1: MANIFEST_V2_DOMAIN, 2: MANIFEST_V3_DOMAIN}
_SEATS_A_BLOCK = 8  # rule 2's seat values a SHA-512: its 64 bytes are 8 big-endian u64s

#: A reporter weight (specs/reputation.md §2, in [0, 1]) is carried as an integer in
#: [1, WEIGHT_SCALE]: 16 bits keep every threshold exact and a table entry small.
WEIGHT_SCALE = 1 << 16
#: A round manifest's lists (specs/committee.md §3.2): a member draws on every position of the
#: groups list once a round (§2), 29 ms of CPython at 2^18 positions under seat rule 2 on this
#: project's 2-core machine (bench/results/vrf.json); 65,536 workers at 4 groups. The sizes are
#: u32 on the wire.
MAX_PAGED_ENTRIES = 1 << 18
#: Positions or keys in one ``entries`` request (§3.5): 1,024 keys are 34 KiB, under the 64 KiB
#: request limit, and their answer (36-byte leaves and at most 18 hashes each) under the 2 MiB
#: answer limit (specs/network.md §7).
MAX_ENTRIES_PER_REQUEST = 1024
#: k is a u32 on the wire; 1,024 members a group would be every verifier of all but the largest
#: networks, and a verifier's work is k x groups_per_round checks a round (§6).
MAX_COMMITTEE_SIZE = 1024

#: The design point of specs/committee.md §5: an adversary holding up to F_STAR of the table's
#: weight lets a bad group go unchecked by every honest member with probability at most
#: EPSILON. k = ceil(ln(1/EPSILON) / (1 - F_STAR)) = ceil(10.89) = 11: per-verifier checks
#: k x groups_per_round = 44 a round at any N, 1.375x the 32 a verifier checks at N = 10 (every
#: other worker's group; bench/results/simulate-scale.json), within the 1.5x issue 30 allows
#: (k <= 12); EPSILON = 1e-3 needs k = 13 (52 checks, 1.63x), 1e-6 needs k = 26.
F_STAR = 0.45
EPSILON = 2.5e-3

_U64 = 1 << 64


class CommitteeError(VrlError, ValueError):
    """A committee value or claim that breaks specs/committee.md; ``reason`` is its code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Draw(StrEnum):
    """What selected a verdict's check (specs/committee.md §4): the value a verdict's ``draw``
    carries, and for the two VRF committees (:data:`SEATS`) the input a member draws over (§2)."""

    TICKET = "ticket"  # the verifier's audit ticket at the subject's rate (specs/network.md §4)
    COMMITTEE = "committee"  # the round's first committee; pi proves it
    RECHECK = "recheck"  # the fresh committee that re-checks a failure (specs/network.md §5.1); pi proves it
    NONE = "none"  # no draw: the trainer's or a pre-trusted anchor's own check


class Refusal(StrEnum):
    """Why a verdict's committee claim does not stand (specs/committee.md §4, in the order a
    node checks it), as the node returns it and the audit's ``committees`` check finds it
    (specs/audit.md §3); CommitteeError's ``reason`` where a claim's path does not prove it."""

    MANIFEST_MISSING = "manifest_missing"  # step 1: not refused by a node, which waits, bounded, for it
    NOT_ELIGIBLE = "not_eligible"  # step 2: no weights entry proven, or a ticket draw
    NO_CLAIM = "no_claim"  # step 2: a draw of none from neither the trainer nor an anchor
    NOT_IN_MANIFEST = "not_in_manifest"  # step 3
    SKIP_IN_COMMITTEE = "skip_in_committee"  # a committee or recheck draw that skipped its check
    BAD_SIGNATURE = "bad_signature"  # step 4
    BAD_PROOF = "bad_proof"  # step 5
    NOT_DRAWN = "not_drawn"  # step 6, and a seat on its own signer's group (§2)
    WRONG_DESIGN = "wrong_design"  # a committee claim in a network of the ticket design


#: The draws that claim a seat on a round's VRF committee: a verdict of one carries ``pi``
#: over that committee's ``alpha`` and a weights entry (specs/committee.md §4).
SEATS = frozenset({Draw.COMMITTEE, Draw.RECHECK})
_SEAT_DOMAINS = {Draw.COMMITTEE: COMMITTEE_DOMAIN, Draw.RECHECK: RECHECK_DOMAIN}


def smallest_k(f_star: float, eps: float) -> int:
    """The smallest committee size k with exp(-k (1 - f_star)) <= eps (specs/committee.md §5)."""
    if not (0 <= f_star < 1 and 0 < eps < 1):
        raise CommitteeError("bad_bound", f"need 0 <= f* < 1 and 0 < eps < 1, got f*={f_star!r}, eps={eps!r}")
    k = math.ceil(math.log(1 / eps) / (1 - f_star))
    while k > 1 and math.exp(-(k - 1) * (1 - f_star)) <= eps:  # guard the ceil against rounding
        k -= 1
    while math.exp(-k * (1 - f_star)) > eps:
        k += 1
    return k


#: The network's default committee size (specs/committee.md §5): 11.
COMMITTEE_SIZE = smallest_k(F_STAR, EPSILON)


def escape_bound(k: float, f: float) -> float:
    """exp(-k (1 - f)): the bound on the chance that no honest member is drawn for a group."""
    if not (k >= 0 and 0 <= f <= 1):
        raise CommitteeError("bad_bound", f"need k >= 0 and 0 <= f <= 1, got k={k!r}, f={f!r}")
    return math.exp(-k * (1 - f))


def exact_escape(honest_probabilities: Iterable[float]) -> float:
    """prod (1 - p_v) over the honest members' draw probabilities: the exact escape chance."""
    out = 1.0
    for p in honest_probabilities:
        out *= 1 - p
    return out


class Weighable(Protocol):
    """What the draw weight reads of a node: :class:`vrl.node.reputation.Standing` satisfies it.
    A protocol, not that class: reputation imports this module. Read-only, as the frozen
    standing is."""

    @property
    def trust(self) -> float: ...
    @property
    def score(self) -> float: ...
    @property
    def quarantined(self) -> bool: ...


def seat_weights(standings: Mapping[bytes, Weighable], trainer: bytes) -> dict[bytes, float]:
    """Each node's weight in the committee draw (specs/committee.md §3.1): its reporter weight
    (EigenTrust, specs/reputation.md §2) times its score (§5), for every node but the trainer
    that is not quarantined and weighs something. The score is what the log shows of the node,
    its contradicted accusations and unfounded race claims included (reputation.md §4 rule 3),
    so a verifier that accuses honest groups loses seats as it loses score; trust alone left a
    false accuser 0.18-0.21 of weight, near an honest node's (python bench/simulate.py adversaries
    --families accuse)."""
    return {peer: s.trust * s.score for peer, s in standings.items()
            if peer != trainer and not s.quarantined and s.trust * s.score > 0}


def quantize_weight(weight: float) -> int:
    """A reporter weight in [0, 1] as the table's integer: floor(weight x 2^16), at most 2^16."""
    if not (isinstance(weight, float | int) and 0 <= weight <= 1):
        raise CommitteeError("bad_weight", f"a reporter weight must be in [0, 1], got {shown(weight)}")
    return min(WEIGHT_SCALE, math.floor(weight * WEIGHT_SCALE))


_U32 = struct.Struct(">I")


def _u32(value: int) -> bytes:
    return _U32.pack(value)


def _u64(value: int) -> bytes:
    return struct.pack(">Q", value)


def _node_id(value: object, what: str) -> bytes:
    if type(value) is not bytes or len(value) != 32:
        raise CommitteeError("bad_entry", f"{what}: expected a 32-byte node id or digest, got {shown(value)}")
    return value


def _strictly_sorted(keys: list[bytes], what: str) -> None:
    for earlier, later in zip(keys, keys[1:], strict=False):
        if earlier >= later:
            raise CommitteeError("bad_order", f"{what} must be sorted by bytes with no repeat, at {later.hex()}")


@dataclass(frozen=True, slots=True)
class WeightsTable:
    """The eligible verifiers of a round and their integer weights, and the committee size k
    (specs/committee.md §3). ``entries`` are ``(node_id, weight)`` sorted by node id, each
    weight in [1, WEIGHT_SCALE]; a node not in it is not eligible (never a member)."""

    committee_size: int
    entries: tuple[tuple[bytes, int], ...]

    def __post_init__(self) -> None:
        if type(self.committee_size) is not int or not 1 <= self.committee_size <= MAX_COMMITTEE_SIZE:
            raise CommitteeError("bad_size", f"committee size must be in [1, {MAX_COMMITTEE_SIZE}], "
                                             f"got {shown(self.committee_size)}")
        if type(self.entries) is not tuple or len(self.entries) > MAX_PAGED_ENTRIES:
            raise CommitteeError("too_many", f"a weights table holds at most {MAX_PAGED_ENTRIES} entries")
        for entry in self.entries:
            if type(entry) is not tuple or len(entry) != 2:
                raise CommitteeError("bad_entry", f"a weights entry is (node id, weight), got {shown(entry)}")
            _node_id(entry[0], "weights entry")
            if type(entry[1]) is not int or not 1 <= entry[1] <= WEIGHT_SCALE:
                raise CommitteeError("bad_weight", f"weight of {entry[0].hex()} must be in [1, {WEIGHT_SCALE}], "
                                                   f"got {shown(entry[1])}")
        _strictly_sorted([node for node, _ in self.entries], "weights entries")

    @classmethod
    def of(cls, committee_size: int, weights: Mapping[bytes, float]) -> WeightsTable:
        """The table of draw weights in [0, 1] (:func:`seat_weights`): every node whose
        quantized weight is at least 1, sorted. The caller chooses who is eligible."""
        entries = sorted((node, quantize_weight(w)) for node, w in weights.items())
        return cls(committee_size, tuple((node, w) for node, w in entries if w >= 1))

    @classmethod
    def heaviest(cls, committee_size: int, weights: Mapping[bytes, float]) -> WeightsTable:
        """specs/committee.md §3.1: the table of the heaviest MAX_PAGED_ENTRIES draw weights
        (ties by node id), quantized."""
        return cls.of(committee_size, dict(sorted(weights.items(), key=lambda item: (-item[1], item[0]))
                                           [:MAX_PAGED_ENTRIES]))

    @property
    def total(self) -> int:
        """W: the sum of the table's weights."""
        return sum(w for _, w in self.entries)

    def weight(self, node: bytes) -> int:
        """w_v, or 0 for a node that is not eligible."""
        return dict(self.entries).get(node, 0)

    def threshold(self, node: bytes) -> int:
        """T_v = min(2^64, floor(k w_v 2^64 / W)): v is a member for group d iff member_value < T_v."""
        w, total = self.weight(node), self.total
        if w == 0:
            return 0
        return min(_U64, (self.committee_size * w << 64) // total)

    def probability(self, node: bytes) -> float:
        """p_v = T_v / 2^64 = min(1, k w_v / W) up to 2^-64: the chance v is drawn for a group."""
        return self.threshold(node) / _U64

    def variance(self) -> float:
        """Var |C_d| = sum p_v (1 - p_v) <= k: the spread of a committee's size (§5)."""
        return sum(p * (1 - p) for p in (self.probability(node) for node, _ in self.entries))

    def expected_checks(self, node: bytes, groups: int) -> float:
        """A member's expected checks in a round of ``groups`` groups: groups x p_v (§6)."""
        return groups * self.probability(node)


@dataclass(frozen=True, slots=True)
class ManifestContent:
    """What the trainer's round manifest fixes (specs/committee.md §3): the round, the weights
    table, the sorted digests of the round's accepted groups, and per worker with a group in it
    the number of its groups there, sorted by node id."""

    round: int
    weights: WeightsTable
    groups: tuple[bytes, ...]
    workers: tuple[tuple[bytes, int], ...]
    seat_rule: int = SEAT_RULE  # the draw's rule (§2): a trainer writes the newest

    def __post_init__(self) -> None:
        if type(self.round) is not int or not 0 <= self.round < _U64:
            raise CommitteeError("bad_round", f"round must be a u64, got {shown(self.round)}")
        _seat_rule(self.seat_rule)
        if not isinstance(self.weights, WeightsTable):
            raise CommitteeError("bad_entry", "weights must be a WeightsTable")
        if type(self.groups) is not tuple or len(self.groups) > MAX_PAGED_ENTRIES:
            raise CommitteeError("too_many", f"a manifest lists at most {MAX_PAGED_ENTRIES} groups")
        _strictly_sorted([_node_id(d, "group") for d in self.groups], "groups")
        if type(self.workers) is not tuple or len(self.workers) > MAX_PAGED_ENTRIES:
            raise CommitteeError("too_many", f"a manifest lists at most {MAX_PAGED_ENTRIES} workers")
        for entry in self.workers:
            if type(entry) is not tuple or len(entry) != 2 or type(entry[1]) is not int or not 1 <= entry[1] < 1 << 32:
                raise CommitteeError("bad_entry", f"a worker entry is (node id, 1 <= count < 2^32), got {shown(entry)}")
            _node_id(entry[0], "worker entry")
        _strictly_sorted([node for node, _ in self.workers], "workers")
        if sum(count for _, count in self.workers) != len(self.groups):
            raise CommitteeError("bad_entry", f"workers' counts sum to {sum(c for _, c in self.workers)}, "
                                              f"but {len(self.groups)} groups are listed")

    def withheld(self, groups_per_round: int) -> dict[bytes, int]:
        """Per listed worker, its assigned groups missing from the manifest (specs/committee.md §7)."""
        if type(groups_per_round) is not int or groups_per_round < 1:
            raise CommitteeError("bad_entry", f"groups_per_round must be a positive int, got {shown(groups_per_round)}")
        over = [node.hex() for node, count in self.workers if count > groups_per_round]
        if over:
            raise CommitteeError("bad_entry", f"workers with more than {groups_per_round} groups: {over[:4]}")
        return {node: groups_per_round - count for node, count in self.workers if count < groups_per_round}


def alpha(draw: Draw, version: int, manifest_root: bytes) -> bytes:
    """The VRF input: domain || u64be(round) || manifest_root (57 bytes for the committee)."""
    if type(version) is not int or not 0 <= version < _U64:
        raise CommitteeError("bad_round", f"round must be a u64, got {shown(version)}")
    if type(manifest_root) is not bytes or len(manifest_root) != 32:
        raise CommitteeError("bad_entry", f"manifest root must be 32 bytes, got {shown(manifest_root)}")
    domain = _SEAT_DOMAINS.get(draw) if isinstance(draw, str) else None
    if domain is None:
        raise CommitteeError("bad_draw", f"only a committee or recheck seat is drawn, not {shown(draw)}")
    return domain + _u64(version) + manifest_root


# -- the paged manifest (specs/committee.md §3, §4) ----------------------------------------------


class List(StrEnum):
    """The three lists a paged manifest commits (specs/committee.md §3.2)."""

    GROUPS = "groups"  # leaf: a group digest
    WEIGHTS = "weights"  # leaf: node || u32be(w)
    WORKERS = "workers"  # leaf: node || u32be(count)


def entry_leaf(node: bytes, value: int) -> bytes:
    """A weights or workers leaf: node || u32be(value)."""
    _node_id(node, "entry")
    if type(value) is not int or not 1 <= value < 1 << 32:
        raise CommitteeError("bad_entry", f"an entry's value must be in [1, 2^32), got {shown(value)}")
    return node + _u32(value)


def _hash32(value: object, what: str) -> bytes:
    if type(value) is not bytes or len(value) != merkle.HASH_BYTES:
        raise CommitteeError("bad_entry", f"{what} must be {merkle.HASH_BYTES} bytes, got {shown(value)}")
    return value


def _count(value: object, what: str, low: int = 0) -> int:
    if type(value) is not int or not low <= value <= MAX_PAGED_ENTRIES:
        raise CommitteeError("too_many", f"{what} must be in [{low}, {MAX_PAGED_ENTRIES}], got {shown(value)}")
    return value


@dataclass(frozen=True, slots=True)
class ManifestHeader:
    """What a paged manifest gossips (specs/committee.md §3.2, §3.3): the round, k, and each list's
    size and Merkle root, with the weights' sum W. Constant size whatever N."""

    round: int
    committee_size: int
    groups: int
    groups_root: bytes
    weights: int
    total_weight: int
    weights_root: bytes
    workers: int
    workers_root: bytes
    seat_rule: int  # the draw's rule (§2), named by the manifest and bound by its root

    def __post_init__(self) -> None:
        if type(self.round) is not int or not 0 <= self.round < _U64:
            raise CommitteeError("bad_round", f"round must be a u64, got {shown(self.round)}")
        _seat_rule(self.seat_rule)
        if type(self.committee_size) is not int or not 1 <= self.committee_size <= MAX_COMMITTEE_SIZE:
            raise CommitteeError("bad_size", f"committee size must be in [1, {MAX_COMMITTEE_SIZE}], "
                                             f"got {shown(self.committee_size)}")
        _count(self.groups, "groups", 1)
        _count(self.weights, "weights")
        _count(self.workers, "workers", 1)
        if self.workers > self.groups:
            raise CommitteeError("bad_entry", f"{self.workers} workers cannot share {self.groups} groups")
        if type(self.total_weight) is not int or not self.weights <= self.total_weight <= self.weights * WEIGHT_SCALE:
            raise CommitteeError("bad_weight", f"W must be the sum of {self.weights} weights in [1, {WEIGHT_SCALE}], "
                                               f"got {shown(self.total_weight)}")
        for name in ("groups_root", "weights_root", "workers_root"):
            _hash32(getattr(self, name), name)

    @property
    def root(self) -> bytes:
        """manifest_root = H(domain || u64be(r) || u32be(k) || u32be(n) || groups_root ||
        u32be(m) || u64be(W) || weights_root || u32be(q) || workers_root), the domain
        "vrl/manifest/v2" || 0x00 for seat rule 1 and "vrl/manifest/v3" || 0x00 for rule 2."""
        return hashlib.sha256(_ROOT_DOMAINS[self.seat_rule] + _u64(self.round) + _u32(self.committee_size)
                              + _u32(self.groups) + self.groups_root
                              + _u32(self.weights) + _u64(self.total_weight) + self.weights_root
                              + _u32(self.workers) + self.workers_root).digest()

    def alpha(self, draw: Draw) -> bytes:
        return alpha(draw, self.round, self.root)

    def size(self, which: List) -> int:
        return {List.GROUPS: self.groups, List.WEIGHTS: self.weights, List.WORKERS: self.workers}[List(which)]

    def root_of(self, which: List) -> bytes:
        return {List.GROUPS: self.groups_root, List.WEIGHTS: self.weights_root,
                List.WORKERS: self.workers_root}[List(which)]

    def threshold(self, weight: int) -> int:
        """T_v = min(2^64, floor(k w_v 2^64 / W)) for a verifier of weight ``weight`` (0: none)."""
        if weight == 0 or self.total_weight == 0:
            return 0
        return min(_U64, (self.committee_size * weight << 64) // self.total_weight)

    def seat_value(self, beta: bytes, position: int) -> int:
        """The seat value at ``position`` under this manifest's seat rule (:func:`seat_value`)."""
        return seat_value(beta, position, self.seat_rule)

    def seats(self, beta: bytes, weight: int) -> tuple[int, ...]:
        """The positions a verifier of weight ``weight`` and round output ``beta`` sits on."""
        return seats(beta, self.groups, self.threshold(weight), self.seat_rule)


@dataclass(frozen=True, slots=True)
class Entries:
    """An ``entries`` answer (specs/committee.md §3.5): positions of one list, their leaves,
    and the multiproof of them under that list's root."""

    round: int
    list: List
    positions: tuple[int, ...]
    leaves: tuple[bytes, ...]
    proof: tuple[bytes, ...]

    def found(self) -> dict[bytes, tuple[int, bytes]]:
        """Each answered leaf's key (its first 32 bytes) -> (position, leaf)."""
        return {leaf[:32]: (i, leaf) for i, leaf in zip(self.positions, self.leaves, strict=True)}


class PagedManifest:
    """The whole of a paged manifest: its lists and their trees, held by the trainer that signs
    it and by an audit (specs/committee.md §3.6). Built from a round's content: the header, and
    the answer to any ``entries`` request."""

    def __init__(self, content: ManifestContent) -> None:
        self.content = content
        weights = content.weights
        self.trees = {List.GROUPS: merkle.Tree(content.groups),
                      List.WEIGHTS: merkle.Tree([entry_leaf(node, w) for node, w in weights.entries]),
                      List.WORKERS: merkle.Tree([entry_leaf(node, c) for node, c in content.workers])}
        self._leaf_keys: dict[List, list[bytes]] = {}
        self.header = ManifestHeader(content.round, weights.committee_size,
                                     len(content.groups), self.trees[List.GROUPS].root,
                                     len(weights.entries), weights.total, self.trees[List.WEIGHTS].root,
                                     len(content.workers), self.trees[List.WORKERS].root, content.seat_rule)

    def _keys(self, which: List) -> list[bytes]:
        """Each leaf's key (its first 32 bytes), computed once a list: a keys request is a
        bisection, not a pass over up to 2^18 leaves (80 ms each, which any peer could ask for)."""
        if which not in self._leaf_keys:
            self._leaf_keys[which] = [leaf[:32] for leaf in self.trees[which].leaves]
        return self._leaf_keys[which]

    def answer(self, which: List, positions: Iterable[int] = (), keys: Iterable[bytes] = ()) -> Entries:
        """The answer to an ``entries`` request: the positions asked, or for each key its
        position or the adjacent ones bracketing it (§3.5)."""
        tree, positions, keys = self.trees[List(which)], tuple(positions), tuple(keys)
        if bool(positions) == bool(keys):
            raise CommitteeError("bad_request", "an entries request names positions or keys, one of them")
        if len(positions) + len(keys) > MAX_ENTRIES_PER_REQUEST:
            raise CommitteeError("too_many", f"at most {MAX_ENTRIES_PER_REQUEST} positions or keys a request")
        if keys:
            leaf_keys = self._keys(List(which))
            wanted: set[int] = set()
            for key in keys:
                at = bisect.bisect_left(leaf_keys, _node_id(key, "key"))
                if at < len(leaf_keys) and leaf_keys[at] == key:
                    wanted.add(at)
                else:  # absent: the neighbours that bracket it (one at either end)
                    wanted |= {i for i in (at - 1, at) if 0 <= i < len(leaf_keys)}
            positions = tuple(sorted(wanted))
        if not positions:  # keys asked of an empty list: nothing to prove
            return Entries(self.header.round, List(which), (), (), ())
        try:
            proof = tree.prove(positions)
        except merkle.MerkleError as e:
            raise CommitteeError("bad_request", str(e)) from None
        return Entries(self.header.round, List(which), positions, tuple(tree.leaves[i] for i in positions), proof)


def check_entries(header: ManifestHeader, answer: Entries, which: List | str, positions: Iterable[int] = (),
                  keys: Iterable[bytes] = ()) -> Entries:
    """Accept an ``entries`` answer to a request for ``positions`` or ``keys`` of the list
    ``which`` (specs/committee.md §3.5): it is of that list and round, its multiproof holds
    under the header's root of that list, its keys increase with their positions, and it
    answers every position asked, or finds or brackets every key asked. Returns it; raises
    CommitteeError ``bad_entries``."""
    if not isinstance(answer, Entries):
        raise CommitteeError("bad_entries", f"expected Entries, got {shown(answer)}")
    positions, keys = tuple(positions), tuple(keys)
    if answer.list not in tuple(List) or which not in tuple(List) or List(answer.list) != List(which):
        raise CommitteeError("bad_entries", f"an answer of list {shown(answer.list)} to a request of {shown(which)}")
    which = List(answer.list)
    size = header.size(which)
    if type(answer.round) is not int or answer.round != header.round:
        raise CommitteeError("bad_entries", f"an answer for round {shown(answer.round)}, not {header.round}")
    if not answer.positions:
        if keys and size == 0:
            return answer  # nothing is in an empty list
        raise CommitteeError("bad_entries", "an answer with no entry")
    try:
        merkle.verify(header.root_of(which), size, answer.positions, answer.leaves, answer.proof)
    except merkle.MerkleError as e:
        raise CommitteeError("bad_entries", f"the {which} entries do not prove: {e}") from None
    width = 32 if which is List.GROUPS else 36
    if any(len(leaf) != width for leaf in answer.leaves):
        raise CommitteeError("bad_entries", f"a {which} leaf is {width} bytes")
    got = [leaf[:32] for leaf in answer.leaves]
    for (i, a), (j, b) in zip(zip(answer.positions, got, strict=True), zip(answer.positions[1:], got[1:], strict=False),
                              strict=False):
        if a >= b:
            raise CommitteeError("bad_entries", f"keys at positions {i} and {j} are not increasing")
    if positions and positions != answer.positions:
        raise CommitteeError("bad_entries", "the answer is not the positions asked")
    at = dict(zip(answer.positions, got, strict=True))
    for key in keys:
        k = bisect.bisect_left(got, key)
        if k < len(got) and got[k] == key:
            continue
        below, above = (answer.positions[k - 1] if k else None), (answer.positions[k] if k < len(got) else None)
        bracketed = ((below is None and above == 0) or (above is None and below == size - 1)
                     or (below is not None and above is not None and above == below + 1))
        if not bracketed or (below is not None and at[below] >= key):
            raise CommitteeError("bad_entries", f"key {key.hex()[:16]} is neither found nor shown absent")
    return answer


def _seat_rule(rule: object) -> int:
    if type(rule) is not int or rule not in SEAT_RULES:
        raise CommitteeError("bad_rule", f"a seat rule is one of {SEAT_RULES}, got {shown(rule)}")
    return rule


def seat_value(beta: bytes, position: int, rule: int) -> int:
    """The seat value of position ``i`` (specs/committee.md §2): under rule 1,
    u64be(SHA-256("vrl/seat/v1" || 0x00 || beta || u32be(i))[0:8]); under rule 2, the u64be
    word ``i mod 8`` of SHA-512("vrl/seat/v2" || 0x00 || beta || u32be(i div 8))."""
    if type(beta) is not bytes or len(beta) != vrf.OUTPUT_BYTES:
        raise CommitteeError(Refusal.BAD_PROOF, f"beta must be {vrf.OUTPUT_BYTES} bytes, got {shown(beta)}")
    if type(position) is not int or not 0 <= position < 1 << 32:
        raise CommitteeError("bad_entry", f"a position is a u32, got {shown(position)}")
    if _seat_rule(rule) == 1:
        return int.from_bytes(hashlib.sha256(SEAT_DOMAIN + beta + _u32(position)).digest()[:8], "big")
    block, word = divmod(position, _SEATS_A_BLOCK)
    digest = hashlib.sha512(SEAT_V2_DOMAIN + beta + _u32(block)).digest()
    return int.from_bytes(digest[8 * word:8 * word + 8], "big")


def seats(beta: bytes, groups: int, threshold: int, rule: int) -> tuple[int, ...]:
    """The positions of a groups list of ``groups`` entries that the verifier whose round output
    is ``beta`` sits on under seat rule ``rule`` (specs/committee.md §2): those whose seat value
    is below ``threshold``."""
    seat_value(beta, 0, rule)  # checks beta and the rule once
    _count(groups, "groups")
    if type(threshold) is not int:
        raise CommitteeError("bad_weight", f"a threshold is an int, got {shown(threshold)}")
    if threshold <= 0:
        return ()
    if threshold >= _U64:
        return tuple(range(groups))
    pack = _U32.pack
    if rule == 1:
        # u64be(digest[0:8]) < T exactly when the digest sorts below T's 8 big-endian bytes (a
        # longer string with an equal prefix sorts after it): one bytes compare a position.
        prefix, below = hashlib.sha256(SEAT_DOMAIN + beta), threshold.to_bytes(8, "big")
        out = []
        for i in range(groups):
            h = prefix.copy()
            h.update(pack(i))
            if h.digest() < below:
                out.append(i)
        return tuple(out)
    # Rule 2: one SHA-512 a block of 8 positions, its words compared at once (numpy reads them
    # big-endian); the last block's words past ``groups`` are dropped.
    prefix = hashlib.sha512(SEAT_V2_DOMAIN + beta)
    blocks = []
    for b in range(-(-groups // _SEATS_A_BLOCK)):
        h = prefix.copy()
        h.update(pack(b))
        blocks.append(h.digest())
    values = np.frombuffer(b"".join(blocks), dtype=">u8")[:groups]
    return tuple(np.flatnonzero(values < np.uint64(threshold)).tolist())


def check_weight(header: ManifestHeader, verifier: bytes, weight: tuple[int, int],
                 weight_path: tuple[bytes, ...]) -> int:
    """Step 2 of a claim (specs/committee.md §4): the weights path proves ``verifier ||
    u32be(w)`` at position ``j`` of ``weight = (j, w)``, else CommitteeError ``not_eligible``.
    Returns T_v."""
    if type(verifier) is not bytes or len(verifier) != 32 or type(weight) is not tuple or len(weight) != 2 \
            or type(weight[0]) is not int or type(weight[1]) is not int or not 1 <= weight[1] <= WEIGHT_SCALE:
        raise CommitteeError(Refusal.NOT_ELIGIBLE, f"a weights entry is a 32-byte node id and (position, 1 <= w <= "
                                             f"{WEIGHT_SCALE}), got {shown(verifier)}, {shown(weight)}")
    try:
        merkle.verify(header.weights_root, header.weights, (weight[0],), (entry_leaf(verifier, weight[1]),),
                      weight_path)
    except merkle.MerkleError as e:
        raise CommitteeError(Refusal.NOT_ELIGIBLE, f"{verifier.hex()} with weight {weight[1]} at {weight[0]} "
                                             f"is not in the weights list: {e}") from None
    return header.threshold(weight[1])


def check_place(header: ManifestHeader, seat: int, group: bytes, group_path: tuple[bytes, ...]) -> None:
    """Step 3 of a claim (specs/committee.md §4): the groups path proves ``group`` at ``seat``,
    else CommitteeError ``not_in_manifest``."""
    try:
        merkle.verify(header.groups_root, header.groups, (seat,), (group,), group_path)
    except merkle.MerkleError as e:
        raise CommitteeError(Refusal.NOT_IN_MANIFEST,
                             f"group {shown(group)} is not at position {shown(seat)}: {e}") from None


def check_seat(header: ManifestHeader, verifier: bytes, weight: tuple[int, int], weight_path: tuple[bytes, ...],
               seat: int, group: bytes, group_path: tuple[bytes, ...]) -> int:
    """Steps 2 and 3 of a claim (specs/committee.md §4), before any signature: the weights
    entry (:func:`check_weight`) and the place (:func:`check_place`). Returns T_v."""
    threshold = check_weight(header, verifier, weight, weight_path)
    check_place(header, seat, group, group_path)
    return threshold
