"""The node protocol's messages: what crosses the network, byte for byte (``specs/network.md``).

Four gossip messages, each a canonical msgpack map with a ``kind`` and a version:

* :class:`Submission`: one whole GRPO group, its rollout records as signed by the worker;
* :class:`SignedVerdict`: a verifier's signed statement about one submission: checked or
  skipped, the outcome, and the digest of the commitments it recomputed itself;
* :class:`PolicyAnnouncement`: a trainer's signed statement that policy version ``v`` has
  this model hash and these weight bytes (fetched in chunks by content hash), made by this
  training step: parent, batch, step config and optimizer state (specs/training.md);
* :class:`StepVerdict`: a verifier's signed statement that it replayed one training step,
  and whether the announced weights are what the step makes.

Every decoder is strict (no unknown fields, exact types, canonical bytes) and raises
:class:`MessageError` naming the message kind and the field.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import msgpack

from vrl.errors import VrlError
from vrl.rollouts.codec import FieldError, canonical_bytes, fixed_bytes, integer, take, text
from vrl.rollouts.keys import NODE_ID_BYTES, SIGNATURE_BYTES, NodeKey, signature_valid
from vrl.rollouts.model import MAX_PLATFORM_BYTES
from vrl.rollouts.record import MAX_GROUP_SIZE, RecordError, Rollout
from vrl.zk.rewards import MAX_COMPANION_BYTES

MESSAGE_VERSION = 1
# 2: a verdict carries the sequential test's evidence, race_tokens and races_lost (specs/network.md §3.2).
VERDICT_VERSION = 2
# 2: a policy announcement binds the training step that made it (specs/training.md §3).
POLICY_VERSION = 3
TOPIC_GROUPS = "vrl/groups/1"
TOPIC_VERDICTS = "vrl/verdicts/2"
TOPIC_POLICIES = "vrl/policies/3"
TOPIC_STEPS = "vrl/steps/1"

GROUP_DOMAIN = b"vrl/group/v1\x00"
VERDICT_DOMAIN = b"vrl/verdict/v1\x00"
POLICY_DOMAIN = b"vrl/policy/v3\x00"
STEP_DOMAIN = b"vrl/step-verdict/v1\x00"
STEP_TICKET_DOMAIN = b"vrl/step-ticket/v1\x00"
AUDIT_TICKET_DOMAIN = b"vrl/audit-ticket/v1\x00"
DIGEST_DOMAIN = b"vrl/recomputed/v1\x00"

U64 = (1 << 64) - 1


class Outcome(StrEnum):
    """What a verdict says of a group (specs/network.md §3.2): a check's result, or that the
    verifier's audit ticket let it skip the group."""

    PASS = "pass"
    SOFT_FAIL = "soft_fail"  # only rejections honest numerical drift can cause (specs/network.md §5)
    HARD_FAIL = "hard_fail"
    SKIPPED = "skipped"


OUTCOMES = {o.value: o for o in Outcome}


class MessageError(VrlError, ValueError):
    """A message that does not decode; names the kind and the field."""


def _msgpack_map(data: bytes, kind: str) -> dict:
    """``data`` as a msgpack map with text keys; anything else is a MessageError."""
    try:
        wire = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as error:  # msgpack raises several unrelated types for bad bytes
        raise MessageError(f"{kind}: not valid msgpack: {error}") from None
    if not isinstance(wire, dict):
        raise MessageError(f"{kind}: expected a msgpack map, got {type(wire).__name__}")
    if not all(isinstance(k, str) for k in wire):
        raise MessageError(f"{kind}: every key must be text (msgpack str), found {_first_non_text(wire)!r}")
    return wire


def _exactly(wire: dict, kind: str, fields: set[str]) -> dict:
    unknown, missing = set(wire) - fields, fields - set(wire)
    if unknown or missing:
        raise MessageError(f"{kind}: field {sorted(unknown or missing)[0]!r} is {'unknown' if unknown else 'missing'}")
    return wire


def _decode_map(data: bytes, kind: str, fields: set[str], version: int = MESSAGE_VERSION) -> dict:
    """A gossip message: its ``kind`` and version first, then exactly ``fields``."""
    wire = _msgpack_map(data, kind)
    if wire.get("kind") != kind:
        raise MessageError(f"{kind}: field 'kind' must be {kind!r}, got {wire.get('kind')!r}")
    if wire.get("v") != version:
        raise MessageError(f"{kind}: unknown message version {wire.get('v')!r}")
    return _exactly(wire, kind, fields | {"kind", "v"})


def _first_non_text(wire: dict) -> object:
    return next(k for k in wire if not isinstance(k, str))


def topic_of(data: bytes) -> str | None:
    """The gossip topic a stored message belongs on, from its ``kind`` (None if not ours)."""
    try:
        wire = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several unrelated types for bad bytes: not a message of ours
        return None
    kind = wire.get("kind") if isinstance(wire, dict) else None
    return {"group": TOPIC_GROUPS, "verdict": TOPIC_VERDICTS, "policy": TOPIC_POLICIES,
            "step": TOPIC_STEPS}.get(kind) if isinstance(
        kind, str) else None


def _fields(kind: str, decode):
    """Run field decoders, turning :class:`~vrl.rollouts.codec.FieldError` into a :class:`MessageError` of ``kind``."""
    try:
        return decode()
    except FieldError as error:
        raise MessageError(f"{kind}: {error}") from None


def _canonical(kind: str, data: bytes, value) -> None:
    if value.to_bytes() != data:
        raise MessageError(f"{kind}: not in canonical encoding")


class _Signed:
    """What the two signed messages share: the signature covers a domain tag and the
    canonical map without its ``signature`` field; ``_SIGNER`` names the signing key's field."""

    _DOMAIN: bytes
    _SIGNER: str
    signature: bytes
    _wire: Callable[[bool], dict[str, Any]]  # each message's map, with or without its signature

    def signing_payload(self) -> bytes:
        return self._DOMAIN + canonical_bytes(self._wire(False))

    def signed(self, key: NodeKey):
        unsigned = replace(self, **{self._SIGNER: key.node_id}, signature=b"")
        return replace(unsigned, signature=key.sign(unsigned.signing_payload()))

    def signature_ok(self) -> bool:
        return signature_valid(getattr(self, self._SIGNER), self.signing_payload(), self.signature)

    def to_bytes(self) -> bytes:
        return canonical_bytes(self._wire(True))


# -- submissions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """One whole group of one node, as gossiped. ``digest`` names it everywhere else."""

    records: tuple[bytes, ...]

    @classmethod
    def of(cls, group: list[Rollout]) -> Submission:
        return cls(tuple(r.to_bytes() for r in sorted(group, key=lambda r: r.sample_index)))

    @property
    def digest(self) -> bytes:
        """SHA-256 over the domain and each record's SHA-256, in sample order."""
        return hashlib.sha256(GROUP_DOMAIN + b"".join(hashlib.sha256(r).digest() for r in self.records)).digest()

    def rollouts(self) -> list[Rollout]:
        """Decode every record (raises :class:`RecordError` for the first bad one)."""
        out = []
        for index, record in enumerate(self.records):
            try:
                out.append(Rollout.from_bytes(record))
            except RecordError as error:
                raise error.at(index) from None
        return out

    def to_bytes(self) -> bytes:
        return canonical_bytes({"kind": "group", "v": MESSAGE_VERSION, "records": list(self.records)})

    @classmethod
    def from_bytes(cls, data: bytes) -> Submission:
        wire = _decode_map(data, "group", {"records"})
        records = wire["records"]
        if not isinstance(records, list) or not 1 <= len(records) <= MAX_GROUP_SIZE or not all(
                isinstance(r, bytes) for r in records):
            raise MessageError(f"group: field 'records' must be a list of 1..{MAX_GROUP_SIZE} byte strings")
        submission = cls(tuple(records))
        _canonical("group", data, submission)
        return submission


def group_problem(rollouts: list[Rollout]) -> str | None:
    """Why these records are not one whole group in sample order, or None."""
    first = rollouts[0]
    if any(r.group_key != first.group_key for r in rollouts):
        return "records belong to different groups"
    if [r.sample_index for r in rollouts] != list(range(first.group_size)):
        return f"expected samples 0..{first.group_size - 1} in order"
    return None


@dataclass(frozen=True, eq=False)
class Group:
    """A group as a node holds it: the submission, its records decoded once with every
    signature checked, and what follows from them and from nothing a message asserts: its
    subject (the records' signer), policy version and slot index (specs/network.md §3.1).

    Made by :func:`decode_group` from received bytes, or by :meth:`of` from rollouts this
    node signed itself. A node replaying its store knows a group's header (its subject,
    version and slot, from the store's columns) without decoding its records again: there
    ``rollouts`` is empty, which the protocol, reading only the header, never notices."""

    submission: Submission
    rollouts: tuple[Rollout, ...]
    subject: bytes
    version: int
    index: int

    @classmethod
    def of(cls, rollouts: list[Rollout]) -> Group:
        ordered = tuple(sorted(rollouts, key=lambda r: r.sample_index))
        first = ordered[0]
        return cls(Submission.of(list(ordered)), ordered, first.node_id, first.policy_version, first.group_index)

    @property
    def digest(self) -> bytes:
        return self.submission.digest

    def to_bytes(self) -> bytes:
        return self.submission.to_bytes()


def decode_group(data: bytes) -> Group:
    """A ``group`` message as a receiver accepts it (specs/network.md §3.1): strict decoding,
    every record decoded, one whole group in order, every signature valid. Its subject is the
    records' ``node_id``: who signed them. Raises only :class:`MessageError`."""
    submission = Submission.from_bytes(data)
    try:
        rollouts = submission.rollouts()
    except RecordError as error:
        raise MessageError(f"group: {error}") from None
    problem = group_problem(rollouts)
    if problem is not None:
        raise MessageError(f"group: {problem}")
    for index, rollout in enumerate(rollouts):
        if not rollout.signature_valid():
            raise MessageError(f"group: record {index}: field 'signature' does not verify")
    first = rollouts[0]
    return Group(submission, tuple(rollouts), first.node_id, first.policy_version, first.group_index)


# -- verdicts --------------------------------------------------------------------------------


def audit_ticket(key: NodeKey, group_digest: bytes) -> bytes:
    """The verifier's lottery ticket for one submission: its Ed25519 signature over the digest.

    RFC 8032 signatures are deterministic, so the verifier cannot reroll it, and nobody
    without the verifier's key can predict it before the group exists: which groups get
    checked is fixed only after submission, and anyone can re-verify the draw.
    """
    return key.sign(AUDIT_TICKET_DOMAIN + group_digest)


def ticket_selected(ticket: bytes, rate: float) -> bool:
    """Whether a ticket draws a check at ``rate``: its hash read as a fraction of 2**64."""
    return int.from_bytes(hashlib.sha256(ticket).digest()[:8], "big") < rate * 2**64


def recomputed_digest(commitments: list[bytes]) -> bytes:
    """What a verdict carries to show the check was done: SHA-256 over the commitments the
    verifier rebuilt from its own prefill, one per rollout in sample order."""
    h = hashlib.sha256(DIGEST_DOMAIN)
    for c in commitments:
        h.update(len(c).to_bytes(4, "big") + c)
    return h.digest()


@dataclass(frozen=True)
class SignedVerdict(_Signed):
    """A verifier's signed statement about one submission."""

    _DOMAIN = VERDICT_DOMAIN
    _SIGNER = "verifier"

    verifier: bytes
    subject: bytes  # the node that submitted the group
    group: bytes  # Submission.digest
    round: int
    policy_version: int
    ticket: bytes  # audit_ticket(verifier, group)
    rate: float  # the check rate the verifier applied to the subject
    outcome: Outcome
    reasons: tuple[str, ...]  # rejection codes of the failed records (empty on pass or skip)
    digest: bytes  # recomputed_digest, or b"" when skipped
    platform: str  # e.g. "torch-2.13.0/cpu/float32": digests compare only on equal platforms
    planted: bool = False  # the verifier made this group itself to test others (always bad)
    # The sequential test's evidence (specs/verification.md §7): the seeded races this check
    # replayed over the group, and how many of them the claimed token lost. 0 and 0 for a skip.
    race_tokens: int = 0
    races_lost: int = 0
    signature: bytes = b""

    @property
    def checked(self) -> bool:
        return self.outcome != Outcome.SKIPPED

    def _wire(self, with_signature: bool) -> dict[str, Any]:
        wire = {"kind": "verdict", "v": VERDICT_VERSION, "verifier": self.verifier, "subject": self.subject,
                "group": self.group, "round": self.round, "policy_version": self.policy_version,
                "ticket": self.ticket, "rate": float(self.rate), "outcome": str(self.outcome),
                "reasons": [str(r) for r in self.reasons], "digest": self.digest, "platform": self.platform,
                "planted": self.planted, "race_tokens": self.race_tokens, "races_lost": self.races_lost}
        if with_signature:
            wire["signature"] = self.signature
        return wire

    def valid(self) -> bool:
        """Signature and ticket both verify under ``verifier``, and a skip is one the ticket allows."""
        return (self.signature_ok()
                and signature_valid(self.verifier, AUDIT_TICKET_DOMAIN + self.group, self.ticket)
                and (self.checked or not ticket_selected(self.ticket, self.rate)))

    @property
    def id(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedVerdict:
        fields = {"verifier", "subject", "group", "round", "policy_version", "ticket", "rate", "outcome",
                  "reasons", "digest", "platform", "planted", "race_tokens", "races_lost", "signature"}
        wire = _decode_map(data, "verdict", fields, VERDICT_VERSION)

        def decode() -> SignedVerdict:
            outcome = text(wire, "outcome", 16)
            if outcome not in OUTCOMES:
                raise FieldError("outcome", f"unknown outcome {outcome!r}")
            reasons = take(wire, "reasons", list)
            if len(reasons) > 64 or not all(isinstance(r, str) and len(r) <= 64 for r in reasons):
                raise FieldError("reasons", "expected at most 64 codes of at most 64 characters")
            digest = take(wire, "digest", bytes)
            if len(digest) not in (0, 32):
                raise FieldError("digest", f"expected 0 or 32 bytes, got {len(digest)}")
            rate = take(wire, "rate", float)
            if not 0.0 <= rate <= 1.0:
                raise FieldError("rate", f"{rate} is outside [0, 1]")
            race_tokens = integer(wire, "race_tokens", 0, U64)
            races_lost = integer(wire, "races_lost", 0, U64)
            if races_lost > race_tokens:
                raise FieldError("races_lost", f"{races_lost} races lost of {race_tokens} replayed")
            if outcome == Outcome.SKIPPED and race_tokens:
                raise FieldError("race_tokens", "a skipped check replayed no race")
            return cls(
                verifier=fixed_bytes(wire, "verifier", NODE_ID_BYTES),
                subject=fixed_bytes(wire, "subject", NODE_ID_BYTES),
                group=fixed_bytes(wire, "group", 32), round=integer(wire, "round", 0, U64),
                policy_version=integer(wire, "policy_version", 0, U64),
                ticket=fixed_bytes(wire, "ticket", SIGNATURE_BYTES), rate=rate, outcome=OUTCOMES[outcome],
                reasons=tuple(reasons), digest=digest, platform=text(wire, "platform", MAX_PLATFORM_BYTES),
                planted=take(wire, "planted", bool), race_tokens=race_tokens, races_lost=races_lost,
                signature=fixed_bytes(wire, "signature", SIGNATURE_BYTES))

        verdict = _fields("verdict", decode)
        _canonical("verdict", data, verdict)
        return verdict


# -- policy announcements ----------------------------------------------------------------------

#: A batch is listed in full in its announcement, at most 4096 groups: 4096 entries of a 32-byte
#: digest and a float64 weight pack to ~176 KiB, under the 256 KiB gossip cap (specs/network.md
#: §7) with room for the rest. AdmissionConfig.batch_groups is bounded by it.
MAX_BATCH_GROUPS = 4096
#: An optimizer state file of 2^41 bytes is AdamW's two moments of a 256-billion-parameter
#: float32 model: any real one fits; the fetch itself is bounded lower (MAX_WEIGHTS_BYTES x 2).
MAX_OPTIMIZER_BYTES = 1 << 41
#: A step's reward proofs are a companion file (specs/zk.md §7, §11), bounded as any is.
MAX_PROOFS_BYTES = MAX_COMPANION_BYTES


@dataclass(frozen=True)
class PolicyAnnouncement(_Signed):
    """Policy version ``version`` is the model with ``model_hash``, whose weights file (see
    :func:`vrl.node.weights.to_blob`) has SHA-256 ``blob`` and ``size`` bytes. Round ``r``
    runs on version ``r``; its seed is ``round_seed(model_hash, r)``, unknowable before this.

    It also binds the training step that made it (specs/training.md §3), so that anyone can
    run the step again: the ``parent`` model hash (version - 1's; empty for version 0), the
    ``batch`` of admitted group digests with their weights, in the order trained, the hash of
    the step config file (``config``), the hashes of the optimizer state files before and after
    the step (``optimizer_before``, empty for version 0; ``optimizer``, of ``optimizer_size``
    bytes), and the ``platform`` the trainer ran on (a replay on the same one is bit-exact).
    In a network of private tasks, ``proofs`` is the hash of the companion file of the batch's
    reward proofs (``proofs_size`` bytes; empty when none is needed: specs/zk.md §11).
    The defaults are a version 0 with nothing trained."""

    _DOMAIN = POLICY_DOMAIN
    _SIGNER = "trainer"

    trainer: bytes
    version: int
    model_hash: bytes
    blob: bytes
    size: int
    parent: bytes = b""
    batch: tuple[tuple[bytes, float], ...] = ()
    config: bytes = bytes(32)
    optimizer_before: bytes = b""
    optimizer: bytes = bytes(32)
    optimizer_size: int = 0
    platform: str = ""
    proofs: bytes = b""
    proofs_size: int = 0
    signature: bytes = b""

    def _wire(self, with_signature: bool) -> dict[str, Any]:
        wire = {"kind": "policy", "v": POLICY_VERSION, "trainer": self.trainer, "version": self.version,
                "model_hash": self.model_hash, "blob": self.blob, "size": self.size, "parent": self.parent,
                "batch": [[digest, float(weight)] for digest, weight in self.batch], "config": self.config,
                "optimizer_before": self.optimizer_before, "optimizer": self.optimizer,
                "optimizer_size": self.optimizer_size, "platform": self.platform, "proofs": self.proofs,
                "proofs_size": self.proofs_size}
        if with_signature:
            wire["signature"] = self.signature
        return wire

    def valid(self) -> bool:
        return self.signature_ok()

    @property
    def id(self) -> bytes:
        """What a step verdict names: the SHA-256 of the announcement's bytes."""
        return hashlib.sha256(self.to_bytes()).digest()

    @property
    def groups(self) -> tuple[bytes, ...]:
        return tuple(digest for digest, _ in self.batch)

    @classmethod
    def from_bytes(cls, data: bytes) -> PolicyAnnouncement:
        fields = {"trainer", "version", "model_hash", "blob", "size", "parent", "batch", "config", "optimizer_before",
                  "optimizer", "optimizer_size", "platform", "proofs", "proofs_size", "signature"}
        wire = _decode_map(data, "policy", fields, POLICY_VERSION)

        def decode() -> PolicyAnnouncement:
            return cls(
                trainer=fixed_bytes(wire, "trainer", NODE_ID_BYTES), version=integer(wire, "version", 0, U64),
                model_hash=fixed_bytes(wire, "model_hash", 32), blob=fixed_bytes(wire, "blob", 32),
                size=integer(wire, "size", 1, 1 << 40), parent=_hash_or_empty(wire, "parent"),
                batch=_batch(wire), config=fixed_bytes(wire, "config", 32),
                optimizer_before=_hash_or_empty(wire, "optimizer_before"),
                optimizer=fixed_bytes(wire, "optimizer", 32),
                optimizer_size=integer(wire, "optimizer_size", 0, MAX_OPTIMIZER_BYTES),
                platform=text(wire, "platform", MAX_PLATFORM_BYTES), proofs=_hash_or_empty(wire, "proofs"),
                proofs_size=integer(wire, "proofs_size", 0, MAX_PROOFS_BYTES),
                signature=fixed_bytes(wire, "signature", SIGNATURE_BYTES))

        announcement = _fields("policy", decode)
        _canonical("policy", data, announcement)
        return announcement


def _hash_or_empty(wire: dict, name: str) -> bytes:
    value = take(wire, name, bytes)
    if len(value) not in (0, 32):
        raise FieldError(name, f"expected 0 or 32 bytes, got {len(value)}")
    return value


def _batch(wire: dict) -> tuple[tuple[bytes, float], ...]:
    entries = take(wire, "batch", list)
    if len(entries) > MAX_BATCH_GROUPS:
        raise FieldError("batch", f"{len(entries)} groups exceeds the limit of {MAX_BATCH_GROUPS}")
    out = []
    for index, entry in enumerate(entries):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], bytes) or len(entry[0]) != 32
                or not isinstance(entry[1], float) or not math.isfinite(entry[1]) or entry[1] < 0):
            raise FieldError(f"batch[{index}]", "expected [a 32-byte group digest, a finite float weight >= 0]")
        out.append((entry[0], entry[1]))
    if len({digest for digest, _ in out}) != len(out):
        raise FieldError("batch", "a group is listed twice")
    return tuple(out)


# -- step verdicts: a verifier's replay of one training step (specs/training.md §5) ------------


class StepOutcome(StrEnum):
    """What a step verdict says: the replay agreed with the announcement, or it did not."""

    PASS = "pass"
    FRAUD = "fraud"


STEP_OUTCOMES = {o.value: o for o in StepOutcome}


class StepFault(StrEnum):
    """Why a step is fraud (specs/training.md §5): each names evidence anyone can re-check."""

    WEIGHTS_MISMATCH = "weights_mismatch"  # the replayed weights are not the announced ones
    OPTIMIZER_MISMATCH = "optimizer_mismatch"  # the replayed optimizer state is not the announced one
    WRONG_PARENT = "wrong_parent"  # parent is not version - 1's model hash
    WRONG_OPTIMIZER_BEFORE = "wrong_optimizer_before"  # not the optimizer version - 1 announced
    WRONG_CONFIG = "wrong_config"  # the step config is not the one the trainer's earlier versions bound
    REJECTED_GROUP = "rejected_group"  # a group the trainer itself failed, trained anyway
    QUARANTINED_GROUP = "quarantined_group"  # a group of a node quarantined before the step's round
    UNAVAILABLE_GROUP = "unavailable_group"  # a listed group no peer, the trainer included, serves
    UNAVAILABLE_STATE = "unavailable_state"  # the step config or optimizer file is not served
    STALE_GROUP = "stale_group"  # a group too old for the step (max_staleness)
    REWARD_UNPROVEN = "reward_unproven"  # a private task's reward the step's proofs do not show (zk.md §11)


@dataclass(frozen=True)
class StepVerdict(_Signed):
    """A verifier's signed statement that it replayed training step ``version - 1 -> version``
    (the announcement with id ``announcement``) and what it found."""

    _DOMAIN = STEP_DOMAIN
    _SIGNER = "verifier"

    verifier: bytes
    trainer: bytes
    version: int
    announcement: bytes  # PolicyAnnouncement.id
    outcome: StepOutcome
    reasons: tuple[str, ...]  # StepFault codes, empty on pass
    replayed: bytes  # the model hash the replay produced, empty when it could not run
    drift: float  # ||theta_claimed - theta_replay|| / ||theta_replay - theta_parent|| (specs/training.md §4)
    platform: str  # the verifier's; equal to the announcement's means the replay had to be bit-exact
    signature: bytes = b""

    def _wire(self, with_signature: bool) -> dict[str, Any]:
        wire = {"kind": "step", "v": MESSAGE_VERSION, "verifier": self.verifier, "trainer": self.trainer,
                "version": self.version, "announcement": self.announcement, "outcome": str(self.outcome),
                "reasons": [str(r) for r in self.reasons], "replayed": self.replayed, "drift": float(self.drift),
                "platform": self.platform}
        if with_signature:
            wire["signature"] = self.signature
        return wire

    def valid(self) -> bool:
        return self.signature_ok()

    @property
    def id(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> StepVerdict:
        fields = {"verifier", "trainer", "version", "announcement", "outcome", "reasons", "replayed", "drift",
                  "platform", "signature"}
        wire = _decode_map(data, "step", fields)

        def decode() -> StepVerdict:
            outcome = text(wire, "outcome", 16)
            if outcome not in STEP_OUTCOMES:
                raise FieldError("outcome", f"unknown outcome {outcome!r}")
            reasons = take(wire, "reasons", list)
            if len(reasons) > 16 or not all(isinstance(r, str) and len(r) <= 64 for r in reasons):
                raise FieldError("reasons", "expected at most 16 codes of at most 64 characters")
            drift = take(wire, "drift", float)
            if not (drift >= 0.0):  # also refuses NaN; +inf is a replay that moved nothing where the claim did
                raise FieldError("drift", f"{drift} is not >= 0")
            return cls(
                verifier=fixed_bytes(wire, "verifier", NODE_ID_BYTES), trainer=fixed_bytes(wire, "trainer", NODE_ID_BYTES),
                version=integer(wire, "version", 1, U64), announcement=fixed_bytes(wire, "announcement", 32),
                outcome=STEP_OUTCOMES[outcome], reasons=tuple(reasons), replayed=_hash_or_empty(wire, "replayed"),
                drift=drift, platform=text(wire, "platform", MAX_PLATFORM_BYTES),
                signature=fixed_bytes(wire, "signature", SIGNATURE_BYTES))

        verdict = _fields("step", decode)
        if (verdict.outcome == StepOutcome.PASS) != (not verdict.reasons):
            raise MessageError("step: field 'reasons' must be empty exactly when the outcome is pass")
        _canonical("step", data, verdict)
        return verdict


# -- backfill: request/response between two peers (specs/network.md §6) ----------------------

#: A page holds whole gossip messages (each at most the transport's 256 KiB gossip cap), at
#: most 1 MiB of them (the server's page, under the transport's 2 MiB response cap,
#: specs/network.md §7) and at most this many: ~4,400 of the smallest kind (a ~240-byte
#: policy) would fit in 1 MiB, so servers stop a page at this count too (Store.since).
BACKFILL_MAX_MESSAGES = 4096
BACKFILL_MAX_MESSAGE_BYTES = 256 << 10


def _plain_map(data: bytes, kind: str, fields: set[str]) -> dict:
    """A request or response map (no kind, no version): exactly ``fields``."""
    return _exactly(_msgpack_map(data, kind), kind, fields)


def _u64(kind: str, wire: dict, name: str) -> int:
    value = wire[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64:
        raise MessageError(f"{kind}: field {name!r} must be an integer in [0, 2^64 - 1], got {value!r:.40}")
    return value


@dataclass(frozen=True)
class BackfillRequest:
    """``{"since": r, "after": n}``: messages of rounds >= ``since``, from position ``after``."""

    since: int
    after: int

    def to_bytes(self) -> bytes:
        return canonical_bytes({"since": self.since, "after": self.after})

    @classmethod
    def from_bytes(cls, data: bytes) -> BackfillRequest:
        wire = _plain_map(data, "backfill request", {"since", "after"})
        return cls(_u64("backfill request", wire, "since"), _u64("backfill request", wire, "after"))


@dataclass(frozen=True)
class SamplingRequest:
    """``{"group": digest, "challenge": 32 bytes, "positions": k}``: prove ``k`` positions of each
    record of one's own group, where ``challenge`` picks them (specs/network.md §3.4; the
    answer is a ``vrl/sampling/v1`` file, specs/zk.md §10)."""

    group: bytes
    challenge: bytes
    positions: int

    def to_bytes(self) -> bytes:
        return canonical_bytes({"group": self.group, "challenge": self.challenge, "positions": self.positions})

    @classmethod
    def from_bytes(cls, data: bytes) -> SamplingRequest:
        kind = "sampling request"
        wire = _plain_map(data, kind, {"group", "challenge", "positions"})
        try:
            return cls(fixed_bytes(wire, "group", 32), fixed_bytes(wire, "challenge", 32),
                       integer(wire, "positions", 1, 64))
        except FieldError as error:
            raise MessageError(f"{kind}: {error}") from None


@dataclass(frozen=True)
class BackfillPage:
    """``{"messages": [bin, ...], "next": n | nil}``: one page of a peer's log; ``next`` is
    where the following page starts (always past the request's ``after``), nil at the end."""

    messages: tuple[bytes, ...]
    next: int | None

    def to_bytes(self) -> bytes:
        return canonical_bytes({"messages": list(self.messages), "next": self.next})

    @classmethod
    def from_bytes(cls, data: bytes, after: int) -> BackfillPage:
        kind = "backfill page"
        wire = _plain_map(data, kind, {"messages", "next"})
        messages = wire["messages"]
        if not isinstance(messages, list) or len(messages) > BACKFILL_MAX_MESSAGES or not all(
                isinstance(m, bytes) and len(m) <= BACKFILL_MAX_MESSAGE_BYTES for m in messages):
            raise MessageError(f"{kind}: field 'messages' must be a list of at most {BACKFILL_MAX_MESSAGES} "
                               f"byte strings of at most {BACKFILL_MAX_MESSAGE_BYTES} bytes")
        following = None if wire["next"] is None else _u64(kind, wire, "next")
        if following is not None and following <= after:
            raise MessageError(f"{kind}: field 'next' must move past {after}, got {following}")
        return cls(tuple(messages), following)
