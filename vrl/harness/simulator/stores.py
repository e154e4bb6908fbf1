"""What each simulated node's store holds, and what the daemon's backfill pages out of it
(``SimConfig.backfill = "daemon"``): the calibration's model of vrl.node.catchup as it runs.

The daemon (vrl.node.daemon.Node.run) starts a backfill pass every BACKFILL_EVERY_SECONDS;
a pass asks every connected peer, page by page from the start (vrl.node.catchup.Backfill.pull:
``after=0``), for every message of its store of versions ``>= since`` (``since`` = the
node's version - 1): policies, round manifests, groups (not planted ones), verdicts and step
verdicts (vrl.node.store.Store.since), at most BACKFILL_PAGE_BYTES and BACKFILL_MAX_MESSAGES a
page, BACKFILL_MAX_PAGES pages a peer. Every byte of every page crosses the link whether the
asker holds the message or not (it drops the known ones after they came). So a pass costs
the peer's whole window, and what a peer's store holds matters: in the committee design the
trainer holds every group and every pass (sent to it, specs/network.md §3.5), a worker its
own, the groups it fetched, and what was gossiped.

A node stores (vrl.node.daemon): what it publishes or sends (``_store_own``), every group and
policy it accepts (the protocol's ``PersistGroup(group, received)`` and
``PersistPolicy(announcement)`` actions, vrl.node.events, which the daemon carries out), a
received verdict once its group is known (``Persist``), a manifest and a step verdict once they
count (``PersistManifest``, ``PersistStep``), and its own verdicts and step verdicts that it
stores without sending (``Persist``, ``PersistStep`` of its own). The simulator stores what a
node accepts as it is handled (:func:`keep`), not by those actions: it absorbs received groups
and verdicts with ``replaying=True`` (no actions), so a received verdict is taken as stored when
the receiver holds its group after it was handled; one whose group comes later is not counted
(its bytes are a verdict's, ~500, against pages of groups).

``"gossip"`` (the default, and specs/network.md §3.5's target for the committee design): a
pass costs what the network gossiped in the window, the same from every peer.

Both page by cursor (specs/network.md §6, vrl.node.catchup): a pass asks each peer only for what
it stored since this node's last pass, across rounds (the cursor is kept for a larger ``since``);
the first pass after a peer was unreachable asks for the whole window. What a pass brought that
the node could not take yet is offered again from the node's memory at the first pass of each
round (Backfill.deferred: no bytes; the daemon also offers each one at the pass after its reason
is gone, which this model leaves to the round's first pass, and its buffer's bound is not
modelled). ``"gossip-round"`` and ``"daemon-round"`` are the models of the cursor kept only within
a round (the first pass of each round pages the window whole, and so offers again what was not
taken: vrl.node.catchup before the cursor was kept across rounds); ``"gossip-full"`` and
``"daemon-full"`` of the passes before cursors (every pass the whole window), kept to compare.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from vrl.node import events as E
from vrl.node.catchup import BACKFILL_MAX_PAGES, BACKFILL_PAGE_BYTES
from vrl.node.messages import Group, Outcome, SignedVerdict, StepOutcome, StepVerdict
from vrl.node.requests import BACKFILL_HAVE_MAX, BACKFILL_MAX_MESSAGES, SHORT_ID_BYTES, BackfillPage, BackfillRequest
from vrl.node.wire import schema_of

from .metrics import Metrics
from .network import Network
from .nodes import Msg, SimNode
from .spec import SimConfig

# A page's msgpack framing: the map, its keys and ``next`` (the empty page's encoding), and per
# message a bin header (3 bytes up to 64 KiB, 5 above: a group of the base model is ~6 KB).
PAGE_OVERHEAD_BYTES = len(BackfillPage((), None).to_bytes())
MESSAGE_OVERHEAD_BYTES = 3
# A page request: {"since": u64, "after": u64, "cursor": [6 u64]} (vrl.node.requests.BackfillRequest),
# as a pass asks for its pages: a cursor of typical positions (a generation takes 9 bytes, a
# watermark below 65,536 3), and a page answering one carries one too.
CURSOR = (1 << 63, 1, 40, 4000, 4000, 1)
REQUEST_BYTES = len(BackfillRequest(1, 1, CURSOR).to_bytes())
FULL_REQUEST_BYTES = len(BackfillRequest(1, 1).to_bytes())  # a request by position (the "-full" models)
CURSOR_BYTES = len(BackfillPage((), None, CURSOR).to_bytes()) - len(BackfillPage((), None).to_bytes())


#: What a node's "gossip" model pass leaves for its next (gossip_pass): the pass's ``since``,
#: and per version the bytes and messages gossiped by then.
GossipMark = tuple[int, dict[int, tuple[int, int]]]


class Holding(Protocol):
    """What storing a message reads of the simulation (driver.Simulation): the stores, if
    modelled (the "daemon" models), and the nodes."""

    @property
    def ledger(self) -> StoreLedger | None: ...
    @property
    def nodes(self) -> list[SimNode]: ...


class Backfilling(Holding, Protocol):
    """What a backfill pass reads and moves of the simulation (driver.Simulation)."""

    @property
    def now(self) -> float: ...
    @property
    def config(self) -> SimConfig: ...
    @property
    def net(self) -> Network: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def trainer(self) -> SimNode: ...
    @property
    def round_bytes(self) -> Mapping[int, int]: ...
    @property
    def round_messages(self) -> Mapping[int, int]: ...
    @property
    def gossip_marks(self) -> dict[int, GossipMark]: ...
    @property
    def daemon_marks(self) -> dict[int, int]: ...
    def deliver(self, node: SimNode, msg: Msg, when: float) -> None: ...


def have_bytes(named: int) -> int:
    """What ``have`` adds to a request naming ``named`` messages (none: the key is absent):
    its key, a bin header, the salt and 8 bytes a short id (specs/network.md §6)."""
    named = min(named, BACKFILL_HAVE_MAX)
    if named == 0:
        return 0
    with_have = BackfillRequest(1, 1, CURSOR, bytes(SHORT_ID_BYTES * (1 + named)))
    return len(with_have.to_bytes()) - REQUEST_BYTES


class StoreLedger:
    """Per node: bytes and messages stored per version, each message once, and the messages
    themselves (what a pass hands a peer that lacks them)."""

    def __init__(self) -> None:
        self.held: list[dict[int, list[int]]] = []  # node -> version -> [bytes, messages]
        self.keys: list[dict[int, dict[int, Msg | None]]] = []  # node -> version -> hash of the bytes -> Msg
        # (asker, peer) -> (since, version -> (bytes, messages) of the peer's store paged so far):
        # the asker's cursor on that peer and the ``since`` it was last used for (keys are in the
        # order stored, as rowids are).
        self.cursors: dict[tuple[int, int], tuple[int, dict[int, tuple[int, int]]]] = {}
        # Per node: how many messages it stored, and when (that count) it stored each: what it
        # names as held since its last pass (``have``, daemon_pass); and the groups a failure it
        # stored names (the trainer's pass on one is served to all, Store._GOSSIPED).
        self.stored: list[int] = []
        self.order: list[dict[int, int]] = []
        self.failed: list[set[bytes]] = []
        self.have_marks: dict[int, int] = {}  # node -> its count when its last pass began

    def grow(self, nodes: int) -> None:
        while len(self.held) < nodes:
            self.held.append(defaultdict(lambda: [0, 0]))
            self.keys.append(defaultdict(dict))
            self.stored.append(0)
            self.order.append({})
            self.failed.append(set())

    def has(self, node: int, version: int, data: bytes) -> bool:
        return hash(data) in self.keys[node].get(version, ())

    def put(self, node: int, version: int, data: bytes, msg: Msg | None = None) -> None:
        """``node`` stores one message of ``version`` (again: a no-op, as the store's)."""
        key = hash(data)
        seen = self.keys[node][version]
        if key in seen:
            return
        seen[key] = msg
        slot = self.held[node][version]
        slot[0] += len(data)
        slot[1] += 1
        self.order[node][key] = self.stored[node]
        self.stored[node] += 1
        verdict = msg.obj if msg is not None else None
        if isinstance(verdict, SignedVerdict) and verdict.outcome != Outcome.PASS:
            self.failed[node].add(verdict.group)

    def named(self, node: int, since: int) -> frozenset[int]:
        """What ``node``'s pass names as held (vrl.node.catchup: Store.held_since): the messages
        of versions >= ``since`` it stored since its last pass began (all, at its first), at most
        BACKFILL_HAVE_MAX, the newest; and the pass's start is remembered."""
        mark = self.have_marks.get(node, 0)
        self.have_marks[node] = self.stored[node]
        order = self.order[node]
        fresh = [(order[key], key) for version, keys in self.keys[node].items() if version >= since
                 for key in keys if order[key] >= mark]
        if len(fresh) > BACKFILL_HAVE_MAX:
            fresh = sorted(fresh)[-BACKFILL_HAVE_MAX:]
        return frozenset(key for _, key in fresh)

    def window(self, node: int, since: int) -> tuple[int, int]:
        """Bytes and messages ``node``'s store holds of versions ``>= since``."""
        size = count = 0
        for version, (b, m) in self.held[node].items():
            if version >= since:
                size += b
                count += m
        return size, count

    def prune(self, oldest: int) -> None:
        """Forget versions below ``oldest``: no pass asks for them any more (the pruner drops them too)."""
        for held, keys, order in zip(self.held, self.keys, self.order):
            for version in [v for v in held if v < oldest]:
                del held[version]
                for key in keys.pop(version, {}):
                    order.pop(key, None)


    def since_cursor(self, me: int, peer: int, since: int, full: bool = False,
                     per_round: bool = False) -> tuple[int, int, dict[int, int]]:
        """What ``me``'s pass of ``since`` pages from ``peer`` and moves its cursor past: bytes,
        messages, and per version the index of the first message not paged before. The cursor
        holds for the same or a larger ``since`` (vrl.node.catchup), for the same one only when
        ``per_round``; ``full``: every pass from no cursor."""
        known = self.cursors.get((me, peer))
        holds = known is not None and not full and (known[0] == since if per_round else known[0] <= since)
        marks = known[1] if known is not None and holds else {}
        size = count = 0
        start: dict[int, int] = {}
        now: dict[int, tuple[int, int]] = {}
        for version, (b, m) in self.held[peer].items():
            if version >= since:
                old_b, old_m = marks.get(version, (0, 0))
                size, count = size + b - old_b, count + m - old_m
                start[version], now[version] = old_m, (b, m)
        self.cursors[(me, peer)] = (since, now)
        return size, count, start

    def forget(self, me: int, peer: int) -> None:
        """``me`` cannot reach ``peer``: vrl.node.catchup drops the cursor of a peer that left."""
        self.cursors.pop((me, peer), None)


def pages(size: int, messages: int) -> tuple[int, int]:
    """A peer's window of ``size`` bytes in ``messages`` messages, paged as Store.since pages it:
    (pages, bytes of the pages) within BACKFILL_MAX_PAGES; an empty window is one empty page."""
    if messages == 0:
        return 1, PAGE_OVERHEAD_BYTES
    count = max(math.ceil(size / BACKFILL_PAGE_BYTES), math.ceil(messages / BACKFILL_MAX_MESSAGES))
    count = min(count, BACKFILL_MAX_PAGES)
    share = min(1.0, count * BACKFILL_PAGE_BYTES / size) if size else 1.0
    return count, round(share * (size + MESSAGE_OVERHEAD_BYTES * messages)) + count * PAGE_OVERHEAD_BYTES


def gossip_pass(sim: Backfilling, node: SimNode, full: bool, per_round: bool = False, have: bool = False) -> None:
    """The ``"gossip"`` model's pass: from each reachable peer, what the network gossiped in the
    window since this node's last pass (of the same ``since`` when ``per_round``; all of it when
    ``full``). ``sim.gossip_marks[node]``: (the last pass's since, version -> (bytes, messages)
    gossiped by then). With ``have`` the node names what it received of that (every message it
    did not miss: ``SimNode.lacked``), and a peer pages only what it missed; a node's first pass
    names nothing (a fresh node holds nothing of the window). Messages stored by a peer after the
    node's last pass that the node stored before it (a pass racing the gossip) are not modelled."""
    assert node.protocol is not None and node.protocol.version is not None  # (Simulation.backfill_pass)
    since = max(node.protocol.version - 1, 0)
    known = sim.gossip_marks.get(node.index)
    holds = known is not None and not full and (known[0] == since if per_round else known[0] <= since)
    marks = known[1] if known is not None and holds else {}
    window = {v: (b, sim.round_messages.get(v, 0)) for v, b in sim.round_bytes.items() if v >= since}
    new = sum(b - marks.get(v, (0, 0))[0] for v, (b, _) in window.items())
    new_messages = sum(m - marks.get(v, (0, 0))[1] for v, (_, m) in window.items())
    sim.gossip_marks[node.index] = (since, window)
    lacked, node.lacked = node.lacked, [0, 0]
    named = 0
    if have and known is not None:
        named = max(new_messages - lacked[1], 0)
        new = min(new, lacked[0])
    page = min(new, BACKFILL_PAGE_BYTES * BACKFILL_MAX_PAGES)
    count = max(1, math.ceil(page / BACKFILL_PAGE_BYTES))
    extra = 0 if full else count * CURSOR_BYTES
    request = count * ((FULL_REQUEST_BYTES if full else REQUEST_BYTES) + have_bytes(named))
    for peer in sim.net.links[node.index]:
        if sim.nodes[peer].protocol is not None and sim.net.reachable(node.index, peer):
            sim.metrics.backfilled(node.index, peer, page + extra, count, request)


def keep(sim: Holding, node: int, msg: Msg) -> None:
    """``node`` stored ``msg`` (its own, or one it accepted), as the daemon does: a received
    verdict only if its group is held (Persist), any other message as it is accepted."""
    ledger = sim.ledger
    if ledger is None:
        return
    ledger.grow(node + 1)
    if isinstance(msg.obj, SignedVerdict) and msg.origin != node:
        protocol = sim.nodes[node].protocol
        if protocol is None or protocol.group_version(msg.obj.group) is None:  # neither held nor forgotten
            return
    ledger.put(node, msg.round, msg.data, msg)


def keep_action(sim: Holding, node: int, action: E.Persist | E.PersistStep | E.PersistManifest) -> None:
    """A Persist, PersistStep or PersistManifest action: the store takes the message (a
    received one again is a no-op; the node's own verdicts the design stores and does not send)."""
    ledger = sim.ledger
    if ledger is None:
        return
    ledger.grow(node + 1)
    message = action.manifest if isinstance(action, E.PersistManifest) else action.verdict
    version = (message.policy_version if isinstance(message, SignedVerdict)
               else message.version if isinstance(message, StepVerdict) else message.round)
    data = message.to_bytes()
    if not ledger.has(node, version, data):
        topic = schema_of(type(message)).topic
        assert topic is not None  # (a gossiped message's schema names its topic)
        ledger.put(node, version, data, Msg(topic, data, message, node, version, True, direct=True))


def _served(key: int, msg: Msg | None, named: frozenset[int], committee: bool, trainer: bytes, sender: bytes | None,
            failed: set[bytes]) -> bool:
    """Whether a peer's store serves ``msg`` in a pass of daemon_pass: not if the asker named it
    as held; in the committee design (``committee``, with ``have``: the daemon as it runs now)
    only what the design gossips, and to the trainer what the peer sent it (``sender``, the
    peer's id when the asker is the trainer; vrl.node.store._GOSSIPED)."""
    if msg is None or key in named:
        return False
    if not committee:
        return True
    v = msg.obj  # (of the topic's class: Simulation.decode)
    if isinstance(v, Group):
        return v.subject == sender
    if isinstance(v, SignedVerdict):
        return v.outcome != Outcome.PASS or v.verifier == sender or (v.verifier == trainer and v.group in failed)
    if isinstance(v, StepVerdict):
        return v.outcome != StepOutcome.PASS
    return True


def daemon_pass(sim: Backfilling, node: SimNode, full: bool = False, per_round: bool = False,
                have: bool = False) -> None:
    """One backfill pass of ``node`` as the daemon runs it (vrl.node.catchup.Backfill.pull):
    every connected peer's window stored since the node's cursor on it (all of it when
    ``full``, the passes before cursors; from no cursor at a new round when ``per_round``),
    paged, each page a request and a response on both sides; what the node's store lacks of it
    is handled as gossip (validated, never forwarded), after the pages' transfer time. Its bytes
    are the pages' (prepaid: no delivery counted again). With the cursor kept across rounds, what
    was paged before and is still not stored is offered again from memory at a new round, at no
    cost in bytes (Backfill.deferred). A pass past BACKFILL_MAX_PAGES is taken as paged whole (a
    bound only the first pass of a round at N = 1,000 could reach).

    With ``have`` (the daemon as it runs now): the node names what it stored since its last pass
    began, and a peer leaves that out; in the committee design a peer pages what the design
    gossips (Store._GOSSIPED: no group, no pass but the trainer's on a group a failure it stored
    names, no step pass), and to the trainer what it sent it (its groups and passes)."""
    ledger, net, me = sim.ledger, sim.net, node.index
    assert ledger is not None and node.protocol is not None  # (the "daemon" models keep the stores)
    since = max((node.protocol.version or 0) - 1, 0)
    new_round = sim.daemon_marks.get(me) != since
    sim.daemon_marks[me] = since
    remembered = not full and not per_round and new_round
    ledger.grow(len(sim.nodes))
    mine = ledger.keys[me]
    named = ledger.named(me, since) if have else frozenset()
    trainer = sim.trainer.key.node_id
    committee = have and node.protocol.design.manifests
    offered: set[int] = set()
    for peer in sorted(net.links[me]):
        if sim.nodes[peer].protocol is None or not net.reachable(me, peer):
            ledger.forget(me, peer)
            continue
        size, messages, start = ledger.since_cursor(me, peer, since, full, per_round)
        failed = ledger.failed[peer]
        sender = sim.nodes[peer].key.node_id if me == sim.trainer.index else None
        served = functools.partial(_served, named=named, committee=committee, trainer=trainer, sender=sender,
                                   failed=failed)
        if have:  # counted message by message: what the peer leaves out
            size = messages = 0
            for version, held in ledger.keys[peer].items():
                if version >= since:
                    for key, msg in itertools.islice(held.items(), start[version], None):
                        if msg is not None and served(key, msg):
                            size, messages = size + len(msg.data), messages + 1
        count, size = pages(size, messages)
        size += 0 if full else count * CURSOR_BYTES
        request = count * ((FULL_REQUEST_BYTES if full else REQUEST_BYTES) + have_bytes(len(named)))
        sim.metrics.backfilled(me, peer, size, count, request)
        when = sim.now + count * sim.config.latency_s + size / sim.config.bandwidth_bps
        for version, held in ledger.keys[peer].items():
            if version < since:
                continue
            # Paged now: from the cursor on; and from memory, once, what earlier passes brought.
            first = 0 if remembered else start[version]
            for index, (key, msg) in enumerate(itertools.islice(held.items(), first, None), first):
                if msg is None or key in mine.get(version, ()) or msg.origin == me or not served(key, msg):
                    continue
                paged = index >= start[version]
                if not paged:
                    if key in offered:
                        continue
                    offered.add(key)
                copy = dataclasses.replace(msg, direct=True)  # handled, not forwarded
                node.prepaid.add(copy)
                sim.deliver(node, copy, when if paged else sim.now)
