"""LoRA adapters as policy blobs (vrl/rl/adapters.py, specs/adapters.md): deterministic from a
seed, one canonical byte string per adapter, a strict decoder that raises only AdapterError
whatever it is given, and apply/merge that compute what PEFT computes."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load as load_tensors

from vrl.errors import VrlError
from vrl.node import weights
from vrl.rl.adapters import (
    DEFAULT_ALPHA,
    DEFAULT_RANK,
    MAX_RANK,
    QWEN2_LINEAR,
    Adapter,
    AdapterError,
    AdapterSpec,
    apply,
    attach,
    blob_size,
    decode,
    expected_shapes,
    max_blob_size,
    merge,
    snapshot,
)
from vrl.rollouts.model import Model, load_model

#: The test vector of specs/adapters.md §5: the ``tiny`` preset, rank 2 on q_proj and v_proj,
#: alpha 32, seed 0, as attached (B zero).
VECTOR_SPEC = AdapterSpec(rank=2, alpha=32, target_modules=("q_proj", "v_proj"))
VECTOR_ID = "38ecbed80c83ee528862118f063260540e3d573771e4304d2a22939df324aabb"
VECTOR_SIZE = 30888


@pytest.fixture(scope="module")
def base() -> Model:
    return load_model("tiny")


_TRAINED: dict[tuple[AdapterSpec, int], Adapter] = {}


def trained(base: Model, spec: AdapterSpec = VECTOR_SPEC, seed: int = 0) -> Adapter:
    """An adapter with every tensor nonzero (as after training): B drawn from a seeded generator.
    Made once per spec and seed (attaching copies the base); callers never change its tensors."""
    if (spec, seed) not in _TRAINED:
        _TRAINED[spec, seed] = _trained(base, spec, seed)
    return _TRAINED[spec, seed]


def _trained(base: Model, spec: AdapterSpec, seed: int) -> Adapter:
    model = attach(base, spec, seed)
    adapter = snapshot(model, spec, base)
    generator = torch.Generator().manual_seed(seed + 1)
    tensors = {name: (torch.randn(t.shape, generator=generator) * 0.05 if ".lora_B." in name else t)
               for name, t in adapter.tensors.items()}
    return Adapter(spec=spec, base_hash=base.model_hash, tensors=tensors)


def raw(header: dict, data: bytes) -> bytes:
    """A safetensors file of this header and data, written as given (for hostile cases)."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def split(blob: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8:8 + length]), blob[8 + length:]


def decoded(blob: bytes, base: Model, **options) -> Adapter:
    return decode(blob, adapter_id=hashlib.sha256(blob).digest(), base=base, **options)


def logits(network: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(1, 25).reshape(2, 12) % 250
    with torch.no_grad():
        return network(input_ids=ids).logits


# -- the spec --------------------------------------------------------------------------------------------


def test_the_default_spec_is_every_linear_layer_of_the_block_at_rank_16_alpha_32_no_dropout():
    spec = AdapterSpec()
    assert (spec.rank, spec.alpha, spec.dropout) == (DEFAULT_RANK, DEFAULT_ALPHA, 0.0) == (16, 32, 0.0)
    assert spec.target_modules == tuple(sorted(QWEN2_LINEAR)) and len(QWEN2_LINEAR) == 7
    assert AdapterSpec(target_modules=("v_proj", "q_proj")).target_modules == ("q_proj", "v_proj")


@pytest.mark.parametrize("fields", [
    {"rank": 0}, {"rank": MAX_RANK + 1}, {"rank": True}, {"rank": 2.0}, {"alpha": 0}, {"alpha": 1 << 20},
    {"dropout": 1.0}, {"dropout": -0.1}, {"dropout": float("nan")}, {"dropout": 0}, {"target_modules": ()},
    {"target_modules": ("q_proj", "q_proj")}, {"target_modules": ("model.q_proj",)}, {"target_modules": ["q_proj"]},
])
def test_a_bad_spec_is_refused_when_made(fields):
    with pytest.raises(AdapterError):
        AdapterSpec(**fields)


def test_a_target_the_base_lacks_or_its_output_head_is_refused(base):
    with pytest.raises(AdapterError, match="not a linear layer of the base"):
        attach(base, AdapterSpec(target_modules=("c_attn",)), 0)
    with pytest.raises(AdapterError, match="not a linear layer of the base"):
        expected_shapes(base.network, AdapterSpec(target_modules=("lm_head",)))


# -- determinism and the bytes ---------------------------------------------------------------------------


def test_two_nodes_given_one_seed_attach_byte_identical_adapters_and_it_starts_as_the_base(base):
    first, second = (snapshot(attach(base, VECTOR_SPEC, 7), VECTOR_SPEC, base) for _ in range(2))
    assert first.blob == second.blob and first.adapter_id == second.adapter_id
    assert snapshot(attach(base, VECTOR_SPEC, 8), VECTOR_SPEC, base).adapter_id != first.adapter_id
    model = attach(base, VECTOR_SPEC, 7)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable)
    assert torch.equal(logits(model), logits(base.network))  # B = 0: the new policy is the base
    assert all(not p.requires_grad for p in base.network.parameters())  # the base itself is untouched


def test_the_test_vector_of_the_spec(base):
    adapter = snapshot(attach(base, VECTOR_SPEC, 0), VECTOR_SPEC, base)
    assert len(adapter.blob) == VECTOR_SIZE == blob_size(base.network, VECTOR_SPEC)
    assert adapter.adapter_id.hex() == VECTOR_ID


def test_round_trip_and_what_safetensors_and_peft_read_of_the_bytes(base):
    adapter = trained(base, AdapterSpec(rank=4))
    back = decoded(adapter.blob, base)
    assert back.spec == adapter.spec and back.base_hash == base.model_hash
    assert back.blob == adapter.blob and list(back.tensors) == sorted(adapter.tensors)
    assert all(torch.equal(back.tensors[k], adapter.tensors[k]) for k in adapter.tensors)
    assert len(adapter.blob) == blob_size(base.network, adapter.spec) <= max_blob_size(base.network)
    # The bytes are a safetensors file, its names PEFT's own saved-state names.
    read = load_tensors(adapter.blob)
    assert set(read) == set(get_peft_model_state_dict(apply(base, adapter)))
    assert all(torch.equal(read[k], adapter.tensors[k]) for k in read)
    header, _ = split(adapter.blob)
    assert header["__metadata__"] == {
        "alpha": "32", "base_model_hash": base.model_hash.hex(), "dropout": "0.0", "format": "vrl/adapter/v1",
        "rank": "4", "target_modules": "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"}
    assert (8 + struct.unpack_from("<Q", adapter.blob)[0]) % 8 == 0  # data aligned, as safetensors pads


def test_the_bound_is_the_largest_adapter_the_base_admits(base):
    # tiny: 4 layers of hidden 256, intermediate 768, 2 of 4 heads' worth of k and v (128).
    per_layer = 2 * (256 + 256) + 2 * (256 + 128) + 3 * (256 + 768)
    assert max_blob_size(base.network) - 4 * 4 * MAX_RANK * per_layer == pytest.approx(8000, abs=8000)
    assert blob_size(base.network, AdapterSpec(rank=MAX_RANK, alpha=4096)) <= max_blob_size(base.network)


# -- hostile bytes -----------------------------------------------------------------------------------------


def _with_header(blob: bytes, edit) -> bytes:
    header, data = split(blob)
    return raw(edit(header) or header, data)


def _nan(base):
    adapter = trained(base)
    name = next(iter(adapter.tensors))
    tensors = dict(adapter.tensors, **{name: adapter.tensors[name].clone().index_fill_(0, torch.tensor([0]), math.nan)})
    return Adapter(VECTOR_SPEC, base.model_hash, tensors).blob


def _inf(base):
    adapter = trained(base)
    name = sorted(adapter.tensors)[-1]
    tensors = dict(adapter.tensors, **{name: adapter.tensors[name].clone().fill_(math.inf)})
    return Adapter(VECTOR_SPEC, base.model_hash, tensors).blob


def _shape(base):
    adapter = trained(base)
    name = next(iter(adapter.tensors))
    return Adapter(VECTOR_SPEC, base.model_hash, dict(adapter.tensors, **{name: torch.zeros(3, 256)})).blob


def _dtype(base):
    def edit(header):
        name = sorted(k for k in header if k != "__metadata__")[0]
        header[name]["dtype"] = "F16"
    return _with_header(trained(base).blob, edit)


def _unknown(base):
    def edit(header):
        header["base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight"] = {
            "dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    return _with_header(trained(base).blob, edit)


def _missing(base):
    def edit(header):
        del header[sorted(k for k in header if k != "__metadata__")[-1]]
    return _with_header(trained(base).blob, edit)


def _metadata(**fields):
    def make(base):
        return _with_header(trained(base).blob, lambda h: h["__metadata__"].update(fields))
    return make


def _spaced(base):
    header, data = split(trained(base).blob)
    text = json.dumps(header, indent=1).encode()
    return struct.pack("<Q", len(text)) + text + data


HOSTILE = {
    "wrong base model": (lambda b: Adapter(VECTOR_SPEC, bytes(32), trained(b).tensors).blob, "adapter for base model"),
    "unknown key": (_unknown, "unknown tensor"),
    "missing key": (_missing, "missing tensor"),
    "wrong shape": (_shape, "has shape"),
    "NaN": (_nan, "NaN or infinite"),
    "Inf": (_inf, "NaN or infinite"),
    "wrong dtype": (_dtype, "is 'F16', adapters are F32"),
    "rank above the maximum": (lambda b: trained(b, AdapterSpec(rank=16, target_modules=("q_proj",))).blob,
                               "rank 16 above the maximum 8"),
    "truncated": (lambda b: trained(b).blob[:-4], "truncated"),
    "truncated header": (lambda b: trained(b).blob[:40], "truncated adapter"),
    "shorter than a length": (lambda b: b"\x01\x02", "truncated adapter"),
    "bytes after the data": (lambda b: trained(b).blob + bytes(4), "bytes after the last tensor"),
    "huge header": (lambda b: struct.pack("<Q", 100_000) + b" " * 100_000, "longer than the"),
    "garbage": (lambda b: b"\x10\x00\x00\x00\x00\x00\x00\x00\xff\xfe not json at all", "not ASCII JSON"),
    "not an object": (lambda b: raw([1, 2], b""), "not a JSON object"),
    "deeply nested": (lambda b: struct.pack("<Q", 3000) + b"[" * 3000, "not ASCII JSON"),  # past json's recursion
    "no metadata": (lambda b: raw({}, b""), "no __metadata__"),
    "other format": (_metadata(format="vrl/adapter/v9"), "adapter format"),
    "unknown metadata key": (_metadata(license="mit"), "unknown adapter metadata key"),
    "non-canonical rank": (_metadata(rank="02"), "canonical positive integer"),
    "dropout not a number": (_metadata(dropout="often"), "not a number"),
    "dropout out of range": (_metadata(dropout="1.5"), r"not a float in \[0, 1\)"),
    "targets unsorted": (_metadata(target_modules="v_proj,q_proj"), "not sorted and distinct"),
    "target the base lacks": (_metadata(target_modules="c_attn"), "not a linear layer"),
    "bad base hash": (_metadata(base_model_hash="00"), "64 lowercase hex"),
    "non-canonical header": (_spaced, "canonical adapter header"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_adapter_is_one_adapter_error_naming_what_is_wrong(base, case):
    make, message = HOSTILE[case]
    blob = make(base)
    with pytest.raises(AdapterError, match=message) as caught:
        decoded(blob, base, max_rank=8)
    assert "\n" not in str(caught.value)


def test_wrong_hash_and_huge_input_are_refused_before_parsing(base):
    blob = trained(base).blob
    with pytest.raises(AdapterError, match="not to its id"):
        decode(blob, adapter_id=bytes(32), base=base)
    bound = max_blob_size(base.network)
    with pytest.raises(AdapterError, match=f"more than the {bound} bytes"):
        decode(bytes(bound + 1), adapter_id=bytes(32), base=base)  # refused before it is hashed
    with pytest.raises(AdapterError, match="an adapter id is 32 bytes"):
        decode(blob, adapter_id=blob[:31], base=base)
    with pytest.raises(AdapterError, match="bytes, not str"):
        decode("text", adapter_id=bytes(32), base=base)  # type: ignore[arg-type]
    assert issubclass(AdapterError, VrlError) and issubclass(AdapterError, ValueError)


def test_apply_refuses_an_adapter_of_another_base_or_shape(base):
    adapter = trained(base)
    with pytest.raises(AdapterError, match="adapter for base model"):
        apply(base, Adapter(VECTOR_SPEC, bytes(32), adapter.tensors))
    name = next(iter(adapter.tensors))
    with pytest.raises(AdapterError, match="has shape"):
        apply(base, Adapter(VECTOR_SPEC, base.model_hash, dict(adapter.tensors, **{name: torch.zeros(1)})))


def test_finite_values_whose_product_overflows_are_refused_by_merge(base):
    adapter = trained(base)
    tensors = {name: torch.full_like(t, 1e30) for name, t in adapter.tensors.items()}
    huge = decoded(Adapter(VECTOR_SPEC, base.model_hash, tensors).blob, base)  # finite: it decodes
    with pytest.raises(AdapterError, match="overflow"):
        merge(base, huge)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=2048), own_id=st.booleans())
def test_any_bytes_are_an_adapter_or_an_adapter_error(base, data, own_id):
    adapter_id = hashlib.sha256(data).digest() if own_id else bytes(32)
    try:
        decode(data, adapter_id=adapter_id, base=base)
    except AdapterError:
        pass


@pytest.fixture(scope="module")
def valid_blob(base) -> bytes:
    return trained(base).blob


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255), st.sampled_from("sid")),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_mutations_of_valid_bytes_decode_to_a_valid_adapter_or_an_adapter_error(base, valid_blob, edits, cut):
    blob = bytearray(valid_blob)
    for at, byte, kind in edits:  # set, insert or delete a byte; the header is the first few hundred bytes
        at %= len(blob) + 1 if kind == "i" else max(len(blob), 1)
        if kind == "s" and blob:
            blob[at] = byte
        elif kind == "i":
            blob[at:at] = bytes([byte])
        elif blob:
            del blob[at]
    if cut is not None:
        blob = blob[:cut % (len(blob) + 1)]
    try:
        adapter = decoded(bytes(blob), base)
    except AdapterError:
        return
    assert adapter.blob == bytes(blob)  # what decodes is canonical: one adapter, one byte string
    adapter.check(base)


# -- apply and merge -----------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")  # PEFT's own call, below
def test_apply_is_peft_unmerged_and_merge_is_its_full_weights(base):
    adapter = trained(base, AdapterSpec(rank=4))
    reference = get_peft_model(copy.deepcopy(base.network), adapter.spec.lora_config())
    set_peft_model_state_dict(reference, load_tensors(adapter.blob))
    reference.eval()
    applied = apply(base, adapter)
    assert torch.equal(logits(applied), logits(reference))
    assert not torch.equal(logits(applied), logits(base.network))  # the adapter does something
    merged = merge(base, adapter)
    assert torch.equal(logits(merged.network), logits(reference.merge_and_unload()))
    torch.testing.assert_close(logits(merged.network), logits(applied), rtol=1e-5, atol=1e-5)
    # W + (alpha / r) B A, layer by layer; every other weight is the base's.
    merged_state, base_state = merged.network.state_dict(), base.network.state_dict()
    assert set(merged_state) == set(base_state)
    for name, tensor in base_state.items():
        path = name.removesuffix(".weight")
        a = adapter.tensors.get(f"base_model.model.{path}.lora_A.weight")
        if a is None:
            assert torch.equal(merged_state[name], tensor), name
        else:
            b = adapter.tensors[f"base_model.model.{path}.lora_B.weight"]
            torch.testing.assert_close(merged_state[name], tensor + adapter.spec.scaling * (b @ a))
    # ... so the full-weights path (vrl.node.weights) carries the merged policy as it carries any.
    blob = weights.to_blob(merged)
    back = weights.from_blob(base, blob, blob_hash=hashlib.sha256(blob).digest(), model_hash=merged.model_hash,
                             name="merged")
    assert back.model_hash == merged.model_hash != base.model_hash
    assert with_opened(blob) == len(base_state)


def with_opened(blob: bytes) -> int:
    """How many tensors safetensors' own reader finds in a weights file (a sanity check)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".safetensors") as file:
        file.write(blob)
        file.flush()
        with safe_open(file.name, "pt") as opened:
            return len(list(opened.keys()))
