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

Each message declares each of its fields once, with its wire type, bounds and the version
that added it; one encoder and one decoder serve them all (:mod:`vrl.node.wire`). Every
decoder is strict (no unknown fields, exact types, canonical bytes) and raises
:class:`MessageError` naming the message kind and the field.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import msgpack

from proofs.vrf import PROOF_BYTES as VRF_PROOF_BYTES
from vrl.node import committee
from vrl.node.committee import SEATS, Draw
from vrl.node.wire import (
    U64,
    Bin,
    Blobs,
    Choice,
    Flag,
    Listed,
    Message,
    Real,
    Signed,
    Text,
    Texts,
    Uint,
    message,
    schema_of,
    wire,
)
from vrl.node.wire import MessageError as MessageError  # decoding's error, named with the messages
from vrl.rollouts.codec import FieldError
from vrl.rollouts.keys import NODE_ID_BYTES, SIGNATURE_BYTES, NodeKey, signature_valid
from vrl.rollouts.model import MAX_PLATFORM_BYTES
from vrl.rollouts.record import MAX_GROUP_SIZE, RecordError, Rollout
from vrl.zk.rewards import MAX_COMPANION_BYTES

MESSAGE_VERSION = 1
# 2: a verdict carries the sequential test's evidence, race_tokens and races_lost (specs/network.md §3.2);
# 3: and its committee claim, draw and pi (specs/committee.md §4). A verdict that needs nothing of
# version 3 (a ticket draw) is still written and read as version 2 (vrl.node.wire: oldest).
VERDICT_VERSION = 4
VERDICT_OLDEST = 2
#: Hashes in a claim's Merkle path (specs/committee.md §4): a list of at most 2^32 - 1 entries
#: (a u32 size) has at most 32 levels.
MAX_PATH_HASHES = 32
# 2: a policy announcement binds the training step that made it (specs/training.md §3);
# 3: and the reward proofs of a private task set's step, proofs and proofs_size (specs/zk.md §11);
# 4: and a weights delta against the parent's file, delta, delta_size and delta_parent (specs/network.md
# §6.1). Version 3 is still read and written: an announcement without a delta is written as v3, the
# bytes (and id and signature) it always had, so nodes that predate deltas still follow it;
# 5: its batch in a file named by hash, batch_file and batch_size (specs/network.md §3.3.1), so that a
# committee network's announcement does not grow with the number of workers.
POLICY_VERSION = 5
POLICY_OLDEST = 3
BATCH_FILE_VERSION = 1
TOPIC_GROUPS = "vrl/groups/1"
TOPIC_VERDICTS = "vrl/verdicts/2"
TOPIC_POLICIES = "vrl/policies/3"
TOPIC_STEPS = "vrl/steps/1"
#: The round manifest is a header since version 2 (specs/committee.md §3.3): version 1 listed
#: every digest, weight and worker, and is no longer read. Version 3 names its seat rule
#: (seat_rule, §2); a manifest of rule 1 is written and read as version 2, the bytes it had.
MANIFEST_VERSION = 3
MANIFEST_OLDEST = 2
#: The lists behind a manifest as the trainer stores them (network.md §8); version 2 adds the
#: seat rule, and lists of rule 1 are written and read as version 1.
MANIFEST_LISTS_VERSION = 2
TOPIC_MANIFESTS = "vrl/manifests/1"  # the committee design only (specs/committee.md §3.3)

GROUP_DOMAIN = b"vrl/group/v1\x00"
VERDICT_DOMAIN = b"vrl/verdict/v1\x00"
POLICY_DOMAIN = b"vrl/policy/v3\x00"
STEP_DOMAIN = b"vrl/step-verdict/v1\x00"
STEP_TICKET_DOMAIN = b"vrl/step-ticket/v1\x00"
AUDIT_TICKET_DOMAIN = b"vrl/audit-ticket/v1\x00"
DIGEST_DOMAIN = b"vrl/recomputed/v1\x00"


class Outcome(StrEnum):
    """What a verdict says of a group (specs/network.md §3.2): a check's result, or that the
    verifier's audit ticket let it skip the group."""

    PASS = "pass"
    SOFT_FAIL = "soft_fail"  # only rejections honest numerical drift can cause (specs/network.md §5)
    HARD_FAIL = "hard_fail"
    SKIPPED = "skipped"


OUTCOMES = {o.value: o for o in Outcome}


# -- submissions -----------------------------------------------------------------------------


@message("group", MESSAGE_VERSION, topic=TOPIC_GROUPS)
@dataclass(frozen=True)
class Submission(Message):
    """One whole group of one node, as gossiped. ``digest`` names it everywhere else."""

    records: tuple[bytes, ...] = field(metadata=wire(Blobs(1, MAX_GROUP_SIZE)))  # each the bytes its worker signed

    @classmethod
    def of(cls, group: list[Rollout]) -> Submission:
        return cls(tuple(r.to_bytes() for r in sorted(group, key=lambda r: r.sample_index)))

    @functools.cached_property  # a group's name, asked for at every step of its handling
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

    @functools.cached_property
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


@message("verdict", VERDICT_VERSION, topic=TOPIC_VERDICTS, oldest=VERDICT_OLDEST)
@dataclass(frozen=True)
class SignedVerdict(Signed):
    """A verifier's signed statement about one submission."""

    _DOMAIN = VERDICT_DOMAIN
    _SIGNER = "verifier"

    verifier: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    subject: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))  # the node that submitted the group
    group: bytes = field(metadata=wire(Bin(32)))  # Submission.digest
    round: int = field(metadata=wire(Uint()))
    policy_version: int = field(metadata=wire(Uint()))
    # audit_ticket(verifier, group); empty unless the draw is a ticket (specs/committee.md §4)
    ticket: bytes = field(metadata=wire(Bin(0, SIGNATURE_BYTES)))
    rate: float = field(metadata=wire(Real(0.0, 1.0)))  # the check rate the verifier applied to the subject
    outcome: Outcome = field(metadata=wire(Choice(Outcome)))
    # Rejection codes of the failed records (empty on pass or skip); at most 64 codes of at most 64
    # characters (specs/network.md §3.2), far above the verifier's codes (specs/verification.md §1).
    reasons: tuple[str, ...] = field(metadata=wire(Texts(64, 64)))
    digest: bytes = field(metadata=wire(Bin(0, 32)))  # recomputed_digest, or b"" when skipped
    # e.g. "torch-2.13.0/cpu/float32": digests compare only on equal platforms
    platform: str = field(metadata=wire(Text(MAX_PLATFORM_BYTES)))
    # The verifier made this group itself to test others (always bad).
    planted: bool = field(default=False, metadata=wire(Flag()))
    # The sequential test's evidence (specs/verification.md §7): the seeded races this check
    # replayed over the group, and how many of them the claimed token lost. 0 and 0 for a skip.
    race_tokens: int = field(default=0, metadata=wire(Uint(), since=2))
    races_lost: int = field(default=0, metadata=wire(Uint(), since=2))
    signature: bytes = field(default=b"", metadata=wire(Bin(SIGNATURE_BYTES)))
    # The committee claim (specs/committee.md §4): what selected the check, and for a committee
    # draw the VRF proof over the round manifest's input, checked by the receiver against it.
    draw: Draw = field(default=Draw.TICKET, metadata=wire(Choice(Draw), since=3))
    pi: bytes = field(default=b"", metadata=wire(Bin(0, VRF_PROOF_BYTES), since=3))
    # The seat it claims in the paged manifest (specs/committee.md §4): the group's position in
    # the round's groups list and its path, and the verifier's weights entry and its path; all
    # zero and empty for a ticket draw, the weights entry too for a draw of none.
    seat: int = field(default=0, metadata=wire(Uint(0, 2**32 - 1), since=4))
    seat_path: tuple[bytes, ...] = field(default=(), metadata=wire(Listed("hash", MAX_PATH_HASHES), since=4))
    weight_at: int = field(default=0, metadata=wire(Uint(0, 2**32 - 1), since=4))
    weight: int = field(default=0, metadata=wire(Uint(0, committee.WEIGHT_SCALE), since=4))
    weight_path: tuple[bytes, ...] = field(default=(), metadata=wire(Listed("hash", MAX_PATH_HASHES), since=4))

    @property
    def checked(self) -> bool:
        return self.outcome != Outcome.SKIPPED

    def valid(self) -> bool:
        """The signature verifies under ``verifier``; for a ticket draw the ticket does too, and a
        skip is one the ticket allows. A committee claim is the round's to check
        (:meth:`vrl.node.protocol.NodeProtocol.verdict_refusal`)."""
        if not self.signature_ok():
            return False
        if self.draw != Draw.TICKET:
            return True
        return (signature_valid(self.verifier, AUDIT_TICKET_DOMAIN + self.group, self.ticket)
                and (self.checked or not ticket_selected(self.ticket, self.rate)))

    @functools.cached_property  # immutable: its bytes, hence its id, never change
    def id(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    def _cross_check(self) -> None:
        if self.races_lost > self.race_tokens:
            raise FieldError("races_lost", f"{self.races_lost} races lost of {self.race_tokens} replayed")
        if self.outcome == Outcome.SKIPPED and self.race_tokens:
            raise FieldError("race_tokens", "a skipped check replayed no race")
        ticket = self.draw == Draw.TICKET
        if len(self.ticket) != (SIGNATURE_BYTES if ticket else 0):
            raise FieldError("ticket", f"a {self.draw} draw carries {'a' if ticket else 'no'} ticket")
        proven = self.draw in SEATS
        if len(self.pi) != (VRF_PROOF_BYTES if proven else 0):
            raise FieldError("pi", f"a {self.draw} draw carries {'a' if proven else 'no'} proof")
        if not ticket and self.outcome == Outcome.SKIPPED:
            raise FieldError("outcome", f"a {self.draw} draw is a check, never a skip (specs/committee.md §4)")
        if ticket and (self.seat or self.seat_path or self.weight_at or self.weight or self.weight_path):
            raise FieldError("seat", "a ticket draw claims no seat")
        if (self.weight >= 1) != proven or (not proven and (self.weight_at or self.weight_path)):
            raise FieldError("weight", f"a {self.draw} draw carries {'a' if proven else 'no'} weights entry")


# -- policy announcements ----------------------------------------------------------------------

#: A batch is listed in full in its announcement, at most 4096 groups: 4096 entries of a 32-byte
#: digest and a float64 weight pack to ~176 KiB, under the 256 KiB gossip cap (specs/network.md
#: §7) with room for the rest. AdmissionConfig.batch_groups is bounded by it.
MAX_BATCH_GROUPS = 4096
#: A step's batch: its groups' digests in the order trained, each with its admission weight.
Batch = tuple[tuple[bytes, float], ...]
#: A batch file (specs/network.md §3.3.1) lists at most 2^16 groups, 16 times the inline limit:
#: 16,384 workers at groups_per_round = 4. Its bytes are bounded by that: 2^16 entries of a
#: 32-byte digest and a float64 weight pack to ~2.9 MB, under 3 MiB with the rest.
MAX_BATCH_FILE_GROUPS = 1 << 16
MAX_BATCH_FILE_BYTES = 3 << 20
#: An optimizer state file of 2^41 bytes is AdamW's two moments of a 256-billion-parameter
#: float32 model: any real one fits; the fetch itself is bounded lower (MAX_WEIGHTS_BYTES x 2).
MAX_OPTIMIZER_BYTES = 1 << 41
#: A step's reward proofs are a companion file (specs/zk.md §7, §11), bounded as any is.
MAX_PROOFS_BYTES = MAX_COMPANION_BYTES
#: A weights file of 2^40 bytes is a 256-billion-parameter float32 model: any real one fits; the
#: fetch itself is bounded lower (MAX_WEIGHTS_BYTES).
MAX_WEIGHTS_FILE_BYTES = 1 << 40


@dataclass(frozen=True, slots=True)
class WeightedDigests:
    """A policy's batch on the wire (specs/network.md §3.3): at most ``max_items`` pairs
    ``[32-byte group digest, weight]``, each weight a finite float >= 0, no digest twice."""

    max_items: int
    as_is: ClassVar[bool] = False

    def decode(self, value: Any, name: str) -> Batch:
        if type(value) is not list:
            raise FieldError(name, f"expected list, got {type(value).__name__}")
        if len(value) > self.max_items:
            raise FieldError(name, f"{len(value)} groups exceeds the limit of {self.max_items}")
        out = []
        for index, entry in enumerate(value):
            if (type(entry) is not list or len(entry) != 2 or type(entry[0]) is not bytes or len(entry[0]) != 32
                    or type(entry[1]) is not float or not math.isfinite(entry[1]) or entry[1] < 0):
                raise FieldError(f"{name}[{index}]", "expected [a 32-byte group digest, a finite float weight >= 0]")
            out.append((entry[0], entry[1]))
        if len({digest for digest, _ in out}) != len(out):
            raise FieldError(name, "a group is listed twice")
        return tuple(out)

    def encode(self, value: Batch) -> list[list[Any]]:
        return [[digest, float(weight)] for digest, weight in value]


@message("policy", POLICY_VERSION, topic=TOPIC_POLICIES, oldest=POLICY_OLDEST)
@dataclass(frozen=True)
class PolicyAnnouncement(Signed):
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
    ``delta`` is the hash of a weights delta (``delta_size`` bytes, smaller than the weights
    file) that rebuilds the weights file from the file whose hash is ``delta_parent``
    (vrl.node.deltas, specs/network.md §6.1): a transport shortcut for whoever holds that file,
    checked against ``blob`` and ``model_hash`` like the file itself; empty when there is none.
    The defaults are a version 0 with nothing trained."""

    _DOMAIN = POLICY_DOMAIN
    _SIGNER = "trainer"

    trainer: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    version: int = field(metadata=wire(Uint()))
    model_hash: bytes = field(metadata=wire(Bin(32)))
    blob: bytes = field(metadata=wire(Bin(32)))
    size: int = field(metadata=wire(Uint(1, MAX_WEIGHTS_FILE_BYTES)))
    parent: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=2))
    batch: Batch = field(
        default=(), metadata=wire(WeightedDigests(MAX_BATCH_GROUPS), since=2))
    config: bytes = field(default=bytes(32), metadata=wire(Bin(32), since=2))
    optimizer_before: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=2))
    optimizer: bytes = field(default=bytes(32), metadata=wire(Bin(32), since=2))
    optimizer_size: int = field(default=0, metadata=wire(Uint(0, MAX_OPTIMIZER_BYTES), since=2))
    platform: str = field(default="", metadata=wire(Text(MAX_PLATFORM_BYTES), since=2))
    proofs: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=3))
    proofs_size: int = field(default=0, metadata=wire(Uint(0, MAX_PROOFS_BYTES), since=3))
    delta: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=4))
    delta_size: int = field(default=0, metadata=wire(Uint(0, MAX_WEIGHTS_FILE_BYTES), since=4))
    delta_parent: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=4))
    batch_file: bytes = field(default=b"", metadata=wire(Bin(0, 32), since=5))
    batch_size: int = field(default=0, metadata=wire(Uint(0, MAX_BATCH_FILE_BYTES), since=5))
    signature: bytes = field(default=b"", metadata=wire(Bin(SIGNATURE_BYTES)))

    def valid(self) -> bool:
        return self.signature_ok()

    def _cross_check(self) -> None:
        if (self.batch_file or self.batch_size) and not (self.batch_file and self.batch_size and not self.batch):
            raise FieldError("batch_file", "a batch in a file names its hash and its size, and the inline batch "
                                           "is then empty")
        if self.delta or self.delta_size or self.delta_parent:
            if not (self.delta and self.delta_parent and 0 < self.delta_size < self.size):
                raise FieldError("delta", "a delta names its hash, its parent file and a size under the weights "
                                          "file's, or none of them")

    @functools.cached_property  # encoding a batch of 4,096 groups took ~3 ms, asked ~17 times a round per node
    def id(self) -> bytes:
        """What a step verdict names: the SHA-256 of the announcement's bytes."""
        return hashlib.sha256(self.to_bytes()).digest()

    @property
    def inline(self) -> Batch | None:
        """The batch when the announcement lists it; None when it names a batch file instead
        (:class:`BatchFile`, fetched by hash: specs/network.md §3.3.1)."""
        return None if self.batch_file else self.batch


@message("batch", BATCH_FILE_VERSION)
@dataclass(frozen=True)
class BatchFile(Message):
    """A policy's batch in a file (specs/network.md §3.3.1): the groups of the step that made
    ``version``, in the order trained, each with its admission weight. Not signed: the
    announcement that names it binds its SHA-256. Content-addressed like the step's other
    files, so that only the nodes that judge a step fetch it (specs/training.md §5)."""

    trainer: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    version: int = field(metadata=wire(Uint(1, U64)))
    batch: Batch = field(metadata=wire(WeightedDigests(MAX_BATCH_FILE_GROUPS)))

    @classmethod
    def of(cls, announcement: PolicyAnnouncement, data: bytes) -> Batch:
        """The batch ``announcement`` names, from the file's bytes: they must hash to its
        ``batch_file``, be ``batch_size`` long, and decode as the batch of its trainer and
        version. Raises MessageError naming what is wrong."""
        if len(data) != announcement.batch_size or hashlib.sha256(data).digest() != announcement.batch_file:
            raise MessageError(f"batch: the file is not the one version {announcement.version} names "
                               f"({len(data)} bytes, {announcement.batch_size} announced)")
        file = cls.from_bytes(data)
        if (file.trainer, file.version) != (announcement.trainer, announcement.version):
            raise MessageError(f"batch: the file is version {file.version}'s of another trainer or version, "
                               f"not version {announcement.version}'s")
        return file.batch


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
    BAD_BATCH = "bad_batch"  # the batch file the announcement names is not a batch of it (network.md §3.3.1)


@message("step", MESSAGE_VERSION, topic=TOPIC_STEPS)
@dataclass(frozen=True)
class StepVerdict(Signed):
    """A verifier's signed statement that it replayed training step ``version - 1 -> version``
    (the announcement with id ``announcement``) and what it found."""

    _DOMAIN = STEP_DOMAIN
    _SIGNER = "verifier"

    verifier: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    trainer: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    version: int = field(metadata=wire(Uint(1, U64)))
    announcement: bytes = field(metadata=wire(Bin(32)))  # PolicyAnnouncement.id
    outcome: StepOutcome = field(metadata=wire(Choice(StepOutcome)))
    # StepFault codes, empty on pass: at most 16 of at most 64 characters (specs/training.md §5),
    # room above the 11 faults there are.
    reasons: tuple[str, ...] = field(metadata=wire(Texts(16, 64)))
    # The model hash the replay produced, empty when it could not run.
    replayed: bytes = field(metadata=wire(Bin(0, 32)))
    # ||theta_claimed - theta_replay|| / ||theta_replay - theta_parent|| (specs/training.md §4); also
    # refuses NaN; +inf is a replay that moved nothing where the claim did.
    drift: float = field(metadata=wire(Real(0.0, math.inf)))
    # The verifier's; equal to the announcement's means the replay had to be bit-exact.
    platform: str = field(metadata=wire(Text(MAX_PLATFORM_BYTES)))
    signature: bytes = field(default=b"", metadata=wire(Bin(SIGNATURE_BYTES)))

    def valid(self) -> bool:
        return self.signature_ok()

    @functools.cached_property  # immutable: its bytes, hence its id, never change
    def id(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()

    def _cross_check(self) -> None:
        if (self.outcome == StepOutcome.PASS) != (not self.reasons):
            raise FieldError("reasons", "must be empty exactly when the outcome is pass")


#: The four gossip messages, each on its own topic (specs/network.md §3).
# -- round manifests (the committee design, specs/committee.md §3) ------------------------------


@message("manifest", MANIFEST_VERSION, topic=TOPIC_MANIFESTS, oldest=MANIFEST_OLDEST)
@dataclass(frozen=True)
class RoundManifest(Signed):
    """The trainer's signed round manifest (specs/committee.md §3.3): the header of what round
    ``round`` holds and who may be drawn to check it, each list behind its Merkle root; the
    lists themselves are the trainer's (:class:`vrl.node.committee.PagedManifest`), and a member
    fetches the entries it needs (``entries`` request, §3.5)."""

    _DOMAIN = committee.MANIFEST_SIGNING_DOMAIN
    _SIGNER = "trainer"

    trainer: bytes = field(metadata=wire(Bin(NODE_ID_BYTES)))
    round: int = field(metadata=wire(Uint()))
    committee_size: int = field(metadata=wire(Uint(1, committee.MAX_COMMITTEE_SIZE)))
    groups: int = field(metadata=wire(Uint(1, committee.MAX_PAGED_ENTRIES)))
    groups_root: bytes = field(metadata=wire(Bin(32)))
    weights: int = field(metadata=wire(Uint(0, committee.MAX_PAGED_ENTRIES)))
    total_weight: int = field(metadata=wire(Uint(0, committee.MAX_PAGED_ENTRIES * committee.WEIGHT_SCALE)))
    weights_root: bytes = field(metadata=wire(Bin(32)))
    workers: int = field(metadata=wire(Uint(1, committee.MAX_PAGED_ENTRIES)))
    workers_root: bytes = field(metadata=wire(Bin(32)))
    # Absent before version 3: rule 1, the only one then.
    seat_rule: int = field(default=1, metadata=wire(Uint(min(committee.SEAT_RULES), max(committee.SEAT_RULES)),
                                                    since=3))
    signature: bytes = field(default=b"", metadata=wire(Bin(SIGNATURE_BYTES)))

    @classmethod
    def of(cls, trainer: bytes, header: committee.ManifestHeader) -> RoundManifest:
        return cls(trainer, header.round, header.committee_size, header.groups, header.groups_root, header.weights,
                   header.total_weight, header.weights_root, header.workers, header.workers_root, header.seat_rule)

    def valid(self) -> bool:
        return self._valid

    @functools.cached_property
    def _valid(self) -> bool:
        return self.signature_ok()

    @functools.cached_property
    def header(self) -> committee.ManifestHeader:
        """What the manifest fixes, and its root (specs/committee.md §3.2)."""
        return committee.ManifestHeader(self.round, self.committee_size, self.groups, self.groups_root, self.weights,
                                        self.total_weight, self.weights_root, self.workers, self.workers_root,
                                        self.seat_rule)

    def _cross_check(self) -> None:
        try:
            self.header  # noqa: B018 (the ranges between fields: workers <= groups, W within m weights)
        except committee.CommitteeError as error:
            raise FieldError("groups", str(error)) from None


@message("manifest lists", MANIFEST_LISTS_VERSION, oldest=1)
@dataclass(frozen=True)
class ManifestLists(Message):
    """The lists behind a round manifest's roots (specs/committee.md §3.1), as the trainer stores
    them (specs/network.md §8): never gossiped; an audit reads them, and checks them against the
    signed header's roots."""

    round: int = field(metadata=wire(Uint()))
    committee_size: int = field(metadata=wire(Uint(1, committee.MAX_COMMITTEE_SIZE)))
    groups: tuple[bytes, ...] = field(metadata=wire(Listed("key", committee.MAX_PAGED_ENTRIES)))
    weights: tuple[bytes, ...] = field(metadata=wire(Listed("leaf", committee.MAX_PAGED_ENTRIES, 36)))
    workers: tuple[bytes, ...] = field(metadata=wire(Listed("leaf", committee.MAX_PAGED_ENTRIES, 36)))
    # Absent before version 2: rule 1, the only one then (the manifest's own, RoundManifest).
    seat_rule: int = field(default=1, metadata=wire(Uint(min(committee.SEAT_RULES), max(committee.SEAT_RULES)),
                                                    since=2))

    @classmethod
    def of(cls, content: committee.ManifestContent) -> ManifestLists:
        return cls(content.round, content.weights.committee_size, content.groups,
                   tuple(committee.entry_leaf(node, w) for node, w in content.weights.entries),
                   tuple(committee.entry_leaf(node, c) for node, c in content.workers), content.seat_rule)

    @functools.cached_property
    def content(self) -> committee.ManifestContent:
        def entries(leaves: tuple[bytes, ...]) -> tuple[tuple[bytes, int], ...]:
            return tuple((leaf[:32], int.from_bytes(leaf[32:], "big")) for leaf in leaves)

        return committee.ManifestContent(self.round, committee.WeightsTable(self.committee_size, entries(self.weights)),
                                         self.groups, entries(self.workers), self.seat_rule)

    def _cross_check(self) -> None:
        if any(len(leaf) != 36 for leaf in self.weights + self.workers):
            raise FieldError("weights", "a weights or workers leaf is a node id and a u32, 36 bytes")
        try:
            self.content  # noqa: B018 (sorted, in range, the workers' counts summing to the groups)
        except committee.CommitteeError as error:
            raise FieldError("groups", str(error)) from None


GOSSIP_MESSAGES = (Submission, SignedVerdict, PolicyAnnouncement, StepVerdict, RoundManifest)
_TOPICS = {schema_of(kind).name: schema_of(kind).topic for kind in GOSSIP_MESSAGES}


def topic_of(data: bytes) -> str | None:
    """The gossip topic a stored message belongs on, from its ``kind`` (None if not ours)."""
    try:
        wire = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several unrelated types for bad bytes: not a message of ours
        return None
    kind = wire.get("kind") if isinstance(wire, dict) else None
    return _TOPICS.get(kind) if isinstance(kind, str) else None
