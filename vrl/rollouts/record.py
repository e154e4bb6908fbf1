"""The signed rollout record (specs/record.md).

A record is a msgpack map in canonical form: keys sorted by their UTF-8 bytes at every
level, integers in their shortest encoding, floats as float64, text as str, byte strings as
bin, and token or logprob arrays packed little-endian into bin. Decoding re-encodes and
demands byte equality, so every record has exactly one encoding and the signature covers it.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import msgpack

from proofs.sampling_params import SamplingParams
from proofs.zk import FELT_BYTES, FIELD_MODULUS
from vrl.rollouts.codec import FieldError, canonical_bytes, fixed_bytes, integer, packed_array, real, take, text
from vrl.rollouts.keys import NODE_ID_BYTES, SIGNATURE_BYTES, NodeKey, signature_valid
from vrl.tasks import RewardSpec, Task
from vrl.tasks.core import MAX_TASK_ID_BYTES, MAX_TEXT_BYTES
from vrl.tasks.rewards import RewardError

RECORD_VERSION = 3
#: Versions this reader decodes: v2 (reward_spec as {correct, format, tag}) is read as the v3
#: spec it maps to (specs/record.md version history), and re-encoded as it was, so records of
#: earlier runs still verify and audit.
READABLE_VERSIONS = (2, 3)
SIGNING_DOMAIN = b"vrl/rollout/v1\x00"
SAMPLE_SEED_DOMAIN = b"vrl/sample-seed/v1\x00"
ROUND_SEED_DOMAIN = b"vrl/round-seed/v1\x00"
FINISH_REASONS = ("stop", "length")
#: Bounds from specs/record.md section 3: generous for real models, small enough that a
#: hostile record cannot make a verifier allocate without limit.
MAX_RECORD_BYTES = 16 << 20
MAX_PROMPT_TOKENS = 1 << 16
MAX_GROUP_SIZE = 1024


class RecordFault(StrEnum):
    """What kind of wrong a record that does not decode is (the verifier's stage-1 reason
    codes follow from it, specs/verification.md §1)."""

    MALFORMED = "malformed"  # a field's type, size or range; an unknown field; not canonical
    OVERSIZED = "oversized"  # longer than MAX_RECORD_BYTES
    UNKNOWN_VERSION = "unknown_version"  # a "v" this reader does not know
    TRUNCATED = "truncated"  # a rollout file ends inside it (specs/record.md §4)
    CORRUPT = "corrupt"  # a rollout file's frame fails its checksum or marker


class RecordError(FieldError):
    """A record that does not decode or violates the schema; names the record and field, and
    says which :class:`RecordFault` it is."""

    def __init__(self, field: str, problem: str, index: int | None = None,
                 kind: RecordFault = RecordFault.MALFORMED) -> None:
        super().__init__(field, problem)
        self.index, self.kind = index, kind
        if index is not None:
            self.args = (f"record {index}: {self.args[0]}",)

    def at(self, index: int) -> RecordError:
        return RecordError(self.field, self.problem, index, self.kind)


def sample_seed(round_seed: bytes, node_id: bytes, task_id: str, sample_index: int) -> bytes:
    """``H(round_seed, node_id, task_id, sample_index)``: the seed no node can choose."""
    task = task_id.encode()
    return hashlib.sha256(
        SAMPLE_SEED_DOMAIN + round_seed + node_id + len(task).to_bytes(4, "big") + task
        + sample_index.to_bytes(4, "big")
    ).digest()


def round_seed(checkpoint_hash: bytes, round_index: int) -> bytes:
    """``H(checkpoint_hash, round)``: unknown to everyone until the policy it samples is published."""
    return hashlib.sha256(ROUND_SEED_DOMAIN + checkpoint_hash + round_index.to_bytes(8, "big")).digest()


def _pack_u32(values: tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def _pack_f32(values: tuple[float, ...]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


@dataclass(frozen=True, slots=True)
class Rollout:
    """One sampled completion with everything a verifier needs to check it. Immutable."""

    node_id: bytes
    model_hash: bytes
    policy_version: int
    round_seed: bytes
    group_index: int
    task_id: str
    sample_index: int
    group_size: int
    prompt: str
    reference: str
    prompt_tokens: tuple[int, ...]
    completion_tokens: tuple[int, ...]
    finish_reason: str
    sampling: SamplingParams
    behaviour_logprobs: tuple[float, ...]
    reward: float
    reward_spec: RewardSpec
    commitment: bytes
    signature: bytes = b""
    # Optional (specs/record.md §2): Poseidon of each sampled token's quantized hidden state,
    # 32 bytes per completion token, for sampling proofs at challenged positions (specs/zk.md
    # §10). Empty, and then absent from the encoding, for a record without them.
    hidden_hashes: bytes = b""
    #: The record version it is encoded as: RECORD_VERSION for every new record; 2 for one
    #: decoded from a v2 file, so it re-encodes (and its signature checks) as it was signed.
    version: int = RECORD_VERSION

    # -- identity -------------------------------------------------------------------------
    @property
    def sample_seed(self) -> bytes:
        return sample_seed(self.round_seed, self.node_id, self.task_id, self.sample_index)

    @property
    def task(self) -> Task:
        """The task this rollout answers, as the record states it."""
        return Task(self.task_id, self.prompt, self.reference)

    @property
    def group_key(self) -> tuple[bytes, bytes, int, int]:
        """A GRPO group: the samples of one assigned task by one node in one round, submitted whole."""
        return (self.node_id, self.round_seed, self.policy_version, self.group_index)

    # -- encoding -------------------------------------------------------------------------
    def _wire(self, with_signature: bool) -> dict[str, Any]:
        wire = {
            "v": self.version,
            "node_id": self.node_id,
            "model_hash": self.model_hash,
            "policy_version": self.policy_version,
            "round_seed": self.round_seed,
            "group_index": self.group_index,
            "task_id": self.task_id,
            "sample_index": self.sample_index,
            "group_size": self.group_size,
            "prompt": self.prompt,
            "reference": self.reference,
            "prompt_tokens": _pack_u32(self.prompt_tokens),
            "completion_tokens": _pack_u32(self.completion_tokens),
            "finish_reason": self.finish_reason,
            "sampling": {
                "temperature": float(self.sampling.temperature),
                "top_k": self.sampling.top_k,
                "top_p": float(self.sampling.top_p),
                "max_new_tokens": self.sampling.max_new_tokens,
                "stop_token_ids": list(self.sampling.stop_token_ids),
            },
            "behaviour_logprobs": _pack_f32(self.behaviour_logprobs),
            "reward": float(self.reward),
            "reward_spec": self._reward_spec_wire(),
            "commitment": self.commitment,
        }
        if self.hidden_hashes:
            wire["hidden_hashes"] = self.hidden_hashes
        if with_signature:
            wire["signature"] = self.signature
        return wire

    def _reward_spec_wire(self) -> Any:
        if self.version == RECORD_VERSION:
            return self.reward_spec.to_wire()
        legacy = self.reward_spec.as_legacy()
        if self.version != 2 or legacy is None:
            raise ValueError(f"a v{self.version} record cannot state the reward {self.reward_spec}")
        return {"correct": float(legacy[0]), "format": float(legacy[1]), "tag": legacy[2]}

    def signing_payload(self) -> bytes:
        """What the signature covers: the domain tag and the canonical record less the signature."""
        return SIGNING_DOMAIN + canonical_bytes(self._wire(with_signature=False))

    def to_bytes(self) -> bytes:
        return canonical_bytes(self._wire(with_signature=True))

    @classmethod
    def from_bytes(cls, data: bytes) -> Rollout:
        """Decode and validate; raises :class:`RecordError` naming the offending field."""
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError("", f"oversized: {len(data)} bytes exceeds the {MAX_RECORD_BYTES}-byte limit",
                              kind=RecordFault.OVERSIZED)
        try:
            wire = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
        except Exception as error:  # msgpack raises several unrelated types for bad bytes
            raise RecordError("", f"not valid msgpack: {error}") from None
        if not isinstance(wire, dict):
            raise RecordError("", f"expected a msgpack map, got {type(wire).__name__}")
        try:
            rollout = _from_wire(wire)
        except RecordError:
            raise
        except FieldError as error:  # the codec's field readers
            raise RecordError(error.field, error.problem) from None
        if rollout.to_bytes() != data:
            raise RecordError("", "not in canonical encoding (key order, int width or float width)")
        return rollout

    # -- signing --------------------------------------------------------------------------
    def signed(self, key: NodeKey, **changes: Any) -> Rollout:
        """A copy with ``changes`` applied, the node id set to ``key``'s and a fresh signature."""
        unsigned = self
        if changes or self.node_id != key.node_id or self.signature:
            unsigned = replace(self, **changes, node_id=key.node_id, signature=b"")
        return replace(unsigned, signature=key.sign(unsigned.signing_payload()))

    def signature_valid(self) -> bool:
        return signature_valid(self.node_id, self.signing_payload(), self.signature)


# -- decoding with field-level errors -------------------------------------------------------

_TOP_LEVEL = {
    "v", "node_id", "model_hash", "policy_version", "round_seed", "group_index", "task_id",
    "sample_index", "group_size", "prompt", "reference", "prompt_tokens", "completion_tokens",
    "finish_reason", "sampling", "behaviour_logprobs", "reward", "reward_spec", "commitment",
    "signature", "hidden_hashes",
}
#: A hidden-state hash: a BN254 field element, little-endian.
HIDDEN_HASH_BYTES = FELT_BYTES
_NESTED = {"sampling": {"temperature", "top_k", "top_p", "max_new_tokens", "stop_token_ids"}}
#: A v2 record's reward_spec keys.
_LEGACY_REWARD = {"correct", "format", "tag"}


def _from_wire(wire: dict[str, Any]) -> Rollout:
    version = take(wire, "v", int)
    if version not in READABLE_VERSIONS:
        raise RecordError("v", f"unknown record version {version} (this reader knows "
                               f"{', '.join(map(str, READABLE_VERSIONS))})", kind=RecordFault.UNKNOWN_VERSION)
    unknown = set(wire) - _TOP_LEVEL
    if unknown:
        raise RecordError(str(sorted(unknown, key=repr)[0]), "unknown field")
    for name, known in _NESTED.items():
        unknown = set(take(wire, name, dict)) - known
        if unknown:
            raise RecordError(f"{name}.{sorted(unknown, key=repr)[0]}", "unknown field")
    sampling_wire = wire["sampling"]
    stops = take(sampling_wire, "stop_token_ids", list, "sampling.")
    if len(stops) > 64 or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 32 for s in stops):
        raise RecordError("sampling.stop_token_ids", "expected at most 64 integers in [0, 2^32 - 1]")
    try:
        sampling = SamplingParams(
            temperature=real(sampling_wire, "temperature", "sampling."),
            top_k=integer(sampling_wire, "top_k", 0, 1 << 24, "sampling."),
            top_p=real(sampling_wire, "top_p", "sampling."),
            max_new_tokens=integer(sampling_wire, "max_new_tokens", 1, 1 << 20, "sampling."),
            stop_token_ids=tuple(stops),
        )
    except ValueError as error:  # InvalidParameters carries the field name
        raise RecordError(getattr(error, "field", "sampling"), getattr(error, "problem", str(error))) from None

    completion = packed_array(wire, "completion_tokens", "I", sampling.max_new_tokens)
    if not completion:
        raise RecordError("completion_tokens", "empty: a rollout has at least one token")
    logprobs = packed_array(wire, "behaviour_logprobs", "f", sampling.max_new_tokens)
    if len(logprobs) != len(completion):
        raise RecordError("behaviour_logprobs", f"{len(logprobs)} values for {len(completion)} tokens")
    if not all(math.isfinite(x) and x <= 0.0 for x in logprobs):
        raise RecordError("behaviour_logprobs", "values must be finite and <= 0")
    finish = take(wire, "finish_reason", str)
    if finish not in FINISH_REASONS:
        raise RecordError("finish_reason", f"{finish!r} is not one of {', '.join(FINISH_REASONS)}")
    prompt_tokens = packed_array(wire, "prompt_tokens", "I", MAX_PROMPT_TOKENS)
    if not prompt_tokens:
        raise RecordError("prompt_tokens", "empty")
    group_size = integer(wire, "group_size", 1, MAX_GROUP_SIZE)
    reward_spec = _reward_spec(wire, version)
    hidden_hashes = take(wire, "hidden_hashes", bytes) if "hidden_hashes" in wire else b""
    if "hidden_hashes" in wire and len(hidden_hashes) != HIDDEN_HASH_BYTES * len(completion):
        raise RecordError("hidden_hashes", f"{len(hidden_hashes)} bytes: one {HIDDEN_HASH_BYTES}-byte hash per "
                                           f"completion token ({len(completion)}) is expected")
    if any(int.from_bytes(hidden_hashes[i:i + HIDDEN_HASH_BYTES], "little") >= FIELD_MODULUS
           for i in range(0, len(hidden_hashes), HIDDEN_HASH_BYTES)):
        raise RecordError("hidden_hashes", "a hash is not a field element (not below the BN254 scalar order)")
    return Rollout(
        node_id=fixed_bytes(wire, "node_id", NODE_ID_BYTES),
        model_hash=fixed_bytes(wire, "model_hash", 32),
        policy_version=integer(wire, "policy_version", 0, (1 << 63) - 1),
        round_seed=fixed_bytes(wire, "round_seed", 32),
        group_index=integer(wire, "group_index", 0, (1 << 32) - 1),
        task_id=text(wire, "task_id", MAX_TASK_ID_BYTES),
        sample_index=integer(wire, "sample_index", 0, MAX_GROUP_SIZE - 1),
        group_size=group_size,
        prompt=text(wire, "prompt", MAX_TEXT_BYTES),
        reference=text(wire, "reference", MAX_TEXT_BYTES),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        finish_reason=finish,
        sampling=sampling,
        behaviour_logprobs=logprobs,
        reward=real(wire, "reward"),
        reward_spec=reward_spec,
        commitment=take(wire, "commitment", bytes),
        signature=fixed_bytes(wire, "signature", SIGNATURE_BYTES),
        hidden_hashes=hidden_hashes,
        version=version,
    )


def _reward_spec(wire: dict[str, Any], version: int) -> RewardSpec:
    """The record's reward spec: v3's array of terms, or v2's ``{correct, format, tag}`` as
    the spec it maps to (specs/record.md §1)."""
    if "reward_spec" not in wire:
        raise RecordError("reward_spec", "missing")
    if version == RECORD_VERSION:
        try:
            return RewardSpec.from_wire(wire["reward_spec"])
        except RewardError as error:
            raise RecordError(error.field, error.problem) from None
    legacy = take(wire, "reward_spec", dict)
    if unknown := set(legacy) - _LEGACY_REWARD:
        raise RecordError(f"reward_spec.{sorted(unknown, key=repr)[0]}", "unknown field")
    tag = take(legacy, "tag", str, "reward_spec.")
    if not (tag == "" or tag.isidentifier()) or len(tag) > 32:
        raise RecordError("reward_spec.tag", f"must be empty or a short identifier, got {tag[:40]!r}")
    try:
        return RewardSpec.legacy(real(legacy, "correct", "reward_spec."), real(legacy, "format", "reward_spec."), tag)
    except RewardError as error:
        raise RecordError(error.field, error.problem) from None
