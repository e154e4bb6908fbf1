"""Private-answer rewards with zk proofs (specs/zk.md §5, §7): task sets whose references are
published only as salted commitments, the answer key that opens them, proofs of a record's
correctness, and the companion files that carry them.

The proofs themselves are :mod:`proofs.zk`'s; this module says what they are about: a record
(its subject is the hash of its bytes), the answer its completion gives (extracted as its
reward spec says) and the task's commitment.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack

from proofs import zk
from proofs.circuits import (
    ANSWER_BYTES, ANSWER_MATCH, CIRCUITS, SALT_BYTES, answer_match_inputs, answer_match_instances, new_salt,
    reference_commitment,
)
from vrl.errors import VrlError
from vrl.rollouts.files import write_bytes_atomic
from vrl.rollouts.record import Rollout
from vrl.tasks import Task
from vrl.tasks.answers import COMMITTED_PREFIX, answer_form, committed_reference

ZK_FILE_FORMAT = "vrl/zk/v1"
#: Attachments in one companion file: one per record of a rollout file, whose records are as many.
MAX_ATTACHMENTS = 65536
#: Lines of an answer key: a task set's size is bounded the same way (vrl/tasks/files.py).
MAX_KEY_LINES = 1_000_000


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
            lines = path.read_text(encoding="utf-8").splitlines()
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
                task_id, form, salt = row["id"], row["form"].encode(), bytes.fromhex(row["salt"])
                if not isinstance(task_id, str) or len(form) > ANSWER_BYTES or len(salt) != SALT_BYTES:
                    raise ValueError(f"an id, a form of at most {ANSWER_BYTES} bytes and a salt of "
                                     f"{SALT_BYTES} bytes (hex)")
            except (ValueError, KeyError, TypeError, AttributeError) as error:
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
    given = rollout.reward_spec.given_form(decode(list(rollout.completion_tokens)))
    if given is None or len(given) > ANSWER_BYTES:
        return None  # scored as not correct, with nothing to prove (specs/zk.md §7)
    return given, commitment


def prove_rewards(rollouts: Sequence[Rollout], key: AnswerKey, decode: Callable[[list[int]], str], srs: zk.Srs,
                  workdir: Path, on_progress: Callable[[int], None] | None = None) -> list[zk.Attachment]:
    """An answer-match proof for every record that needs one (its reference committed, its
    completion giving an answer): the answer holder's side."""
    attachments = []
    for rollout in rollouts:
        needed = _needs_proof(rollout, decode)
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
    correctness, or the zk reason code of the first failure (the last attachment's, when
    several were tried; ``zk_missing`` when none names the record). For ``verify(proven=)``."""
    by_subject: dict[bytes, list[zk.Attachment]] = {}
    for attachment in attachments:
        by_subject.setdefault(attachment.subject, []).append(attachment)
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
            if reason is zk.Reason.OK:
                shown[index] = correct
                break
            shown[index] = reason.value
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
        if path.stat().st_size > limit:
            raise ZkFileError(f"{path}: larger than any companion file ({limit} bytes)")
        data = path.read_bytes()
    except OSError as error:
        raise ZkFileError(f"{path}: cannot read ({error.strerror or error})") from None
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
