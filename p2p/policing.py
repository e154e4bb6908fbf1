"""Peer policing: what a transport does about peers that misbehave, decided without I/O.

A :class:`Policing` is fed events (a peer sent something invalid; our validator rejected a
gossip message a peer forwarded; a gossip message arrived to be judged) and answers with
decisions: whether to deliver a message, and whether the event banned its peer, in which case
the transport hangs up on it. The scores and bans are :class:`PeerScores`
(GossipSub v1.1's P4; :class:`p2p.transport.TransportLimits`). Both transports police with it;
carrying a decision out (closing connections, cutting a link) is each transport's own.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from p2p._common import check_limits
from p2p.transport import PeerId, TransportLimits, Validation

DECAY_INTERVAL = 1.0
"""Seconds between two decays of a count: go-libp2p-pubsub's ``DefaultDecayInterval``. Whole
intervals only, as GossipSub decays at its heartbeat: so n invalid messages inside one interval
count exactly n, and a threshold of -n**2 bans at the n-th."""

DECAY_TO_ZERO = 0.01
"""A count that decays below this is forgotten: go-libp2p-pubsub's ``DefaultDecayToZero``."""

MAX_SCORED_PEERS = 10_000
"""Peers with a count (or a ban) remembered at once. Every one of them completed a Noise
handshake with a key of its own and sent something invalid; past this many, the smallest count
is forgotten first. ~200 bytes each: 2 MB at most."""


class PeerScores:
    """GossipSub v1.1 P4 scores and bans, per peer (see :class:`p2p.transport.TransportLimits`).
    Thread-safe: the libp2p transport counts on its network thread, the node reads on its own."""

    def __init__(self, limits: TransportLimits, clock: Callable[[], float] = time.monotonic, *,
                 max_peers: int = MAX_SCORED_PEERS) -> None:
        self.limits = self._limits = check_limits(limits)
        self._clock = clock
        self._max_peers = max_peers
        # typeshed types float ** float as Any (a negative base gives a complex); 0.5 is positive
        self._decay: float = 0.5 ** (DECAY_INTERVAL / limits.invalid_message_halflife)
        self._counts: dict[PeerId, tuple[float, float]] = {}  # peer -> (count, start of its interval)
        self._banned_until: dict[PeerId, float] = {}
        self._lock = threading.Lock()

    def penalize(self, peer: PeerId) -> bool:
        """Count one invalid message against ``peer``. True if this is what bans it."""
        with self._lock:
            now = self._clock()
            if self._is_banned(peer, now):
                return False  # what a banned peer still gets through (in flight) adds nothing
            count = self._count(peer, now) + 1.0
            self._counts[peer] = (count, self._counts.get(peer, (0.0, now))[1])
            if len(self._counts) > self._max_peers:
                self._forget_smallest(keep=peer)
            if self._limits.invalid_message_weight * count * count > self._limits.ban_threshold:
                return False
            self._banned_until[peer] = now + self._limits.ban_seconds
            if len(self._banned_until) > self._max_peers:
                del self._banned_until[min(self._banned_until, key=self._banned_until.__getitem__)]
            return True

    def score(self, peer: PeerId) -> float:
        with self._lock:
            count = self._count(peer, self._clock())
        return self._limits.invalid_message_weight * count * count if count else 0.0

    def banned(self, peer: PeerId) -> bool:
        with self._lock:
            return self._is_banned(peer, self._clock())

    def _is_banned(self, peer: PeerId, now: float) -> bool:
        until = self._banned_until.get(peer)
        if until is None:
            return False
        if now < until:
            return True
        del self._banned_until[peer]
        return False

    def _count(self, peer: PeerId, now: float) -> float:
        """The peer's count decayed to ``now`` (and stored so)."""
        entry = self._counts.get(peer)
        if entry is None:
            return 0.0
        count, since = entry
        intervals = math.floor((now - since) / DECAY_INTERVAL)
        if intervals <= 0:
            return count
        count *= self._decay ** intervals
        if count < DECAY_TO_ZERO:
            del self._counts[peer]
            return 0.0
        self._counts[peer] = (count, since + intervals * DECAY_INTERVAL)
        return count

    def _forget_smallest(self, keep: PeerId) -> None:
        now = self._clock()
        for peer in list(self._counts):
            self._count(peer, now)  # drops the ones that have decayed away
        while len(self._counts) > self._max_peers:
            del self._counts[min((p for p in self._counts if p != keep), key=lambda p: self._counts[p][0])]


@dataclass(frozen=True, slots=True)
class Ruling:
    """What to do with one gossip message: its verdict (deliver and forward only on ACCEPT),
    and whether judging it banned the peer that forwarded it (hang up on that peer)."""

    verdict: Validation
    ban: bool


class Policing:
    """Scores, bans and rejection counts of one transport's peers. Thread-safe where the
    libp2p transport needs it: the node reads scores and bans on its own thread (PeerScores
    locks); the events are fed from one thread."""

    def __init__(self, limits: TransportLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._scores = PeerScores(limits, clock)
        self.limits = self._scores.limits
        self._rejections: Counter[PeerId] = Counter()

    # -- what the node asks --

    def score(self, peer: PeerId) -> float:
        return self._scores.score(peer)

    def banned(self, peer: PeerId) -> bool:
        return self._scores.banned(peer)

    def rejections(self, peer: PeerId) -> int:
        """How many gossip messages forwarded by ``peer`` our validators rejected."""
        return self._rejections[peer]

    # -- events --

    def misbehaved(self, peer: PeerId) -> bool:
        """``peer`` sent us one invalid message. True if this is what bans it: hang up."""
        return self._scores.penalize(peer)

    def rejected(self, forwarder: PeerId) -> bool:
        """Our validator REJECTed a gossip message that ``forwarder`` sent us: it counts as a
        rejection and as an invalid message. True if this is what bans it: hang up."""
        self._rejections[forwarder] += 1
        return self.misbehaved(forwarder)


class GossipPolicing(Policing):
    """Policing for a transport whose gossip router keeps the seen cache (libp2p), so that a
    message reaches :meth:`gossip` again only if it was not accepted. It remembers the ids of
    the messages it rejected, each for ``rejected_ttl`` seconds and at most ``rejected_max`` of
    them, so that every copy counts against its forwarder without running the validator again.
    (The loopback transport keeps its own seen cache, with each message's verdict.)"""

    def __init__(self, limits: TransportLimits, clock: Callable[[], float] = time.monotonic, *,
                 rejected_ttl: float, rejected_max: int) -> None:
        super().__init__(limits, clock)
        self._rejected_ttl = rejected_ttl
        self._rejected_max = rejected_max
        self._rejected: OrderedDict[bytes, float] = OrderedDict()  # msg_id -> when rejected

    def gossip(self, sender: PeerId | None, msg_id: bytes, validate: Callable[[], Validation]) -> Ruling:
        """Judge a gossip message that ``sender`` forwarded to us (None: our own publish).
        ``validate`` gives the validator's verdict; it is not asked for a banned sender's
        message, nor for another copy of a message we rejected. A REJECT counts against the
        sender, the peer that sent it to us (GossipSub v1.1 P4; an honest peer validates before
        it forwards); IGNORE counts against nobody."""
        if sender is not None and self.banned(sender):
            return Ruling(Validation.IGNORE, False)  # in flight when we banned it: dropped unread, counted once already
        if self._was_rejected(msg_id):
            verdict = Validation.REJECT  # another copy: it counts again, as in go-libp2p
        else:
            verdict = validate()
            if verdict is Validation.REJECT:
                self._remember_rejected(msg_id)
        return Ruling(verdict, verdict is Validation.REJECT and sender is not None and self.rejected(sender))

    def _was_rejected(self, msg_id: bytes) -> bool:
        now = self._clock()
        while self._rejected:
            oldest, when = next(iter(self._rejected.items()))
            if now - when <= self._rejected_ttl and len(self._rejected) <= self._rejected_max:
                break
            del self._rejected[oldest]
        return msg_id in self._rejected

    def _remember_rejected(self, msg_id: bytes) -> None:
        self._rejected[msg_id] = self._clock()
        self._rejected.move_to_end(msg_id)
