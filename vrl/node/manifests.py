"""The committee design's part of a node's state (specs/committee.md): the round manifests it
holds, its own VRF outputs, and the outputs of others it has verified.

A sub-machine of :class:`vrl.node.protocol.NodeProtocol`, pure like it: no I/O, no clock. The
protocol asks it whether this node sits on a group's committee (:meth:`Rounds.draw`), whether a
received verdict's claim stands (:meth:`Rounds.refusal`), and, for the trainer, for the manifest
that closes a round (:meth:`Rounds.close`). The rules that read it with the rest of the node's
state are :mod:`vrl.node.rounds`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from proofs import merkle, vrf
from vrl.node import committee
from vrl.node.claims import LossClaims
from vrl.node.committee import SEATS, Draw, Refusal
from vrl.node.events import FetchEntries
from vrl.node.messages import Outcome, RoundManifest, SignedVerdict
from vrl.node.requests import EntriesAnswer, EntriesRequest
from vrl.rollouts.keys import NodeKey


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
        for version in [r for r in self.manifests if r < floor]:
            self.manifests.pop(version)
            for table in (self.received_at, self.omitted, self.lists, self.weight, self._positions, self.absent,
                          self._learnt):
                table.pop(version, None)
            self.fetched.discard(version)
        for digest in [d for d, (r, _, _) in self.places.items() if r < floor]:
            del self.places[digest]
        for eligible in [k for k in self._eligible if k[0] < floor]:
            del self._eligible[eligible]
        for mine in [k for k in self._mine if k[0] < floor]:
            del self._mine[mine]
        for verified in [k for k in self._verified if k[1] < floor]:
            del self._verified[verified]
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

    def close(self, version: int, committee_size: int, groups: Iterable[tuple[bytes, bytes]],
              weights: Mapping[bytes, float], now: float,
              rank: Callable[[bytes], Any] = lambda worker: worker) -> RoundManifest:
        """The trainer's manifest of round ``version``: ``groups`` as (digest, subject), the
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
        lists = committee.PagedManifest(committee.ManifestContent(version, table, tuple(sorted(listed_digests)),
                                                                  tuple(workers), self.seat_rule))
        manifest = RoundManifest.of(self.key.node_id, lists.header).signed(self.key)
        self.add(manifest, now)
        self.hold_lists(lists)
        self.learn_lists(lists)
        return manifest

    def learn_lists(self, lists: committee.PagedManifest) -> None:
        """Every group of held lists is proven listed (the trainer's own): its place, with the
        path put in its own verdicts' claims computed when a claim needs it."""
        version = lists.header.round
        for position, digest in enumerate(lists.content.groups):
            self.places.setdefault(digest, (version, position, None))  # type: ignore[arg-type]

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

    def wanted(self, version: int) -> tuple[str, tuple[int, ...], tuple[bytes, ...]] | None:
        """The next entries request this member needs for its committee seats of ``version``:
        its own weights entry first, then its seats' digests (at most a request's worth);
        None when it has them all, or sits on nothing."""
        if version not in self.weight:
            return (committee.List.WEIGHTS, (), (self.key.node_id,))
        positions = self.positions(version)
        known = self._learnt.get(version, set())
        missing = tuple(i for i in positions if i not in known)
        if not missing:
            return None
        return (committee.List.GROUPS, missing[:committee.MAX_ENTRIES_PER_REQUEST], ())


    def positions(self, version: int) -> tuple[int, ...]:
        """This node's committee seats in round ``version`` (positions, §3.2), once its weight is known."""
        return self._seats_of(version)[0]

    def _seats_of(self, version: int) -> tuple[tuple[int, ...], frozenset[int]]:
        if version not in self._positions:
            entry = self.weight.get(version)
            if entry is None:
                return (), frozenset()
            header = self.manifests[version].header
            beta = self.own(version, Draw.COMMITTEE)[1]
            positions = header.seats(beta, entry[1])
            self._positions[version] = (positions, frozenset(positions))
        return self._positions[version]

    # -- draws ------------------------------------------------------------------------------
    def own(self, version: int, draw: Draw) -> tuple[bytes, bytes]:
        """This node's (pi, beta) for a round and draw: one VRF evaluation, kept."""
        if (version, draw) not in self._mine:
            pi = vrf.prove(self.key.private_seed(), self.manifests[version].header.alpha(draw))
            self._mine[version, draw] = (pi, vrf.proof_to_hash(pi))
        return self._mine[version, draw]

    def sits(self, digest: bytes, draw: Draw) -> bool:
        """Whether this node sits on ``digest``'s committee of that draw: its place is proven, and
        its seat value is under this node's threshold."""
        place = self.places.get(digest)
        if place is None or place[0] not in self.manifests:
            return False
        version, position, _ = place
        entry = self.weight.get(version)
        if entry is None:
            return False
        if draw is Draw.COMMITTEE:
            return position in self._seats_of(version)[1]
        header = self.manifests[version].header
        return header.seat_value(self.own(version, draw)[1], position) < header.threshold(entry[1])

    def seats(self, version: int) -> frozenset[bytes]:
        """The digests of this node's committee seats in round ``version`` it has learnt."""
        positions = self._seats_of(version)[1]
        return frozenset(d for d, (r, p, _) in self.places.items() if r == version and p in positions)

    def _place(self, digest: bytes) -> tuple[int, int, tuple[bytes, ...]]:
        """A known place with its path: the trainer's own lists' paths are computed when first
        needed (a claim, or a verdict's claim to compare with), then kept."""
        version, position, path = self.places[digest]
        if path is None:
            path = self.lists[version].trees[committee.List.GROUPS].prove([position])
            self.places[digest] = (version, position, path)
        return version, position, path

    def claim(self, digest: bytes, draw: Draw) -> dict[str, Any] | None:
        """The claim a verdict of this node on ``digest`` carries (specs/committee.md §4): its
        place and path, and for a drawn check its weights entry and path; None if unproven."""
        place = self.places.get(digest)
        if place is None:
            return None
        version, position, path = self._place(digest)
        fields: dict[str, Any] = {"seat": position, "seat_path": path}
        if draw in SEATS:
            entry = self.weight.get(version)
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


class _RoundOf(Mapping[bytes, int]):
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

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)
