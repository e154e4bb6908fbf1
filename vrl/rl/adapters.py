"""LoRA adapters as content-addressed policy blobs (specs/adapters.md): a learner's policy is
the shared base model plus its own low-rank adapter, so a verifier fetches megabytes, not the
model (issue 48, item 3).

* :class:`AdapterSpec`: rank, alpha, dropout and the target modules, checked when made.
* :func:`attach`: a PEFT LoRA adapter on a copy of the base, initialised from a seed alone, so
  two nodes given the same seed hold byte-identical adapters.
* :class:`Adapter`: the adapter's tensors with its spec and the base's model hash;
  :attr:`Adapter.blob` is its one canonical byte string (safetensors, keys sorted, float32, a
  header that records the spec and the base), :attr:`Adapter.adapter_id` the SHA-256 of it,
  as every blob of :mod:`vrl.node.blobs` is named.
* :func:`decode`: the strict reader. Hostile bytes are normal input: whatever they hold, it
  returns an adapter that fits the base or raises :class:`AdapterError` with one line naming
  what is wrong, and it checks the size against a bound computed from the base before hashing
  or parsing anything.
* :func:`apply` (the unmerged PEFT model) and :func:`merge` (full weights, a :class:`Model`,
  so the full-weights path of :mod:`vrl.node.weights` and its deltas stays open).

It lives in ``vrl.rl`` rather than beside the weights blobs in ``vrl.node``: the trainer
(``vrl.rl``) attaches and trains it, and the node (the layer above) fetches, decodes and
applies it, so both may import it (tests/test_layout.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from vrl.errors import VrlError, shown
from vrl.rollouts.model import Model

#: The header's ``format``: what these bytes are, and the version of this layout.
FORMAT = "vrl/adapter/v1"
#: The one dtype an adapter's tensors are stored in. PEFT keeps LoRA weights in float32 even
#: over a half-precision base (get_peft_model's autocast_adapter_dtype), and vrl's nodes compute
#: in float32 (specs/security.md §4), so float32 loses nothing either side holds.
DTYPE = "F32"
_WIDTH = 4  # bytes per float32 element
#: The linear layers of a Qwen2 decoder block (the presets', and Qwen2.5's): attention's four
#: projections and the SwiGLU MLP's three.
QWEN2_LINEAR = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
# Defaults. LoRA Without Regret (Schulman et al., Thinking Machines, 2025,
# thinkingmachines.ai/blog/lora) measured LoRA against full fine-tuning: attention-only
# adapters fall behind, adapters on every layer (the MLP too) keep up; for policy-gradient RL
# even rank 1 matched full fine-tuning (an episode carries about one bit); they used alpha 32
# at every rank. So: every linear layer of the block, alpha 32, and rank 16, with room to
# spare over RL's needs and still 1.4% of the 0.5B shape's float32 weights file, 15% of a
# bfloat16 weights delta of one step of it (bench/adapters.py). No dropout: it draws from
# torch's global generator at every training forward, which a peer replaying the step
# (specs/training.md §4) would have to reproduce.
DEFAULT_RANK = 16
DEFAULT_ALPHA = 32
#: The highest rank a node accepts. 4x the default; at 64 an adapter on the 0.5B shape is
#: 141 MB (bench/adapters.py), about 60% of a bfloat16 weights delta of one GRPO step of it
#: (234 MB, bench/results/delta-qwen2.5-0.5b.json): past that an adapter is not the cheap way
#: to ship a policy, and the full weights with their delta are.
MAX_RANK = 64
#: The largest alpha accepted: 128x the default, past any value in common use (8 to 512); the
#: bound keeps the header's number short and the scale alpha / rank sane.
MAX_ALPHA = 4096
#: Characters the header spends at most on the dropout: Python's shortest round-trip repr of a
#: float in [0, 1) is at most 17 significant digits, a point and an exponent (``e-308``): 23.
_MAX_FLOAT_TEXT = 24
#: Seeds of the initial A matrices (:func:`attach`).
INIT_DOMAIN = b"vrl/adapter-init/v1\x00"
_METADATA_KEYS = ("alpha", "base_model_hash", "dropout", "format", "rank", "target_modules")
_INTEGER = re.compile(r"[1-9][0-9]{0,5}")  # canonical decimal, no sign, no leading zero
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# PEFT's names for an adapter's tensors in its saved state dict (get_peft_model_state_dict):
# the wrapped model's path, the adapter name ("default") left out.
_PREFIX = "base_model.model."
_ADAPTER_NAME = "default"


class AdapterError(VrlError, ValueError):
    """An adapter spec, or adapter bytes, that is not a valid adapter of this base: the message
    says which check failed, in one line."""


@dataclass(frozen=True)
class AdapterSpec:
    """What a LoRA adapter is, besides its values: ``rank`` r, ``alpha`` (the update is scaled
    by alpha / r), ``dropout`` (training only) and the ``target_modules``, the names of the base's
    linear layers it adapts (kept sorted: one spec, one header)."""

    rank: int = DEFAULT_RANK
    alpha: int = DEFAULT_ALPHA
    dropout: float = 0.0
    target_modules: tuple[str, ...] = QWEN2_LINEAR

    def __post_init__(self) -> None:
        if type(self.rank) is not int or not 1 <= self.rank <= MAX_RANK:
            raise AdapterError(f"adapter rank {shown(self.rank)} is not an integer in [1, {MAX_RANK}]")
        if type(self.alpha) is not int or not 1 <= self.alpha <= MAX_ALPHA:
            raise AdapterError(f"adapter alpha {shown(self.alpha)} is not an integer in [1, {MAX_ALPHA}]")
        if type(self.dropout) is not float or not 0.0 <= self.dropout < 1.0:
            raise AdapterError(f"adapter dropout {shown(self.dropout)} is not a float in [0, 1)")
        targets = self.target_modules
        if (not isinstance(targets, tuple) or not targets
                or not all(isinstance(t, str) and _MODULE_NAME.fullmatch(t) for t in targets)):
            raise AdapterError(f"adapter target modules {shown(targets)} are not a non-empty tuple of module names")
        if len(set(targets)) != len(targets):
            raise AdapterError(f"adapter target modules {shown(targets)} name a module twice")
        object.__setattr__(self, "target_modules", tuple(sorted(targets)))

    @property
    def scaling(self) -> float:
        """What PEFT multiplies B A by (plain LoRA, not rsLoRA)."""
        return self.alpha / self.rank

    def lora_config(self) -> LoraConfig:
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=list(self.target_modules), bias="none")


# -- what an adapter of a base must hold -------------------------------------------------------------


def adaptable(network: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """The base's linear layers an adapter may target, by module path: ``(in, out)`` features.
    The output head is not one: in the presets it is the tied embedding, and the activation
    commitment covers its input (specs/commitment.md), which the verifier multiplies by it."""
    getter = getattr(network, "get_output_embeddings", None)  # a PreTrainedModel's; a bare module has none
    head = getter() if callable(getter) else None
    return {path: (module.in_features, module.out_features) for path, module in network.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head}


def expected_shapes(network: torch.nn.Module, spec: AdapterSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor an adapter of ``spec`` on ``network`` holds, by its name in the blob (PEFT's
    saved-state name), sorted: ``lora_A.weight`` of shape ``(r, in)`` and ``lora_B.weight`` of
    ``(out, r)`` for each targeted layer. Raises AdapterError for a target the base lacks."""
    layers = adaptable(network)
    names = {path.rsplit(".", 1)[-1] for path in layers}
    missing = [t for t in spec.target_modules if t not in names]
    if missing:
        raise AdapterError(f"target module {shown(missing[0])} is not a linear layer of the base "
                           f"(it has {', '.join(sorted(names)) or 'none'})")
    shapes: dict[str, tuple[int, ...]] = {}
    for path, (fan_in, fan_out) in layers.items():
        if path.rsplit(".", 1)[-1] in spec.target_modules:
            shapes[f"{_PREFIX}{path}.lora_A.weight"] = (spec.rank, fan_in)
            shapes[f"{_PREFIX}{path}.lora_B.weight"] = (fan_out, spec.rank)
    return dict(sorted(shapes.items()))


def _metadata(spec: AdapterSpec, base_hash: bytes, dropout_text: str | None = None) -> dict[str, str]:
    return {"alpha": str(spec.alpha), "base_model_hash": base_hash.hex(),
            "dropout": repr(spec.dropout) if dropout_text is None else dropout_text, "format": FORMAT,
            "rank": str(spec.rank), "target_modules": ",".join(spec.target_modules)}


def _header(metadata: dict[str, str], shapes: Mapping[str, tuple[int, ...]]) -> bytes:
    """The canonical header: ``u64le(N)`` and N bytes of JSON (sorted keys, no spaces, ASCII),
    padded with spaces so the data starts at a multiple of 8, as safetensors pads its own."""
    entries: dict[str, Any] = {"__metadata__": metadata}
    at = 0
    for name, shape in shapes.items():  # sorted: the data is laid out in name order
        end = at + _WIDTH * math.prod(shape)
        entries[name] = {"data_offsets": [at, end], "dtype": DTYPE, "shape": list(shape)}
        at = end
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text


def _data_bytes(shapes: Mapping[str, tuple[int, ...]]) -> int:
    return _WIDTH * sum(math.prod(shape) for shape in shapes.values())


def blob_size(network: torch.nn.Module, spec: AdapterSpec, base_hash: bytes = bytes(32)) -> int:
    """The exact length of the blob of any adapter of ``spec`` on ``network``: it depends on the
    shapes alone (a meta-device network will do)."""
    shapes = expected_shapes(network, spec)
    return len(_header(_metadata(spec, base_hash), shapes)) + _data_bytes(shapes)


def max_blob_size(network: torch.nn.Module, max_rank: int = MAX_RANK) -> int:
    """The most bytes an adapter of this base may take: every adaptable layer at ``max_rank``
    (the largest the header can name), alpha at MAX_ALPHA and the longest dropout text. Every
    field of the header and the data grows with the rank and the set of targets, so no valid
    adapter of rank <= ``max_rank`` is longer: it is the bound :func:`decode` checks first."""
    header, data = _bounds(network, max_rank)
    return header + data


def _bounds(network: torch.nn.Module, max_rank: int) -> tuple[int, int]:
    """The longest header (its 8-byte length included) and data section of any adapter of rank
    <= ``max_rank`` on ``network``: those of the largest adapter it admits."""
    last = {path.rsplit(".", 1)[-1] for path in adaptable(network)}
    names = tuple(sorted(name for name in last if _MODULE_NAME.fullmatch(name)))
    if not names:
        return 0, 0
    spec = AdapterSpec(rank=max_rank, alpha=MAX_ALPHA, target_modules=names)
    shapes = expected_shapes(network, spec)
    return len(_header(_metadata(spec, bytes(32), "0" * _MAX_FLOAT_TEXT), shapes)), _data_bytes(shapes)


# -- the adapter and its bytes -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Adapter:
    """A LoRA adapter's values (``tensors``: blob name -> float32 CPU tensor), its ``spec`` and
    the model hash of the base it adapts (:attr:`vrl.rollouts.model.Model.model_hash`)."""

    spec: AdapterSpec
    base_hash: bytes
    tensors: Mapping[str, torch.Tensor] = field(repr=False)

    @cached_property
    def blob(self) -> bytes:
        """The canonical bytes (specs/adapters.md §2): the header, then each tensor's float32
        little-endian bytes in name order. The same adapter gives the same bytes everywhere."""
        names = sorted(self.tensors)
        shapes = {name: tuple(self.tensors[name].shape) for name in names}
        data = [self.tensors[name].detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
                .tobytes() for name in names]
        return _header(_metadata(self.spec, self.base_hash), shapes) + b"".join(data)

    @cached_property
    def adapter_id(self) -> bytes:
        """SHA-256 of :attr:`blob`: its name in a node's blob directory and on the wire."""
        return hashlib.sha256(self.blob).digest()

    def check(self, base: Model) -> None:
        """Raises AdapterError unless this adapter fits ``base``: its hash, and every tensor's name,
        shape, dtype and values (what :func:`decode` checks of bytes, for one made in memory)."""
        if self.base_hash != base.model_hash:
            raise AdapterError(f"adapter for base model {self.base_hash.hex()[:16]}, not for "
                               f"{base.name} ({base.model_hash.hex()[:16]})")
        expected = expected_shapes(base.network, self.spec)
        _check_names(set(self.tensors), expected)
        for name, shape in expected.items():
            tensor = self.tensors[name]
            if tuple(tensor.shape) != shape:
                raise AdapterError(f"tensor {shown(name)} has shape {list(tensor.shape)}, the base needs {list(shape)}")
            if tensor.dtype != torch.float32:
                raise AdapterError(f"tensor {shown(name)} is {tensor.dtype}, adapters are float32")
            if not bool(torch.isfinite(tensor).all()):
                raise AdapterError(f"tensor {shown(name)} holds NaN or infinite values")


def _check_names(names: set[str], expected: Mapping[str, tuple[int, ...]]) -> None:
    unknown = sorted(names - set(expected))
    if unknown:
        raise AdapterError(f"unknown tensor {shown(unknown[0])}: not an adapter tensor of this spec on this base")
    missing = sorted(set(expected) - names)
    if missing:
        raise AdapterError(f"missing tensor {shown(missing[0])} ({len(missing)} of {len(expected)} missing)")


def decode(blob: bytes, *, adapter_id: bytes, base: Model, max_rank: int = MAX_RANK) -> Adapter:
    """The adapter ``blob`` holds, checked against its id and the ``base``; raises only
    AdapterError, in the order of specs/adapters.md §3: the size against
    :func:`max_blob_size` (before anything is hashed or parsed, so memory stays bounded by
    the base), the SHA-256 against ``adapter_id``, then the header (its format, base, rank,
    spec, tensor names, dtypes and shapes, and that it is the canonical header), the length,
    and the values (finite)."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise AdapterError(f"adapter bytes are bytes, not {type(blob).__name__}")
    if not isinstance(adapter_id, bytes) or len(adapter_id) != 32:
        raise AdapterError(f"an adapter id is 32 bytes, not {shown(adapter_id)}")
    if type(max_rank) is not int or not 1 <= max_rank <= MAX_RANK:
        raise AdapterError(f"max_rank {shown(max_rank)} is not an integer in [1, {MAX_RANK}]")
    max_header, max_data = _bounds(base.network, max_rank)
    bound = max_header + max_data
    if len(blob) > bound:  # before the copy, the hash and the parse: nothing is sized by hostile bytes
        raise AdapterError(f"adapter of {len(blob)} bytes, more than the {bound} bytes of any adapter of "
                           f"rank <= {max_rank} on {base.name}")
    blob = bytes(blob)
    if hashlib.sha256(blob).digest() != adapter_id:
        raise AdapterError(f"adapter bytes hash to {hashlib.sha256(blob).hexdigest()[:16]}, not to its id "
                           f"{adapter_id.hex()[:16]}")
    header, length = _read_header(blob, max_header - 8)
    spec, base_hash = _read_metadata(header.pop("__metadata__", None), max_rank)
    if base_hash != base.model_hash:
        raise AdapterError(f"adapter for base model {base_hash.hex()[:16]}, not for {base.name} "
                           f"({base.model_hash.hex()[:16]})")
    expected = expected_shapes(base.network, spec)
    _check_names(set(header), expected)
    for name, shape in expected.items():
        entry = header[name]
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise AdapterError(f"tensor {shown(name)}: its entry is not {{dtype, shape, data_offsets}}")
        if entry["dtype"] != DTYPE:
            raise AdapterError(f"tensor {shown(name)} is {shown(entry['dtype'])}, adapters are {DTYPE}")
        if entry["shape"] != list(shape):
            raise AdapterError(f"tensor {shown(name)} has shape {shown(entry['shape'])}, the base needs {list(shape)}")
    canonical = _header(_metadata(spec, base_hash), expected)
    if blob[:8 + length] != canonical:
        raise AdapterError("not the canonical adapter header (data offsets, key order, spacing or padding)")
    size = len(canonical) + _data_bytes(expected)
    if len(blob) != size:
        raise AdapterError(f"adapter of {len(blob)} bytes, its header describes {size}: "
                           f"{'truncated' if len(blob) < size else 'bytes after the last tensor'}")
    tensors, at = {}, len(canonical)
    for name, shape in expected.items():
        count = math.prod(shape)
        values = np.frombuffer(blob, dtype="<f4", count=count, offset=at)
        if not np.isfinite(values).all():
            raise AdapterError(f"tensor {shown(name)} holds NaN or infinite values")
        tensors[name] = torch.from_numpy(values.astype(np.float32)).reshape(shape)  # a copy: owns its memory
        at += _WIDTH * count
    return Adapter(spec=spec, base_hash=base_hash, tensors=tensors)


def _read_header(blob: bytes, max_length: int) -> tuple[dict[str, Any], int]:
    """The header's JSON object and its length N (the blob is ``u64le(N) || N bytes || data``),
    N at most ``max_length`` (the largest adapter's), so json never parses more than that."""
    if len(blob) < 8:
        raise AdapterError(f"truncated adapter: {len(blob)} bytes, shorter than its 8-byte header length")
    (length,) = struct.unpack_from("<Q", blob)
    if length > len(blob) - 8:
        raise AdapterError(f"truncated adapter: its header of {length} bytes runs past its {len(blob)} bytes")
    if length > max_length:
        raise AdapterError(f"adapter header of {length} bytes, longer than the {max_length} of any adapter here")
    try:
        header = json.loads(blob[8:8 + length].decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise AdapterError("not an adapter: its header is not ASCII JSON") from None
    if not isinstance(header, dict):
        raise AdapterError("not an adapter: its header is not a JSON object")
    return header, length


def _read_metadata(metadata: object, max_rank: int) -> tuple[AdapterSpec, bytes]:
    """The spec and the base's hash a header's ``__metadata__`` names, each field checked."""
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise AdapterError("not an adapter: no __metadata__ map of text values in its header")
    unknown = sorted(set(metadata) - set(_METADATA_KEYS))
    if unknown:
        raise AdapterError(f"unknown adapter metadata key {shown(unknown[0])}")
    missing = [key for key in _METADATA_KEYS if key not in metadata]
    if missing:
        raise AdapterError(f"adapter metadata has no {missing[0]!r}")
    if metadata["format"] != FORMAT:
        raise AdapterError(f"adapter format {shown(metadata['format'])}, this node reads {FORMAT!r}")
    base = metadata["base_model_hash"]
    if not re.fullmatch(r"[0-9a-f]{64}", base):
        raise AdapterError(f"adapter base_model_hash {shown(base)} is not 64 lowercase hex digits")
    for key in ("rank", "alpha"):
        if not _INTEGER.fullmatch(metadata[key]):
            raise AdapterError(f"adapter {key} {shown(metadata[key])} is not a canonical positive integer")
    rank = int(metadata["rank"])
    if rank > max_rank:
        raise AdapterError(f"adapter rank {rank} above the maximum {max_rank}")
    try:
        dropout = float(metadata["dropout"])
    except ValueError:
        raise AdapterError(f"adapter dropout {shown(metadata['dropout'])} is not a number") from None
    if repr(dropout) != metadata["dropout"]:
        raise AdapterError(f"adapter dropout {shown(metadata['dropout'])} is not written as repr writes it")
    targets = tuple(metadata["target_modules"].split(","))
    if list(targets) != sorted(set(targets)):
        raise AdapterError(f"adapter target modules {shown(metadata['target_modules'])} are not sorted and distinct")
    spec = AdapterSpec(rank=rank, alpha=int(metadata["alpha"]), dropout=dropout, target_modules=targets)
    return spec, bytes.fromhex(base)


# -- on a model ------------------------------------------------------------------------------------------


def _wrap(base: Model, spec: AdapterSpec) -> PeftModel:
    """A PEFT model of ``spec`` over a copy of the base's network (the base is left as it was)."""
    expected_shapes(base.network, spec)  # a target the base lacks is an AdapterError, not PEFT's
    network = copy.deepcopy(base.network)
    with warnings.catch_warnings():
        # PEFT asks transformers whether gradient checkpointing is on through a deprecated name.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        wrapped = get_peft_model(network, spec.lora_config(), adapter_name=_ADAPTER_NAME)
    return cast(PeftModel, wrapped)  # one plain LoRA config: a PeftModel, never a mixed one


def lora_parameters(model: PeftModel) -> dict[str, torch.nn.Parameter]:
    """The adapter's live parameters by blob name (PEFT's parameter name less ``.default``)."""
    marker = f".{_ADAPTER_NAME}."
    return {name.replace(marker, "."): parameter for name, parameter in model.named_parameters()
            if ".lora_A." in name or ".lora_B." in name}


def attach(base: Model, spec: AdapterSpec, seed: int) -> PeftModel:
    """A trainable LoRA adapter over a copy of ``base``, its values a function of ``seed`` alone:
    each ``lora_A`` uniform in ``+-1 / sqrt(in)`` (PEFT's own default, kaiming-uniform with
    a = sqrt(5)) from a generator seeded by ``SHA-256(INIT_DOMAIN || u64be(seed) || name)``, each
    ``lora_B`` zero, so the new policy is the base (specs/adapters.md §4). The base's weights
    are frozen; the adapter's require gradients."""
    if type(seed) is not int or not 0 <= seed < 1 << 64:
        raise AdapterError(f"adapter seed {shown(seed)} is not an integer in [0, 2^64)")
    model = _wrap(base, spec)
    with torch.no_grad():
        for name, parameter in sorted(lora_parameters(model).items()):
            if ".lora_B." in name:
                parameter.zero_()
                continue
            digest = hashlib.sha256(INIT_DOMAIN + seed.to_bytes(8, "big") + name.encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big"))
            bound = 1.0 / math.sqrt(parameter.shape[1])
            values = torch.empty(parameter.shape, dtype=torch.float32).uniform_(-bound, bound, generator=generator)
            parameter.copy_(values)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_A." in name or ".lora_B." in name)
    return model


def snapshot(model: PeftModel, spec: AdapterSpec, base: Model) -> Adapter:
    """The adapter ``model`` (made by :func:`attach` or :func:`apply` over ``base``) holds now."""
    live = lora_parameters(model)
    _check_names(set(live), expected_shapes(base.network, spec))
    tensors = {name: live[name].detach().to("cpu", torch.float32).clone() for name in sorted(live)}
    return Adapter(spec=spec, base_hash=base.model_hash, tensors=tensors)


def apply(base: Model, adapter: Adapter) -> PeftModel:
    """``base`` with ``adapter``, unmerged: PEFT's LoRA layers over a copy of the base's network,
    in eval mode and without gradients. Raises AdapterError if the adapter is not one of this base."""
    adapter.check(base)
    model = _wrap(base, adapter.spec)
    live = lora_parameters(model)
    with torch.no_grad():
        for name, tensor in adapter.tensors.items():
            live[name].copy_(tensor)
    model.eval()
    model.requires_grad_(False)
    return model


def merge(base: Model, adapter: Adapter) -> Model:
    """The full weights of ``base`` with ``adapter`` merged in (each targeted ``W`` becomes
    ``W + (alpha / r) B A``, PEFT's merge), as a plain :class:`Model` of the base's architecture:
    what :mod:`vrl.node.weights` publishes and hashes. Its forward equals :func:`apply`'s up to
    float rounding (the sums are taken in another order), not bit for bit. Finite A and B may
    still overflow in their product (entries near 1e38): a merged weight that is not finite is an
    AdapterError."""
    merged = apply(base, adapter).merge_and_unload()
    merged.eval().requires_grad_(False)
    modules = dict(merged.named_modules())
    for name in adapter.tensors:
        if name.endswith(".lora_A.weight"):
            path = name.removeprefix(_PREFIX).removesuffix(".lora_A.weight")
            if not bool(torch.isfinite(modules[path].weight).all()):
                raise AdapterError(f"merging the adapter makes {shown(path)}'s weight overflow (not finite)")
    name = f"{base.name}+adapter-{adapter.adapter_id.hex()[:12]}"
    return Model(name=name, network=merged, tokenizer=base.tokenizer, dtype_name=base.dtype_name)
