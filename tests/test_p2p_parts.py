"""The parts of the libp2p transport on their own, without a host: framing (p2p.framing),
policing (p2p.policing) and the trio <-> asyncio bridge (p2p.bridge).

Framing: any bytes give a head or the module's own FrameError, reading no more than the head
asks for; what a peer encodes is read back whole. Policing: fed events, its decisions follow
P4 and its memory stays bounded. The bridge: calls both ways, cancellation across, and a close
that fails what still waits. No sockets; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p import _common, framing
from p2p._common import Status
from p2p.bridge import TrioBridge
from p2p.policing import GossipPolicing, Policing
from p2p.transport import TransportError, TransportLimits, Validation

HEAD_MAX = framing.NAME_SIZE.size + _common.MAX_PROTOCOL_NAME_BYTES + framing.REQUEST_TAIL.size


# -- framing -------------------------------------------------------------------------------------


class ChunkedStream:
    """An in-memory stream that hands out its bytes in the given chunk sizes (never more than
    asked), and then b"" for the end; it counts what was taken."""

    def __init__(self, data: bytes, chunks: list[int]) -> None:
        self._data = data
        self._chunks = [size for size in chunks if size > 0] or [1]
        self._reads = 0
        self.taken = 0

    async def read(self, n: int | None = None) -> bytes:
        size = self._chunks[self._reads % len(self._chunks)]
        self._reads += 1
        if n is not None:
            size = min(size, n)
        piece = self._data[self.taken:self.taken + size]
        self.taken += len(piece)
        return piece


def run_now(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (it reads a ChunkedStream) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the coroutine suspended")


def outcome(call) -> tuple[str, Any]:
    try:
        return "ok", call()
    except framing.FrameError as error:
        return type(error).__name__, None


names = st.text(max_size=80).filter(lambda name: len(name.encode()) <= _common.MAX_PROTOCOL_NAME_BYTES)


def encode(name: str, body: bytes) -> bytes:
    return framing.encode_request(name, body, timeout=1.0, max_response=1)


# Any bytes, and requests as peers encode them, cut anywhere (and so also followed by garbage).
heads = st.one_of(
    st.binary(max_size=HEAD_MAX + 40),
    st.builds(lambda name, body, cut, tail: encode(name, body)[:cut] + tail,
              names, st.binary(max_size=20), st.integers(0, 400), st.binary(max_size=8)),
)


@settings(max_examples=300, deadline=None)
@given(heads, st.lists(st.integers(1, 64), max_size=8))
def test_any_bytes_are_a_request_head_or_a_frame_error_and_a_stream_reads_only_the_head(
        data: bytes, chunks: list[int]) -> None:
    kind, parsed = outcome(lambda: framing.parse(framing.request_head(), data))
    if kind == "ok":
        head, used = parsed
        assert used <= min(len(data), HEAD_MAX)
        name = head.protocol.encode()
        assert len(name) <= _common.MAX_PROTOCOL_NAME_BYTES
        assert data[:used] == framing.NAME_SIZE.pack(len(name)) + name + framing.REQUEST_TAIL.pack(
            head.max_response, head.deadline_ms, head.size)
    # Over a stream, in any chunks: the same answer, and not a byte past the head.
    stream = ChunkedStream(data, chunks)
    streamed = outcome(lambda: run_now(framing.read(stream, framing.request_head())))
    assert streamed[0] == kind
    if kind == "ok":
        assert streamed[1] == parsed[0] and stream.taken == parsed[1]
    assert stream.taken <= HEAD_MAX


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=16), st.lists(st.integers(1, 8), max_size=4))
def test_any_bytes_are_a_response_head_or_a_frame_error(data: bytes, chunks: list[int]) -> None:
    kind, parsed = outcome(lambda: framing.parse(framing.response_head(), data))
    assert kind in ("ok", "Truncated")
    assert (kind == "ok") == (len(data) >= framing.RESPONSE_HEAD.size)
    stream = ChunkedStream(data, chunks)
    streamed = outcome(lambda: run_now(framing.read(stream, framing.response_head())))
    assert streamed[0] == kind
    if kind == "ok":
        assert streamed[1] == parsed[0] and parsed[1] == stream.taken == framing.RESPONSE_HEAD.size


@settings(max_examples=200, deadline=None)
@given(names, st.binary(max_size=300), st.floats(0.0005, 1e9), st.integers(0, 2**40), st.lists(st.integers(1, 50)))
def test_a_request_reads_back_as_it_was_sent(protocol: str, body: bytes, timeout: float, max_response: int,
                                              chunks: list[int]) -> None:
    wire = framing.encode_request(protocol, body, timeout=timeout, max_response=max_response)
    stream = ChunkedStream(wire, chunks)
    head = run_now(framing.read(stream, framing.request_head()))
    assert head.protocol == protocol and head.size == len(body)
    assert head.max_response == min(max_response, framing.U32_MAX)
    assert head.deadline_ms == min(math.ceil(timeout * 1000), framing.U32_MAX)
    assert run_now(framing.read_exactly(stream, head.size)) == body
    assert stream.taken == len(wire)


def test_a_request_deadline_is_whole_milliseconds_rounded_up_and_clamped() -> None:
    def deadline(timeout: float) -> int:
        head, _ = framing.parse(framing.request_head(), framing.encode_request("/p", b"", timeout=timeout,
                                                                               max_response=0))
        return head.deadline_ms

    assert deadline(0.0001) == 1 and deadline(1.5) == 1500 and deadline(1e12) == framing.U32_MAX


@given(st.sampled_from(list(Status)), st.binary(max_size=300))
def test_a_response_reads_back_as_it_was_sent(status: Status, body: bytes) -> None:
    wire = framing.encode_response(status, body)
    (got, size), used = framing.parse(framing.response_head(), wire)
    assert (got, size, wire[used:]) == (status, len(body), body)


def test_a_name_too_long_is_refused_before_it_is_read() -> None:
    wire = framing.NAME_SIZE.pack(_common.MAX_PROTOCOL_NAME_BYTES + 1) + b"x" * 1000
    stream = ChunkedStream(wire, [4096])
    with pytest.raises(framing.MalformedRequest):
        run_now(framing.read(stream, framing.request_head()))
    assert stream.taken == framing.NAME_SIZE.size


def test_a_name_that_is_not_utf8_is_malformed_and_an_empty_one_is_a_name() -> None:
    with pytest.raises(framing.MalformedRequest):
        framing.parse(framing.request_head(), framing.NAME_SIZE.pack(1) + b"\xff" + bytes(12))
    head, _ = framing.parse(framing.request_head(), framing.NAME_SIZE.pack(0) + bytes(12))
    assert head.protocol == ""  # refused later as an unknown protocol, not as a malformed frame


def test_a_stream_that_ends_early_is_truncated() -> None:
    with pytest.raises(framing.Truncated):
        run_now(framing.read_exactly(ChunkedStream(b"abc", [2]), 4))


def test_the_response_limit_is_the_callers_for_ok_and_the_error_detail_otherwise() -> None:
    assert framing.response_limit(Status.OK, 10**9) == 10**9
    assert all(framing.response_limit(status, 10**9) == _common.MAX_ERROR_DETAIL_BYTES
               for status in [*Status, 200] if status != Status.OK)


# -- policing ------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PEERS = [bytes([i + 1]) * 32 for i in range(3)]


def test_a_peer_is_banned_by_the_event_that_crosses_the_threshold_and_only_once() -> None:
    police = Policing(TransportLimits(), Clock())  # -1 * count^2, ban at -100: the tenth
    peer = PEERS[0]
    decisions = [police.rejected(peer) for _ in range(9)] + [police.misbehaved(peer)]
    assert decisions == [False] * 9 + [True]
    assert police.banned(peer) and police.rejections(peer) == 9 and police.score(peer) == -100.0
    assert not police.misbehaved(peer) and not police.rejected(peer)  # in flight: nothing new to do
    assert police.rejections(PEERS[1]) == 0 and not police.banned(PEERS[1])


def gossip_police(clock: Clock, *, ttl: float = 120.0, max_ids: int = 100, threshold: float = -100.0) -> GossipPolicing:
    return GossipPolicing(TransportLimits(ban_threshold=threshold), clock, rejected_ttl=ttl, rejected_max=max_ids)


class Validator:
    def __init__(self, verdict: Validation) -> None:
        self.verdict = verdict
        self.calls = 0

    def __call__(self) -> Validation:
        self.calls += 1
        return self.verdict


def test_a_copy_of_a_rejected_message_counts_again_without_the_validator_until_forgotten() -> None:
    clock = Clock()
    police = gossip_police(clock, ttl=120.0)
    reject = Validator(Validation.REJECT)
    assert police.gossip(PEERS[0], b"m", reject).verdict is Validation.REJECT
    assert police.gossip(PEERS[1], b"m", reject).verdict is Validation.REJECT
    assert reject.calls == 1 and police.rejections(PEERS[0]) == police.rejections(PEERS[1]) == 1
    clock.now += 121.0
    police.gossip(PEERS[1], b"m", reject)
    assert reject.calls == 2 and police.rejections(PEERS[1]) == 2


def test_ignore_and_accept_count_against_nobody_and_are_asked_every_time() -> None:
    police = gossip_police(Clock())
    for verdict in (Validation.IGNORE, Validation.ACCEPT):
        validator = Validator(verdict)
        rulings = [police.gossip(PEERS[0], b"m", validator) for _ in range(3)]
        assert {(ruling.verdict, ruling.ban) for ruling in rulings} == {(verdict, False)}
        assert validator.calls == 3
    assert police.rejections(PEERS[0]) == 0 and police.score(PEERS[0]) == 0.0


def test_our_own_rejected_publish_costs_nobody_but_is_remembered() -> None:
    police = gossip_police(Clock())
    reject = Validator(Validation.REJECT)
    own = police.gossip(None, b"m", reject)
    assert (own.verdict, own.ban) == (Validation.REJECT, False)
    assert police.gossip(PEERS[0], b"m", reject).verdict is Validation.REJECT  # a copy, forwarded back to us
    assert reject.calls == 1 and police.rejections(PEERS[0]) == 1


def test_a_banned_senders_message_is_dropped_unjudged_and_uncounted() -> None:
    police = gossip_police(Clock(), threshold=-1.0)  # the first invalid message bans
    reject = Validator(Validation.REJECT)
    ruling = police.gossip(PEERS[0], b"m1", reject)
    assert ruling.verdict is Validation.REJECT and ruling.ban and police.banned(PEERS[0])
    accept = Validator(Validation.ACCEPT)
    assert police.gossip(PEERS[0], b"m2", accept).verdict is Validation.IGNORE
    assert accept.calls == 0 and police.rejections(PEERS[0]) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 0, 1, 2]), st.integers(0, 30), st.sampled_from(list(Validation)),
                          st.floats(0.0, 40.0)), max_size=80))
def test_gossip_rulings_follow_the_rules_and_the_memory_stays_bounded(events) -> None:
    clock = Clock()
    police = gossip_police(clock, ttl=60.0, max_ids=8, threshold=-9.0)  # ban at the third invalid message
    for sender_index, message, verdict, wait in events:
        clock.now += wait
        sender = None if sender_index is None else PEERS[sender_index]
        was_banned = sender is not None and police.banned(sender)
        rejections = police.rejections(sender) if sender is not None else 0
        validator = Validator(verdict)
        ruling = police.gossip(sender, b"%d" % message, validator)
        assert len(police._rejected) <= 8
        if was_banned:
            assert (ruling.verdict, ruling.ban, validator.calls) == (Validation.IGNORE, False, 0)
            continue
        assert ruling.verdict is verdict or (validator.calls == 0 and ruling.verdict is Validation.REJECT)
        counted = ruling.verdict is Validation.REJECT and sender is not None
        if sender is not None:
            assert police.rejections(sender) == rejections + counted
            assert ruling.ban == (counted and police.banned(sender))
        else:
            assert not ruling.ban


# -- the bridge ----------------------------------------------------------------------------------

WAIT = 10.0  # seconds any one step may take before the test fails: a bound, not a timing


async def started_bridge() -> TrioBridge:
    bridge = TrioBridge("test-bridge")

    async def main() -> None:
        await bridge.serve(lambda nursery: None)

    await asyncio.wait_for(asyncio.wrap_future(bridge.start(main)), WAIT)
    return bridge


async def stopped(bridge: TrioBridge) -> None:
    await bridge.stop()
    bridge.fail_calls()


def test_the_bridge_calls_trio_from_asyncio_and_asyncio_from_trio() -> None:
    async def scenario() -> None:
        bridge = await started_bridge()
        node_loop = asyncio.get_running_loop()

        async def double(x: int) -> int:
            await trio.sleep(0)
            return 2 * x

        async def on_node() -> asyncio.AbstractEventLoop:
            return asyncio.get_running_loop()

        async def ask_node() -> asyncio.AbstractEventLoop:
            return await bridge.in_asyncio(on_node())

        assert await asyncio.wait_for(bridge.call(double, 21), WAIT) == 42
        assert await asyncio.wait_for(bridge.call(ask_node), WAIT) is node_loop
        await stopped(bridge)

    asyncio.run(scenario())


def test_errors_on_the_trio_side_reach_the_caller_as_transport_errors() -> None:
    async def scenario() -> None:
        bridge = await started_bridge()

        async def refuse() -> None:
            raise TransportError("refused on purpose")

        async def crash() -> None:
            raise KeyError("a bug")

        with pytest.raises(TransportError, match="refused on purpose"):
            await asyncio.wait_for(bridge.call(refuse), WAIT)
        with pytest.raises(TransportError, match="unexpected libp2p error"):
            await asyncio.wait_for(bridge.call(crash), WAIT)
        await stopped(bridge)

    asyncio.run(scenario())


def test_cancelling_a_call_cancels_its_trio_side_and_stopping_fails_the_calls_left() -> None:
    async def scenario() -> None:
        bridge = await started_bridge()
        entered, left = threading.Event(), threading.Event()

        async def forever() -> None:
            entered.set()
            try:
                await trio.sleep_forever()
            finally:
                left.set()

        call = asyncio.ensure_future(bridge.call(forever))
        assert await asyncio.to_thread(entered.wait, WAIT)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await asyncio.to_thread(left.wait, WAIT)

        entered.clear()
        left.clear()
        waiting = asyncio.ensure_future(bridge.call(forever))
        assert await asyncio.to_thread(entered.wait, WAIT)
        await stopped(bridge)
        with pytest.raises(TransportError, match="transport closed"):
            await asyncio.wait_for(waiting, WAIT)
        assert left.is_set()
        with pytest.raises(TransportError, match="transport closed"):
            bridge.to_trio(lambda: None)  # trio has finished

    asyncio.run(scenario())


def test_a_main_that_fails_before_serving_fails_the_start() -> None:
    async def scenario() -> None:
        bridge = TrioBridge("test-bridge")

        async def main() -> None:
            raise OSError("cannot listen")

        with pytest.raises(OSError, match="cannot listen"):
            await asyncio.wait_for(asyncio.wrap_future(bridge.start(main)), WAIT)
        await bridge.join()
        assert not bridge.started

    asyncio.run(scenario())
