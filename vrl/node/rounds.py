"""The committee design's part of a node's state (specs/committee.md): the round manifests it
holds, its own VRF outputs, and the outputs of others it has verified.

A sub-machine of :class:`vrl.node.protocol.NodeProtocol`, pure like it: no I/O, no clock. The
protocol asks it whether this node sits on a group's committee (:meth:`Rounds.draw`), whether a
received verdict's claim stands (:meth:`Rounds.refusal`), and, for the trainer, for the manifest
that closes a round (:meth:`Rounds.close`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from proofs import vrf
from vrl.node import committee
from vrl.node.claims import LossClaims
from vrl.node.committee import Draw
from vrl.node.events import Action, FetchGroup, Persist, Publish, Send
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_VERDICTS,
    Outcome,
    RoundManifest,
    SignedVerdict,
    VerdictDraw,
)
from vrl.node.reputation import ReputationError, withheld_of
from vrl.rollouts.keys import NodeKey

#: The protocol these rules read (vrl.node.protocol.NodeProtocol; not imported: it imports this module).
NodeProtocol = Any

#: Why a verdict's committee claim is refused (specs/committee.md §4), besides CommitteeError's
#: codes (not_eligible, bad_proof, not_drawn).
NO_MANIFEST = "no_manifest"  # not refused: it waits, bounded, for its round's manifest
NOT_IN_MANIFEST = "not_in_manifest"
NO_CLAIM = "no_claim"
WRONG_DESIGN = "wrong_design"

# A node re-evaluates reputation (EigenTrust over every report held) at most this often within a
# round, besides at each new round, in either design (specs/reputation.md §2, committee.md §8):
# at N = 1,000 a committee trainer holds ~50,000 new reports a round, and a recomputation per
# report made round 0 never finish (bench/results/simulate-scale.json); nor did the ticket
# design's round 0 at N = 100 (bench/results/simulate-tickets-100-partial.json). 5 s is 20 of
# the daemon's ticks and a twelfth of round_timeout: a confirmed cheat is quarantined at most
# 5 s later than at once, while its failed groups are held back by their failures alone
# (specs/network.md §5.2).
REPUTATION_EVERY_SECONDS = 5.0

_PROVEN = {VerdictDraw.COMMITTEE: Draw.COMMITTEE, VerdictDraw.RECHECK: Draw.RECHECK}


class Rounds:
    """Manifests by round, and the VRF outputs this node computed or verified."""

    def __init__(self, key: NodeKey, trainer: bytes) -> None:
        self.key, self.trainer = key, trainer
        self.manifests: dict[int, RoundManifest] = {}
        self.received_at: dict[int, float] = {}
        self.round_of: dict[bytes, int] = {}  # group digest -> the round whose manifest lists it
        # round -> {worker: its groups of the round this node held, unquarantined, when the
        # manifest came, that the manifest leaves out}: evidence a trainer framed a worker as
        # withholding (specs/committee.md §7), which this node can show but not prove.
        self.omitted: dict[int, dict[bytes, int]] = {}
        # round -> {verifier: weight} of its table: the claim's lookup (specs/committee.md §4 step
        # 2) is one hash lookup, not a walk of up to 1,024 entries, since it is all a fresh key's
        # verdict costs (§7); and (round, verifier) -> T_v, computed once.
        self._eligible: dict[int, dict[bytes, int]] = {}
        self._thresholds: dict[tuple[int, bytes], int] = {}
        self._mine: dict[tuple[int, Draw], tuple[bytes, bytes]] = {}  # (round, draw) -> (pi, beta)
        # (verifier, round, draw) -> (pi, beta) once verified: one VRF verification per verifier
        # and round; a different pi for the same triple is verified again (specs/vrf.md §5).
        self._verified: dict[tuple[bytes, int, Draw], tuple[bytes, bytes]] = {}
        self._seats: dict[tuple[int, Draw], frozenset[bytes]] = {}  # (round, draw) -> the digests drawn for
        self.fetched: set[int] = set()  # rounds whose committee seats' groups are all held
        self.claims = LossClaims()  # the trainer's loss confirmations charged to members (vrl.node.claims)
        # The trainer's: held groups no longer fresh on which a failure counted, checked again
        # while it holds them and their version's weights (late_rechecks).
        self.late_failures: set[bytes] = set()
        # Rounds below ``floor`` are forgotten (:meth:`forget`): their manifests come again in
        # backfill and must not count twice. ``added`` counts manifests ever held (a pass's key).
        self.floor, self.added = 0, 0

    # -- manifests --------------------------------------------------------------------------
    def add(self, manifest: RoundManifest, now: float) -> bool:
        """Hold a manifest: the configured trainer's, signed, the first one of its round."""
        if (manifest.trainer != self.trainer or manifest.round in self.manifests or manifest.round < self.floor
                or not manifest.valid()):
            return False
        self.added += 1
        self.manifests[manifest.round] = manifest
        self.received_at[manifest.round] = now
        self._eligible[manifest.round] = dict(manifest.weights)
        for digest in manifest.groups:
            self.round_of.setdefault(digest, manifest.round)
        return True

    def forget(self, floor: int) -> None:
        """Drop every round below ``floor``: no group of it is fresh any more, so no check, claim
        or fetch names it. A member holds each manifest's digests (128 KiB a round at N = 1,000);
        kept forever, they were the simulator's largest growth, and a long-running node's."""
        if floor <= self.floor:
            return
        for round_ in [r for r in self.manifests if r < floor]:
            manifest = self.manifests.pop(round_)
            for digest in manifest.groups:
                if self.round_of.get(digest) == round_:
                    del self.round_of[digest]
            for table in (self.received_at, self.omitted, self._eligible):
                table.pop(round_, None)
            self.fetched.discard(round_)
        for table in (self._thresholds, self._mine, self._seats):
            for key in [k for k in table if k[0] < floor]:
                del table[key]
        for key in [k for k in self._verified if k[1] < floor]:
            del self._verified[key]
        self.claims.forget(floor)
        self.floor = floor

    def listed(self, digest: bytes, version: int) -> bool | None:
        """Whether a group of ``version`` is in its round's manifest; None while there is none."""
        if version not in self.manifests:
            return None
        return self.round_of.get(digest) == version

    def close(self, round_: int, committee_size: int, groups: Iterable[tuple[bytes, bytes]],
              weights: Mapping[bytes, float], now: float,
              rank: Callable[[bytes], Any] = lambda worker: worker) -> RoundManifest:
        """The trainer's manifest of round ``round_``: ``groups`` as (digest, subject), the
        eligible verifiers' draw weights (committee.seat_weights, specs/committee.md §3.1); signed, and held.

        Workers are taken in ``rank`` order (the trainer's: highest score first, so a flood of
        fresh keys cannot push an established worker out); past the manifest's capacity a
        worker is left out whole, never cut short: a worker cut short would look withholding
        (specs/committee.md §7.1), one left out is absent, which costs it nothing."""
        by_worker: dict[bytes, list[bytes]] = defaultdict(list)
        for digest, subject in set(groups):
            by_worker[subject].append(digest)
        listed_digests: list[bytes] = []
        workers: list[tuple[bytes, int]] = []
        for subject in sorted(by_worker, key=rank):
            digests = by_worker[subject]
            if (len(workers) == committee.MAX_WORKER_ENTRIES
                    or len(listed_digests) + len(digests) > committee.MAX_MANIFEST_GROUPS):
                continue
            workers.append((subject, len(digests)))
            listed_digests += digests
        workers.sort()
        listed = tuple(sorted(listed_digests))
        table = committee.WeightsTable.heaviest(committee_size, weights)
        manifest = RoundManifest(self.key.node_id, round_, committee_size, table.entries, listed,
                                 tuple(workers)).signed(self.key)
        self.add(manifest, now)
        return manifest

    def threshold(self, round_: int, verifier: bytes) -> int:
        """T_v of ``verifier`` in round ``round_``'s table (0 if not in it), computed once."""
        if (round_, verifier) not in self._thresholds:
            self._thresholds[round_, verifier] = self.manifests[round_].content.weights.threshold(verifier)
        return self._thresholds[round_, verifier]

    # -- draws ------------------------------------------------------------------------------
    def own(self, round_: int, draw: Draw) -> tuple[bytes, bytes]:
        """This node's (pi, beta) for a round and draw: one VRF evaluation, kept."""
        if (round_, draw) not in self._mine:
            pi = vrf.prove(self.key.private_seed(), self.manifests[round_].content.alpha(draw))
            self._mine[round_, draw] = (pi, vrf.proof_to_hash(pi))
        return self._mine[round_, draw]

    def draw(self, digest: bytes, draw: Draw) -> bytes | None:
        """This node's proof if it sits on ``digest``'s committee of that draw, else None."""
        round_ = self.round_of.get(digest)
        if round_ is None:
            return None
        threshold = self.threshold(round_, self.key.node_id)
        if threshold == 0:
            return None
        pi, beta = self.own(round_, draw)
        return pi if committee.is_member(beta, digest, threshold) else None

    def seats(self, round_: int, draw: Draw) -> frozenset[bytes]:
        """The digests of manifest ``round_`` this node sits on the committee of (one hash per
        listed group, once a round): what it fetches and checks (specs/network.md §3.5)."""
        if (round_, draw) not in self._seats:
            manifest = self.manifests[round_]
            threshold = manifest.content.weights.threshold(self.key.node_id)
            beta = self.own(round_, draw)[1] if threshold else b""
            self._seats[round_, draw] = frozenset(
                d for d in manifest.groups if threshold and committee.is_member(beta, d, threshold))
        return self._seats[round_, draw]

    # -- claims of others -------------------------------------------------------------------
    def refusal(self, verdict: SignedVerdict, trusted: frozenset[bytes]) -> str | None:
        """Why a verdict's claim does not stand in the committee design (specs/committee.md §4),
        or None if it does; NO_MANIFEST while its round's manifest is not held. The cheap steps
        (manifest, table, listing) come before any signature or VRF: a fresh key's verdict is
        refused after two lookups."""
        manifest = self.manifests.get(verdict.policy_version)
        if manifest is None:
            return NO_MANIFEST
        if verdict.draw == VerdictDraw.NONE:
            if verdict.verifier != self.trainer and verdict.verifier not in trusted:
                return NO_CLAIM
        elif verdict.draw == VerdictDraw.TICKET or verdict.verifier not in self._eligible[manifest.round]:
            return "not_eligible"
        if self.round_of.get(verdict.group) != verdict.policy_version:
            return NOT_IN_MANIFEST
        if verdict.outcome == Outcome.SKIPPED:
            return "skip_in_committee"
        if not verdict.signature_ok():
            return "bad_signature"
        if verdict.draw == VerdictDraw.NONE:
            return None
        draw = _PROVEN[verdict.draw]
        known = self._verified.get((verdict.verifier, manifest.round, draw))
        if known is not None and known[0] == verdict.pi:
            beta = known[1]
        else:
            try:
                beta = vrf.verify(verdict.verifier, verdict.pi, manifest.content.alpha(draw))
            except vrf.VrfError:
                return "bad_proof"
            self._verified[verdict.verifier, manifest.round, draw] = (verdict.pi, beta)
        threshold = self.threshold(manifest.round, verdict.verifier)
        return None if committee.is_member(beta, verdict.group, threshold) else "not_drawn"


# -- the protocol's committee rules (functions of its state, as vrl.node.steps reads the Ledger) --


def committee_checks(node: NodeProtocol) -> list[Action]:
    """The committee design's checks (specs/committee.md §2, §8): a member fetches and checks its
    groups; a counting failure or a suspect's group goes to the fresh recheck committee; the
    trainer checks failures, suspects, its lazy-verifier audits, groups a member states lost races
    on (within that member's budget, vrl.node.claims), and groups no counting verdict reached
    within ``submission_window`` of the manifest (an empty or silent committee)."""
    actions: list[Action] = []
    trainer = node.has("trainer")
    if not trainer and node.has("verifier"):
        actions += _fetches(node)
    # A node's checks wait while a batch's worth of them is under way (re-checks of failures never
    # wait): its one model thread, first come first served, must still train or generate. At
    # N = 1,000 the trainer's ~4,000 fallback checks of round 0, all asked at once, queued ~480 s
    # ahead of its step; a member's 1,200-2,000 seats of the first bootstrap manifest, ~85 s
    # ahead of its next generation, whose groups came after their round had closed
    # (bench/simulate.py; specs/committee.md §8, §9).
    room: int | None = None  # counted at its first use: most passes ask for no check
    budget = node.config.loss_claim_budget

    def own(digest: bytes) -> SignedVerdict | None:  # the trainer's own verdict on a group, if any
        return node.verdicts.get(digest, {}).get(node.me)

    candidates = node.scans.checks.candidates(node, scan_key(node))
    if node.abandoned_checks:  # a check that could not run is asked again behind those waiting
        candidates.sort(key=lambda d: node.abandoned_checks.get(d, 0))  # stable: arrival order within
    for digest in candidates:
        group, round_ = node.groups[digest], node.rounds.round_of.get(digest)
        if (round_ is None or group.subject == node.me or digest in node.planted or node.me in node.verdicts[digest]
                or group.version not in node.loaded or group.subject in node.quarantined
                or ("check", digest) in node._in_flight):  # under way: its end touches it again
            continue
        others = [v for verifier, v in node.verdicts[digest].items() if verifier != node.me]
        failed = any(v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) and (trainer or node.weighs(v))
                     for v in others)
        if trainer:
            unchecked = not any(node.weighs(v) for v in others)
            if failed or node.suspect(group.subject):
                actions += node._check(digest, group.version, VerdictDraw.NONE, b"")
            else:
                claim = None
                if not (any(node._audits(v) for v in others) or (
                        unchecked and node.now - node.rounds.received_at[round_] >= node.config.submission_window)):
                    claims = [v for v in others if _states_losses(v)]
                    if not claims:
                        continue
                    claim = node.rounds.claims.pick(claims, budget, own)
                    if claim is None:  # every claimant's budget is spent (specs/committee.md §8)
                        if node.rounds.claims.open(claims, own):
                            node.scans.checks.dirty.add(digest)  # a charge under way may be confirmed
                        continue
                if room is None:
                    room = _check_room(node)
                if room <= 0:
                    node.scans.checks.dirty.add(digest)  # deferred: looked at again on the next pass
                    continue
                new = node._check(digest, group.version, VerdictDraw.NONE, b"")
                if new and claim is not None:
                    node.rounds.claims.charge(round_, claim, budget)
                room -= len(new)
                actions += new
        elif node.has("verifier"):
            seats = ([Draw.RECHECK] if failed or node.suspect(group.subject) else []) + [Draw.COMMITTEE]
            seat = next((s for s in seats if digest in node.rounds.seats(round_, s)), None)
            if seat is None:
                continue
            if seat is Draw.COMMITTEE:
                if room is None:
                    room = _check_room(node)
                if room <= 0:
                    node.scans.checks.dirty.add(digest)  # deferred: looked at again on the next pass
                    continue
            new = node._check(digest, group.version, VerdictDraw(str(seat)), node.rounds.own(round_, seat)[0])
            if seat is Draw.COMMITTEE:
                room -= len(new)
            actions += new
    if trainer and node.rounds.late_failures:
        actions += late_rechecks(node)
    return actions


def _check_room(node: NodeProtocol) -> int:
    """How many more checks that wait may be asked now: a batch's worth under way at most."""
    return node.config.admission.batch_groups - sum(1 for key in node._in_flight if key[0] == "check")


def late_rechecks(node: NodeProtocol) -> list[Action]:
    """The trainer re-checks a failure that came once its group was no longer fresh, as it does
    a fresh one: only its pass clears the group and charges the accuser (specs/reputation.md §4
    rule 3, §5). Members' checks end after their round has gone stale where batches are smaller
    than a round; unchecked, a false accuser's late failures lowered honest workers' scores for
    good (12 nodes, 3 accusers: scores 0.3-0.6 against 0.8-0.9, bench/simulate.py)."""
    actions: list[Action] = []
    for digest in sorted(node.rounds.late_failures):
        group = node.groups.get(digest)
        if (group is None or node.me in node.verdicts.get(digest, {}) or group.version not in node.loaded
                or group.subject in node.quarantined):
            node.rounds.late_failures.discard(digest)  # checked, forgotten, moot, or its weights gone
            continue
        actions += node._check(digest, group.version, VerdictDraw.NONE, b"")
    return actions


def _states_losses(verdict: SignedVerdict) -> bool:
    """Whether a member's drawn check states lost races: the trainer checks the group too, so
    that the pooled test may count them (vrl.node.pooling: a loss counts once a pre-trusted
    check found it). Under the same wait as its audits: a liar's claims delay, never stop, a step."""
    return verdict.races_lost > 0 and verdict.draw == VerdictDraw.COMMITTEE


def _fetches(node: NodeProtocol) -> list[Action]:
    """A member fetches by digest the groups it is drawn for and does not hold (specs/network.md
    §3.5): its committee seats in each fresh round, and its recheck seats on groups a counting
    failure names (that failure waits among the pending verdicts until its group is here). Any
    verifier also fetches a group a pre-trusted node's failure names (the trainer's re-check is
    what confirms fraud, reputation.md §3): a verdict counts only on a group its node holds, so
    without it a view that sat on none of a cheat's groups never saw it quarantined (one honest
    view of 11 on a 12-node devnet, bench/results/devnet-committee.json). Only while the group's
    producer is not quarantined in this view: past that, its further groups would show nothing
    new, and a network of 1,000 with a tenth cheating fails ~400 groups in their first round."""
    actions: list[Action] = []
    wanted: list[tuple[bytes, int]] = []
    for round_ in sorted(node.rounds.manifests):
        if node._fresh(round_) and round_ in node.loaded and round_ not in node.rounds.fetched:
            missing = [d for d in sorted(node.rounds.seats(round_, Draw.COMMITTEE)) if d not in node.groups]
            if not missing:
                node.rounds.fetched.add(round_)  # groups are never dropped: nothing of it to fetch again
            wanted += [(d, round_) for d in missing]
    for verdict in node.waiting:
        round_ = node.rounds.round_of.get(verdict.group)
        if (round_ is not None and node._fresh(round_) and round_ in node.loaded
                and verdict.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)
                and ((verdict.verifier in node.reputation.pretrusted and verdict.subject not in node.quarantined)
                     or (node.weighs(verdict) and verdict.group in node.rounds.seats(round_, Draw.RECHECK)))):
            wanted.append((verdict.group, round_))
    for digest, round_ in wanted:
        if digest not in node.groups:
            actions += node._once(FetchGroup(digest, round_))
    return actions


def close_rounds(node: NodeProtocol) -> list[Action]:
    """The trainer closes each fresh round's submission window with its signed manifest
    (specs/committee.md §3.4): when every expected worker's groups are in, or after
    ``submission_window`` once no group arrived for ``verdict_wait``, or after
    ``submission_window + submission_grace`` whatever arrives. Eligible: every other node of
    nonzero weight (specs/committee.md §3.1)."""
    actions: list[Action] = []
    for version in sorted(v for v in node.policies if node._fresh(v) and v not in node.rounds.manifests):
        digests = [d for d in node._by_version.get(version, []) if node.groups[d].subject not in node.quarantined]
        counts = defaultdict(int)
        for d in digests:
            counts[node.groups[d].subject] += 1
        previous = node.rounds.manifests.get(version - 1)
        expected = {s for s, _ in previous.workers} if previous else set()
        expected |= {node.groups[d].subject for d in digests if d not in node.planted}
        # Complete: every expected worker's groups are in, and none arrived for verdict_wait (a
        # worker not yet seen this round may still be on its way: quiet, not merely full).
        last = max((node.groups[d].arrived for d in digests), default=node.now)
        quiet = node.now - last >= node.config.verdict_wait
        complete = bool(expected) and all(counts[s] >= node.config.groups_per_round for s in expected) and quiet
        open_for = node.now - node.round_started.get(version, node.now)
        if not complete and (open_for < node.config.submission_window or (
                not quiet and open_for < node.config.submission_window + node.config.submission_grace)):
            continue
        # Never closed empty (no worker's group yet): its groups, when they come, would be left
        # out, no batch would follow, no version, no next round: the network would stall (seen
        # on a 12-node devnet on 2 shared cores, where fetching a version's weights took workers
        # longer than submission_window: bench/results/devnet-committee.json).
        if all(d in node.planted for d in digests):
            continue
        weights = committee.seat_weights(node.reputation.standings(version), node.me)
        manifest = node.rounds.close(version, node.config.committee_size,
                                     [(d, node.groups[d].subject) for d in digests], weights, node.now,
                                     rank=lambda worker: (-node.standing(worker).score, worker))
        note_withheld(node, manifest)
        # The trainer's evaluation at the close (specs/committee.md §8) includes the withheld
        # records the manifest just implied: only the sums are redone (they move no weight);
        # its next event takes the evaluation's quarantines (rounds.evaluate: the first time).
        node.reputation.standings(version)
        node._evaluated = None
        actions.append(Publish(TOPIC_MANIFESTS, manifest.to_bytes()))
    return actions


def note_withheld(node: NodeProtocol, manifest: RoundManifest) -> None:
    """A held manifest's withheld slots feed the node's reputation view (specs/committee.md §7),
    as every node that holds the manifest derives them. A manifest listing a worker with more
    groups than a round holds is not this network's: it implies nothing (it is still held, for
    the committees it fixes). What this node held of the round that the manifest leaves out is
    kept in ``rounds.omitted``."""
    if not node.committee:
        return
    omitted: dict[bytes, int] = defaultdict(int)
    for digest in node._by_version.get(manifest.round, []):
        subject = node.groups[digest].subject
        if node.rounds.round_of.get(digest) != manifest.round and subject not in node.quarantined \
                and digest not in node.planted:
            omitted[subject] += 1
    node.rounds.omitted[manifest.round] = dict(omitted)
    try:
        records = withheld_of(manifest, node.config.groups_per_round)
    except ReputationError:
        return
    for record in records:
        node.reputation.add_withheld(record)


# -- routing (specs/network.md §3.5) and reputation's evaluation (specs/committee.md §8) --------


def submit(node: NodeProtocol, groups) -> list[Action]:
    """A worker's groups go to the trainer alone; members fetch them by digest. The worker holds
    its own, as a publisher gets its gossip back."""
    actions: list[Action] = []
    for group in groups:
        actions += node._accept_group(group, node.now)
    return actions + [Send(node.config.trainer, TOPIC_GROUPS, g.to_bytes()) for g in groups]


def route_verdict(node: NodeProtocol, verdict: SignedVerdict) -> list[Action]:
    """A pass concerns only the trainer, which decides and admits: sent to it alone (its own
    stored); a failure is gossiped, since it calls a recheck committee no sender can name."""
    if verdict.outcome != Outcome.PASS:
        return [Publish(TOPIC_VERDICTS, verdict.to_bytes())]
    if node.has("trainer"):
        return [Persist(verdict)]
    return [Send(node.config.trainer, TOPIC_VERDICTS, verdict.to_bytes())]


def verified(node: NodeProtocol, digest: bytes) -> bool:
    """Whether a decided group counts as checked for admission's trusted share (specs/reputation.md
    §6): a pass by a pre-trusted node; in the committee design also a pass by a member of its
    committee (a seat its claim proved, committee.md §4), the design's check of every group, which
    the anchors no longer make (committee.md §8 says why, and what trusted_share bounds then)."""
    anchors = node.reputation.pretrusted
    return any(v.outcome == Outcome.PASS and (v.verifier in anchors or (
        node.committee and v.draw in (VerdictDraw.COMMITTEE, VerdictDraw.RECHECK)))
        for v in node.verdicts[digest].values())


def evaluate(node: NodeProtocol, replaying: bool) -> bool:
    """Whether to evaluate reputation (and quarantines) now: the first time, when the round moved,
    and otherwise at most every REPUTATION_EVERY_SECONDS, and only if a report came since. Events
    absorbed in a batch (``replaying``) evaluate nothing: the batch's next live event does, once.
    Evidence is reports and withheld records alike (a manifest's records lower a score as a
    failure report does, specs/committee.md §7.1)."""
    last = node._evaluated
    if replaying or (last is not None and last[0] == (node.version or 0) and (
            node.reputation.held() == last[2] or node.now - last[1] < REPUTATION_EVERY_SECONDS)):
        return False
    node._evaluated = (node.version or 0, node.now, node.reputation.held())
    return True


# -- passes over the fresh groups, incremental (the trainer holds ~12,000 at N = 1,000) ---------


def scan_key(node: NodeProtocol) -> tuple:
    """Everything besides a group's own verdicts, arrival and check in flight that the rules over
    fresh groups read (committee_checks, ticket_checks, NodeProtocol.decided): while it is
    unchanged, only the groups touched since the last pass can come out differently."""
    deadlines = sum(1 for r, at in node.rounds.received_at.items()
                    if node._fresh(r) and node.now - at >= node.config.submission_window)
    return (node.version, len(node.loaded), node.rounds.added, len(node.quarantined), len(node.planted),
            len(node.refused), tuple(sorted(node.suspects.items())), node._evaluated, deadlines,
            tuple(sorted(v for v in node.policies if node._fresh(v))))


class Scan:
    """Which fresh groups one rule must look at again: all of them when the key moved, else those
    touched (a verdict, an arrival, a check begun or ended, a step trained on) since its last pass.
    The same answers as a pass over every fresh group, at the cost of the touched ones."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.dirty: set[bytes] = set()

    def candidates(self, node: NodeProtocol, key: tuple) -> list[bytes]:
        if key != self.key:
            self.key, self.dirty = key, set()
            return node._fresh_groups()
        touched, self.dirty = self.dirty, set()
        fresh = [d for d in touched if d in node.groups and node._fresh(node.groups[d].version)]
        return sorted(fresh, key=lambda d: (node.groups[d].arrived, d))  # ties (one arrival time) by digest


class Scans:
    """Incremental passes: the checks a node asks for (both designs' rules, committee_checks and
    vrl.node.tickets.ticket_checks), and the committee design's decisions (the ticket design's
    depend on the clock, verdict_wait, so they are made over every fresh group)."""

    def __init__(self) -> None:
        self.checks, self.decisions = Scan(), Scan()
        self.decided: dict[bytes, bool | None] = {}

    def touch(self, digest: bytes) -> None:
        self.checks.dirty.add(digest)
        self.decisions.dirty.add(digest)

    def forget(self, digest: bytes) -> None:
        """A group no longer held (vrl.node.forgetting): nothing of it is looked at again."""
        self.checks.dirty.discard(digest)
        self.decisions.dirty.discard(digest)
        self.decided.pop(digest, None)

    def decide(self, node: NodeProtocol, fresh: list[bytes]) -> dict[bytes, bool | None]:
        """NodeProtocol.decided of each fresh group, recomputed for the touched ones only."""
        key = scan_key(node)
        if key != self.decisions.key:
            self.decided = {}
        for digest in self.decisions.candidates(node, key):
            self.decided[digest] = node.decided(digest)
        return {d: self.decided[d] if d in self.decided else self.decided.setdefault(d, node.decided(d))
                for d in fresh}
