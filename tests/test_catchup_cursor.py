"""Backfill between two real stores on a loopback pair (vrl.node.catchup, specs/network.md §6):
the second pass of a ``since`` moves only what the peer stored since the first; a restarted or
reset peer is paged whole again and nothing is lost; a new ``since`` starts from no cursor."""

from __future__ import annotations

import asyncio

import structlog

from p2p.loopback import LoopbackNetwork
from p2p.transport import Validation
from tests.test_store_cursor import put
from vrl.node.catchup import BACKFILL_PROTOCOL, Backfill
from vrl.node.messages import BackfillPage, BackfillRequest, Submission
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
        # The peer restarts: its store opens with a new generation, and is paged whole once.
        server.store.close()
        server.store = Store(tmp_path / "server.sqlite")
        carried, taken = await a_pass(0)
        assert sorted(carried) == sorted(first + new) and taken == []
        # Its data_dir is wiped: a fresh store of other messages, fewer rows than the cursor's
        # watermarks; the client gets every one of them.
        server.store.close()
        server.store = Store(tmp_path / "wiped.sqlite")
        other = [put(server.store, kind, n, 0) for n in range(100, 104) for kind in (2, 3)]
        carried, taken = await a_pass(0)
        assert sorted(carried) == sorted(taken) == sorted(other)
        assert client_store.counts()["groups"] == 33 + 4 and client_store.counts()["verdicts"] == 33 + 4
        # A new since starts from no cursor: everything of the new window again, once.
        carried, taken = await a_pass(1)
        assert carried == [] and taken == []  # (the window of versions >= 1 is empty)
        late = put(server.store, 2, 200, 1)
        assert await a_pass(1) == ([late], [late])
        assert sorted((await a_pass(0))[0]) == sorted(other + [late])
        server.store.close()
        client_store.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
