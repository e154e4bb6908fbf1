"""Message decoders raise only MessageError, naming the field (specs/network.md §3, §6)."""

from __future__ import annotations

import msgpack
import pytest

from vrl.node.messages import (
    BackfillPage,
    BackfillRequest,
    MessageError,
    PolicyAnnouncement,
    SignedVerdict,
    Submission,
    audit_ticket,
    topic_of,
)
from vrl.rollouts.keys import NodeKey

KEY = NodeKey.from_seed(b"m" * 32)
GROUP = Submission((b"record",))
VERDICT = SignedVerdict(KEY.node_id, b"w" * 32, GROUP.digest, 2**64 - 1, 2**64 - 1, audit_ticket(KEY, GROUP.digest),
                        0.5, "pass", (), b"\x01" * 32, "p").signed(KEY)
POLICY = PolicyAnnouncement(KEY.node_id, 2**64 - 1, b"\x01" * 32, b"\x02" * 32, 5).signed(KEY)


@pytest.mark.parametrize("message", [GROUP, VERDICT, POLICY], ids=["group", "verdict", "policy"])
def test_a_map_with_mixed_key_types_is_a_message_error_not_a_type_error(message):
    wire = msgpack.unpackb(message.to_bytes(), raw=False)
    wire[b"extra"] = 1
    wire["other"] = 2
    with pytest.raises(MessageError, match="key"):
        type(message).from_bytes(msgpack.packb(wire, use_bin_type=True))


def test_u64_fields_take_the_whole_range_and_nothing_beyond():
    assert SignedVerdict.from_bytes(VERDICT.to_bytes()) == VERDICT
    assert PolicyAnnouncement.from_bytes(POLICY.to_bytes()) == POLICY
    wire = msgpack.unpackb(VERDICT.to_bytes(), raw=False)
    wire["round"] = -1
    with pytest.raises(MessageError, match="round"):
        SignedVerdict.from_bytes(msgpack.packb(wire, use_bin_type=True))


@pytest.mark.parametrize("page", [
    {"messages": 1, "next": None}, {"messages": [1], "next": None}, {"messages": [], "next": "x"},
    {"messages": [], "next": -1}, {"messages": [], "next": -2**63}, {"messages": [], "next": 5},
    {"messages": []}, {"messages": [], "next": None, "more": 1}, {b"messages": [], "next": None},
    {"messages": [b"x" * (256 << 10 + 1)], "next": None}, [], 7,
])
def test_hostile_backfill_pages_are_message_errors(page):
    with pytest.raises(MessageError, match="backfill page"):
        BackfillPage.from_bytes(msgpack.packb(page, use_bin_type=True), after=5)


def test_backfill_codecs_round_trip_across_the_u64_range():
    for since, after in [(0, 0), (2**63, 7), (2**64 - 1, 2**64 - 1)]:
        assert BackfillRequest.from_bytes(BackfillRequest(since, after).to_bytes()) == BackfillRequest(since, after)
    page = BackfillPage((VERDICT.to_bytes(), GROUP.to_bytes()), 2**64 - 1)
    assert BackfillPage.from_bytes(page.to_bytes(), after=3) == page
    for bad in [{"since": -2**63, "after": 0}, {"since": True, "after": 0}, {"since": 1}, b"x", {1: 2}]:
        with pytest.raises(MessageError, match="backfill request"):
            BackfillRequest.from_bytes(msgpack.packb(bad, use_bin_type=True))


def test_topic_of_names_only_our_kinds():
    assert topic_of(VERDICT.to_bytes()) == "vrl/verdicts/2"
    for data in (b"", b"\xc1", msgpack.packb([1]), msgpack.packb({"kind": ["group"]}), msgpack.packb({"kind": 1})):
        assert topic_of(data) is None
