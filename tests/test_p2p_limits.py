"""Property tests for what p2p adds to decode network bytes and to score peers: the gossipsub
frame follower (p2p.libp2p_transport.VarintFrames), the request protocol name check, the
P4 scores and bans (p2p.policing.PeerScores) and the TransportLimits boundary.

Each property: any input gives a value or the module's own error, and the state stays bounded.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from p2p import _common
from p2p.libp2p_transport import VarintFrames, protocol_name
from p2p.policing import DECAY_INTERVAL, PeerScores
from p2p.transport import TransportLimits

LIMIT = 300


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def reference(stream: bytes, limit: int) -> tuple[bool, bool]:
    """(oversized, malformed) for the first frame that is either, decoding ``stream`` whole:
    what py-libp2p's read_varint_prefixed_bytes_limited would hit first."""
    at = 0
    while at < len(stream):
        length, shift = 0, 0
        for index in range(10):
            if at >= len(stream):
                return False, False  # the stream ends inside a prefix
            byte = stream[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
            if index == 9:
                return False, True
        if length > limit:
            return True, False
        at += length
    return False, False


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


frames = st.lists(
    st.one_of(
        st.binary(max_size=LIMIT).map(lambda body: encode_varint(len(body)) + body),  # a valid frame
        st.integers(LIMIT + 1, 2**64).map(encode_varint),  # an announced frame over the limit
        st.binary(min_size=1, max_size=12),  # garbage, including prefixes that never end
    ),
    max_size=8,
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(frames, st.lists(st.integers(0, 4000), max_size=20))
def test_the_frame_follower_agrees_with_a_whole_decode_whatever_the_chunks(stream: bytes, cuts: list[int]) -> None:
    follower = VarintFrames(LIMIT)
    for chunk in chunked(stream, cuts):
        follower.feed(chunk)
        assert follower._prefix_bytes <= VarintFrames.MAX_PREFIX_BYTES  # O(1) state
    assert (follower.oversized, follower.malformed) == reference(stream, LIMIT)


@given(st.binary(max_size=2 * _common.MAX_PROTOCOL_NAME_BYTES))
def test_a_protocol_name_off_the_wire_is_a_name_or_none(raw: bytes) -> None:
    name = protocol_name(raw)
    if name is not None:
        assert name.encode() == raw and len(raw) <= _common.MAX_PROTOCOL_NAME_BYTES
    else:
        assert len(raw) > _common.MAX_PROTOCOL_NAME_BYTES or not _is_utf8(raw)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


PEERS = [bytes([i]) * 32 for i in range(4)]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-50.0, -0.01), st.floats(0.5, 1e4), st.floats(-1000.0, -0.5), st.floats(0.0, 100.0),
    st.lists(st.tuples(st.sampled_from(["penalize", "wait"]), st.integers(0, 3), st.floats(0.0, 50.0)), max_size=60),
)
def test_scores_and_bans_follow_p4(weight: float, halflife: float, threshold: float, ban_seconds: float,
                                   steps: list[tuple[str, int, float]]) -> None:
    limits = TransportLimits(invalid_message_weight=weight, invalid_message_halflife=halflife,
                             ban_threshold=threshold, ban_seconds=ban_seconds)
    clock = Clock()
    scores = PeerScores(limits, clock)
    banned_until: dict[bytes, float] = {}
    for action, index, seconds in steps:
        peer = PEERS[index]
        if action == "wait":
            clock.now += seconds
            continue
        before = scores.score(peer)
        was_banned = scores.banned(peer)
        bans = scores.penalize(peer)
        after = scores.score(peer)
        assert after <= 0.0
        if was_banned:
            assert not bans and after == before  # a banned peer's traffic adds nothing
        else:
            assert after < before
            assert bans == (after <= threshold)
        if bans:
            banned_until[peer] = clock.now + ban_seconds
        for other in PEERS:
            assert scores.banned(other) == (clock.now < banned_until.get(other, -math.inf))
    # A count decays to nothing, and is then forgotten.
    clock.now += DECAY_INTERVAL * (1 + halflife * math.log2(1e6))
    assert all(scores.score(peer) == 0.0 for peer in PEERS)
    assert scores._counts == {}


def test_scores_are_exact_within_a_decay_interval() -> None:
    clock = Clock()
    scores = PeerScores(TransportLimits(), clock)  # defaults: -1 * count^2, ban at -100
    peer = PEERS[0]
    for count in range(1, 10):
        assert not scores.penalize(peer)
        assert scores.score(peer) == -count * count
        clock.now += DECAY_INTERVAL * 0.09
    assert scores.penalize(peer) and scores.banned(peer)  # the tenth, inside one interval
    clock.now += TransportLimits().ban_seconds
    assert not scores.banned(peer)
    assert -100.0 < scores.score(peer) < 0.0  # decayed (three half-lives), not forgotten


def test_the_number_of_peers_scored_is_bounded() -> None:
    scores = PeerScores(TransportLimits(ban_threshold=-1.0), Clock(), max_peers=50)
    for i in range(200):
        scores.penalize(i.to_bytes(32, "big"))
    assert len(scores._counts) <= 50 and len(scores._banned_until) <= 50


values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.just(10**400), st.floats(allow_nan=True),
                   st.text(max_size=5), st.binary(max_size=5))


@given(st.dictionaries(st.sampled_from(["invalid_message_weight", "invalid_message_halflife", "ban_threshold",
                                        "ban_seconds", "handshake_timeout", "max_pending_connections"]), values))
def test_transport_limits_are_a_value_or_a_value_error(fields: dict) -> None:
    try:
        limits = TransportLimits(**fields)
    except ValueError:
        return
    assert limits.invalid_message_weight < 0 and limits.ban_threshold < 0
    assert limits.invalid_message_halflife > 0 and 0 < limits.handshake_timeout < math.inf
    assert isinstance(limits.max_pending_connections, int) and limits.max_pending_connections >= 1
