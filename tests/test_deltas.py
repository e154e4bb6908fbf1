"""Weight deltas (vrl/node/deltas.py, specs/network.md §6.1): bit-exact rebuilds, hostile deltas
refused with DeltaError only, and a node that falls back to the full weights file whenever the
delta fails, through its real fetch path on the loopback transport."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as save_tensors
from structlog.testing import capture_logs

from vrl.node import deltas
from vrl.node.deltas import DeltaError
from vrl.node.weights import to_blob
from vrl.rollouts.model import Model


def nudged(model: Model, scale: float = 2e-5, seed: int = 0) -> Model:
    """A copy of ``model`` with every weight moved by about ``scale`` (an Adam step's size)."""
    network = copy.deepcopy(model.network)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return Model(name="nudged", network=network, tokenizer=model.tokenizer, dtype_name=model.dtype_name)


def bf16_blob(model: Model) -> bytes:
    return save_tensors({k: v.detach().to(torch.bfloat16).contiguous().clone()
                         for k, v in model.network.state_dict().items()})


@pytest.fixture(scope="module")
def pair(tiny) -> tuple[bytes, bytes, bytes]:
    parent, target = to_blob(tiny), to_blob(nudged(tiny))
    return parent, target, deltas.encode(parent, target)


@pytest.fixture(scope="module")
def small_pair() -> tuple[bytes, bytes, bytes]:
    """The micro preset's (0.27M parameters): many hostile deltas a second."""
    import vrl

    micro = vrl.load_model("micro")
    parent, target = to_blob(micro), to_blob(nudged(micro))
    return parent, target, deltas.encode(parent, target)


def test_a_delta_rebuilds_the_target_bit_for_bit_and_is_smaller(tiny, pair):
    parent, target, delta = pair
    assert deltas.rebuild(parent, delta) == target
    assert len(delta) < len(target)
    parent16, target16 = bf16_blob(tiny), bf16_blob(nudged(tiny))
    delta16 = deltas.encode(parent16, target16)
    assert deltas.rebuild(parent16, delta16) == target16
    assert len(delta16) < len(target16) // 4  # most bf16 weights do not move by 2e-5
    assert deltas.rebuild(parent, deltas.encode(parent, parent)) == parent  # nothing changed


def test_a_truncated_delta_is_refused_at_every_length(pair):
    parent, _, delta = pair
    for cut in sorted({0, 1, 7, 8, 9, 85, 86, 100, len(delta) // 2, len(delta) - 5, len(delta) - 1}):
        with pytest.raises(DeltaError, match="truncated|corrupt"):
            deltas.rebuild(parent, delta[:cut])


def test_a_delta_against_another_parent_is_refused(tiny, pair):
    _, target, delta = pair
    with pytest.raises(DeltaError, match="another parent"):
        deltas.rebuild(target, delta)


@pytest.mark.parametrize("where", [0, 9, 50, 80, 90, -40, -2])
def test_corrupt_bytes_are_refused(pair, where):
    parent, _, delta = pair
    spoiled = bytearray(delta)
    spoiled[where] ^= 0x10
    with pytest.raises(DeltaError):
        deltas.rebuild(parent, bytes(spoiled))


def test_declared_sizes_that_are_not_the_parents_are_refused_before_allocating(pair):
    """A header claiming 2^64 - 1 bytes or 2^32 - 1 regions allocates nothing of that size."""
    parent, _, delta = pair
    header = deltas._HEADER
    fields = list(header.unpack_from(delta))
    for index, value in ((5, 2**64 - 1), (5, len(parent) + 1), (6, 2**32 - 1), (6, 1)):
        changed = list(fields)
        changed[index] = value
        with pytest.raises(DeltaError):
            deltas.rebuild(parent, header.pack(*changed) + delta[header.size:])
    wrong_width = bytearray(delta)
    wrong_width[header.size + 9 + 8] = 8  # the first tensor's width: F32's 4 made 8
    with pytest.raises(DeltaError, match="layout"):
        deltas.rebuild(parent, bytes(wrong_width))
    with pytest.raises(DeltaError, match="zstd frame"):
        deltas.rebuild(parent, delta + b"\x00")  # bytes after the frame


def test_files_of_different_architectures_have_no_delta(tiny, pair):
    parent = pair[0]
    other = save_tensors({"w": torch.zeros(3)})
    with pytest.raises(DeltaError, match="same tensors"):
        deltas.encode(parent, other)
    with pytest.raises(DeltaError, match="not a safetensors"):
        deltas.encode(b"\xff" * 16, b"\xff" * 16)
    with pytest.raises(DeltaError):
        deltas.rebuild(b"short", struct.pack(">8sBB", b"VRLDELTA", 1, 1) + bytes(100))


@settings(max_examples=200, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_mutation_of_a_delta_rebuilds_the_target_or_raises_delta_error(small_pair, data):
    """Hostile input: spliced, cut, flipped or random bytes give the exact target or a DeltaError."""
    parent, target, delta = small_pair
    mutated = data.draw(st.one_of(
        st.binary(max_size=256),
        st.tuples(st.integers(0, len(delta)), st.binary(max_size=16)).map(lambda c: delta[:c[0]] + c[1]),
        st.tuples(st.integers(0, len(delta) - 1), st.integers(1, 255)).map(
            lambda c: delta[:c[0]] + bytes([delta[c[0]] ^ c[1]]) + delta[c[0] + 1:]),
        st.tuples(st.integers(0, 90), st.binary(min_size=1, max_size=8)).map(
            lambda c: delta[:c[0]] + c[1] + delta[c[0] + len(c[1]):]),
    ))
    try:
        rebuilt = deltas.rebuild(parent, mutated)
    except DeltaError:
        return
    assert rebuilt == target


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64]),
                          st.integers(0, 40)), min_size=1, max_size=4), st.integers(0, 2**31))
def test_any_pair_of_one_layout_round_trips(shapes, seed):
    generator = torch.Generator().manual_seed(seed)
    parent_tensors, target_tensors = {}, {}
    for index, (dtype, size) in enumerate(shapes):
        base = torch.randn(size, generator=generator)
        changed = base + torch.randn(size, generator=generator) * (torch.rand(size, generator=generator) < 0.3)
        parent_tensors[f"t{index}"], target_tensors[f"t{index}"] = base.to(dtype), changed.to(dtype)
    parent, target = save_tensors(parent_tensors), save_tensors(target_tensors)
    assert deltas.rebuild(parent, deltas.encode(parent, target)) == target


# -- through a node's fetch path, on the loopback transport ---------------------------------------


def test_a_node_rebuilds_from_a_delta_and_falls_back_to_the_full_file_when_the_delta_fails(tmp_path, tiny):
    """The node holds version 0's file. With a good delta (and no peer serving the full file)
    it rebuilds version 1; with a truncated, corrupt or other-parent delta it logs why and
    fetches the full file; every time the loaded weights are version 1's."""
    from p2p.blobs import BlobStore
    from p2p.loopback import LoopbackNetwork
    from tests.test_node import TRAINER, WORKERS, config
    from vrl.node import protocol as P
    from vrl.node.daemon import Node
    from vrl.node.messages import PolicyAnnouncement

    def h(data: bytes) -> bytes:
        return hashlib.sha256(data).digest()

    async def fetch(case: str, delta: bytes, serve_full: bool) -> tuple[Node, list[dict]]:
        network = LoopbackNetwork()
        node = Node(config(tmp_path / case), network.transport(WORKERS[0].private_seed()), WORKERS[0])
        holder = network.transport(WORKERS[1].private_seed())
        await node.transport.start()
        await holder.start()
        served = BlobStore(holder)
        served.put(delta)
        if serve_full:
            served.put(child)
        await node.transport.connect(holder.addresses()[0])
        node.blobs.keep(parent)
        first = PolicyAnnouncement(TRAINER.node_id, 0, skeleton.model_hash, h(parent), len(parent)).signed(TRAINER)
        second = PolicyAnnouncement(TRAINER.node_id, 1, model.model_hash, h(child), len(child),
                                    parent=skeleton.model_hash, delta=h(delta), delta_size=len(delta),
                                    delta_parent=h(parent)).signed(TRAINER)
        node.protocol.handle(P.PolicyAnnounced(first))
        node.protocol.handle(P.PolicyAnnounced(second))
        with capture_logs() as logs:
            await asyncio.wait_for(node._fetch_policy(second), 60)
        node.store.close()
        await node.transport.close()
        await holder.close()
        return node, logs

    skeleton = tiny
    model = nudged(tiny)
    parent, child = to_blob(skeleton), to_blob(model)
    good = deltas.encode(parent, child)
    other = deltas.encode(to_blob(nudged(tiny, seed=1)), child)
    corrupt = bytearray(good)
    corrupt[len(good) // 2] ^= 0x01
    cases = {"good": (good, False, None), "truncated": (good[:len(good) // 2], True, "truncated"),
             "corrupt": (bytes(corrupt), True, "corrupt"), "other-parent": (other, True, "another parent")}

    async def scenario() -> None:
        for case, (delta, serve_full, reason) in cases.items():
            node, logs = await fetch(case, delta, serve_full)
            assert 1 in node.protocol.loaded, case
            assert node.work.models[1].model_hash == model.model_hash, case
            assert (node.blobs.directory / h(child).hex()).read_bytes() == child, case
            events = [entry for entry in logs if entry.get("version") == 1]
            if reason is None:
                assert any(e["event"] == "weights rebuilt from a delta" for e in events), events
            else:
                refused = [e for e in events if e["event"] == "weights delta not used; fetching the full file"]
                assert refused and reason in refused[0]["reason"], (case, events)

    asyncio.run(scenario())


def test_a_network_trainer_publishes_deltas_and_its_workers_rebuild_from_them(tmp_path):
    """End to end on the loopback network: each version after 0 names a delta against its
    parent's file (the full file is kept and served too), and the workers, holding the parent,
    fetch the delta and load the version they rebuild. Runs until each honest worker has loaded a
    version whose weights differ from its parent's (a step without gradient changes nothing, and
    a node that holds the file already fetches nothing)."""
    from tests.test_node import run_network
    from vrl.node.store import Store

    def changed(node) -> list[int]:
        policies, loaded = node.protocol.policies, node.protocol.loaded
        return [v for v in loaded if v - 1 in policies and policies[v].blob != policies[v - 1].blob]

    workers = {"honest-0": "w0", "honest-1": "w1"}
    with capture_logs() as logs:
        nodes = asyncio.run(run_network(tmp_path, rounds=10,
                                        until=lambda nodes: all(changed(nodes[n]) for n in workers)))
    events = [entry["event"] for entry in logs]
    assert "weights rebuilt from a delta" in events
    assert "weights delta not used; fetching the full file" not in events
    store = Store(tmp_path / "trainer" / "node.sqlite")
    policies = {v: store.policy(v) for v in range(nodes["trainer"].protocol.version + 1)}
    store.close()
    assert not policies[0].delta
    trainer_blobs = tmp_path / "trainer" / "blobs"
    for version in range(1, len(policies)):
        policy = policies[version]
        assert policy.delta_parent == policies[version - 1].blob and 0 < policy.delta_size < policy.size
        assert (trainer_blobs / policy.blob.hex()).exists() and (trainer_blobs / policy.delta.hex()).exists()
    for name, directory in workers.items():
        rebuilt = changed(nodes[name])
        assert rebuilt, name
        assert all((tmp_path / directory / "blobs" / policies[v].delta.hex()).exists() for v in rebuilt), name
