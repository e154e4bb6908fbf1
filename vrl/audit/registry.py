"""The audit's checks (specs/audit.md §3), each declared once, in the order they run: its name,
the line ``vrl audit --help`` shows for it, its work estimate (the items it tells its progress
in, for a progress bar) and whether it re-executes models. Each check's module binds its
function to its name (:meth:`Registry.runs`); :class:`vrl.audit.Audit` runs the checks, and
states their work, through :data:`REGISTRY`.

The command line builds ``--check``'s choices and help from this module while it starts, and
``vrl --help`` must not load torch (tests/test_cli.py), so this module imports only the
standard library; what a check needs to run comes with :class:`CheckContext`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proofs.zk import Srs
    from vrl.audit.findings import Finding
    from vrl.audit.index import Progress, Run
    from vrl.audit.models import Models
    from vrl.audit.sources import Inputs


class Tally:
    """What the work estimates read of the inputs, each read once however many checks ask.
    ``draw(key, sample)`` is the audit's draw of the items it re-executes
    (:func:`vrl.audit.checks.sampled`), given here: the checks import this module."""

    def __init__(self, inputs: Inputs, draw: Callable[[bytes, float], bool]) -> None:
        self.inputs, self.draw = inputs, draw

    @functools.cached_property
    def _counts(self) -> list[dict[str, int]]:
        return [node.store.counts() for node in self.inputs.nodes]

    def total(self, table: str) -> int:
        """Rows of ``table`` over every store: what a pass over each store's rows tells."""
        return sum(counts[table] for counts in self._counts)

    def most(self, table: str) -> int:
        """Rows of ``table`` in the fullest store: what the run holds once, as of its best copy."""
        return max((counts[table] for counts in self._counts), default=0)

    @functools.cached_property
    def groups(self) -> frozenset[bytes]:
        """The distinct group digests the stores hold."""
        return frozenset(row[0] for node in self.inputs.nodes for row in node.store.group_headers())

    def drawn(self, sample: float) -> int:
        """The distinct groups an audit at ``sample`` draws."""
        return sum(self.draw(digest, sample) for digest in self.groups)


Estimate = Callable[[Tally, float], int]  # (the inputs' tally, the share re-executed) -> items


@dataclass(frozen=True)
class CheckContext:
    """What a check's function is given: the run the ``signatures`` pass indexed, the findings
    it adds to, whom it tells its progress (``progress(name, items)``), the share it re-executes,
    the models (loaded before a check that re-executes), and the SRS files proofs may be made
    against (the dev one only with ``allow_dev_srs``)."""

    run: Run
    findings: list[Finding]
    progress: Progress
    sample: float
    models: Models | None = None
    srs: Sequence[Srs] = ()
    allow_dev_srs: bool = False

    @property
    def loaded(self) -> Models:
        """The models, for a check declared ``reexecutes``."""
        if self.models is None:
            raise RuntimeError("a check that re-executes is run with the audit's models")
        return self.models


Runner = Callable[[CheckContext], None]


@dataclass(frozen=True)
class AuditCheck:
    """One check's declaration. ``indexes``: the pass that reads the log and builds the run
    every other check reads; it always runs, first, and binds no function here."""

    name: str
    help: str
    work: Estimate
    reexecutes: bool = False
    indexes: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.help.strip():
            raise ValueError(f"a check needs a name and a line of help, got {self.name!r}, {self.help!r}")
        if not callable(self.work):
            raise TypeError(f"check {self.name!r} states no work estimate: its progress bar would have no end")


class Registry:
    """The declared checks, in order, and the function each is run by."""

    def __init__(self) -> None:
        self._checks: dict[str, AuditCheck] = {}
        self._runners: dict[str, Runner] = {}

    def declare(self, name: str, help: str, *, work: Estimate, reexecutes: bool = False,  # noqa: A002 (the CLI's word)
                indexes: bool = False) -> AuditCheck:
        check = AuditCheck(name, help, work, reexecutes, indexes)
        if name in self._checks:
            raise ValueError(f"check {name!r} is declared twice")
        if indexes != (not self._checks):
            raise ValueError(f"check {name!r}: the one pass that indexes the log is declared first")
        self._checks[name] = check
        return check

    def runs(self, *names: str) -> Callable[[Runner], Runner]:
        """Binds the decorated function to the checks ``names`` (several: one pass runs them
        all, and runs once however many of them are chosen)."""

        def bind(function: Runner) -> Runner:
            for name in names:
                check = self._checks.get(name)
                if check is None or check.indexes:
                    raise ValueError(f"{function.__name__} runs {name!r}, which is not a declared check it can run")
                if name in self._runners:
                    raise ValueError(f"check {name!r} is run by {self._runners[name].__name__} already")
                self._runners[name] = function
            return function

        return bind

    def __iter__(self) -> Iterator[AuditCheck]:
        return iter(self._checks.values())

    def __getitem__(self, name: str) -> AuditCheck:
        return self._checks[name]

    def __contains__(self, name: object) -> bool:
        return name in self._checks

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._checks)

    def unknown(self, names: Iterable[str]) -> str | None:
        """Why ``names`` are not all checks (the first that is not), or None."""
        name = next((n for n in names if n not in self._checks), None)
        return None if name is None else f"unknown check {name!r}; choose from {', '.join(self._checks)}"

    def runner(self, name: str) -> Runner:
        return self._runners[name]

    def unbound(self) -> tuple[str, ...]:
        """The declared checks no function runs yet (the indexing pass needs none)."""
        return tuple(c.name for c in self if not c.indexes and c.name not in self._runners)

    def work(self, tally: Tally, sample: float) -> dict[str, int]:
        """Every check's estimate at ``sample``."""
        return {check.name: check.work(tally, sample) for check in self}


#: Every check of an audit (specs/audit.md §3). ``admission`` and ``quarantine`` are one pass
#: over the batches, and tell their progress per policy version.
REGISTRY = Registry()
REGISTRY.declare("signatures", "every stored message's signature, as the log is read (always runs)",
                 work=lambda tally, sample: tally.total("groups"), indexes=True)
REGISTRY.declare("reputation", "each store's reputation snapshot against its own verdict log replayed",
                 work=lambda tally, sample: len(tally.inputs.nodes))
REGISTRY.declare("duplicates", "records replayed, and slots signed twice, across the whole history",
                 work=lambda tally, sample: len(tally.groups))
REGISTRY.declare("lazy_verifiers", "passes on planted groups, race-loss fails their signer's evidence "
                                   "does not support", work=lambda tally, sample: tally.total("verdicts"))
REGISTRY.declare("committees", "every committee claim against its round's manifest, every weights table "
                               "re-derived", work=lambda tally, sample: tally.total("verdicts"))
REGISTRY.declare("admission", "every batch against the admission rules",
                 work=lambda tally, sample: tally.most("policies"))
REGISTRY.declare("quarantine", "no batch trains a node its trainer had quarantined",
                 work=lambda tally, sample: tally.most("policies"))
REGISTRY.declare("groups", "a sample of groups re-verified, and the verdicts on them", reexecutes=True,
                 work=lambda tally, sample: tally.drawn(sample))
REGISTRY.declare("steps", "a sample of training steps replayed", reexecutes=True,
                 work=lambda tally, sample: int(tally.most("policies") * sample) + 1)
REGISTRY.declare("accuracy", "the trainer's held-out accuracy re-measured", reexecutes=True,
                 work=lambda tally, sample: int(tally.most("policies") * sample) + 2)
REGISTRY.declare("evaluation", "held-out claims on private test sets (*.claim.json) re-checked",
                 work=lambda tally, sample: len(tally.inputs.claims))
REGISTRY.declare("sampling", "rollout files' sampling proofs checked",
                 work=lambda tally, sample: len(tally.inputs.rollout_files))
