"""Private-answer rewards with zk proofs (specs/zk.md §5, §7): task sets whose references are
published only as salted commitments, the answer key that opens them, proofs of a record's
correctness, and the companion files that carry them.

The proofs themselves are :mod:`proofs.zk`'s; this module says what they are about: a record
(its subject is the hash of its bytes), the answer its completion gives (extracted as its
reward spec says) and the task's commitment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack

from proofs import zk
from proofs.circuits import (
    ANSWER_BYTES,
    ANSWER_MATCH,
    CIRCUITS,
    SALT_BYTES,
    answer_match_inputs,
    answer_match_instances,
    new_salt,
    reference_commitment,
    salt_values,
)
from proofs.sampling_params import SamplingParams
from vrl.errors import VrlError
from vrl.rollouts.files import write_bytes_atomic
from vrl.rollouts.keys import NodeKey, signature_valid, write_new_private
from vrl.rollouts.model import Model
from vrl.rollouts.record import RecordError, Rollout
from vrl.rollouts.verify import proven_answer
from vrl.tasks import RewardSpec, Task
from vrl.tasks.answers import COMMITTED_PREFIX, answer_form, committed_reference
from vrl.tasks.files import task_row

ZK_FILE_FORMAT = "vrl/zk/v1"
#: Attachments in one companion file: one per record of a rollout file, whose records are as many.
MAX_ATTACHMENTS = 65536
#: The most a companion file holds: that many attachments of the largest proof, with room.
MAX_COMPANION_BYTES = MAX_ATTACHMENTS * (zk.MAX_PROOF_BYTES + 1024)
#: Lines of an answer key, and its bytes: a line is at most about 150 bytes (a task id of at
#: most 256 bytes, record.md §2, aside), so a million tasks fit in 256 MiB.
MAX_KEY_LINES = 1_000_000
MAX_KEY_BYTES = 256 << 20


class ZkFileError(VrlError, ValueError):
    """A companion file or answer key that cannot be used; the message names the file and,
    where it can, the line or the attachment."""


def work_directory() -> Path:
    """Where circuits, keys and dev SRS files are kept: ``$VRL_ZK_DIR``, else the user's cache."""
    if "VRL_ZK_DIR" in os.environ:
        return Path(os.environ["VRL_ZK_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vrl" / "zk"


def record_subject(rollout: Rollout) -> bytes:
    """What an attachment about a record names: SHA-256 of the record's canonical bytes."""
    return hashlib.sha256(rollout.to_bytes()).digest()


# -- the answer key -----------------------------------------------------------------------------

@dataclass(frozen=True)
class AnswerKey:
    """What opens a task set's committed references: by task id, the reference's form and salt."""

    entries: dict[str, tuple[bytes, bytes]]  # task id -> (form, salt)

    def commitment(self, task_id: str) -> bytes:
        form, salt = self.entries[task_id]
        return reference_commitment(form, salt)

    def correct(self, task: Task, given: bytes | None) -> bool:
        """Whether a given answer's form matches the task's private reference."""
        if task.id not in self.entries:
            raise ZkFileError(f"task {task.id!r} is not in the answer key")
        return given is not None and given == self.entries[task.id][0]

    def check(self, tasks: Iterable[Task]) -> None:
        """That the key opens every committed reference of ``tasks``, before any work is done
        with it: a ZkFileError naming the first task it does not open."""
        for task in tasks:
            commitment = committed_reference(task.answer)
            if commitment is not None and (task.id not in self.entries or self.commitment(task.id) != commitment):
                raise ZkFileError(f"task {task.id!r}: the answer key does not open its committed reference")

    def scorer(self, reward_spec: RewardSpec) -> Callable[[Task, str], float]:
        """Rewards from the key, for generation over a committed task set (``vrl generate
        --answers``): what a verifier with the proofs recomputes."""
        def score(task: Task, completion: str) -> float:
            if committed_reference(task.answer) is None:
                return reward_spec.reward(task, completion)
            return reward_spec.reward_given(self.correct(task, reward_spec.given_form(completion)), completion)
        return score

    def opened(self, tasks: Iterable[Task]) -> list[Task]:
        """``tasks`` with each committed reference replaced by the answer the key opens it to
        (an answer whose form is the key's): what the answer holder scores its own held-out
        evaluation with. A ZkFileError names a task it cannot open."""
        self.check(tasks)
        out = []
        for task in tasks:
            if committed_reference(task.answer) is not None:
                form = self.entries[task.id][0]
                answer = form.split(b":", 1)[-1].decode()  # a form is a kind tag, ":", the normal text
                if answer_form(answer) != form:
                    raise ZkFileError(f"task {task.id!r}: the key's form {form!r} is not an answer's normal form")
                task = dataclasses.replace(task, answer=answer)  # a chat task stays one
            out.append(task)
        return out

    def to_lines(self) -> str:
        return "".join(json.dumps({"id": task_id, "form": form.decode(), "salt": salt.hex()}) + "\n"
                       for task_id, (form, salt) in self.entries.items())

    @classmethod
    def read(cls, path: Path | str) -> AnswerKey:
        path = Path(path)
        try:  # a regular file only, bounded, as every file this module reads
            lines = regular_file_bytes(path, MAX_KEY_BYTES).decode("utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise ZkFileError(f"{path}: cannot read the answer key ({error})") from None
        if len(lines) > MAX_KEY_LINES:
            raise ZkFileError(f"{path}: more than {MAX_KEY_LINES} lines")
        entries: dict[str, tuple[bytes, bytes]] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                task_id, form, salt_hex = row["id"], row["form"].encode(), row["salt"]
                if (not isinstance(task_id, str) or len(form) > ANSWER_BYTES or not isinstance(salt_hex, str)
                        or len(salt_hex) != 2 * SALT_BYTES or salt_hex.strip("0123456789abcdef")):
                    raise ValueError(f"an id, a form of at most {ANSWER_BYTES} bytes and a salt of "
                                     f"{2 * SALT_BYTES} lowercase hex digits")
                salt = bytes.fromhex(salt_hex)
                salt_values(salt)  # each value below 2^15
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError, zk.ZkError) as error:
                raise ZkFileError(f"{path}:{number}: not an answer key line ({error!r:.200})") from None
            if task_id in entries:
                raise ZkFileError(f"{path}:{number}: task {task_id!r} twice")
            entries[task_id] = (form, salt)
        return cls(entries)


def write_key(path: Path | str, key: AnswerKey) -> None:
    """Write an answer key as a new file, private (0600) from its first byte, whole or not at
    all, and never over an existing one: its salts alone open the published commitments."""
    try:
        write_new_private(Path(path), key.to_lines().encode())
    except FileExistsError:
        raise ZkFileError(f"{path} exists; an answer key is never overwritten") from None


def write_task_file(path: Path | str, tasks: Iterable[Task]) -> None:
    """A task file of JSON lines ``{"id", "prompt", "answer"}`` (a chat task's prompt as its
    messages: vrl.tasks.files.task_row), written whole or not at all: what ``vrl commit-answers``
    writes the public file of a private task set as, each answer a commitment (specs/zk.md §7)."""
    write_bytes_atomic(path, "".join(json.dumps(task_row(t)) + "\n" for t in tasks).encode())


def commit_answers(tasks: Iterable[Task]) -> tuple[list[Task], AnswerKey]:
    """The public tasks (each reference replaced by its commitment) and the private key."""
    public, entries = [], {}
    for task in tasks:
        if committed_reference(task.answer) is not None:
            raise ZkFileError(f"task {task.id!r}: its reference is committed already")
        form = answer_form(task.answer)
        if len(form) > ANSWER_BYTES:
            raise ZkFileError(f"task {task.id!r}: its reference {task.answer[:40]!r} is {len(form)} bytes in normal "
                              f"form, more than answer-match/v1 holds ({ANSWER_BYTES})")
        if task.id in entries:
            raise ZkFileError(f"task {task.id!r} twice")
        salt = new_salt()
        entries[task.id] = (form, salt)
        public.append(dataclasses.replace(task, answer=COMMITTED_PREFIX + reference_commitment(form, salt).hex()))
    return public, AnswerKey(entries)


# -- proofs of records ------------------------------------------------------------------------

def _needs_proof(rollout: Rollout, decode: Callable[[list[int]], str]) -> tuple[bytes, bytes] | None:
    """``(given form, commitment)`` of a record whose correctness a proof must show; None
    for one with an ordinary reference, or whose completion gives no provable answer."""
    commitment = committed_reference(rollout.reference)
    if commitment is None:
        return None
    given = proven_answer(rollout.reward_spec, decode(list(rollout.completion_tokens)))
    return None if given is None else (given, commitment)  # None: not correct, nothing to prove


#: What one answer-match proof shows, with its witness: (the given answer's form, the
#: reference's form, its salt). Records that give the same answer to one task share it (§2).
Statement = tuple[bytes, bytes, bytes]


def proof_plan(rollouts: Sequence[Rollout], key: AnswerKey, decode: Callable[[list[int]], str],
               ) -> tuple[list[Statement], list[tuple[bytes, int]]]:
    """What proving ``rollouts``' correctness takes: the distinct statements, and for each
    record that needs a proof, its subject and the index of its statement. The answer holder's
    side; a ZkFileError names a record the key cannot open."""
    statements: dict[Statement, int] = {}
    named: list[tuple[bytes, int]] = []
    for index, rollout in enumerate(rollouts):
        try:
            needed = _needs_proof(rollout, decode)
        except ValueError as error:  # a malformed committed reference
            raise ZkFileError(f"record {index}: {error}") from None
        if needed is None:
            continue
        given, commitment = needed
        if rollout.task_id not in key.entries:
            raise ZkFileError(f"record {index}: task {rollout.task_id!r} is not in the answer key")
        form, salt = key.entries[rollout.task_id]
        if reference_commitment(form, salt) != commitment:
            raise ZkFileError(f"record {index}: the answer key does not open the commitment of task "
                              f"{rollout.task_id!r}")
        named.append((record_subject(rollout), statements.setdefault((given, form, salt), len(statements))))
    return list(statements), named


def prove_statements(statements: Sequence[Statement], srs: zk.Srs, workdir: Path,
                     on_progress: Callable[[int], None] | None = None) -> list[zk.Attachment]:
    """One answer-match proof per statement, each naming no record yet (a zero subject):
    :func:`named_proofs` names them. A module-level function, so a node's prover process can
    run it."""
    proofs = []
    for given, form, salt in statements:
        proofs.append(zk.prove(ANSWER_MATCH, answer_match_inputs(given, form, salt), bytes(32), srs, workdir))
        if on_progress is not None:
            on_progress(1)
    return proofs


def named_proofs(proofs: Sequence[zk.Attachment], named: Sequence[tuple[bytes, int]]) -> list[zk.Attachment]:
    """Each record's attachment: its statement's proof under the record's subject. The subject
    is an index, not part of the statement (§2), so one proof serves every record it is true of."""
    return [dataclasses.replace(proofs[statement], subject=subject) for subject, statement in named]


def prove_rewards(rollouts: Sequence[Rollout], key: AnswerKey, decode: Callable[[list[int]], str], srs: zk.Srs,
                  workdir: Path, on_progress: Callable[[int], None] | None = None) -> list[zk.Attachment]:
    """An answer-match attachment for every record that needs one (its reference committed,
    its completion giving an answer), one proof per distinct statement: the answer holder's
    side. ``on_progress(1)`` follows each proof made."""
    statements, named = proof_plan(rollouts, key, decode)
    return named_proofs(prove_statements(statements, srs, workdir, on_progress), named)


def proven_correctness(rollouts: Sequence[Rollout | object], attachments: Sequence[zk.Attachment],
                       decode: Callable[[list[int]], str], srs: Sequence[zk.Srs], workdir: Path, *,
                       allow_dev: bool = False) -> dict[int, bool | str]:
    """What the proofs show, by record index, for the records that need one: the answer's
    correctness, or the zk reason code of its failure (``zk_missing`` when no attachment
    names the record). Only the first attachment naming a record is tried: a file of many
    for one record costs one check, not many. For ``verify(proven=)``."""
    by_subject: dict[bytes, list[zk.Attachment]] = {}
    for attachment in attachments:
        by_subject.setdefault(attachment.subject, [attachment])
    # One proof serves every record that gives its answer to its task (named_proofs); a
    # verification costs 24 ms (bench/zk.py), so each distinct proof is verified once.
    verified: dict[tuple[bytes, tuple[bytes, ...]], zk.Reason] = {}
    shown: dict[int, bool | str] = {}
    for index, rollout in enumerate(rollouts):
        if not isinstance(rollout, Rollout):
            continue
        try:
            needed = _needs_proof(rollout, decode)
        except ValueError:
            continue  # a malformed committed reference: stage 8 says so
        if needed is None:
            continue
        given, commitment = needed
        subject = record_subject(rollout)
        shown[index] = "zk_missing"
        for attachment in by_subject.get(subject, []):
            if attachment.instances[2:] not in ((zk.felt(0),), (zk.felt(1),)):
                shown[index] = zk.Reason.WRONG_INSTANCES.value
                continue
            correct = attachment.instances[2] == zk.felt(1)
            expected = answer_match_instances(given, commitment, correct)
            # The statement is the record's own instances; the subject only names it (§2).
            unnamed = (dataclasses.replace(attachment, subject=bytes(32)).to_bytes(), expected)
            if unnamed not in verified:
                verified[unnamed] = zk.verify(attachment, CIRCUITS, subject=subject, instances=expected,
                                              srs=srs, workdir=workdir, allow_dev=allow_dev)
            reason = verified[unnamed]
            shown[index] = correct if reason is zk.Reason.OK else reason.value
    return shown


def training_rewards(groups: Sequence[Sequence[Rollout]], attachments: Sequence[zk.Attachment],
                     decode: Callable[[list[int]], str], srs: Sequence[zk.Srs], workdir: Path, *,
                     allow_dev: bool = False) -> tuple[list[list[float]], dict[bytes, str]]:
    """What a step on ``groups`` trains on (specs/zk.md §11), group by group: a record's own
    reward for an ordinary reference; for a committed one, its reward with the correctness
    the proofs show (no provable answer: not correct). Also, by record subject, each record
    whose proof is missing or fails, with the zk reason code: those are scored not correct,
    and a step that needed them is at fault."""
    flat = [rollout for group in groups for rollout in group]
    shown = proven_correctness(flat, attachments, decode, srs, workdir, allow_dev=allow_dev)
    rewards: list[list[float]] = []
    failures: dict[bytes, str] = {}
    index = 0
    for group in groups:
        row = []
        for rollout in group:
            try:
                committed = committed_reference(rollout.reference) is not None
            except ValueError:  # a malformed commitment: no check passes it; nothing to learn
                failures[record_subject(rollout)] = "malformed_reference"
                committed = True
            if not committed:
                row.append(rollout.reward)
            else:
                proof = shown.get(index, False)  # needs no proof: gives no provable answer
                if isinstance(proof, str):
                    failures[record_subject(rollout)], proof = proof, False
                row.append(rollout.reward_spec.reward_given(proof, decode(list(rollout.completion_tokens))))
            index += 1
        rewards.append(row)
    return rewards, failures


#: The most one answer-match attachment takes in a step's proofs file: 4,100 bytes measured
#: (bench/results/zk.json: a 3,840-byte proof and 3 instances), with room for msgpack's framing.
MAX_REWARD_ATTACHMENT_BYTES = 8 << 10


def max_proofs_bytes(records: int) -> int:
    """The most a step's reward proofs file may take: at most one attachment per record of its
    batch (specs/zk.md §11). What a replaying node fetches at most, whatever size is announced."""
    return 16 + records * MAX_REWARD_ATTACHMENT_BYTES


def step_rewards(groups: Sequence[Sequence[Rollout]], proofs: bytes, decode: Callable[[list[int]], str],
                 srs: Sequence[zk.Srs], workdir: Path, *,
                 allow_dev: bool = False) -> tuple[list[list[float]], str | None]:
    """What a step of private tasks must have trained on (:func:`training_rewards`), from the
    proofs file its announcement binds (empty bytes: none), and why the step is at fault, None
    when it is not: the zk reason code of the first record whose proof is missing or fails,
    or ``proofs_malformed`` for a file that is not one (specs/zk.md §11). A record left
    unproven is scored not correct, so the replay also finds a step that trained otherwise."""
    try:
        attachments, fault = (attachments_from_bytes(proofs, "reward proofs") if proofs else []), None
    except ZkFileError:
        attachments, fault = [], "proofs_malformed"
    rewards, failures = training_rewards(groups, attachments, decode, srs, workdir, allow_dev=allow_dev)
    return rewards, fault or next(iter(failures.values()), None)


# -- companion files -------------------------------------------------------------------------------

def companion_path(rollout_file: Path | str) -> Path:
    """Where a rollout file's proofs are kept: ``FILE.zk``."""
    return Path(f"{rollout_file}.zk")


def write_attachments(path: Path | str, attachments: Sequence[zk.Attachment]) -> None:
    """Write a companion file whole or not at all (specs/zk.md §7)."""
    if len(attachments) > MAX_ATTACHMENTS:
        raise ZkFileError(f"{path}: {len(attachments)} attachments, more than {MAX_ATTACHMENTS}")
    write_bytes_atomic(path, attachments_bytes(attachments))


def read_attachments(path: Path | str) -> list[zk.Attachment]:
    """A companion file's attachments; a file that is not one, or an attachment that does
    not decode, is a ZkFileError naming the file (and the attachment's position)."""
    path = Path(path)
    return attachments_from_bytes(regular_file_bytes(path, MAX_COMPANION_BYTES), path)


def attachments_from_bytes(data: bytes, path: Path | str = "<bytes>") -> list[zk.Attachment]:
    try:
        top = msgpack.unpackb(data, raw=False, max_array_len=MAX_ATTACHMENTS, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise ZkFileError(f"{path}: not a {ZK_FILE_FORMAT} file ({error})") from None
    if not (isinstance(top, list) and len(top) == 2 and top[0] == ZK_FILE_FORMAT and isinstance(top[1], list)):
        raise ZkFileError(f"{path}: not a {ZK_FILE_FORMAT} file")
    attachments = []
    for position, item in enumerate(top[1]):
        try:
            attachments.append(zk.Attachment.from_bytes(item))
        except zk.MalformedAttachment as error:
            raise ZkFileError(f"{path}: attachment {position}: {error}") from None
    return attachments


# -- held-out evaluation claims (specs/zk.md §9) ----------------------------------------------------

CLAIM_FORMAT = "vrl/evaluation-claim/v1"
EVALUATION_DOMAIN = b"vrl/evaluation/v1\x00"
#: What a claim's signature covers starts with this: a claim is its evaluator's word, so that
#: a claim the proofs do not uphold incriminates whoever signed it, and no one else.
CLAIM_DOMAIN = b"vrl/evaluation-claim/v1\x00"
#: A claim file is a few hundred bytes; this bounds what a reader takes from one.
MAX_CLAIM_BYTES = 1 << 16


def task_set_digest(tasks: Sequence[Task]) -> bytes:
    """What a claim names its task set by: SHA-256 of the canonical msgpack array of
    ``[id, prompt, answer]`` per task, in the list's order (answers as published: commitments),
    and ``true`` after a chat task's answer: its prompt is messages, rendered by the model's
    chat template, and a plain task whose text is those messages' JSON is another task
    (specs/zk.md §9)."""
    return hashlib.sha256(msgpack.packb([[t.id, t.prompt, t.answer, *([True] if t.chat else [])] for t in tasks],
                                        use_bin_type=True)).digest()


def evaluation_seed(model_hash: bytes, task_digest: bytes) -> bytes:
    """An evaluation's round seed, a pure function of the model and the task set."""
    return hashlib.sha256(EVALUATION_DOMAIN + model_hash + task_digest).digest()


def evaluation_sampling(model: Model, max_new_tokens: int) -> SamplingParams:
    """How an evaluation decodes: greedily (temperature 0), one sample per task. Sampling
    noise would give the evaluator draws to try until one flatters (a fresh node key is a
    fresh seed); the greedy answer is one, whoever asks. ``max_new_tokens`` is the claim's."""
    from vrl.rollouts.generate import sampling_for

    return sampling_for(model, temperature=0.0, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class Claim:
    """A held-out accuracy claim: ``correct`` of ``total`` tasks answered right, greedily,
    within ``max_new_tokens``, by the model of ``model_hash``, signed by ``evaluator``. It
    binds its records and proofs files by hash, so no one can swap either under it."""

    model_hash: bytes
    task_set: bytes
    tasks: int
    max_new_tokens: int
    correct: int
    total: int
    evaluator: bytes
    records: str  # the rollout file, beside the claim; its proofs are records + ".zk"
    records_sha256: bytes
    proofs_sha256: bytes
    # Where a checker may find the model and the public task file (an audit does): locators
    # only, since the model is checked by its hash and the task set by its digest.
    model: str = ""
    task_file: str = ""
    signature: bytes = b""  # the evaluator's, over signing_bytes()

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def signing_bytes(self) -> bytes:
        packed: bytes = msgpack.packb(
            [self.model_hash, self.task_set, self.tasks, self.max_new_tokens, self.correct, self.total,
             self.evaluator, self.records, self.records_sha256, self.proofs_sha256, self.model, self.task_file],
            use_bin_type=True)
        return CLAIM_DOMAIN + packed

    def signed(self, key: NodeKey) -> Claim:
        """The claim signed by ``key`` (a NodeKey), which becomes its evaluator."""
        unsigned = dataclasses.replace(self, evaluator=key.node_id, signature=b"")
        return dataclasses.replace(unsigned, signature=key.sign(unsigned.signing_bytes()))

    def signature_valid(self) -> bool:
        return signature_valid(self.evaluator, self.signing_bytes(), self.signature)

    def to_json(self) -> str:
        return json.dumps({"format": CLAIM_FORMAT, "model_hash": self.model_hash.hex(), "task_set": self.task_set.hex(),
                           "tasks": self.tasks, "max_new_tokens": self.max_new_tokens, "correct": self.correct,
                           "total": self.total, "accuracy": self.accuracy, "evaluator": self.evaluator.hex(),
                           "records": self.records, "records_sha256": self.records_sha256.hex(),
                           "proofs_sha256": self.proofs_sha256.hex(), "model": self.model,
                           "task_file": self.task_file, "signature": self.signature.hex()}, indent=1) + "\n"

    @classmethod
    def read(cls, path: Path | str) -> Claim:
        path = Path(path)
        try:
            data = json.loads(regular_file_bytes(path, MAX_CLAIM_BYTES).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            raise ZkFileError(f"{path}: cannot read the claim ({error})") from None
        if not isinstance(data, dict) or data.get("format") != CLAIM_FORMAT:
            raise ZkFileError(f"{path}: not a {CLAIM_FORMAT} claim")
        try:
            counts = [data[k] for k in ("tasks", "max_new_tokens", "correct", "total")]
            if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 32 for c in counts):
                raise ValueError("tasks, max_new_tokens, correct and total must be integers in [0, 2^32)")
            hashes = [_hex(data[k], 32, k) for k in ("model_hash", "task_set", "evaluator", "records_sha256",
                                                       "proofs_sha256")]
            records, locators = data["records"], [data.get(k, "") for k in ("model", "task_file")]
            if not isinstance(records, str) or not records or Path(records).name != records:
                raise ValueError("records must name a file beside the claim")
            if not all(isinstance(x, str) and len(x) <= 4096 for x in locators):
                raise ValueError("model and task_file are paths or preset names")
            signature = _hex(data["signature"], 64, "signature")
        except (KeyError, TypeError, ValueError) as error:
            raise ZkFileError(f"{path}: {error}") from None
        return cls(hashes[0], hashes[1], counts[0], counts[1], counts[2], counts[3], hashes[2], records, hashes[3],
                   hashes[4], locators[0], locators[1], signature)


def _hex(value: object, size: int, name: str) -> bytes:
    if not isinstance(value, str) or len(value) != 2 * size or value.strip("0123456789abcdef"):
        raise ValueError(f"{name} must be {2 * size} lowercase hex digits")
    return bytes.fromhex(value)


def regular_file_bytes(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` (a FIFO or a device would block or never end)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ZkFileError(f"{path}: not a regular file")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise ZkFileError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > limit:
        raise ZkFileError(f"{path}: larger than {limit} bytes")
    return data


def evaluate_private(model: Model, public: Sequence[Task], key: AnswerKey, node: NodeKey, *, max_new_tokens: int,
                     srs: zk.Srs, workdir: Path, records_name: str, model_locator: str = "", task_file: str = "",
                     on_progress: Callable[[int], None] | None = None,
                     ) -> tuple[list[Rollout], list[zk.Attachment], Claim]:
    """Answer every task of ``public`` greedily (at the evaluation's seed), score the answers
    with the key and prove each one's correctness: the records, the proofs and the claim,
    which binds the bytes the records and proofs are written as (:func:`write_claim`)."""
    from vrl.rollouts.generate import generate
    from vrl.tasks import RewardSpec, TaskList

    plain = next((t.id for t in public if committed_reference(t.answer) is None), None)
    if plain is not None:
        raise ZkFileError(f"task {plain!r} has its reference in the clear: an evaluation claim is about a private "
                          "task set (vrl commit-answers), every reference committed")
    key.check(public)
    spec = RewardSpec()
    digest = task_set_digest(public)
    records = generate(model, TaskList("evaluation", tuple(public)), node,
                       round_seed=evaluation_seed(model.model_hash, digest),
                       sampling=evaluation_sampling(model, max_new_tokens), groups=len(public), group_size=1,
                       score=key.scorer(spec), ordered=True)
    statements, named = proof_plan(records, key, model.decode)
    attachments = named_proofs(prove_statements(statements, srs, workdir, on_progress), named)
    if on_progress is not None:  # a task whose answer shares a proof, or has none, is done too
        on_progress(len(records) - len(statements))
    correct = sum(key.correct(task, proven_answer(spec, model.decode(list(r.completion_tokens))))
                  for task, r in zip(public, records))
    records_bytes, proofs_bytes = _rollout_file_bytes(records), attachments_bytes(attachments)
    claim = Claim(model.model_hash, digest, len(public), max_new_tokens, correct, len(records), node.node_id,
                  records_name, hashlib.sha256(records_bytes).digest(), hashlib.sha256(proofs_bytes).digest(),
                  model_locator, task_file).signed(node)
    return records, attachments, claim


def _rollout_file_bytes(records: Sequence[Rollout]) -> bytes:
    """A rollout file's bytes, as :func:`vrl.rollouts.files.write_rollouts` writes them."""
    from vrl.rollouts.files import FILE_MAGIC, frame

    return FILE_MAGIC + b"".join(frame(r) for r in records)


def write_claim(out: Path, records: Sequence[Rollout], attachments: Sequence[zk.Attachment], claim: Claim) -> Path:
    """Write a claim's three files whole: the records (``out``), the proofs (``out.zk``) and
    the claim (``out.claim.json``), the first two exactly the bytes the claim's hashes name."""
    write_bytes_atomic(out, _rollout_file_bytes(records))
    write_attachments(companion_path(out), attachments)
    path = out.with_name(out.name + ".claim.json")
    write_bytes_atomic(path, claim.to_json().encode())
    return path


def attachments_bytes(attachments: Sequence[zk.Attachment]) -> bytes:
    packed: bytes = msgpack.packb([ZK_FILE_FORMAT, [a.to_bytes() for a in attachments]], use_bin_type=True)
    return packed


@dataclass(frozen=True)
class ClaimCheck:
    """What checking a claim found. ``unchecked``: why it could not be judged (its files are
    not the ones it signs, the model or task set given is not its own, its signature does not
    verify): it incriminates no one. ``problems``: what is wrong with what its evaluator
    signed. ``correct`` of ``total``: what the proofs show."""

    correct: int
    total: int
    problems: tuple[str, ...]
    unchecked: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and not self.unchecked


def check_claim_file(path: Path, model: Model, public: Sequence[Task], srs: Sequence[zk.Srs], workdir: Path, *,
                     allow_dev: bool = False) -> tuple[Claim, ClaimCheck]:
    """Read a claim and the records and proofs files beside it, and check it (:func:`check_claim`).
    Raises ZkFileError for a claim file that cannot be read; files that are not the ones the
    claim signs make the check ``unchecked``."""
    path = Path(path)
    claim = Claim.read(path)
    records_path = path.parent / claim.records
    try:
        records_bytes = regular_file_bytes(records_path, 1 << 30)  # one record a task: far below
        proofs_bytes = regular_file_bytes(companion_path(records_path), MAX_COMPANION_BYTES)
    except ZkFileError as error:
        return claim, ClaimCheck(0, 0, (), (str(error),))
    unchecked = [f"{name} is not the file the claim signs" for name, data, digest in (
        (str(records_path), records_bytes, claim.records_sha256),
        (str(companion_path(records_path)), proofs_bytes, claim.proofs_sha256))
        if hashlib.sha256(data).digest() != digest]
    if unchecked:
        return claim, ClaimCheck(0, 0, (), tuple(unchecked))
    from vrl.rollouts.files import RolloutFileError, records_from_bytes

    try:  # the very bytes hashed: a file swapped after the hash is never read
        records = list(records_from_bytes(records_bytes, str(records_path)))
        attachments = attachments_from_bytes(proofs_bytes, companion_path(records_path))
    except (RolloutFileError, ZkFileError) as error:  # the files it signs are damaged: its evaluator's doing
        return claim, ClaimCheck(0, 0, (str(error),))
    return claim, check_claim(claim, records, attachments, model, public, srs, workdir, allow_dev=allow_dev)


def check_claim(claim: Claim, records: Sequence[Rollout | RecordError], attachments: Sequence[zk.Attachment],
                model: Model,
                public: Sequence[Task], srs: Sequence[zk.Srs], workdir: Path, *, allow_dev: bool = False) -> ClaimCheck:
    """Re-check a claim from its records and proofs alone (specs/zk.md §9): its signature, the
    model and task set it names, every record verified greedily at the evaluation's seed with
    the default reward spec and the rewards from the proofs, every task answered once by the
    evaluator, and the correct count recomputed."""
    from vrl.rollouts.verify import Expectations, verify
    from vrl.tasks import RewardSpec, TaskList

    unchecked = [] if claim.signature_valid() else ["the claim's signature does not verify under its evaluator"]
    if claim.model_hash != model.model_hash:
        unchecked.append(f"it is about model {claim.model_hash.hex()[:16]}, the one given is "
                         f"{model.model_hash.hex()[:16]}")
    digest = task_set_digest(public)
    if claim.task_set != digest or claim.tasks != len(public):
        unchecked.append(f"it is about task set {claim.task_set.hex()[:16]} of {claim.tasks} tasks, the one given is "
                         f"{digest.hex()[:16]} of {len(public)}")
    if any(committed_reference(t.answer) is None for t in public):
        unchecked.append("the task set given has references in the clear: not a private task set")
    if unchecked:
        return ClaimCheck(0, 0, (), tuple(unchecked))
    proven = proven_correctness(records, attachments, model.decode, srs, workdir, allow_dev=allow_dev)
    expect = Expectations(tasks=TaskList("evaluation", tuple(public)), round_seed=evaluation_seed(claim.model_hash,
                                                                                                   claim.task_set),
                          sampling=evaluation_sampling(model, claim.max_new_tokens), reward_spec=RewardSpec(),
                          in_order=True)
    verdicts = verify(records, model, expect=expect, proven=proven)
    problems = [f"record {v.index}: {v.reason}: {v.message}" for v in verdicts if not v.accepted][:20]
    groups: dict[int, int] = {}
    for record in records:
        if isinstance(record, Rollout):
            groups[record.group_index] = groups.get(record.group_index, 0) + 1
            if record.node_id != claim.evaluator or record.group_size != 1:
                problems.append(f"record of task {record.task_id!r}: not the evaluator's, or not one sample a task")
                break
    missing = [g for g in range(len(public)) if groups.get(g) != 1]
    if missing:
        problems.append(f"{len(missing)} tasks not answered exactly once (the first: task {missing[0]})")
    correct = sum(1 for shown in proven.values() if shown is True)
    total = sum(isinstance(r, Rollout) for r in records)
    if (claim.correct, claim.total) != (correct, total):
        problems.append(f"claims {claim.correct} of {claim.total} correct; the proofs show {correct} of {total}")
    return ClaimCheck(correct, total, tuple(problems))
