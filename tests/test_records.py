"""Record encoding, signing and rollout files: bad input is named, never fatal, never lossy."""

from __future__ import annotations

import dataclasses
import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import vrl
from vrl.rollouts.files import FILE_MAGIC, RolloutFileError, RolloutWriter, frame, iter_records
from vrl.rollouts.record import MAX_RECORD_BYTES, RecordError, Rollout, canonical_bytes


def test_roundtrip_and_immutability(honest):
    rollout = honest[0]
    assert Rollout.from_bytes(rollout.to_bytes()) == rollout
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.reward = 1.0  # type: ignore[misc]


def test_signed_copy_changes_only_what_was_asked(honest, other_node):
    copy = honest[0].signed(other_node, reward=0.5)
    assert copy.reward == 0.5 and copy.node_id == other_node.node_id and copy.signature_valid()
    assert honest[0].signature_valid() and honest[0].reward != 0.5


def wire(rollout) -> dict:
    return msgpack.unpackb(rollout.to_bytes(), raw=False)


@pytest.mark.parametrize("field,value,message", [
    ("reward", "1.0", "field 'reward': expected float"),
    ("sample_index", -1, "field 'sample_index'"),
    ("completion_tokens", b"\x01\x02\x03", "field 'completion_tokens'"),
    ("node_id", b"short", "field 'node_id': expected 32 bytes"),
    ("finish_reason", "eos", "field 'finish_reason'"),
    ("v", 1, "unknown record version 1"),
])
def test_wrong_field_named(honest, field, value, message):
    data = wire(honest[0])
    data[field] = value
    with pytest.raises(RecordError, match=message):
        Rollout.from_bytes(canonical_bytes(data))


def test_nested_and_missing_fields_named(honest):
    data = wire(honest[0])
    data["sampling"]["temperature"] = -1.0
    with pytest.raises(RecordError, match="sampling.temperature"):
        Rollout.from_bytes(canonical_bytes(data))
    data = wire(honest[0])
    del data["commitment"]
    with pytest.raises(RecordError, match="field 'commitment': missing"):
        Rollout.from_bytes(canonical_bytes(data))


@pytest.mark.parametrize("stop", [-1, 2**32, 2**63, 2**64 - 1])
def test_stop_token_ids_are_checked_against_their_range(honest, stop):
    """specs/record.md §1: each stop token is 0 .. 2^32 - 1 (issue 13 §2: every integer is
    checked against its range at decode)."""
    data = wire(honest[0])
    data["sampling"]["stop_token_ids"] = [stop]
    with pytest.raises(RecordError, match="sampling.stop_token_ids"):
        Rollout.from_bytes(canonical_bytes(data))


def test_non_canonical_encoding_rejected(honest):
    data = wire(honest[0])
    reordered = msgpack.packb(dict(reversed(list(data.items()))), use_bin_type=True)
    with pytest.raises(RecordError, match="canonical"):
        Rollout.from_bytes(reordered)


def test_damaged_file_keeps_every_intact_record(tmp_path, honest):
    path = tmp_path / "r.msgpack"
    good = [frame(r) for r in honest[:4]]
    bad_type = wire(honest[4])
    bad_type["reward"] = "lots"
    payload = canonical_bytes(bad_type)
    import zlib
    wrong_type = struct.pack(">4sII", b"VRLR", len(payload), zlib.crc32(payload)) + payload
    oversized = struct.pack(">4sII", b"VRLR", MAX_RECORD_BYTES + 1, 0)
    corrupt = bytearray(good[1])
    corrupt[40] ^= 0xFF
    path.write_bytes(FILE_MAGIC + good[0] + bytes(corrupt) + wrong_type + good[2] + oversized + good[3]
                     + good[0][: len(good[0]) // 2])
    items = list(iter_records(path))
    kinds = ["Rollout" if isinstance(item, Rollout) else item.problem.split(":")[0] if not item.field
             else f"field {item.field!r}" for item in items]
    assert kinds == ["Rollout", "corrupt", "field 'reward'", "Rollout", "oversized", "Rollout", "truncated"]
    assert [item for item in items if isinstance(item, Rollout)] == [honest[0], honest[2], honest[3]]
    verdicts = vrl.verify(items, vrl.load_model("tiny"))
    schema = [(v.index, v.reason) for v in verdicts if v.stage is vrl.Stage.SCHEMA]
    assert schema == [(1, "corrupt_record"), (2, "malformed_record"), (4, "oversized_record"), (6, "truncated_record")]
    assert "record 2: field 'reward'" in verdicts[2].message


def test_not_a_rollout_file(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"hello")
    with pytest.raises(RolloutFileError, match="not a vrl rollout file"):
        list(iter_records(path))
    with pytest.raises(RolloutFileError):
        list(iter_records(tmp_path / "missing"))


def test_writer_appends_and_atomic_write_replaces(tmp_path, honest):
    path = tmp_path / "r.msgpack"
    with RolloutWriter(path) as writer:
        writer.write(honest[0])
    with RolloutWriter(path) as writer:
        writer.write(honest[1])
    assert list(vrl.read_rollouts(path)) == honest[:2]
    assert vrl.write_rollouts(path, honest[:3]) == 3
    assert list(vrl.read_rollouts(path)) == honest[:3]
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind


def test_unknown_keys_of_mixed_types_are_named_not_fatal(honest):
    data = wire(honest[0])
    data["zzz"] = 1
    raw = msgpack.packb({**data, b"bin-key": 1}, use_bin_type=True)
    with pytest.raises(RecordError, match="unknown field"):
        Rollout.from_bytes(raw)


def test_bad_length_field_mid_file_does_not_lose_later_records(tmp_path, honest):
    path = tmp_path / "r.msgpack"
    broken = bytearray(frame(honest[0]))
    broken[4:8] = (10**6).to_bytes(4, "big")  # a length running past the end of the file
    path.write_bytes(FILE_MAGIC + bytes(broken) + frame(honest[1]))
    items = list(iter_records(path))
    assert isinstance(items[0], RecordError) and "runs past the end" in str(items[0])
    assert items[1] == honest[1]


_map_keys = st.one_of(st.text(max_size=6), st.binary(max_size=6))
_maps = st.recursive(st.one_of(st.integers(-5, 5), st.text(max_size=4), st.binary(max_size=4)),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(_map_keys, inner, max_size=5)), max_leaves=20)


@given(st.dictionaries(_map_keys, _maps, max_size=8))
def test_canonical_map_keys_sort_as_their_utf8_bytes(value):
    """A map's keys, str and bytes alike and mixed, are written in the order of their bytes
    (a str as its UTF-8), at every depth: what a plain sort gives for keys of one kind."""
    def reference(v):
        if isinstance(v, dict):
            return {k: reference(v[k]) for k in sorted(v, key=lambda k: k.encode() if isinstance(k, str) else k)}
        return [reference(x) for x in v] if isinstance(v, list) else v
    assert canonical_bytes(value) == msgpack.packb(reference(value), use_bin_type=True, use_single_float=False,
                                                   strict_types=True)
