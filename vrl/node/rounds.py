"""The committee design's rules (specs/committee.md): functions of a node's state, read through
:class:`vrl.node.state.NodeState`, as :mod:`vrl.node.steps` reads its Ledger. The design's own
part of that state, the manifests and draws, is :class:`vrl.node.manifests.Rounds`.

Pure like the protocol: no I/O, no clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from vrl.node import committee
from vrl.node.committee import Draw
from vrl.node.events import Action, FetchEntries, FetchGroup, Persist, PersistManifest, Publish, Send
from vrl.node.manifests import Rounds as Rounds
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_VERDICTS,
    Group,
    ManifestLists,
    Outcome,
    RoundManifest,
    SignedVerdict,
)
from vrl.node.reputation import ReputationError, withheld_of
from vrl.node.scans import scan_key
from vrl.node.state import NodeState, NodeView

# A node re-evaluates reputation (EigenTrust over every report held) at most this often within a
# round, besides at each new round, in either design (specs/reputation.md §2, committee.md §8):
# at N = 1,000 a committee trainer holds ~50,000 new reports a round, and a recomputation per
# report made round 0 never finish (bench/results/simulate-scale.json); nor did the ticket
# design's round 0 at N = 100 (bench/results/simulate-tickets-100-partial.json). 5 s is 20 of
# the daemon's ticks and a twelfth of round_timeout: a confirmed cheat is quarantined at most
# 5 s later than at once, while its failed groups are held back by their failures alone
# (specs/network.md §5.2).
REPUTATION_EVERY_SECONDS = 5.0


def committee_checks(node: NodeState) -> list[Action]:
    """The committee design's checks (specs/committee.md §2, §8): a member fetches and checks its
    groups; a counting failure or a suspect's group goes to the fresh recheck committee; the
    trainer checks failures, suspects, its lazy-verifier audits, groups a member states lost races
    on (within that member's budget, vrl.node.claims), and groups no counting verdict reached
    within ``submission_window`` of the manifest (an empty or silent committee)."""
    actions: list[Action] = []
    trainer = node.has("trainer")
    if not trainer and node.has("verifier"):
        actions += _fetches(node)
    if not trainer and node.has("worker"):
        actions += own_listing(node)
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

    candidates = node.scans.checks.candidates(node, scan_key(node), lambda: _check_room(node))
    if node.abandoned_checks:  # a check that could not run is asked again behind those waiting
        candidates.sort(key=lambda d: node.abandoned_checks.get(d, 0))  # stable: arrival order within
    for digest in candidates:
        # listed_in: the version whose manifest lists the group, which a check must prove it sits on
        group, listed_in = node.groups[digest], node.rounds.round_of.get(digest)
        if (listed_in is None or group.subject == node.me or digest in node.planted or node.me in node.verdicts[digest]
                or group.version not in node.loaded or group.subject in node.quarantined
                or node.checking(digest)):  # under way: its end touches it again
            continue
        others = [v for verifier, v in node.verdicts[digest].items() if verifier != node.me]
        failed = any(v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) and (trainer or node.weighs(v))
                     for v in others)
        if trainer:
            unchecked = not any(node.weighs(v) for v in others)
            if failed or node.suspect(group.subject):
                actions += node.start_check(digest, group.version, Draw.NONE, b"")
            else:
                claim = None
                if not (any(node.audits(v) for v in others) or (
                        unchecked and node.now - node.rounds.received_at[listed_in] >= node.config.submission_window)):
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
                    node.scans.checks.defer(digest)  # looked at again once there is room
                    continue
                new = node.start_check(digest, group.version, Draw.NONE, b"")
                if new and claim is not None:
                    node.rounds.claims.charge(listed_in, claim, budget)
                room -= len(new)
                actions += new
        elif node.has("verifier"):
            seats = ([Draw.RECHECK] if failed or node.suspect(group.subject) else []) + [Draw.COMMITTEE]
            seat = next((s for s in seats if node.rounds.sits(digest, s)), None)
            if seat is None:
                continue
            if seat is Draw.COMMITTEE:
                if room is None:
                    room = _check_room(node)
                if room <= 0:
                    node.scans.checks.defer(digest)  # looked at again once there is room
                    continue
            new = node.start_check(digest, group.version, seat, node.rounds.own(listed_in, seat)[0])
            if seat is Draw.COMMITTEE and room is not None:  # (counted above for a committee seat)
                room -= len(new)
            actions += new
    if trainer and node.rounds.late_failures:
        actions += late_rechecks(node)
    return actions


def _check_room(node: NodeView) -> int:
    """How many more checks that wait may be asked now: a batch's worth under way at most."""
    return node.config.admission.batch_groups - node.checks_under_way()


def late_rechecks(node: NodeState) -> list[Action]:
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
        actions += node.start_check(digest, group.version, Draw.NONE, b"")
    return actions


def _states_losses(verdict: SignedVerdict) -> bool:
    """Whether a member's drawn check states lost races: the trainer checks the group too, so
    that the pooled test may count them (vrl.node.pooling: a loss counts once a pre-trusted
    check found it). Under the same wait as its audits: a liar's claims delay, never stop, a step."""
    return verdict.races_lost > 0 and verdict.draw == Draw.COMMITTEE


def _fetches(node: NodeState) -> list[Action]:
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
    for version in sorted(node.rounds.manifests):
        if node.fresh(version) and version in node.loaded and version not in node.rounds.fetched:
            # First its weights entry, then its seats' digests (specs/committee.md §3.5).
            entries = node.rounds.wanted(version)
            if entries is not None:
                actions += node.once(FetchEntries(version, str(entries[0]), entries[1], entries[2]))
            missing = [d for d in sorted(node.rounds.seats(version)) if d not in node.groups]
            if entries is None and not missing:
                node.rounds.fetched.add(version)  # groups are never dropped: nothing of it to fetch again
            wanted += [(d, version) for d in missing]
    for verdict in node.waiting:
        version = node.rounds.round_of.get(verdict.group)
        if (version is not None and node.fresh(version) and version in node.loaded
                and verdict.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)
                and ((verdict.verifier in node.reputation.pretrusted and verdict.subject not in node.quarantined)
                     or (node.weighs(verdict) and node.rounds.sits(verdict.group, Draw.RECHECK)))):
            wanted.append((verdict.group, version))
    for digest, version in wanted:
        if digest not in node.groups:
            actions += node.once(FetchGroup(digest, version))
    return actions


def own_listing(node: NodeState) -> list[Action]:
    """A worker asks, by key, whether each of its own groups of a fresh round is in the round's
    groups list (specs/committee.md §3.5): what the trainer left out is then its own evidence
    (``rounds.omitted``), since the workers list that implies its withheld slots is behind a root."""
    actions: list[Action] = []
    for version in sorted(node.rounds.manifests):
        if not node.fresh(version):
            continue
        unknown = tuple(sorted(d for d in node.groups_of_version(version) if node.groups[d].subject == node.me
                               and d not in node.planted and node.rounds.listed(d, version) is None))
        if unknown:
            keys = unknown[:committee.MAX_ENTRIES_PER_REQUEST]
            actions += node.once(FetchEntries(version, str(committee.List.GROUPS), (), keys))
    return actions


def close_rounds(node: NodeState) -> list[Action]:
    """The trainer closes each fresh round's submission window with its signed manifest
    (specs/committee.md §3.4): when every expected worker's groups are in, or after
    ``submission_window`` once no group arrived for ``verdict_wait``, or after
    ``submission_window + submission_grace`` whatever arrives. Eligible: every other node of
    nonzero weight (specs/committee.md §3.1)."""
    actions: list[Action] = []
    for version in sorted(v for v in node.policies if node.fresh(v) and v not in node.rounds.manifests):
        digests = [d for d in node.groups_of_version(version) if node.groups[d].subject not in node.quarantined]
        counts: defaultdict[bytes, int] = defaultdict(int)
        for d in digests:
            counts[node.groups[d].subject] += 1
        previous = node.rounds.lists.get(version - 1)
        expected = {s for s, _ in previous.content.workers} if previous else set()
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
        # Stored with its lists, which it serves (entries) and an audit reads (network.md §8).
        actions.append(PersistManifest(manifest, ManifestLists.of(node.rounds.lists[version].content)))
        # The trainer's evaluation at the close (specs/committee.md §8) includes the withheld
        # records the manifest just implied: only the sums are redone (they move no weight);
        # its next event takes the evaluation's quarantines (NodeProtocol._evaluation_due: the first time).
        node.reputation.standings(version)
        node.request_evaluation()
        actions.append(Publish(TOPIC_MANIFESTS, manifest.to_bytes()))
    return actions


def note_withheld(node: NodeState, manifest: RoundManifest) -> None:
    """The withheld slots of a round whose lists this node holds (the trainer's own) feed its
    reputation view (specs/committee.md §7.1): the workers list is behind its root, so other
    views do not see them (§3.6). A manifest listing a worker with more groups than a round
    holds is not this network's: it implies nothing (it is still held, for the committees it
    fixes). What this node held of the round that the lists leave out is kept in ``rounds.omitted``."""
    lists = node.rounds.lists.get(manifest.round)
    if not node.design.manifests or lists is None:
        return
    omitted: dict[bytes, int] = defaultdict(int)
    for digest in node.groups_of_version(manifest.round):
        subject = node.groups[digest].subject
        if node.rounds.round_of.get(digest) != manifest.round and subject not in node.quarantined \
                and digest not in node.planted:
            omitted[subject] += 1
    node.rounds.omitted[manifest.round] = dict(omitted)
    try:
        records = withheld_of(lists.content, node.config.groups_per_round)
    except ReputationError:
        return
    for record in records:
        node.reputation.add_withheld(record)


# -- routing (specs/network.md §3.5) ----------------------------------------------------------


def submit(node: NodeState, groups: Iterable[Group]) -> list[Action]:
    """A worker's groups go to the trainer alone; members fetch them by digest. The worker holds
    its own, as a publisher gets its gossip back."""
    actions: list[Action] = []
    for group in groups:
        actions += node.accept_group(group, node.now)
    return actions + [Send(node.config.trainer, TOPIC_GROUPS, g.to_bytes()) for g in groups]


def route_verdict(node: NodeView, verdict: SignedVerdict) -> list[Action]:
    """A pass concerns only the trainer, which decides and admits: sent to it alone (its own
    stored); a failure is gossiped, since it calls a recheck committee no sender can name."""
    if verdict.outcome != Outcome.PASS:
        return [Publish(TOPIC_VERDICTS, verdict.to_bytes())]
    if node.has("trainer"):
        return [Persist(verdict)]
    return [Send(node.config.trainer, TOPIC_VERDICTS, verdict.to_bytes())]


def verified(node: NodeView, digest: bytes) -> bool:
    """Whether a decided group counts as checked for admission's trusted share (specs/reputation.md
    §6): a pass by a pre-trusted node; in the committee design also a pass by a member of its
    committee (a seat its claim proved, committee.md §4), the design's check of every group, which
    the anchors no longer make (committee.md §8 says why, and what trusted_share bounds then)."""
    anchors = node.reputation.pretrusted
    return any(v.outcome == Outcome.PASS and (v.verifier in anchors or node.design.seated(v))
               for v in node.verdicts[digest].values())
