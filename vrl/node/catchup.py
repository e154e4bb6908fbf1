"""How a node catches up: at a restart it replays its store into a fresh protocol
(:func:`replay_store`); gossip it missed (it was away, a partition, a drop, a clogged link)
it pages in from its peers' stores by backfill (:class:`Backfill`, specs/network.md §6)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from typing import TypedDict

import structlog

from p2p.transport import Message, Transport, TransportError, Validation, message_id
from vrl.node import protocol as P
from vrl.node.messages import (
    Group,
    ManifestLists,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
    topic_of,
)
from vrl.node.requests import BACKFILL_CURSOR_TABLES, SHORT_ID_BYTES, BackfillPage, BackfillRequest
from vrl.node.store import Store, StoreError
from vrl.node.wire import U64
from vrl.rollouts.record import Rollout

BACKFILL_PROTOCOL = "/vrl/backfill/1"
BACKFILL_PAGE_BYTES = 1 << 20  # under the transport's 2 MiB response cap
BACKFILL_MAX_PAGES = 64  # bounded catch-up per peer; the rest arrives by gossip
# The cursor a pass starts from when it has none for a peer: generation 0 is no store's, so the
# peer answers from the start (specs/network.md §6).
FIRST_CURSOR = (0,) * (1 + BACKFILL_CURSOR_TABLES)
# Messages a pass brought that this node could not take yet (specs/network.md §6: a verdict before
# its manifest or its group, a group or step verdict of a version not announced here yet), kept in
# memory to be offered again: at most this many, and bytes. 4,096 is the protocol's own bound on
# verdicts waiting for their group (vrl.node.protocol.MAX_PENDING_VERDICTS: a round of 32 nodes
# that all work and verify); 16 MiB holds them (~450 bytes a verdict) with room for the groups of
# a version a moment ahead (~6 KB each for the base model: 2,000 of them). Past either bound the
# oldest goes, and the peer it came from is paged whole at the next round (Backfill.rewind).
DEFERRED_MAX_MESSAGES = 4096
DEFERRED_MAX_BYTES = 16 << 20


class Served(TypedDict, total=False):
    """The keywords a committee network's page is served with (Store.page's ``trainer`` and
    ``sender``): the trainer, and to the trainer, this node, the sender of what it sent it."""

    trainer: bytes
    sender: bytes


def _never(message: Message) -> int | None:
    return None


class Backfill:
    """Serves pages of ``store`` to peers on :data:`BACKFILL_PROTOCOL`, and pages in what
    they hold and this node lacks, each message judged by ``validate`` as gossip is.

    ``waits`` says of a message this node did not store once it was handled whether the reason
    is temporary: the policy version it waits in, or None if it is refused for good
    (vrl.node.validation.Validator.waits; the default: nothing waits). ``committee``: in a network
    of the committee design, the trainer's id and this node's, whose backfill serves what the
    design gossips, and to the trainer what this node sent it (specs/network.md §3.5, §6); None
    (the ticket design): everything."""

    def __init__(self, transport: Transport, store: Store, validate: Callable[[Message], Validation],
                 log: structlog.BoundLogger, waits: Callable[[Message], int | None] = _never,
                 committee: tuple[bytes, bytes] | None = None) -> None:
        self.transport, self.store, self.validate, self.log, self.waits = transport, store, validate, log, waits
        self.committee = committee
        # Per peer: the ``since`` of the last pass that asked it and the cursor its last page gave.
        # A pass of that ``since`` or a larger one (a later round) asks from there, so that every
        # message the peer stores crosses the link once; a smaller ``since`` asks from the start.
        # In memory only: a node that starts asks each peer for everything.
        self.cursors: dict[bytes, tuple[int, tuple[int, ...]]] = {}
        # What a pass brought and this node could not take yet, by message id, oldest first (dicts
        # keep order): (the message, the version it waits in). Offered again from here, not by
        # paging the peer's window again (specs/network.md §6).
        self.deferred: dict[bytes, tuple[Message, int]] = {}
        self.deferred_bytes = 0
        # Peers some message of which was dropped from ``deferred`` (its bounds): paged whole at
        # the next pass of a new ``since``, as every round was before cursors were kept.
        self.rewind: set[bytes] = set()
        self.dropped = 0  # messages dropped from ``deferred`` for room, ever
        self.since: int | None = None  # the last pass's
        # This node's own store's rowids when its last pass began: what it took since is named
        # in the next pass's requests (``have``, specs/network.md §6). None: everything.
        self.marks: tuple[int, ...] | None = None

    async def serve(self, peer: bytes, data: bytes) -> bytes:
        """Answer one page; a malformed request counts against its sender (as an invalid gossip
        message does) and raises MessageError, which the transport answers with an error."""
        try:
            request = BackfillRequest.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise
        # The asker is known by its connection's key, not by anything it says (specs/security.md).
        served: Served = {} if self.committee is None else {
            "trainer": self.committee[0], **({"sender": self.committee[1]} if peer == self.committee[0] else {})}
        # Off the event loop: a page is a SQLite read of up to 1 MiB (8 MiB read with ``have``).
        if request.cursor is None:  # by position, as before cursors (specs/network.md §6)
            messages, following = await asyncio.to_thread(self.store.since, request.since, BACKFILL_PAGE_BYTES,
                                                          request.after, **served)
            return BackfillPage(tuple(messages), following).to_bytes()
        page = await asyncio.to_thread(self.store.page, request.since, request.cursor, BACKFILL_PAGE_BYTES,
                                       held=request.held(), salt=request.salt, **served)
        # ``next`` counts the pass's messages, served or left out as held (the cursor is the
        # position); capped at the u64 range for a request whose ``after`` is near it (an honest
        # pass counts at most 64 pages' worth).
        following = None if page.done else min(request.after + len(page.messages) + page.left_out, U64)
        return BackfillPage(tuple(page.messages), following, page.cursor).to_bytes()

    async def pull(self, since: int) -> AsyncIterator[Message]:
        """What every connected peer holds of rounds ``>= since`` that this node has not
        stored, validated and ready to be handled as gossip. Known messages cost a hash, not a
        validation. Each peer is asked from where its last page left off (its cursor), across
        rounds: a pass costs what the peer stored since. What this node could not take yet when
        it came is offered again from memory (:attr:`deferred`): at each pass once its reason is
        gone, and all of it at the first pass of a new ``since``, as the whole window paged again
        at each round did before (specs/network.md §6)."""
        new_round = since != self.since
        self.since = since
        async for message in self._reoffer(since, everything=new_round):
            yield message
        # What this node took since its last pass, named to every peer before the bodies cross
        # (``have``): a message it received by gossip is not paged to it again. The first pass
        # names everything it holds of the window (its store replayed at a start).
        have, self.marks = await asyncio.to_thread(self.store.held_since, since, self.marks,
                                                   secrets.token_bytes(SHORT_ID_BYTES))
        peers = sorted(self.transport.peers())
        # Bounded by the peers connected: a peer that left and comes back is asked from the start.
        self.cursors = {peer: self.cursors[peer] for peer in peers if peer in self.cursors}
        if new_round:
            for peer in self.rewind:
                self.cursors.pop(peer, None)
            self.rewind.clear()
        for peer in peers:
            known = self.cursors.get(peer)
            # A larger ``since`` serves a subset of a smaller one's rows, so a cursor holds for it.
            cursor = known[1] if known is not None and known[0] <= since else FIRST_CURSOR
            after = 0
            for _ in range(BACKFILL_MAX_PAGES):
                try:
                    raw = await self.transport.request(peer, BACKFILL_PROTOCOL, BackfillRequest(
                        since, after, cursor, have or None).to_bytes(), timeout=10.0)
                    page = BackfillPage.from_bytes(raw, after, cursor)
                except (TransportError, MessageError) as error:
                    if isinstance(error, MessageError):
                        self.transport.penalize(peer)  # its page breaks specs/network.md §6
                    self.log.info("backfill from peer stopped", peer=peer.hex()[:8], error=str(error))
                    break
                for data in page.messages:
                    topic = topic_of(data)
                    if topic is None or self.store.has(topic, data):
                        continue
                    message = Message(topic, data, peer, message_id(topic, data))
                    judged = self.validate(message)
                    if judged is Validation.ACCEPT:
                        yield message
                    if judged is not Validation.REJECT:
                        self._defer(message)
                # Once the page's messages are handled: a pass cut short resumes after them.
                assert page.cursor is not None  # BackfillPage.from_bytes refused a page without one
                cursor = page.cursor
                self.cursors[peer] = (since, cursor)
                if page.next is None:
                    break
                after = page.next
        # What the pages brought (a manifest, a group, a policy) may be what a deferred message waited for.
        async for message in self._reoffer(since, everything=False):
            yield message

    def _defer(self, message: Message) -> None:
        """Keep a handled message this node did not store, if its reason is temporary (``waits``)."""
        if message.msg_id in self.deferred or self.store.has(message.topic, message.data):
            return
        version = self.waits(message)
        if version is None:
            return
        self.deferred[message.msg_id] = (message, version)
        self.deferred_bytes += len(message.data)
        while len(self.deferred) > DEFERRED_MAX_MESSAGES or self.deferred_bytes > DEFERRED_MAX_BYTES:
            dropped = self._drop(next(iter(self.deferred)))
            self.dropped += 1
            if dropped.origin not in self.rewind:  # (logged once a peer a round, not once a message)
                self.rewind.add(dropped.origin)
                self.log.info("backfill memory full; peer paged whole next round", peer=dropped.origin.hex()[:8])

    def _drop(self, msg_id: bytes) -> Message:
        message, _ = self.deferred.pop(msg_id)
        self.deferred_bytes -= len(message.data)
        return message

    async def _reoffer(self, since: int, everything: bool) -> AsyncIterator[Message]:
        """Offer the deferred messages again: those whose reason is gone, or, ``everything``, all
        of them (a verdict the protocol's bounded buffer let go of waits there again). A message
        of a version below ``since`` is dropped, as no peer pages it any more."""
        for msg_id in list(self.deferred):
            if msg_id not in self.deferred:  # dropped for room while an earlier one was handled
                continue
            message, version = self.deferred[msg_id]
            if version < since or self.store.has(message.topic, message.data):
                self._drop(msg_id)
                continue
            if not everything and self.waits(message) is not None:
                continue
            self._drop(msg_id)
            judged = self.validate(message)
            if judged is Validation.ACCEPT:
                yield message
            if judged is not Validation.REJECT:
                self._defer(message)


def replay_store(store: Store, protocol: P.NodeProtocol) -> None:
    """Rebuild ``protocol``'s state from ``store`` (no actions: they happened already)."""
    def earlier_protocol(what: str, error: MessageError) -> StoreError:
        return StoreError(f"{store.path}: a stored {what} is not one this node can follow ({error}); "
                          f"it was written by an earlier protocol: start this node with a new data_dir")

    for kind, data, extra in store.replay():
        if kind == "policy":
            try:
                announcement = PolicyAnnouncement.from_bytes(data)
            except MessageError as error:
                raise earlier_protocol("policy announcement", error) from None
            # The clock as it was when the policy arrived: its round started then, not at 0.
            protocol.handle(P.Tick(extra[0]), replaying=True)
            protocol.handle(P.PolicyAnnounced(announcement), replaying=True)
        elif kind == "manifest":
            # Before the groups and verdicts of its round (Store.replay's order): a restarted
            # node draws its committees and checks others' claims from it again.
            try:
                manifest = RoundManifest.from_bytes(data)
            except MessageError as error:
                raise earlier_protocol("round manifest", error) from None
            try:  # the trainer's own lists behind it; damaged ones leave it the header alone
                lists = ManifestLists.from_bytes(extra[1]) if extra[1] is not None else None
            except MessageError:
                lists = None
            protocol.handle(P.ManifestReceived(manifest, extra[0], lists), replaying=True)
        elif kind == "group":
            subject, version, received, planted = extra
            submission = Submission.from_bytes(data)
            if planted:
                protocol.handle(P.Planted(submission, subject, version), replaying=True)
            # The header only: its records are decoded (signatures checked) if a check or a
            # training step asks for them (GroupCache.body), not for every group the store ever held.
            index = Rollout.from_bytes(submission.records[0]).group_index
            protocol.handle(P.GroupReceived(Group(submission, (), subject, version, index), received),
                            replaying=True)
        elif kind == "verdict":
            try:
                verdict = SignedVerdict.from_bytes(data)
            except MessageError as error:  # a version 1 verdict (specs/network.md §3.2)
                raise earlier_protocol("verdict", error) from None
            protocol.handle(P.VerdictReceived(verdict), replaying=True)
        elif kind == "step":
            protocol.handle(P.StepVerdictReceived(StepVerdict.from_bytes(data)), replaying=True)
        elif kind == "trained":
            version, groups = extra
            announced = store.policy(version)
            if announced is not None:
                protocol.handle(P.Trained(announced, groups), replaying=True)
