"""How a node catches up: at a restart it replays its store into a fresh protocol
(:func:`replay_store`); gossip it missed (it was away, a partition, a drop, a clogged link)
it pages in from its peers' stores by backfill (:class:`Backfill`, specs/network.md §6)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import structlog

from p2p.transport import Message, Transport, TransportError, Validation, message_id
from vrl.node import protocol as P
from vrl.node.messages import (
    BACKFILL_CURSOR_TABLES,
    BackfillPage,
    BackfillRequest,
    Group,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
    topic_of,
)
from vrl.node.store import Store, StoreError
from vrl.node.wire import U64
from vrl.rollouts.record import Rollout

BACKFILL_PROTOCOL = "/vrl/backfill/1"
BACKFILL_PAGE_BYTES = 1 << 20  # under the transport's 2 MiB response cap
BACKFILL_MAX_PAGES = 64  # bounded catch-up per peer; the rest arrives by gossip
# The cursor a pass starts from when it has none for a peer: generation 0 is no store's, so the
# peer answers from the start (specs/network.md §6).
FIRST_CURSOR = (0,) * (1 + BACKFILL_CURSOR_TABLES)


class Backfill:
    """Serves pages of ``store`` to peers on :data:`BACKFILL_PROTOCOL`, and pages in what
    they hold and this node lacks, each message judged by ``validate`` as gossip is."""

    def __init__(self, transport: Transport, store: Store, validate: Callable[[Message], Validation],
                 log: structlog.BoundLogger) -> None:
        self.transport, self.store, self.validate, self.log = transport, store, validate, log
        # Per peer: the ``since`` of its last pass and the cursor its last page gave, so that
        # the next pass of the same ``since`` asks only for what the peer stored since. In
        # memory only: a node that starts asks each peer for everything.
        self.cursors: dict[bytes, tuple[int, tuple[int, ...]]] = {}

    async def serve(self, peer: bytes, data: bytes) -> bytes:
        """Answer one page; a malformed request counts against its sender (as an invalid gossip
        message does) and raises MessageError, which the transport answers with an error."""
        try:
            request = BackfillRequest.from_bytes(data)
        except MessageError:
            self.transport.penalize(peer)
            raise
        # Off the event loop: a page is a SQLite read of up to 1 MiB.
        if request.cursor is None:  # by position, as before cursors (specs/network.md §6)
            messages, following = await asyncio.to_thread(self.store.since, request.since, BACKFILL_PAGE_BYTES,
                                                          request.after)
            return BackfillPage(tuple(messages), following).to_bytes()
        messages, cursor, done = await asyncio.to_thread(self.store.page, request.since, request.cursor,
                                                         BACKFILL_PAGE_BYTES)
        # ``next`` counts the pass's messages (the cursor is the position); capped at the u64 range
        # for a request whose ``after`` is near it (an honest pass counts at most 64 pages' worth).
        following = None if done else min(request.after + len(messages), U64)
        return BackfillPage(tuple(messages), following, cursor).to_bytes()

    async def pull(self, since: int) -> AsyncIterator[Message]:
        """What every connected peer holds of rounds ``>= since`` that this node has not
        stored, validated and ready to be handled as gossip. Known messages cost a hash, not a
        validation. A peer asked with the same ``since`` before is asked from where its last
        page left off (its cursor): a pass costs what it stored since. A new ``since`` (a new
        round) starts from no cursor, so a message this node could not take yet when it came
        (a verdict before its manifest, a group of a policy not yet here) is offered again."""
        peers = sorted(self.transport.peers())
        # Bounded by the peers connected: a peer that left and comes back is asked from the start.
        self.cursors = {peer: self.cursors[peer] for peer in peers if peer in self.cursors}
        for peer in peers:
            known = self.cursors.get(peer)
            cursor = known[1] if known is not None and known[0] == since else FIRST_CURSOR
            after: int | None = 0
            for _ in range(BACKFILL_MAX_PAGES):
                try:
                    raw = await self.transport.request(peer, BACKFILL_PROTOCOL, BackfillRequest(
                        since, after, cursor).to_bytes(), timeout=10.0)
                    page = BackfillPage.from_bytes(raw, after, cursor)
                except (TransportError, MessageError) as error:
                    if isinstance(error, MessageError):
                        self.transport.penalize(peer)  # its page breaks specs/network.md §6
                    self.log.info("backfill from peer stopped", peer=peer.hex()[:8], error=str(error))
                    break
                after = page.next
                for data in page.messages:
                    topic = topic_of(data)
                    if topic is None or self.store.has(topic, data):
                        continue
                    message = Message(topic, data, peer, message_id(topic, data))
                    if self.validate(message) is Validation.ACCEPT:
                        yield message
                # Once the page's messages are handled: a pass cut short resumes after them.
                cursor = page.cursor
                self.cursors[peer] = (since, cursor)
                if after is None:
                    break


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
            protocol.handle(P.ManifestReceived(RoundManifest.from_bytes(data), extra[0]), replaying=True)
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
            announcement = store.policy(version)
            if announcement is not None:
                protocol.handle(P.Trained(announcement, groups), replaying=True)
