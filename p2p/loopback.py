"""An in-process network for tests: transports on one asyncio loop, with deterministic faults.

``LoopbackNetwork`` is the wire; ``network.transport(seed)`` makes a peer on it. It keeps the
semantics of :mod:`p2p.transport` that the libp2p transport has, so the contract tests hold
for both:

* Gossip floods along connected links. Each receiving peer that subscribes to the topic runs
  its validator first, then delivers and forwards only what it accepts; a peer that does not
  subscribe neither delivers nor forwards (as in a gossipsub mesh). A message is processed
  once per peer for :data:`SEEN_TTL` seconds, whatever the verdict.
* A request to a peer that is not connected redials it if this peer ever ``connect``-ed to it
  (it knows the address), as libp2p does; otherwise it raises PeerUnavailable.
* Misbehaving peers are scored and banned as on libp2p (:class:`p2p.transport.TransportLimits`):
  a gossip message the validator REJECTs counts against the peer that forwarded it, again for
  each copy; a request over the handler's limit against its caller. A ban unlinks the two
  peers, and refuses links and requests between them, either way, until it ends. (The
  handshake deadline and the pending cap are about sockets: loopback has none.)

Faults, all drawn from one seeded ``random.Random`` so a run can be replayed:

* ``set_faults(drop_gossip=, drop_requests=, delay=)``: each gossip hop, or each request, is
  lost with that probability; every hop (gossip, request, response) arrives ``delay`` seconds
  late. A lost request is a timeout for its caller.
* ``partition(groups)`` / ``heal()``: only peers in the same group reach each other; a peer in
  no group reaches nobody. Links stay up, traffic across groups is lost (requests time out).
* ``crash(peer)``: the peer's transport dies. Its links are gone, requests to it time out
  (a ``connect`` is refused), gossip to it is lost, and its own methods raise
  :class:`TransportError`. Restart it with ``network.transport(same_seed)``: a new object with
  the same identity and no links.
* ``freeze(peer)`` / ``thaw(peer)``: the peer stays connected but nothing reaches it or leaves
  it until ``thaw``, as with a SIGSTOPped process whose kernel buffers the traffic. Requests
  time out meanwhile (a ``connect`` is refused); what was held is delivered, in order, on
  ``thaw``.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import random
from collections.abc import Callable, Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from p2p import _common
from p2p import traffic as T
from p2p._common import Status
from p2p.policing import Policing
from p2p.transport import (
    DEFAULT_REQUEST_TIMEOUT,
    MAX_GOSSIP_BYTES,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    Message,
    MessageHandler,
    MessageTooLarge,
    PeerId,
    PeerUnavailable,
    RequestHandler,
    RequestTimeout,
    TransportError,
    TransportLimits,
    Validation,
    Validator,
    message_id,
)

ADDRESS_PREFIX = "loopback/"

SEEN_TTL = 120.0
"""Seconds a peer remembers a message id: py-libp2p's ``Pubsub(seen_ttl=120)`` default
(``libp2p/pubsub/pubsub.py``), so a republish of the same content within it is one message on
both transports."""


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"
    CRASHED = "crashed"


class LoopbackNetwork:
    """The hub every :class:`LoopbackTransport` of one test talks through. Single asyncio loop."""

    def __init__(self, *, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._nodes: dict[PeerId, LoopbackTransport] = {}  # the latest transport per identity
        self._links: dict[PeerId, set[PeerId]] = {}
        self._drop_gossip = 0.0
        self._drop_requests = 0.0
        self._delay = 0.0
        self._group_of: dict[PeerId, int] | None = None
        self._frozen: set[PeerId] = set()
        self._held: list[tuple[PeerId, PeerId, Callable[[], None]]] = []

    def transport(self, private_seed: bytes, *, limits: TransportLimits = TransportLimits()) -> LoopbackTransport:
        """A new peer with this Ed25519 identity. Reusing the seed of a crashed or closed peer
        restarts it (with no memory of scores or bans); reusing a live one is an error."""
        _common.check_limits(limits)
        key = Ed25519PrivateKey.from_private_bytes(_common.check_seed(private_seed))
        peer = key.public_key().public_bytes_raw()
        old = self._nodes.get(peer)
        if old is not None and old._state in (_State.NEW, _State.RUNNING):
            raise ValueError(f"peer {peer.hex()[:16]} is already on this network")
        node = LoopbackTransport(self, peer, limits)
        self._nodes[peer] = node
        return node

    def set_faults(self, *, drop_gossip: float = 0.0, drop_requests: float = 0.0, delay: float = 0.0) -> None:
        """Replace the fault settings (all off by default)."""
        for name, p in (("drop_gossip", drop_gossip), ("drop_requests", drop_requests)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} is a probability, not {p}")
        if delay < 0:
            raise ValueError(f"delay is a duration, not {delay}")
        self._drop_gossip, self._drop_requests, self._delay = drop_gossip, drop_requests, delay

    def partition(self, groups: Iterable[Iterable[PeerId]]) -> None:
        """Split the network: traffic flows only within a group."""
        group_of: dict[PeerId, int] = {}
        for index, group in enumerate(groups):
            for peer in group:
                if group_of.setdefault(_common.check_peer(peer), index) != index:
                    raise ValueError(f"peer {peer.hex()[:16]} is in two groups")
        self._group_of = group_of

    def heal(self) -> None:
        """End the partition."""
        self._group_of = None

    def crash(self, peer: PeerId) -> None:
        """Kill the peer's transport: see the module docstring."""
        node = self._running_node(peer)
        self._unlink(peer)
        self._frozen.discard(peer)
        self._held = [item for item in self._held if peer not in item[:2]]
        node._die(_State.CRASHED)

    def freeze(self, peer: PeerId) -> None:
        """Hold all traffic to and from the peer until :meth:`thaw`."""
        self._running_node(peer)
        self._frozen.add(peer)

    def thaw(self, peer: PeerId) -> None:
        """Release the peer and deliver, in order, what was held for it."""
        self._frozen.discard(peer)
        held, self._held = self._held, []
        for src, dst, deliver in held:
            if src in self._frozen or dst in self._frozen:
                self._held.append((src, dst, deliver))
            elif self._reachable(src, dst):
                self._after_delay(deliver)

    # -- used by LoopbackTransport --

    def _running_node(self, peer: PeerId) -> LoopbackTransport:
        node = self._nodes.get(peer)
        if node is None or node._state is not _State.RUNNING:
            raise ValueError(f"peer {peer.hex()[:16]} is not running on this network")
        return node

    def _reachable(self, a: PeerId, b: PeerId) -> bool:
        if self._group_of is None:
            return True
        group = self._group_of.get(a)
        return group is not None and group == self._group_of.get(b)

    def _banned_between(self, a: PeerId, b: PeerId) -> bool:
        """Whether either peer has banned the other: libp2p refuses the connection after the
        handshake on the banning side, whichever side dialled."""
        return any(node is not None and node._police.banned(other)
                   for node, other in ((self._nodes.get(a), b), (self._nodes.get(b), a)))

    def _cut(self, a: PeerId, b: PeerId) -> None:
        self._links.get(a, set()).discard(b)
        self._links.get(b, set()).discard(a)

    def _link(self, src: PeerId, dst: PeerId) -> None:
        node = self._nodes.get(dst)
        if dst == src or node is None or node._state is not _State.RUNNING:
            raise PeerUnavailable(f"nothing listens at {ADDRESS_PREFIX}{dst.hex()}")
        if dst in self._frozen or not self._reachable(src, dst):
            raise PeerUnavailable(f"{ADDRESS_PREFIX}{dst.hex()} does not answer")
        if self._banned_between(src, dst):
            raise PeerUnavailable(f"{ADDRESS_PREFIX}{dst.hex()} refused the connection (banned)")
        self._links.setdefault(src, set()).add(dst)
        self._links.setdefault(dst, set()).add(src)

    def _unlink(self, peer: PeerId) -> None:
        for other in self._links.pop(peer, set()):
            self._links.get(other, set()).discard(peer)

    def _neighbours(self, peer: PeerId) -> list[PeerId]:
        # Sorted: set order of bytes depends on PYTHONHASHSEED, and the order of the
        # random draws below must not.
        return sorted(self._links.get(peer, ()))

    def _carry(self, src: PeerId, dst: PeerId, deliver: Callable[[], None], drop: float) -> None:
        """Move one hop's traffic from ``src`` to ``dst`` through the faults."""
        if not self._reachable(src, dst):
            return
        if drop and self._rng.random() < drop:
            return
        if src in self._frozen or dst in self._frozen:
            self._held.append((src, dst, deliver))
            return
        self._after_delay(deliver)

    def _after_delay(self, deliver: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        if self._delay:
            loop.call_later(self._delay, deliver)
        else:
            loop.call_soon(deliver)

    def _forward(self, src: LoopbackTransport, message: Message, exclude: PeerId) -> None:
        for peer in self._neighbours(src.peer_id):
            if peer in (exclude, message.origin):
                continue
            node = self._nodes[peer]
            src._traffic.add(T.GOSSIP_OUT, message.topic, len(message.data))
            self._carry(src.peer_id, peer, functools.partial(node._receive, message, src.peer_id), self._drop_gossip)

    def _send_request(self, src: LoopbackTransport, dst: PeerId, protocol: str, data: bytes,
                      max_response: int, reply: asyncio.Future[tuple[Status, bytes]]) -> None:
        node = self._nodes.get(dst)
        if dst == src.peer_id or node is None or node._state in (_State.NEW, _State.CLOSED):
            raise PeerUnavailable(f"nothing listens at {ADDRESS_PREFIX}{dst.hex()}")
        linked = dst in self._links.get(src.peer_id, ())
        if not linked and dst not in src._known:
            raise PeerUnavailable(f"no known address for {dst.hex()[:16]}")
        if self._banned_between(src.peer_id, dst):
            raise PeerUnavailable(f"{dst.hex()[:16]}: no connection (banned)")
        silent = dst in self._frozen or not self._reachable(src.peer_id, dst)
        if node._state is _State.CRASHED or (silent and not linked):
            return  # a vanished host, or a dial that hangs: the caller hears nothing, times out
        if not linked:
            self._link(src.peer_id, dst)

        def respond(status: Status, body: bytes) -> None:
            def deliver() -> None:
                if not reply.done():
                    src._traffic.add(T.RESPONSE_IN, protocol, len(body))
                    reply.set_result((status, body))
            self._carry(dst, src.peer_id, deliver, 0.0)

        self._carry(src.peer_id, dst, lambda: node._serve(src.peer_id, protocol, data, max_response, reply, respond),
                    self._drop_requests)


class LoopbackTransport:
    """A :class:`p2p.transport.Transport` on a :class:`LoopbackNetwork`. Make it with
    ``network.transport(seed)``."""

    def __init__(self, network: LoopbackNetwork, peer: PeerId, limits: TransportLimits = TransportLimits()) -> None:
        self._network = network
        self._peer_id = peer
        self._police = Policing(limits)
        self._state = _State.NEW
        self._subscriptions: dict[str, _common.Subscription] = {}
        self._handlers: dict[str, tuple[RequestHandler, int]] = {}
        self._seen: dict[bytes, tuple[float, bool]] = {}  # msg_id -> (when first seen, rejected), oldest first
        self._known: set[PeerId] = set()  # peers connect() reached: a request may redial them
        self._tasks = _common.Tasks()  # the node's message and request handlers
        self._pending: set[asyncio.Future[tuple[Status, bytes]]] = set()
        self._traffic = T.Traffic()

    @property
    def peer_id(self) -> PeerId:
        return self._peer_id

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise TransportError(f"a transport starts once; this one is {self._state.value}")
        self._state = _State.RUNNING

    async def close(self) -> None:
        if self._state in (_State.NEW, _State.RUNNING):
            self._network._unlink(self._peer_id)
            self._die(_State.CLOSED)

    def addresses(self) -> list[str]:
        return [ADDRESS_PREFIX + self._peer_id.hex()] if self._state is _State.RUNNING else []

    async def connect(self, address: str) -> PeerId:
        self._check_running()
        peer = parse_address(address)
        if self._police.banned(peer):
            raise PeerUnavailable(f"{peer.hex()[:16]} is banned")
        self._network._link(self._peer_id, peer)
        self._known.add(peer)
        await asyncio.sleep(0)
        return peer

    def peers(self) -> set[PeerId]:
        return set(self._network._links.get(self._peer_id, ())) if self._state is _State.RUNNING else set()

    def rejections(self, peer: PeerId) -> int:
        """How many gossip messages forwarded by ``peer`` this peer's validators rejected."""
        return self._police.rejections(peer)

    def traffic(self) -> dict[tuple[str, str], T.Count]:
        return self._traffic.snapshot()

    def score(self, peer: PeerId) -> float:
        return self._police.score(_common.check_peer(peer))

    def banned(self, peer: PeerId) -> bool:
        return self._police.banned(_common.check_peer(peer))

    def penalize(self, peer: PeerId) -> None:
        self._penalize(_common.check_peer(peer))

    def subscribe(self, topic: str, on_message: MessageHandler, validator: Validator | None = None) -> None:
        if _common.check_topic(topic) in self._subscriptions:
            raise ValueError(f"already subscribed to {topic!r}")
        self._subscriptions[topic] = _common.Subscription(on_message, validator)

    async def publish(self, topic: str, data: bytes) -> None:
        self._check_running()
        _common.check_topic(topic)
        data = bytes(data)
        if len(data) > MAX_GOSSIP_BYTES:
            raise MessageTooLarge(f"gossip of {len(data)} bytes > {MAX_GOSSIP_BYTES}")
        self._receive(Message(topic, data, self._peer_id, message_id(topic, data)), self._peer_id)
        await asyncio.sleep(0)

    def set_handler(self, protocol: str, handler: RequestHandler, *, max_request: int = MAX_REQUEST_BYTES) -> None:
        self._handlers[_common.check_protocol(protocol)] = (handler, max_request)

    async def request(self, peer: PeerId, protocol: str, data: bytes, *, timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      max_response: int = MAX_RESPONSE_BYTES) -> bytes:
        self._check_running()
        _common.check_peer(peer)
        _common.check_protocol(protocol)
        _common.check_request_limits(timeout, max_response)
        reply: asyncio.Future[tuple[Status, bytes]] = asyncio.get_running_loop().create_future()
        self._network._send_request(self, peer, protocol, bytes(data), max_response, reply)
        self._traffic.add(T.REQUEST_OUT, protocol, len(data))
        self._pending.add(reply)
        try:
            async with asyncio.timeout(timeout):
                status, body = await reply
        except TimeoutError:
            raise RequestTimeout(f"{protocol}: no answer from {peer.hex()[:16]} within {timeout} s") from None
        finally:
            self._pending.discard(reply)
        return _common.outcome(status, body, protocol)

    # -- called by the network --

    def _receive(self, message: Message, forwarder: PeerId) -> None:
        if self._state is not _State.RUNNING or self._police.banned(forwarder):
            return  # a banned peer's traffic still in flight is dropped unread
        if forwarder != self._peer_id:
            self._traffic.add(T.GOSSIP_COPIES_IN, message.topic, len(message.data))
        seen = self._seen_before(message.msg_id)
        if seen is not None:
            if seen:  # another copy of a message we rejected: it counts again, as in go-libp2p
                self._reject(forwarder)
            return
        subscription = self._subscriptions.get(message.topic)
        if subscription is None:
            if forwarder == self._peer_id:  # our own publish to a topic we do not read: fan out
                self._network._forward(self, message, exclude=forwarder)
            return
        verdict = _common.judge(subscription.validator, message)
        if verdict is Validation.REJECT:
            self._seen[message.msg_id] = (self._seen[message.msg_id][0], True)
            self._reject(forwarder)
        if verdict is not Validation.ACCEPT:
            return
        if message.origin != self._peer_id:
            self._traffic.add(T.GOSSIP_IN, message.topic, len(message.data))
        self._tasks.spawn(subscription.on_message(message))
        self._network._forward(self, message, exclude=forwarder)

    def _serve(self, caller: PeerId, protocol: str, data: bytes, max_response: int,
               reply: asyncio.Future[tuple[Status, bytes]], respond: Callable[[Status, bytes], None]) -> None:
        if self._state is not _State.RUNNING or reply.done():
            return
        if self._police.banned(caller):
            return  # it got in before the ban: no answer, as libp2p resets its streams
        handler, max_request = self._handlers.get(protocol, (None, 0))
        refusal = _common.refuse(handler, max_request, len(data))
        if refusal is not None:  # counted nowhere here, as on libp2p: its protocol may be no one's
            respond(*refusal)
            if refusal[0] is Status.REQUEST_TOO_LARGE:
                self._penalize(caller)
            return
        assert handler is not None  # refuse() refused a request without one
        self._traffic.add(T.REQUEST_IN, protocol, len(data))

        async def answer() -> None:
            status, body = await _common.serve(handler, caller, data, max_response)
            self._traffic.add(T.RESPONSE_OUT, protocol, len(body))
            respond(status, body)

        task = self._tasks.spawn(answer())
        # The caller gave up (deadline) or went away: stop working for it, as libp2p does.
        reply.add_done_callback(lambda _: task.cancel())

    # -- internals --

    def _check_running(self) -> None:
        if self._state is not _State.RUNNING:
            raise TransportError(f"transport is {self._state.value}")

    def _seen_before(self, msg_id: bytes) -> bool | None:
        """None the first time a message id is seen (it is then remembered); afterwards,
        whether this peer rejected it."""
        now = asyncio.get_running_loop().time()
        while self._seen:
            oldest = next(iter(self._seen))
            if now - self._seen[oldest][0] <= SEEN_TTL:
                break
            del self._seen[oldest]
        if msg_id in self._seen:
            return self._seen[msg_id][1]
        self._seen[msg_id] = (now, False)
        return None

    def _reject(self, forwarder: PeerId) -> None:
        # Our own publishes that our validator rejects cost nothing.
        if forwarder != self._peer_id and self._police.rejected(forwarder):
            self._hang_up(forwarder)

    def _penalize(self, peer: PeerId) -> None:
        if self._police.misbehaved(peer):
            self._hang_up(peer)

    def _hang_up(self, peer: PeerId) -> None:
        """``peer`` is banned now: cut our link to it."""
        _common.log.info("banned peer %s for %.0f s", peer.hex()[:16], self._police.limits.ban_seconds)
        self._network._cut(self._peer_id, peer)

    def _die(self, state: _State) -> None:
        self._state = state
        self._tasks.cancel()
        for reply in self._pending:
            if not reply.done():
                reply.set_exception(TransportError(f"transport {state.value}"))


def parse_address(address: str) -> PeerId:
    """The peer named by a loopback address. Raises ValueError if it is not one."""
    if not isinstance(address, str) or not address.startswith(ADDRESS_PREFIX):
        raise ValueError(f"not a loopback address: {address!r}")
    try:
        return _common.check_peer(bytes.fromhex(address.removeprefix(ADDRESS_PREFIX)))
    except ValueError:
        raise ValueError(f"not a loopback address: {address!r}") from None
