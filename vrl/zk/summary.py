"""What a rollout file's proofs show, as a verifier reports it (``vrl verify``): the rewards
proven by its companion file (specs/zk.md §5) and the tokens proven at challenged positions
by its sampling file (§8.4, §10), each checked against the SRS files the verifier trusts and
summed up in a typed, immutable summary the caller prints."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proofs import zk
from proofs.circuits import ANSWER_MATCH
from vrl.rollouts.model import Model
from vrl.rollouts.record import RecordError, Rollout
from vrl.zk.rewards import proven_correctness, read_attachments, work_directory
from vrl.zk.sampling import PositionCheck, SamplingProofError, check_openings, read_openings


def trusted_srs(srs: Path | None, allow_dev: bool) -> list[zk.Srs]:
    """The SRS files a verifier holds: the user's, and this machine's dev SRS when it is
    allowed or exists (known, so that proofs against it are named as dev ones: zk_dev_srs).
    Raises ZkError for an unreadable file."""
    trusted = [zk.Srs.load(srs)] if srs is not None else []
    if allow_dev or (work_directory() / f"dev-kzg{ANSWER_MATCH.logrows}.srs").exists():
        trusted.append(zk.dev_srs(work_directory(), ANSWER_MATCH.logrows))
    return trusted


@dataclass(frozen=True, slots=True)
class RewardProofs:
    """What a companion file's proofs show about a rollout file's records."""

    file: Path
    attachments: int  # in the file
    proven: int  # records whose proof verified (their answer shown correct or wrong)
    failed: Mapping[str, int]  # zk reason code -> records whose proof failed with it, first seen first
    dev_srs_allowed: bool
    by_record: Mapping[int, bool | str]  # by record index: what verify(proven=) takes

    def to_json(self) -> dict[str, Any]:
        return {"file": str(self.file), "attachments": self.attachments, "dev_srs_allowed": self.dev_srs_allowed,
                "proven": self.proven, "failed": dict(self.failed)}


def check_reward_proofs(path: Path, records: Sequence[Rollout | RecordError], model: Model, *, srs: Path | None,
                        allow_dev: bool) -> RewardProofs:
    """The proofs in the companion file ``path`` checked against ``records`` (``model`` decodes
    their answers), under the SRS ``srs`` names and, when allowed or present, the dev one.
    Raises ZkFileError for an unusable file, ZkError for an unreadable SRS."""
    attachments = read_attachments(path)
    by_record = proven_correctness(records, attachments, model.decode, trusted_srs(srs, allow_dev), work_directory(),
                                   allow_dev=allow_dev)
    failed = Counter(v for v in by_record.values() if isinstance(v, str))
    return RewardProofs(path, len(attachments), sum(isinstance(v, bool) for v in by_record.values()),
                        MappingProxyType(dict(failed)), allow_dev, MappingProxyType(by_record))


@dataclass(frozen=True, slots=True)
class SamplingProofs:
    """What a sampling file's openings show about a rollout file's records."""

    file: Path
    challenge: bytes  # the one the file answers
    challenge_given: bool  # held to the verifier's own; else positions as the file says
    positions: int  # checked
    proven: int
    failed: Mapping[str, int]  # outcome -> positions that failed with it, first seen first
    records_failed: int
    max_margin: float  # the largest by which a proven token lost its race (0: all won), raw logits
    dev_srs_allowed: bool
    checks: tuple[PositionCheck, ...]  # each check's record is its index in the rollout file

    def to_json(self) -> dict[str, Any]:
        return {"file": str(self.file), "challenge": self.challenge.hex(), "challenge_given": self.challenge_given,
                "positions": self.positions, "proven": self.proven, "failed": dict(self.failed),
                "records_failed": self.records_failed, "max_margin": self.max_margin,
                "dev_srs_allowed": self.dev_srs_allowed,
                "checks": [{"record": c.record, "position": c.position, "outcome": str(c.outcome)}
                           for c in self.checks]}


def check_sampling_proofs(path: Path, records: Sequence[Rollout | RecordError], model: Model, *, srs: Path | None,
                          allow_dev: bool, challenge: bytes | None, count: int, drift: float) -> SamplingProofs:
    """The openings in the sampling file ``path`` checked against ``records`` (specs/zk.md
    §8.4): with the ``challenge`` the verifier issued, every one of the ``count`` positions per
    record it picks must be answered, and no other; without it, the file's own challenge holds.
    ``drift`` is the verifier's profile's race margin (check_openings). Raises
    SamplingProofError for an unusable file or another challenge, ZkError for an unreadable SRS."""
    in_file = [i for i, r in enumerate(records) if isinstance(r, Rollout)]  # damaged records have no proofs
    decoded = [r for r in records if isinstance(r, Rollout)]  # the records of in_file, in its order
    issued, openings = read_openings(path)
    if challenge is not None and challenge != issued:
        raise SamplingProofError(f"{path}: answers challenge {issued.hex()[:16]}..., not the one given")
    checks = check_openings(decoded, openings, model, trusted_srs(srs, allow_dev), work_directory(),
                            challenge=challenge, count=count, allow_dev=allow_dev, drift=drift)
    failed = Counter(str(c.outcome) for c in checks if c.outcome != "ok")
    margins = [c.margin for c in checks if c.outcome == "ok"]
    return SamplingProofs(path, issued, challenge is not None, len(checks), len(checks) - sum(failed.values()),
                          MappingProxyType(dict(failed)), len({c.record for c in checks if c.outcome != "ok"}),
                          max(margins, default=0.0), allow_dev,
                          tuple(dataclasses.replace(c, record=in_file[c.record]) for c in checks))
