"""The committee design's part of a node's state (specs/committee.md): the round manifests it
holds, its own VRF outputs, and the outputs of others it has verified.

A sub-machine of :class:`vrl.node.protocol.NodeProtocol`, pure like it: no I/O, no clock. The
protocol asks it whether this node sits on a group's committee (:meth:`Rounds.draw`), whether a
received verdict's claim stands (:meth:`Rounds.refusal`), and, for the trainer, for the manifest
that closes a round (:meth:`Rounds.close`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from proofs import vrf
from vrl.node import committee
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
from vrl.rollouts.keys import NodeKey

#: The protocol these rules read (vrl.node.protocol.NodeProtocol; not imported: it imports this module).
NodeProtocol = Any

#: Why a verdict's committee claim is refused (specs/committee.md §4), besides CommitteeError's
#: codes (not_eligible, bad_proof, not_drawn).
NO_MANIFEST = "no_manifest"  # not refused: it waits, bounded, for its round's manifest
NOT_IN_MANIFEST = "not_in_manifest"
NO_CLAIM = "no_claim"
WRONG_DESIGN = "wrong_design"

# The committee design re-evaluates reputation (EigenTrust over every report held) at most this
# often within a round, besides at each new round (specs/committee.md §8): at N = 1,000 a
# trainer holds ~50,000 new reports a round, and a recomputation per report made round 0 never
# finish (bench/results/simulate-scale.json). 5 s is 20 of the daemon's ticks and a twelfth of
# round_timeout: a confirmed cheat is quarantined at most 5 s later than at once, while its
# failed groups are held back by their failures alone (specs/network.md §5.2).
REPUTATION_EVERY_SECONDS = 5.0

_PROVEN = {VerdictDraw.COMMITTEE: Draw.COMMITTEE, VerdictDraw.RECHECK: Draw.RECHECK}


class Rounds:
    """Manifests by round, and the VRF outputs this node computed or verified."""

    def __init__(self, key: NodeKey, trainer: bytes) -> None:
        self.key, self.trainer = key, trainer
        self.manifests: dict[int, RoundManifest] = {}
        self.received_at: dict[int, float] = {}
        self.round_of: dict[bytes, int] = {}  # group digest -> the round whose manifest lists it
        self._mine: dict[tuple[int, Draw], tuple[bytes, bytes]] = {}  # (round, draw) -> (pi, beta)
        # (verifier, round, draw) -> (pi, beta) once verified: one VRF verification per verifier
        # and round; a different pi for the same triple is verified again (specs/vrf.md §5).
        self._verified: dict[tuple[bytes, int, Draw], tuple[bytes, bytes]] = {}
        self._seats: dict[tuple[int, Draw], frozenset[bytes]] = {}  # (round, draw) -> the digests drawn for

    # -- manifests --------------------------------------------------------------------------
    def add(self, manifest: RoundManifest, now: float) -> bool:
        """Hold a manifest: the configured trainer's, signed, the first one of its round."""
        if manifest.trainer != self.trainer or manifest.round in self.manifests or not manifest.valid():
            return False
        self.manifests[manifest.round] = manifest
        self.received_at[manifest.round] = now
        for digest in manifest.groups:
            self.round_of.setdefault(digest, manifest.round)
        return True

    def listed(self, digest: bytes, version: int) -> bool | None:
        """Whether a group of ``version`` is in its round's manifest; None while there is none."""
        if version not in self.manifests:
            return None
        return self.round_of.get(digest) == version

    def close(self, round_: int, committee_size: int, groups: Iterable[tuple[bytes, bytes]],
              weights: Mapping[bytes, float], now: float) -> RoundManifest:
        """The trainer's manifest of round ``round_``: ``groups`` as (digest, subject), the
        eligible verifiers' reporter weights (specs/committee.md §3.1); signed, and held."""
        groups = sorted(set(groups))[:committee.MAX_MANIFEST_GROUPS]
        counts: dict[bytes, int] = {}
        for _, subject in groups:
            counts[subject] = counts.get(subject, 0) + 1
        workers = sorted(counts.items())[:committee.MAX_WORKER_ENTRIES]
        kept = {subject for subject, _ in workers}
        listed = tuple(sorted(d for d, subject in groups if subject in kept))
        eligible = sorted(weights.items(), key=lambda item: (-item[1], item[0]))[:committee.MAX_WEIGHT_ENTRIES]
        table = committee.WeightsTable.of(committee_size, dict(eligible))
        manifest = RoundManifest(self.key.node_id, round_, committee_size, table.entries, listed,
                                 tuple(workers)).signed(self.key)
        self.add(manifest, now)
        return manifest

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
        threshold = self.manifests[round_].content.weights.threshold(self.key.node_id)
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
        elif verdict.draw == VerdictDraw.TICKET or manifest.content.weights.weight(verdict.verifier) == 0:
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
        threshold = manifest.content.weights.threshold(verdict.verifier)
        return None if committee.is_member(beta, verdict.group, threshold) else "not_drawn"


# -- the protocol's committee rules (functions of its state, as vrl.node.steps reads the Ledger) --


def committee_checks(node: NodeProtocol) -> list[Action]:
    """The committee design's checks (specs/committee.md §2, §8): a member fetches and checks its
    groups; a counting failure or a suspect's group goes to the fresh recheck committee; the
    trainer checks failures, suspects, its lazy-verifier audits and groups no counting verdict
    reached within ``submission_window`` of the manifest (an empty or silent committee)."""
    actions: list[Action] = []
    trainer = node.has("trainer")
    if not trainer and node.has("verifier"):
        actions += _fetches(node)
    for digest in node.scans.checks.candidates(node, _scan_key(node)):
        group, round_ = node.groups[digest], node.rounds.round_of.get(digest)
        if (round_ is None or group.subject == node.me or digest in node.planted or node.me in node.verdicts[digest]
                or group.version not in node.loaded or group.subject in node.quarantined):
            continue
        others = [v for verifier, v in node.verdicts[digest].items() if verifier != node.me]
        failed = any(v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) and (trainer or node.weighs(v))
                     for v in others)
        if trainer:
            unchecked = not any(node.weighs(v) for v in others)
            if (failed or node.suspect(group.subject) or any(node._audits(v) for v in others)
                    or (unchecked and node.now - node.rounds.received_at[round_] >= node.config.submission_window)):
                actions += node._check(digest, group.version, VerdictDraw.NONE, b"")
        elif node.has("verifier"):
            seats = ([Draw.RECHECK] if failed or node.suspect(group.subject) else []) + [Draw.COMMITTEE]
            for seat in seats:
                if digest in node.rounds.seats(round_, seat):
                    actions += node._check(digest, group.version, VerdictDraw(str(seat)),
                                           node.rounds.own(round_, seat)[0])
                    break
    return actions


def _fetches(node: NodeProtocol) -> list[Action]:
    """A member fetches by digest the groups it is drawn for and does not hold (specs/network.md
    §3.5): its committee seats in each fresh round, and its recheck seats on groups a counting
    failure names (that failure waits among the pending verdicts until its group is here)."""
    actions: list[Action] = []
    wanted: list[tuple[bytes, int]] = []
    for round_ in sorted(node.rounds.manifests):
        if node._fresh(round_) and round_ in node.loaded:
            wanted += [(d, round_) for d in sorted(node.rounds.seats(round_, Draw.COMMITTEE))]
    for verdict in list(node._pending.values()):
        round_ = node.rounds.round_of.get(verdict.group)
        if (round_ is not None and node._fresh(round_) and round_ in node.loaded and node.weighs(verdict)
                and verdict.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)
                and verdict.group in node.rounds.seats(round_, Draw.RECHECK)):
            wanted.append((verdict.group, round_))
    for digest, round_ in wanted:
        if digest not in node.groups:
            actions += node._once(FetchGroup(digest, round_))
    return actions


def close_rounds(node: NodeProtocol) -> list[Action]:
    """The trainer closes each fresh round's submission window with its signed manifest
    (specs/committee.md §3.4): when every expected worker's groups are in, or after
    ``submission_window``. Eligible: every other node of nonzero weight (specs/committee.md §3.1)."""
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
        complete = (bool(expected) and all(counts[s] >= node.config.groups_per_round for s in expected)
                    and node.now - last >= node.config.verdict_wait)
        if not complete and node.now - node.round_started.get(version, node.now) < node.config.submission_window:
            continue
        # Never closed empty (no worker's group yet): its groups, when they come, would be left
        # out, no batch would follow, no version, no next round: the network would stall (seen
        # on a 12-node devnet on 2 shared cores, where fetching a version's weights took workers
        # longer than submission_window: bench/results/devnet-committee.json).
        if all(d in node.planted for d in digests):
            continue
        weights = {peer: standing.trust for peer, standing in node.reputation.standings(version).items()
                   if peer != node.me and standing.trust > 0 and not standing.quarantined}
        manifest = node.rounds.close(version, node.config.committee_size,
                                     [(d, node.groups[d].subject) for d in digests], weights, node.now)
        actions.append(Publish(TOPIC_MANIFESTS, manifest.to_bytes()))
    return actions


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


def evaluate(node: NodeProtocol, replaying: bool) -> bool:
    """Whether to evaluate reputation (and quarantines) now: the first time, when the round moved,
    and otherwise at most every REPUTATION_EVERY_SECONDS, and only if a report came since. Events
    absorbed in a batch (``replaying``) evaluate nothing: the batch's next live event does, once."""
    last = node._evaluated
    if replaying or (last is not None and last[0] == (node.version or 0) and (
            len(node.reputation) == last[2] or node.now - last[1] < REPUTATION_EVERY_SECONDS)):
        return False
    node._evaluated = (node.version or 0, node.now, len(node.reputation))
    return True


# -- passes over the fresh groups, incremental (the trainer holds ~12,000 at N = 1,000) ---------


def _scan_key(node: NodeProtocol) -> tuple:
    """Everything besides a group's own verdicts, arrival and check in flight that the rules over
    fresh groups read (committee_checks, NodeProtocol.decided): while it is unchanged, only the
    groups touched since the last pass can come out differently."""
    deadlines = sum(1 for r, at in node.rounds.received_at.items()
                    if node._fresh(r) and node.now - at >= node.config.submission_window)
    return (node.version, len(node.loaded), len(node.rounds.manifests), len(node.quarantined), len(node.planted),
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
        return sorted(fresh, key=lambda d: node.groups[d].arrived)


class Scans:
    """The committee design's incremental passes: the checks it asks for, and its decisions."""

    def __init__(self) -> None:
        self.checks, self.decisions = Scan(), Scan()
        self.decided: dict[bytes, bool | None] = {}

    def touch(self, digest: bytes) -> None:
        self.checks.dirty.add(digest)
        self.decisions.dirty.add(digest)

    def decide(self, node: NodeProtocol, fresh: list[bytes]) -> dict[bytes, bool | None]:
        """NodeProtocol.decided of each fresh group, recomputed for the touched ones only."""
        key = _scan_key(node)
        if key != self.decisions.key:
            self.decided = {}
        for digest in self.decisions.candidates(node, key):
            self.decided[digest] = node.decided(digest)
        return {d: self.decided[d] if d in self.decided else self.decided.setdefault(d, node.decided(d))
                for d in fresh}
