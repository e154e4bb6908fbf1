"""Backfill between two real stores on a loopback pair (vrl.node.catchup, specs/network.md §6):
a pass moves only what the peer stored since the last one, across rounds (a larger ``since``); a
restarted or reset peer is paged whole again and nothing is lost; a smaller ``since`` starts from
no cursor; what the client could not take yet is offered again from memory once it can, and
every message it could take is taken exactly once."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p.loopback import LoopbackNetwork
from p2p.transport import Message, Validation
from tests.test_store_cursor import put
from vrl.node import catchup
from vrl.node.catchup import BACKFILL_PROTOCOL, Backfill
from vrl.node.messages import Submission
from vrl.node.requests import BackfillPage, BackfillRequest
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

SERVER, CLIENT = NodeKey.from_seed(b"S" * 32), NodeKey.from_seed(b"C" * 32)


def handle(store: Store, topic: str, data: bytes) -> None:
    """What the daemon's handler stores of an accepted message (vrl.node.daemon._on_message)."""
    from vrl.node.messages import SignedVerdict

    if topic.startswith("vrl/groups"):
        store.put_group(Submission.from_bytes(data), b"w" * 32, 0, 0.0)
    elif topic.startswith("vrl/verdicts"):
        store.put_verdict(SignedVerdict.from_bytes(data), 0.0)


def test_a_second_pass_moves_only_the_new_messages_and_a_reset_peer_is_paged_whole(tmp_path):
    async def scenario() -> None:
        network = LoopbackNetwork(seed=7)
        server_transport, client_transport = (network.transport(k.private_seed()) for k in (SERVER, CLIENT))
        for transport in (server_transport, client_transport):
            await transport.start()
        log = structlog.get_logger()
        server = Backfill(server_transport, Store(tmp_path / "server.sqlite"), lambda m: Validation.ACCEPT, log)
        client_store = Store(tmp_path / "client.sqlite")
        # The validator every message passes here: what is tested is what is paged, not judged.
        client = Backfill(client_transport, client_store, lambda m: Validation.ACCEPT, log)
        paged: list[list[bytes]] = []  # the messages each page carried, as the client received them

        async def serve(peer: bytes, data: bytes) -> bytes:
            answer = await server.serve(peer, data)
            request = BackfillRequest.from_bytes(data)
            paged.append(list(BackfillPage.from_bytes(answer, request.after, request.cursor).messages))
            return answer

        server_transport.set_handler(BACKFILL_PROTOCOL, serve)
        await client_transport.connect(server_transport.addresses()[0])

        async def a_pass(since: int) -> tuple[list[bytes], list[bytes]]:
            """(every message the pass's pages carried, the ones the client lacked and took)."""
            paged.clear()
            taken = []
            async for message in client.pull(since):
                handle(client_store, message.topic, message.data)
                taken.append(message.data)
            return [m for page in paged for m in page], taken

        first = [put(server.store, kind, n, 0) for n in range(30) for kind in (2, 3)]
        carried, taken = await a_pass(0)
        assert sorted(carried) == sorted(taken) == sorted(first)
        assert await a_pass(0) == ([], [])  # nothing stored since: one empty page
        new = [put(server.store, kind, n, 0) for n in range(30, 33) for kind in (2, 3)]
        carried, taken = await a_pass(0)
        assert carried == taken == new[0::2] + new[1::2]  # only the new ones cross the link: groups, then verdicts
        # The peer restarts: its store opens with a new generation, and is paged whole once, less
        # what the client took since its last pass began (named in ``have``: the new ones).
        server.store.close()
        server.store = Store(tmp_path / "server.sqlite")
        carried, taken = await a_pass(0)
        assert sorted(carried) == sorted(first) and taken == []
        # Its data_dir is wiped: a fresh store of other messages, fewer rows than the cursor's
        # watermarks; the client gets every one of them.
        server.store.close()
        server.store = Store(tmp_path / "wiped.sqlite")
        other = [put(server.store, kind, n, 0) for n in range(100, 104) for kind in (2, 3)]
        carried, taken = await a_pass(0)
        assert sorted(carried) == sorted(taken) == sorted(other)
        assert client_store.counts()["groups"] == 33 + 4 and client_store.counts()["verdicts"] == 33 + 4
        # A new since (the next round) keeps the cursor: nothing paged before comes again.
        ahead = put(server.store, 3, 150, 1)
        assert await a_pass(0) == ([ahead], [ahead])
        carried, taken = await a_pass(1)
        assert carried == [] and taken == []
        late = put(server.store, 2, 200, 1)
        assert await a_pass(1) == ([late], [late])
        # A smaller since than the cursor's starts from no cursor: rows of the versions between were
        # skipped; less the one the client took in its last pass.
        assert sorted((await a_pass(0))[0]) == sorted(other + [ahead])
        server.store.close()
        client_store.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


class Pair:
    """A server and a client :class:`Backfill` on a loopback pair. The client cannot take the
    messages in ``blocked`` yet (its validator ignores them; ``waits`` gives their version, as
    Validator.waits does for a verdict before its manifest) and takes every other one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blocked: set[bytes] = set()
        # Accepted but not stored when handled (a verdict whose group is not here: the protocol
        # parks it in its bounded buffer), waiting in their version.
        self.parked: set[bytes] = set()
        self.versions: dict[bytes, int] = {}  # every message written, with its version
        self.paged: list[bytes] = []  # every message a page carried to the client, in order
        self.taken: list[bytes] = []  # every message the client handled and stored, in order

    async def start(self) -> None:
        network = LoopbackNetwork(seed=11)
        server_transport, client_transport = (network.transport(k.private_seed()) for k in (SERVER, CLIENT))
        for transport in (server_transport, client_transport):
            await transport.start()
        log = structlog.get_logger()
        self.server = Backfill(server_transport, Store(self.root / "server.sqlite"), lambda m: Validation.ACCEPT, log)
        self.client_store = Store(self.root / "client.sqlite")
        self.client = Backfill(client_transport, self.client_store, self.validate, log, waits=self.waits)

        async def serve(peer: bytes, data: bytes) -> bytes:
            answer = await self.server.serve(peer, data)
            request = BackfillRequest.from_bytes(data)
            self.paged += BackfillPage.from_bytes(answer, request.after, request.cursor).messages
            return answer

        server_transport.set_handler(BACKFILL_PROTOCOL, serve)
        await client_transport.connect(server_transport.addresses()[0])

    def validate(self, message: Message) -> Validation:
        return Validation.IGNORE if message.data in self.blocked else Validation.ACCEPT

    def waits(self, message: Message) -> int | None:
        return self.versions[message.data] if message.data in self.blocked | self.parked else None

    def write(self, kind: int, n: int, version: int, blocked: bool = False) -> bytes:
        data = put(self.server.store, kind, n, version)
        self.versions[data] = version
        if blocked:
            self.blocked.add(data)
        return data

    async def a_pass(self, since: int) -> tuple[list[bytes], list[bytes]]:
        """(what the pass's pages carried, what the client took)."""
        paged, taken = len(self.paged), len(self.taken)
        async for message in self.client.pull(since):
            assert message.data not in self.blocked  # only what it can take is handed on
            if message.data not in self.parked:
                handle(self.client_store, message.topic, message.data)
            self.taken.append(message.data)
        return self.paged[paged:], self.taken[taken:]

    def close(self) -> None:
        self.server.store.close()
        self.client_store.close()


def test_a_message_not_takeable_yet_is_taken_later_without_paging_it_again(tmp_path):
    """A verdict before its manifest (ignored, waits in its version) is kept and taken at the
    pass after it can be, from memory: neither that pass nor the next round's pages it again. One
    refused for good (waits gives None) is not kept: it is never offered again."""
    async def scenario() -> None:
        pair = Pair(tmp_path)
        await pair.start()
        ready = pair.write(3, 1, 0)
        early = pair.write(3, 2, 0, blocked=True)
        assert await pair.a_pass(0) == ([ready, early], [ready])
        assert list(pair.client.deferred) and pair.client.deferred_bytes == len(early)
        assert await pair.a_pass(0) == ([], [])  # still waiting: kept, not paged again
        pair.blocked.discard(early)  # its manifest came (by gossip)
        assert await pair.a_pass(0) == ([], [early])
        assert not pair.client.deferred and pair.client.deferred_bytes == 0
        assert await pair.a_pass(1) == ([], [])  # the next round pages nothing old again
        # Refused for good (another trainer's, a duplicate slot): not kept, not offered again.
        never = pair.write(3, 3, 1)
        pair.client.waits = lambda message: None
        pair.blocked.add(never)
        assert await pair.a_pass(1) == ([never], [])
        pair.blocked.discard(never)
        assert not pair.client.deferred and await pair.a_pass(2) == ([], [])
        pair.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_parked_message_is_handed_again_once_a_round_from_memory(tmp_path):
    """A verdict the protocol parked (accepted, not stored: its group is not here) is handed
    again at the first pass of each round, as the round's full pass did before (the protocol's
    buffer may have let it go, and it is what makes a recheck member fetch the group), and not
    at the passes between; it costs no page."""
    async def scenario() -> None:
        pair = Pair(tmp_path)
        await pair.start()
        waiting = pair.write(3, 1, 1)
        pair.parked.add(waiting)
        assert await pair.a_pass(0) == ([waiting], [waiting])
        assert await pair.a_pass(0) == ([], [])
        assert await pair.a_pass(1) == ([], [waiting])
        assert await pair.a_pass(1) == ([], [])
        pair.parked.clear()  # its group came: handled and stored, the last time
        assert await pair.a_pass(1) == ([], [waiting])
        assert await pair.a_pass(2) == ([], []) and not pair.client.deferred
        pair.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_deferred_message_out_of_the_window_is_dropped_and_a_full_buffer_pages_its_peer_whole_next_round(
        tmp_path, monkeypatch):
    """Past its bounds the buffer drops its oldest message and pages the peer it came from whole
    at the next round, so nothing it could take is lost; one whose version falls below ``since``
    is dropped, as no peer pages it any more."""
    monkeypatch.setattr(catchup, "DEFERRED_MAX_MESSAGES", 2)

    async def scenario() -> None:
        pair = Pair(tmp_path)
        await pair.start()
        old = pair.write(3, 1, 0, blocked=True)
        first, second = pair.write(3, 2, 1, blocked=True), pair.write(3, 3, 1, blocked=True)
        assert await pair.a_pass(0) == ([old, first, second], [])
        assert pair.client.dropped == 1 and pair.client.rewind == {SERVER.node_id}  # ``old`` went, for room
        pair.blocked.clear()
        assert sorted((await pair.a_pass(0))[1]) == sorted([first, second])  # same round: from memory
        # The next round pages the server whole once (``old`` is below it: not taken), then by cursor.
        carried, taken = await pair.a_pass(1)
        assert sorted(carried) == sorted([first, second]) and taken == [] and not pair.client.rewind
        late = pair.write(3, 4, 1, blocked=True)
        assert await pair.a_pass(1) == ([late], [])
        assert await pair.a_pass(2) == ([], [])  # ``late`` (version 1) fell out of the window
        assert not pair.client.deferred and pair.client.deferred_bytes == 0
        pair.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.sampled_from([2, 3]), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("pass")),
    st.tuples(st.just("round")),
    st.tuples(st.just("unblock"), st.integers(0, 50)),
), max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, room=st.sampled_from([2, catchup.DEFERRED_MAX_MESSAGES]))
def test_every_message_the_client_could_take_is_taken_exactly_once(ops, room):
    """Interleaved writes to the peer's store, passes, new rounds and messages becoming
    takeable: the client takes no message twice, and, once all can be taken, every message of
    the window; while the buffer has room, each message crosses the link once, whatever the rounds."""
    async def scenario(root: Path) -> None:
        pair = Pair(root)
        await pair.start()
        since, n = 0, 0
        for op in ops:
            if op[0] == "write":
                n += 1
                pair.write(op[1], n, since + op[2], blocked=op[3])
            elif op[0] == "pass":
                await pair.a_pass(since)
            elif op[0] == "round":
                since += 1
            elif pair.blocked:
                pair.blocked.discard(sorted(pair.blocked)[op[1] % len(pair.blocked)])
            assert len(set(pair.taken)) == len(pair.taken)
        pair.blocked.clear()
        await pair.a_pass(since)
        since += 1
        await pair.a_pass(since)  # (a buffer that overflowed pages its peer whole at a new round)
        assert len(set(pair.taken)) == len(pair.taken)
        assert {d for d, v in pair.versions.items() if v >= since} <= set(pair.taken)
        if pair.client.dropped == 0:
            assert len(set(pair.paged)) == len(pair.paged)
        pair.close()

    original = catchup.DEFERRED_MAX_MESSAGES
    catchup.DEFERRED_MAX_MESSAGES = room
    try:
        with tempfile.TemporaryDirectory() as root:
            asyncio.run(asyncio.wait_for(scenario(Path(root)), 60))
    finally:
        catchup.DEFERRED_MAX_MESSAGES = original


def test_a_committee_server_pages_groups_to_the_trainer_alone_knowing_it_by_its_connection(tmp_path):
    """specs/network.md §3.5, §6: the trainer, known by the key its connection proved, is paged
    the server's own groups (a send that failed reaches it so); any other peer only what the
    design gossips."""
    async def pages(trainer: bytes, name: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
        network = LoopbackNetwork(seed=3)
        server_transport, client_transport = (network.transport(k.private_seed()) for k in (SERVER, CLIENT))
        for transport in (server_transport, client_transport):
            await transport.start()
        log = structlog.get_logger()
        server = Backfill(server_transport, Store(tmp_path / f"{name}-server.sqlite"), lambda m: Validation.ACCEPT,
                          log, committee=(trainer, SERVER.node_id))
        client_store = Store(tmp_path / f"{name}-client.sqlite")
        client = Backfill(client_transport, client_store, lambda m: Validation.ACCEPT, log)
        server_transport.set_handler(BACKFILL_PROTOCOL, server.serve)
        await client_transport.connect(server_transport.addresses()[0])
        for n in range(3):  # groups the server fetched from others: no one's by backfill
            put(server.store, 2, n, 0)
        own = [Submission((b"own %d" % n,)) for n in range(2)]
        for n, group in enumerate(own):
            server.store.put_group(group, SERVER.node_id, 0, float(n))
        failures = [put(server.store, kind, 3, 0) for kind in (0, 1)]  # a policy, a manifest: gossiped in any design
        taken = []
        async for message in client.pull(0):
            handle(client_store, message.topic, message.data)
            taken.append(message.data)
        for store in (server.store, client_store):
            store.close()
        return taken, [g.to_bytes() for g in own], failures

    taken, own, gossiped = asyncio.run(pages(CLIENT.node_id, "trainer"))
    assert sorted(taken) == sorted(own + gossiped)
    taken, own, gossiped = asyncio.run(pages(SERVER.node_id, "member"))
    assert sorted(taken) == sorted(gossiped)
