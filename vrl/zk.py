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
    ANSWER_BYTES, ANSWER_MATCH, CIRCUITS, SALT_BYTES, answer_match_inputs, answer_match_instances, new_salt,
    reference_commitment, salt_values,
)
from vrl.errors import VrlError
from vrl.rollouts.files import write_bytes_atomic
from vrl.rollouts.keys import signature_valid
from vrl.rollouts.record import Rollout
from vrl.rollouts.verify import proven_answer
from vrl.tasks import Task
from vrl.tasks.answers import COMMITTED_PREFIX, answer_form, committed_reference

ZK_FILE_FORMAT = "vrl/zk/v1"
#: Attachments in one companion file: one per record of a rollout file, whose records are as many.
MAX_ATTACHMENTS = 65536
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

    def scorer(self, reward_spec) -> Callable[[Task, str], float]:
        """Rewards from the key, for generation over a committed task set (``vrl generate
        --answers``): what a verifier with the proofs recomputes."""
        def score(task: Task, completion: str) -> float:
            if committed_reference(task.answer) is None:
                return reward_spec.reward(task, completion)
            return reward_spec.reward_given(self.correct(task, reward_spec.given_form(completion)), completion)
        return score

    def to_lines(self) -> str:
        return "".join(json.dumps({"id": task_id, "form": form.decode(), "salt": salt.hex()}) + "\n"
                       for task_id, (form, salt) in self.entries.items())

    @classmethod
    def read(cls, path: Path | str) -> AnswerKey:
        path = Path(path)
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_KEY_BYTES + 1)
            if len(data) > MAX_KEY_BYTES:
                raise ZkFileError(f"{path}: larger than any answer key ({MAX_KEY_BYTES} bytes)")
            lines = data.decode("utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
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
            except (ValueError, KeyError, TypeError, AttributeError, zk.ZkError) as error:
                raise ZkFileError(f"{path}:{number}: not an answer key line ({error})") from None
            if task_id in entries:
                raise ZkFileError(f"{path}:{number}: task {task_id!r} twice")
            entries[task_id] = (form, salt)
        return cls(entries)


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
        public.append(Task(task.id, task.prompt, COMMITTED_PREFIX + reference_commitment(form, salt).hex()))
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


def prove_rewards(rollouts: Sequence[Rollout], key: AnswerKey, decode: Callable[[list[int]], str], srs: zk.Srs,
                  workdir: Path, on_progress: Callable[[int], None] | None = None) -> list[zk.Attachment]:
    """An answer-match proof for every record that needs one (its reference committed, its
    completion giving an answer): the answer holder's side."""
    attachments = []
    for index, rollout in enumerate(rollouts):
        try:
            needed = _needs_proof(rollout, decode)
        except ValueError as error:  # a malformed committed reference
            raise ZkFileError(f"record {index}: {error}") from None
        if needed is not None:
            given, commitment = needed
            if rollout.task_id not in key.entries:
                raise ZkFileError(f"task {rollout.task_id!r} is not in the answer key")
            form, salt = key.entries[rollout.task_id]
            if reference_commitment(form, salt) != commitment:
                raise ZkFileError(f"task {rollout.task_id!r}: the answer key does not open the record's commitment")
            attachments.append(zk.prove(ANSWER_MATCH, answer_match_inputs(given, form, salt), record_subject(rollout),
                                        srs, workdir))
        if on_progress is not None:
            on_progress(1)
    return attachments


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
            reason = zk.verify(attachment, CIRCUITS, subject=subject,
                               instances=answer_match_instances(given, commitment, correct), srs=srs,
                               workdir=workdir, allow_dev=allow_dev)
            shown[index] = correct if reason is zk.Reason.OK else reason.value
    return shown


# -- companion files -------------------------------------------------------------------------------

def companion_path(rollout_file: Path | str) -> Path:
    """Where a rollout file's proofs are kept: ``FILE.zk``."""
    return Path(f"{rollout_file}.zk")


def write_attachments(path: Path | str, attachments: Sequence[zk.Attachment]) -> None:
    """Write a companion file whole or not at all (specs/zk.md §7)."""
    if len(attachments) > MAX_ATTACHMENTS:
        raise ZkFileError(f"{path}: {len(attachments)} attachments, more than {MAX_ATTACHMENTS}")
    write_bytes_atomic(path, msgpack.packb([ZK_FILE_FORMAT, [a.to_bytes() for a in attachments]], use_bin_type=True))


def read_attachments(path: Path | str) -> list[zk.Attachment]:
    """A companion file's attachments; a file that is not one, or an attachment that does
    not decode, is a ZkFileError naming the file (and the attachment's position)."""
    path = Path(path)
    limit = MAX_ATTACHMENTS * (zk.MAX_PROOF_BYTES + 1024)
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO or a device has no size to check
            raise ZkFileError(f"{path}: not a regular file")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise ZkFileError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > limit:
        raise ZkFileError(f"{path}: larger than any companion file ({limit} bytes)")
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


def task_set_digest(tasks: Sequence[Task]) -> bytes:
    """What a claim names its task set by: SHA-256 of the canonical msgpack array of
    ``[id, prompt, answer]`` per task, in the list's order (answers as published: commitments)."""
    return hashlib.sha256(msgpack.packb([[t.id, t.prompt, t.answer] for t in tasks], use_bin_type=True)).digest()


def evaluation_seed(model_hash: bytes, task_digest: bytes) -> bytes:
    """An evaluation's round seed, a pure function of the model and the task set: the evaluator
    cannot try seeds until it likes the accuracy."""
    return hashlib.sha256(EVALUATION_DOMAIN + model_hash + task_digest).digest()


@dataclass(frozen=True)
class Claim:
    """A held-out accuracy claim: ``correct`` of ``total`` samples right, one group of
    ``samples`` per task of the set, made by ``evaluator`` with the model of ``model_hash``.
    Its records and proofs are the rollout file ``records`` and its companion file."""

    model_hash: bytes
    task_set: bytes
    tasks: int
    samples: int
    correct: int
    total: int
    evaluator: bytes
    records: str  # the rollout file, relative to the claim's folder
    # Where a checker may find the model and the public task file (an audit does): locators
    # only, since the model is checked by its hash and the task set by its digest.
    model: str = ""
    task_file: str = ""
    signature: bytes = b""  # the evaluator's, over signing_bytes()

    def signing_bytes(self) -> bytes:
        return CLAIM_DOMAIN + msgpack.packb(
            [self.model_hash, self.task_set, self.tasks, self.samples, self.correct, self.total, self.evaluator,
             self.records, self.model, self.task_file], use_bin_type=True)

    def signed(self, key) -> Claim:
        """The claim signed by ``key`` (a NodeKey), which becomes its evaluator."""
        unsigned = dataclasses.replace(self, evaluator=key.node_id, signature=b"")
        return dataclasses.replace(unsigned, signature=key.sign(unsigned.signing_bytes()))

    def signature_valid(self) -> bool:
        return signature_valid(self.evaluator, self.signing_bytes(), self.signature)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def to_json(self) -> str:
        return json.dumps({"format": CLAIM_FORMAT, "model_hash": self.model_hash.hex(), "task_set": self.task_set.hex(),
                           "tasks": self.tasks, "samples": self.samples, "correct": self.correct, "total": self.total,
                           "accuracy": self.accuracy, "evaluator": self.evaluator.hex(), "records": self.records,
                           "model": self.model, "task_file": self.task_file, "signature": self.signature.hex()},
                          indent=1) + "\n"

    @classmethod
    def read(cls, path: Path | str) -> Claim:
        path = Path(path)
        try:
            if path.stat().st_size > 1 << 16:
                raise ZkFileError(f"{path}: larger than any claim (64 KiB)")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ZkFileError(f"{path}: cannot read the claim ({error})") from None
        if not isinstance(data, dict) or data.get("format") != CLAIM_FORMAT:
            raise ZkFileError(f"{path}: not a {CLAIM_FORMAT} claim")
        try:
            counts = [data[k] for k in ("tasks", "samples", "correct", "total")]
            if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 32 for c in counts):
                raise ValueError("tasks, samples, correct and total must be integers in [0, 2^32)")
            hashes = [bytes.fromhex(data[k]) for k in ("model_hash", "task_set", "evaluator")]
            if any(len(h) != 32 for h in hashes) or not isinstance(data["records"], str):
                raise ValueError("model_hash, task_set and evaluator are 64 hex digits; records a file name")
            if Path(data["records"]).name != data["records"]:
                raise ValueError("records must name a file beside the claim")
            locators = [data.get(k, "") for k in ("model", "task_file")]
            if not all(isinstance(x, str) and len(x) <= 4096 for x in locators):
                raise ValueError("model and task_file are paths or preset names")
            signature = bytes.fromhex(data["signature"])
            if len(signature) != 64:
                raise ValueError("signature must be 128 hex digits")
        except (KeyError, TypeError, ValueError) as error:
            raise ZkFileError(f"{path}: {error}") from None
        return cls(hashes[0], hashes[1], counts[0], counts[1], counts[2], counts[3], hashes[2], data["records"],
                   *locators, signature)


def evaluate_private(model, public: Sequence[Task], key: AnswerKey, node, *, samples: int, sampling, srs: zk.Srs,
                     workdir: Path, records_name: str, model_locator: str = "", task_file: str = "",
                     on_progress: Callable[[int], None] | None = None) -> tuple[list[Rollout], list[zk.Attachment], Claim]:
    """Sample every task of ``public`` (``samples`` each, at the evaluation's seed), score
    them with the key, prove each answer's correctness: the records, proofs and claim."""
    from vrl.rollouts.generate import generate
    from vrl.tasks import RewardSpec, TaskList

    spec = RewardSpec()
    digest = task_set_digest(public)
    records = generate(model, TaskList("evaluation", tuple(public)), node,
                       round_seed=evaluation_seed(model.model_hash, digest), sampling=sampling, groups=len(public),
                       group_size=samples, score=key.scorer(spec), ordered=True)
    attachments = prove_rewards(records, key, model.decode, srs, workdir, on_progress=on_progress)
    correct = sum(r.reward >= spec.correct > 0 for r in records)
    return records, attachments, Claim(model.model_hash, digest, len(public), samples, correct, len(records),
                                       node.node_id, records_name, model_locator, task_file).signed(node)


@dataclass(frozen=True)
class ClaimCheck:
    """What checking a claim found: the correct count the proofs show, and every problem."""

    correct: int
    total: int
    problems: tuple[str, ...]
    sampling: object = None  # the records' sampling parameters (one set), what the accuracy is at

    @property
    def ok(self) -> bool:
        return not self.problems


def check_claim(claim: Claim, records: Sequence[Rollout | object], attachments: Sequence[zk.Attachment], model,
                public: Sequence[Task], srs: Sequence[zk.Srs], workdir: Path, *, allow_dev: bool = False) -> ClaimCheck:
    """Re-check a claim from its records and proofs alone (specs/zk.md §9): the model and task
    set it names, the seed it must have used, every record verified (the rewards from the
    proofs), every task answered by exactly one full group signed by the evaluator, and the
    correct count recomputed."""
    from vrl.rollouts.verify import Expectations, verify
    from vrl.tasks import TaskList

    problems = [] if claim.signature_valid() else ["the claim's signature does not verify under its evaluator"]
    if claim.model_hash != model.model_hash:
        problems.append(f"claims model {claim.model_hash.hex()[:16]}, the verifier's is {model.model_hash.hex()[:16]}")
    digest = task_set_digest(public)
    if claim.task_set != digest or claim.tasks != len(public):
        problems.append(f"claims task set {claim.task_set.hex()[:16]} of {claim.tasks} tasks, the given one is "
                        f"{digest.hex()[:16]} of {len(public)}")
    proven = proven_correctness(records, attachments, model.decode, srs, workdir, allow_dev=allow_dev)
    verdicts = verify(records, model, expect=Expectations(tasks=TaskList("evaluation", tuple(public)),
                                                          round_seed=evaluation_seed(claim.model_hash, claim.task_set),
                                                          in_order=True), proven=proven)
    problems += [f"record {v.index}: {v.reason}: {v.message}" for v in verdicts if not v.accepted][:20]
    samplings = {r.sampling for r in records if isinstance(r, Rollout)}
    if len(samplings) > 1:
        problems.append(f"the records were sampled {len(samplings)} ways: an accuracy is at one setting")
    groups: dict[int, int] = {}
    for record in records:
        if isinstance(record, Rollout):
            groups[record.group_index] = groups.get(record.group_index, 0) + 1
            if record.node_id != claim.evaluator or record.group_size != claim.samples:
                problems.append(f"record of task {record.task_id!r}: not the evaluator's, or not a group of "
                                f"{claim.samples}")
                break
    missing = [g for g in range(len(public)) if groups.get(g) != claim.samples]
    if missing:
        problems.append(f"{len(missing)} tasks without a full group of {claim.samples} samples (the first: task "
                        f"{missing[0]})")
    correct = sum(1 for i, shown in proven.items() if shown is True)
    total = sum(isinstance(r, Rollout) for r in records)
    if (claim.correct, claim.total) != (correct, total):
        problems.append(f"claims {claim.correct} of {claim.total} correct; the proofs show {correct} of {total}")
    return ClaimCheck(correct, total, tuple(problems), next(iter(samplings)) if len(samplings) == 1 else None)
