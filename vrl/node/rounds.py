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

from proofs import merkle, vrf
from vrl.node import committee
from vrl.node.claims import LossClaims
from vrl.node.committee import SEATS, Draw, Refusal
from vrl.node.events import Action, FetchEntries, FetchGroup, Persist, PersistManifest, Publish, Send
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_VERDICTS,
    ManifestLists,
    Outcome,
    RoundManifest,
    SignedVerdict,
)
from vrl.node.reputation import ReputationError, withheld_of
from vrl.node.requests import EntriesAnswer, EntriesRequest
from vrl.node.scans import scan_key
from vrl.rollouts.keys import NodeKey

#: The protocol these rules read (vrl.node.protocol.NodeProtocol; not imported: it imports this module).
NodeProtocol = Any

# A node re-evaluates reputation (EigenTrust over every report held) at most this often within a
# round, besides at each new round, in either design (specs/reputation.md §2, committee.md §8):
# at N = 1,000 a committee trainer holds ~50,000 new reports a round, and a recomputation per
# report made round 0 never finish (bench/results/simulate-scale.json); nor did the ticket
# design's round 0 at N = 100 (bench/results/simulate-tickets-100-partial.json). 5 s is 20 of
# the daemon's ticks and a twelfth of round_timeout: a confirmed cheat is quarantined at most
# 5 s later than at once, while its failed groups are held back by their failures alone
# (specs/network.md §5.2).
REPUTATION_EVERY_SECONDS = 5.0

class Rounds:
    """Manifests by round, what this node has proven of their lists, and the VRF outputs it
    computed or verified (specs/committee.md §3, §4)."""

    def __init__(self, key: NodeKey, trainer: bytes) -> None:
        self.key, self.trainer = key, trainer
        self.manifests: dict[int, RoundManifest] = {}  # the signed headers
        self.lists: dict[int, committee.PagedManifest] = {}  # the trainer's: every list it signed
        self.received_at: dict[int, float] = {}
        # group digest -> (round, position, path) of a listing this node proved: its own seats'
        # entries, every accepted claim's path, and for the trainer every group it listed.
        self.places: dict[bytes, tuple[int, int, tuple[bytes, ...]]] = {}
        # round -> {worker: its groups of the round this node held, unquarantined, when the
        # manifest came, that the manifest leaves out}: the trainer's, which holds the lists
        # (specs/committee.md §7.1; a worker sees its own with a keys request, §3.5).
        self.omitted: dict[int, dict[bytes, int]] = {}
        # round -> digests its groups list proves absent (a worker's own, asked by key, §3.5)
        self.absent: dict[int, set[bytes]] = {}
        # round -> this node's weights entry (position, w, path), or None when the list proves it
        # absent; missing while not fetched.
        self.weight: dict[int, tuple[int, int, tuple[bytes, ...]] | None] = {}
        # (round, verifier, position, w, path) proven, -> T_v: a claim's weights path is hashed
        # once a round per verifier, not once a verdict (specs/committee.md §4 step 2).
        self._eligible: dict[tuple[int, bytes], tuple[tuple[int, int, tuple[bytes, ...]], int]] = {}
        self._mine: dict[tuple[int, Draw], tuple[bytes, bytes]] = {}  # (round, draw) -> (pi, beta)
        # (verifier, round, draw) -> (pi, beta) once verified: one VRF verification per verifier
        # and round; a different pi for the same triple is verified again (specs/vrf.md §5).
        self._verified: dict[tuple[bytes, int, Draw], tuple[bytes, bytes]] = {}
        # round -> this node's committee seats, in order (requests) and as a set (sits(), per group)
        self._positions: dict[int, tuple[tuple[int, ...], frozenset[int]]] = {}
        # round -> the positions of its groups list an entries answer proved to this node (by
        # round: a digest a hostile trainer listed in two rounds has one place, two positions)
        self._learnt: dict[int, set[int]] = {}
        self.fetched: set[int] = set()  # rounds whose committee seats' groups are all held
        self.claims = LossClaims()  # the trainer's loss confirmations charged to members (vrl.node.claims)
        # The trainer's: held groups no longer fresh on which a failure counted, checked again
        # while it holds them and their version's weights (late_rechecks).
        self.late_failures: set[bytes] = set()
        # Rounds below ``floor`` are forgotten (:meth:`forget`): their manifests come again in
        # backfill and must not count twice. ``added`` counts manifests ever held (a pass's key).
        self.floor, self.added = 0, 0
        # The seat rule of the manifests this node signs when it is the trainer (specs/committee.md
        # §2): the newest. An older trainer's rule 1 is what a test sets here to play one.
        self.seat_rule = committee.SEAT_RULE

    # -- manifests --------------------------------------------------------------------------
    def add(self, manifest: RoundManifest, now: float) -> bool:
        """Hold a manifest: the configured trainer's, signed, the first one of its round."""
        if (manifest.trainer != self.trainer or manifest.round in self.manifests or manifest.round < self.floor
                or not manifest.valid()):
            return False
        self.added += 1
        self.manifests[manifest.round] = manifest
        self.received_at[manifest.round] = now
        return True

    def hold_lists(self, content: committee.ManifestContent | committee.PagedManifest) -> bool:
        """Hold the lists behind a held manifest (the trainer's own, replayed from its store):
        only if they give its header (lists no header commits, from a damaged store, are not
        held; the manifest still is, for the committees it fixes)."""
        try:
            lists = content if isinstance(content, committee.PagedManifest) else committee.PagedManifest(content)
        except committee.CommitteeError:
            return False
        manifest = self.manifests.get(lists.header.round)
        if manifest is None or manifest.header != lists.header:
            return False
        self.lists[lists.header.round] = lists
        return True

    @property
    def round_of(self) -> _RoundOf:
        """group digest -> the round whose manifest this node has proven lists it."""
        return _RoundOf(self.places)

    def forget(self, floor: int) -> None:
        """Drop every round below ``floor``: no group of it is fresh any more, so no check, claim
        or fetch names it."""
        if floor <= self.floor:
            return
        for round_ in [r for r in self.manifests if r < floor]:
            self.manifests.pop(round_)
            for table in (self.received_at, self.omitted, self.lists, self.weight, self._positions, self.absent,
                          self._learnt):
                table.pop(round_, None)
            self.fetched.discard(round_)
        for digest in [d for d, (r, _, _) in self.places.items() if r < floor]:
            del self.places[digest]
        for table in (self._eligible, self._mine):
            for key in [k for k in table if k[0] < floor]:
                del table[key]
        for key in [k for k in self._verified if k[1] < floor]:
            del self._verified[key]
        self.claims.forget(floor)
        self.floor = floor

    def listed(self, digest: bytes, version: int) -> bool | None:
        """Whether a group of ``version`` is in its round's manifest: True once proven (or in the
        lists this node holds), False when the lists say it is not, None while unknown (no
        manifest yet, or a list this node has not seen)."""
        if version not in self.manifests:
            return None
        place = self.places.get(digest)
        if place is not None:
            return place[0] == version
        return False if version in self.lists or digest in self.absent.get(version, ()) else None

    def close(self, round_: int, committee_size: int, groups: Iterable[tuple[bytes, bytes]],
              weights: Mapping[bytes, float], now: float,
              rank: Callable[[bytes], Any] = lambda worker: worker) -> RoundManifest:
        """The trainer's manifest of round ``round_``: ``groups`` as (digest, subject), the
        eligible verifiers' draw weights (committee.seat_weights, specs/committee.md §3.1); signed,
        and held with its lists.

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
            if (len(workers) == committee.MAX_PAGED_ENTRIES
                    or len(listed_digests) + len(digests) > committee.MAX_PAGED_ENTRIES):
                continue
            workers.append((subject, len(digests)))
            listed_digests += digests
        workers.sort()
        table = committee.WeightsTable.heaviest(committee_size, weights)
        lists = committee.PagedManifest(committee.ManifestContent(round_, table, tuple(sorted(listed_digests)),
                                                                  tuple(workers), self.seat_rule))
        manifest = RoundManifest.of(self.key.node_id, lists.header).signed(self.key)
        self.add(manifest, now)
        self.hold_lists(lists)
        self.learn_lists(lists)
        return manifest

    def learn_lists(self, lists: committee.PagedManifest) -> None:
        """Every group of held lists is proven listed (the trainer's own): its place, with the
        path put in its own verdicts' claims computed when a claim needs it."""
        round_ = lists.header.round
        for position, digest in enumerate(lists.content.groups):
            self.places.setdefault(digest, (round_, position, None))  # type: ignore[arg-type]

    # -- entries (specs/committee.md §3.5) ---------------------------------------------------
    def answer(self, request: EntriesRequest) -> committee.Entries:
        """The entries of a held list a peer asks for; CommitteeError if this node holds none."""
        lists = self.lists.get(request.round)
        if lists is None:
            raise committee.CommitteeError("no_lists", f"this node holds no lists of round {request.round}")
        return lists.answer(request.list, request.positions, request.keys)

    def learn(self, fetch: FetchEntries, answer: EntriesAnswer) -> list[bytes]:
        """Take an entries answer to this node's request ``fetch``: checked against the request
        and the round's header (CommitteeError ``bad_entries`` if it does not hold). Returns the
        digests it proved listed that were not known before."""
        manifest = self.manifests.get(fetch.round)
        if manifest is None:
            return []
        if answer.round != fetch.round:
            raise committee.CommitteeError("bad_entries", f"an answer of round {answer.round} to round {fetch.round}")
        entries = committee.check_entries(manifest.header, answer.entries, fetch.list, fetch.positions, fetch.keys)
        which = committee.List(fetch.list)
        header = manifest.header
        if which is committee.List.WEIGHTS:
            if self.key.node_id in fetch.keys:
                found = entries.found().get(self.key.node_id)
                if found is None:
                    self.weight[fetch.round] = None
                else:
                    j, leaf = found
                    paths = merkle.paths(header.weights_root, header.weights, entries.positions, entries.leaves,
                                         entries.proof)
                    self.weight[fetch.round] = (j, int.from_bytes(leaf[32:], "big"),
                                                paths[entries.positions.index(j)])
            return []
        if which is not committee.List.GROUPS:
            return []
        paths = merkle.paths(header.groups_root, header.groups, entries.positions, entries.leaves, entries.proof)
        self._learnt.setdefault(fetch.round, set()).update(entries.positions)
        learnt = []
        for position, digest, path in zip(entries.positions, entries.leaves, paths, strict=True):
            if digest not in self.places:
                self.places[digest] = (fetch.round, position, path)
                learnt.append(digest)
        if fetch.keys:  # a worker's own digests (§3.5): those shown absent are what the trainer left out
            absent = self.absent.setdefault(fetch.round, set())
            absent |= set(fetch.keys) - set(entries.leaves)
            if absent:
                self.omitted.setdefault(fetch.round, {})[self.key.node_id] = len(absent)
        return learnt

    def wanted(self, round_: int) -> tuple[str, tuple[int, ...], tuple[bytes, ...]] | None:
        """The next entries request this member needs for its committee seats of ``round_``:
        its own weights entry first, then its seats' digests (at most a request's worth);
        None when it has them all, or sits on nothing."""
        if round_ not in self.weight:
            return (committee.List.WEIGHTS, (), (self.key.node_id,))
        positions = self.positions(round_)
        known = self._learnt.get(round_, set())
        missing = tuple(i for i in positions if i not in known)
        if not missing:
            return None
        return (committee.List.GROUPS, missing[:committee.MAX_ENTRIES_PER_REQUEST], ())


    def positions(self, round_: int) -> tuple[int, ...]:
        """This node's committee seats in round ``round_`` (positions, §3.2), once its weight is known."""
        return self._seats_of(round_)[0]

    def _seats_of(self, round_: int) -> tuple[tuple[int, ...], frozenset[int]]:
        if round_ not in self._positions:
            entry = self.weight.get(round_)
            if entry is None:
                return (), frozenset()
            header = self.manifests[round_].header
            beta = self.own(round_, Draw.COMMITTEE)[1]
            positions = header.seats(beta, entry[1])
            self._positions[round_] = (positions, frozenset(positions))
        return self._positions[round_]

    # -- draws ------------------------------------------------------------------------------
    def own(self, round_: int, draw: Draw) -> tuple[bytes, bytes]:
        """This node's (pi, beta) for a round and draw: one VRF evaluation, kept."""
        if (round_, draw) not in self._mine:
            pi = vrf.prove(self.key.private_seed(), self.manifests[round_].header.alpha(draw))
            self._mine[round_, draw] = (pi, vrf.proof_to_hash(pi))
        return self._mine[round_, draw]

    def sits(self, digest: bytes, draw: Draw) -> bool:
        """Whether this node sits on ``digest``'s committee of that draw: its place is proven, and
        its seat value is under this node's threshold."""
        place = self.places.get(digest)
        if place is None or place[0] not in self.manifests:
            return False
        round_, position, _ = place
        entry = self.weight.get(round_)
        if entry is None:
            return False
        if draw is Draw.COMMITTEE:
            return position in self._seats_of(round_)[1]
        header = self.manifests[round_].header
        return header.seat_value(self.own(round_, draw)[1], position) < header.threshold(entry[1])

    def seats(self, round_: int) -> frozenset[bytes]:
        """The digests of this node's committee seats in round ``round_`` it has learnt."""
        positions = self._seats_of(round_)[1]
        return frozenset(d for d, (r, p, _) in self.places.items() if r == round_ and p in positions)

    def _place(self, digest: bytes) -> tuple[int, int, tuple[bytes, ...]]:
        """A known place with its path: the trainer's own lists' paths are computed when first
        needed (a claim, or a verdict's claim to compare with), then kept."""
        round_, position, path = self.places[digest]
        if path is None:
            path = self.lists[round_].trees[committee.List.GROUPS].prove([position])
            self.places[digest] = (round_, position, path)
        return round_, position, path

    def claim(self, digest: bytes, draw: Draw) -> dict[str, Any] | None:
        """The claim a verdict of this node on ``digest`` carries (specs/committee.md §4): its
        place and path, and for a drawn check its weights entry and path; None if unproven."""
        place = self.places.get(digest)
        if place is None:
            return None
        round_, position, path = self._place(digest)
        fields: dict[str, Any] = {"seat": position, "seat_path": path}
        if draw in SEATS:
            entry = self.weight.get(round_)
            if entry is None:
                return None
            fields.update(weight_at=entry[0], weight=entry[1], weight_path=entry[2])
        return fields

    # -- claims of others -------------------------------------------------------------------
    def refusal(self, verdict: SignedVerdict, trusted: frozenset[bytes]) -> Refusal | None:
        """Why a verdict's claim does not stand in the committee design (specs/committee.md §4),
        or None if it does; MANIFEST_MISSING while its round's manifest is not held. The cheap steps
        (manifest, weights path, groups path) come before any signature or VRF: a fresh key's
        verdict is refused after a lookup and a path of about 18 hashes."""
        manifest = self.manifests.get(verdict.policy_version)
        if manifest is None:
            return Refusal.MANIFEST_MISSING
        header = manifest.header
        threshold = 0
        if verdict.draw == Draw.NONE:
            if verdict.verifier != self.trainer and verdict.verifier not in trusted:
                return Refusal.NO_CLAIM
        elif verdict.draw == Draw.TICKET:
            return Refusal.NOT_ELIGIBLE
        else:
            entry = (verdict.weight_at, verdict.weight, verdict.weight_path)
            known = self._eligible.get((manifest.round, verdict.verifier))
            if known is not None and known[0] == entry:
                threshold = known[1]
            else:
                try:
                    threshold = committee.check_weight(header, verdict.verifier, (verdict.weight_at, verdict.weight),
                                                       verdict.weight_path)
                except committee.CommitteeError:
                    return Refusal.NOT_ELIGIBLE
                self._eligible[manifest.round, verdict.verifier] = (entry, threshold)
        place = self._place(verdict.group) if verdict.group in self.places else None
        if place is None or place != (manifest.round, verdict.seat, verdict.seat_path):
            try:
                committee.check_place(header, verdict.seat, verdict.group, verdict.seat_path)
            except committee.CommitteeError:
                return Refusal.NOT_IN_MANIFEST
        if verdict.outcome == Outcome.SKIPPED:
            return Refusal.SKIP_IN_COMMITTEE
        if not verdict.signature_ok():
            return Refusal.BAD_SIGNATURE
        self.places.setdefault(verdict.group, (manifest.round, verdict.seat, verdict.seat_path))
        if verdict.draw == Draw.NONE:
            return None
        if verdict.verifier == verdict.subject:  # never a member for its own group (§2); the
            return Refusal.NOT_DRAWN  # subject is the group's signer, checked once the group is known
        draw = verdict.draw
        known_beta = self._verified.get((verdict.verifier, manifest.round, draw))
        if known_beta is not None and known_beta[0] == verdict.pi:
            beta = known_beta[1]
        else:
            try:
                beta = vrf.verify(verdict.verifier, verdict.pi, header.alpha(draw))
            except vrf.VrfError:
                return Refusal.BAD_PROOF
            self._verified[verdict.verifier, manifest.round, draw] = (verdict.pi, beta)
        return None if header.seat_value(beta, verdict.seat) < threshold else Refusal.NOT_DRAWN


class _RoundOf(Mapping):
    """A read-only view of ``Rounds.places``: digest -> round."""

    def __init__(self, places: dict[bytes, tuple[int, int, Any]]) -> None:
        self._places = places

    def __getitem__(self, digest: bytes) -> int:
        return self._places[digest][0]

    def __contains__(self, digest: object) -> bool:
        return digest in self._places

    def get(self, digest: bytes, default: Any = None) -> Any:
        # Mapping.get goes through __getitem__ and a KeyError for every group not listed: 14% of
        # committee_checks at N = 1,000 (bench/simulate.py), which asks it of every candidate.
        place = self._places.get(digest)
        return default if place is None else place[0]

    def __iter__(self):
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)


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
                actions += node._check(digest, group.version, Draw.NONE, b"")
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
                    node.scans.checks.defer(digest)  # looked at again once there is room
                    continue
                new = node._check(digest, group.version, Draw.NONE, b"")
                if new and claim is not None:
                    node.rounds.claims.charge(round_, claim, budget)
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
            new = node._check(digest, group.version, seat, node.rounds.own(round_, seat)[0])
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
        actions += node._check(digest, group.version, Draw.NONE, b"")
    return actions


def _states_losses(verdict: SignedVerdict) -> bool:
    """Whether a member's drawn check states lost races: the trainer checks the group too, so
    that the pooled test may count them (vrl.node.pooling: a loss counts once a pre-trusted
    check found it). Under the same wait as its audits: a liar's claims delay, never stop, a step."""
    return verdict.races_lost > 0 and verdict.draw == Draw.COMMITTEE


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
            # First its weights entry, then its seats' digests (specs/committee.md §3.5).
            entries = node.rounds.wanted(round_)
            if entries is not None:
                actions += node._once(FetchEntries(round_, str(entries[0]), entries[1], entries[2]))
            missing = [d for d in sorted(node.rounds.seats(round_)) if d not in node.groups]
            if entries is None and not missing:
                node.rounds.fetched.add(round_)  # groups are never dropped: nothing of it to fetch again
            wanted += [(d, round_) for d in missing]
    for verdict in node.waiting:
        round_ = node.rounds.round_of.get(verdict.group)
        if (round_ is not None and node._fresh(round_) and round_ in node.loaded
                and verdict.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)
                and ((verdict.verifier in node.reputation.pretrusted and verdict.subject not in node.quarantined)
                     or (node.weighs(verdict) and node.rounds.sits(verdict.group, Draw.RECHECK)))):
            wanted.append((verdict.group, round_))
    for digest, round_ in wanted:
        if digest not in node.groups:
            actions += node._once(FetchGroup(digest, round_))
    return actions


def own_listing(node: NodeProtocol) -> list[Action]:
    """A worker asks, by key, whether each of its own groups of a fresh round is in the round's
    groups list (specs/committee.md §3.5): what the trainer left out is then its own evidence
    (``rounds.omitted``), since the workers list that implies its withheld slots is behind a root."""
    actions: list[Action] = []
    for round_ in sorted(node.rounds.manifests):
        if not node._fresh(round_):
            continue
        unknown = tuple(sorted(d for d in node._by_version.get(round_, ()) if node.groups[d].subject == node.me
                               and d not in node.planted and node.rounds.listed(d, round_) is None))
        if unknown:
            keys = unknown[:committee.MAX_ENTRIES_PER_REQUEST]
            actions += node._once(FetchEntries(round_, str(committee.List.GROUPS), (), keys))
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
        # its next event takes the evaluation's quarantines (rounds.evaluate: the first time).
        node.reputation.standings(version)
        node._evaluated = None
        actions.append(Publish(TOPIC_MANIFESTS, manifest.to_bytes()))
    return actions


def note_withheld(node: NodeProtocol, manifest: RoundManifest) -> None:
    """The withheld slots of a round whose lists this node holds (the trainer's own) feed its
    reputation view (specs/committee.md §7.1): the workers list is behind its root, so other
    views do not see them (§3.6). A manifest listing a worker with more groups than a round
    holds is not this network's: it implies nothing (it is still held, for the committees it
    fixes). What this node held of the round that the lists leave out is kept in ``rounds.omitted``."""
    lists = node.rounds.lists.get(manifest.round)
    if not node.committee or lists is None:
        return
    omitted: dict[bytes, int] = defaultdict(int)
    for digest in node._by_version.get(manifest.round, []):
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
        node.committee and v.draw in SEATS))
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
