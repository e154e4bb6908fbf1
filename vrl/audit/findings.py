"""What an audit says: findings, each with a severity, the evidence and one sentence
(specs/audit.md §2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType
from typing import Any


class Severity(IntEnum):
    """How bad a finding is. Ordered, so ``max()`` of a report's findings is its worst."""

    INFO = 0  # worth knowing, proves nothing wrong (e.g. two honest views disagree on timing)
    WARNING = 1  # could not be checked, or suspicious without proof (a missing blob, an unconfirmed fail)
    ERROR = 2  # signed evidence that someone broke the protocol, or that the log is damaged

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    """One thing an audit found. ``check`` is the check's name (:data:`vrl.audit.CHECKS`),
    ``code`` what it found (specs/audit.md §3), ``subject`` the hex id of the node it
    incriminates (empty when it incriminates none, e.g. a damaged store), ``evidence`` the ids,
    rounds and values that let anyone find it again, and ``sentence`` one human sentence."""

    check: str
    code: str
    severity: Severity
    sentence: str
    subject: str = ""
    evidence: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", MappingProxyType(dict(self.evidence)))

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "code": self.code, "severity": str(self.severity), "subject": self.subject,
                "sentence": self.sentence, "evidence": dict(self.evidence)}
