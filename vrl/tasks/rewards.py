"""Reward functions: named, versioned and hashed, so every verifier recomputes the same one
(specs/rewards.md).

A reward spec is a weighted sum of **terms**; a term names a reward function by name and
version (``answer/v1``) and gives every parameter that function declares. The record carries
the whole spec (specs/record.md §1), so a verifier needs nothing else to recompute it, and a
verifier that does not have a term's function, or cannot compute it here
(:class:`RewardUnavailable`), refuses the record (``reward_unknown``) rather than guess. The
built-in functions are defined here; others come from installed packages through the
``vrl.rewards`` entry point group (:func:`registry`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import math
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import msgpack

from vrl.errors import VrlError, shown
from vrl.tasks import gym  # reasoning-gym itself is imported only when a gym task is built or scored
from vrl.tasks.answers import answer_form, answers_match, committed_reference, extract_answer, has_format, parse_number
from vrl.tasks.core import Task

#: A term's identity: ``SHA-256(REWARD_DOMAIN || canonical({"name", "params", "version"}))``.
REWARD_DOMAIN = b"vrl/reward/v1\x00"
#: A whole spec's identity: ``SHA-256(SPEC_DOMAIN || canonical(wire))``, the weights included.
SPEC_DOMAIN = b"vrl/reward-spec/v1\x00"
#: Where installed packages declare their reward functions (importlib.metadata entry points).
ENTRY_POINT_GROUP = "vrl.rewards"
#: Bounds of specs/rewards.md §1: far past any sensible spec (TRL's examples combine 2 to 4
#: reward functions), small enough that a hostile record costs a verifier nothing to decode.
MAX_TERMS = 16
MAX_PARAMS = 16
MAX_PARAM_TEXT_BYTES = 1024
MAX_WEIGHT = 1e6  # as the v2 record's correct/format weights (specs/record.md version history)
MAX_VERSION = (1 << 16) - 1
#: The running interpreter's major.minor version: code/v1's ``python`` default (specs/rewards.md §3.6).
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
#: The exact-answer reward, by name and version: the one term a committed reference's proof
#: covers (specs/rewards.md §4); a plugin's ``answer/v2`` is another function.
ANSWER = ("answer", 1)
NAME = re.compile(r"[a-z][a-z0-9._-]{0,63}", re.ASCII)
PARAM = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)

Param = str | int | float | bool
Params = Mapping[str, Param]


class RewardError(VrlError, ValueError):
    """A reward spec that cannot be used: a malformed term, a parameter of the wrong type or
    range, or a reward this machine does not have (:class:`RewardUnknown`). ``field`` names the
    term and parameter (``reward_spec[1].params.abs_tol``), ``problem`` what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"field {field!r}: {problem}")


class RewardUnknown(RewardError):
    """A term whose reward function (name and version) is not installed here."""


class RewardUnavailable(RewardError):
    """A reward this machine cannot compute, through no fault of the record: an installed
    function that needs what is missing here (another Python version, a platform without the
    code sandbox, no fork, no temporary space). A verifier turns it into ``reward_unknown``,
    never ``reward_mismatch`` (specs/rewards.md §6)."""


@dataclass(frozen=True, slots=True)
class RewardFunction:
    """One reward function: what a package registers under the ``vrl.rewards`` entry point group.

    ``score(task, completion, params)`` must be a pure function of its arguments (no clock, no
    randomness, no files, no network) returning a finite float, so that every verifier gets
    the same float. Changing what it returns for any input is a new ``version``: the version
    is part of the reward's identity and of every record that uses it.
    """

    name: str
    version: int
    #: Every parameter with its default; the default's type is the parameter's type.
    defaults: Mapping[str, Param]
    score: Callable[[Task, str, Params], float]
    #: What is wrong with a full set of parameters, or None (ranges; types are checked already).
    check: Callable[[Params], str | None] = lambda params: None
    #: Reads ``task.answer`` in the clear: impossible for a committed reference (specs/zk.md §7).
    uses_reference: bool = True
    #: A score of 1 means the answer is correct: what an evaluation's accuracy counts.
    checks_answer: bool = False
    #: Runs code the record and its task carry (code/v1): a verifier runs it only under a spec
    #: it names itself, never one a record asserts (specs/rewards.md §6).
    runs_code: bool = False
    summary: str = ""
    #: Why this machine cannot compute the function with these parameters, or None: checked
    #: before any model work, so a verifier says ``reward_unknown`` rather than a wrong score.
    unavailable: Callable[[Params], str | None] = lambda params: None

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and NAME.fullmatch(self.name)):
            raise ValueError(f"a reward name is {NAME.pattern}, got {self.name!r}")
        if not (type(self.version) is int and 1 <= self.version <= MAX_VERSION):
            raise ValueError(f"reward {self.name}: a version is an integer in [1, {MAX_VERSION}], got {self.version!r}")
        for key, value in self.defaults.items():
            if not (isinstance(key, str) and PARAM.fullmatch(key)) or type(value) not in (str, int, float, bool):
                raise ValueError(f"reward {self.name}: parameter {key!r} must be named {PARAM.pattern} with a "
                                 f"str, int, float or bool default")

    @property
    def id(self) -> str:
        return f"{self.name}/v{self.version}"


# -- terms and specs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RewardTerm:
    """``weight`` times the reward function ``name/v{version}`` with ``params`` (sorted pairs)."""

    name: str
    version: int
    weight: float
    params: tuple[tuple[str, Param], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.name}/v{self.version}"

    def param(self, key: str) -> Param:
        return dict(self.params)[key]

    def function(self) -> RewardFunction:
        """This term's reward function; :class:`RewardUnknown` when it is not installed."""
        found = registry().get((self.name, self.version))
        if found is None:
            raise RewardUnknown("reward_spec", f"reward {self.id} is not installed here ({_installed()}); "
                                               "a verifier refuses what it cannot recompute")
        return found

    def identity(self) -> bytes:
        """The reward function's identity with these parameters (the weight is not part of it)."""
        wire = {"name": self.name, "params": dict(self.params), "version": self.version}
        return hashlib.sha256(REWARD_DOMAIN + canonical_bytes(wire)).digest()

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params), "version": self.version, "weight": float(self.weight)}

    def __str__(self) -> str:
        params = ",".join(f"{k}={_show(v)}" for k, v in self.params)
        return f"{self.id}:{self.weight:g}" + (f":{params}" if params else "")


def canonical_bytes(value: Any) -> bytes:
    """specs/record.md §2's canonical msgpack of a spec's values (maps with str keys, arrays,
    str, int, float64, bool): what vrl.rollouts.codec writes for the record, here for the
    identities, since this layer sits below that one (tests/test_layout.py)."""
    def ordered(item: Any) -> Any:
        if isinstance(item, dict):
            return {key: ordered(item[key]) for key in sorted(item)}  # UTF-8 order is code-point order
        return [ordered(v) for v in item] if isinstance(item, list) else item
    packed: bytes = msgpack.packb(ordered(value), use_bin_type=True, use_single_float=False, strict_types=True)
    return packed


def _show(value: Param) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True, slots=True)
class RewardSpec:
    """A reward: ``sum(term.weight * term's score)`` over the terms, in order (specs/rewards.md §2).

    The default is the exact-answer reward alone, the bare answer read without a tag: what
    the arithmetic tasks use (specs/tasks.md §3).
    """

    terms: tuple[RewardTerm, ...] = field(default_factory=lambda: (term("answer/v1"),))

    def __post_init__(self) -> None:
        _check_terms(self.terms)

    # -- identity and wire --------------------------------------------------------------------
    def to_wire(self) -> list[dict[str, Any]]:
        return [t.to_wire() for t in self.terms]

    @classmethod
    def from_wire(cls, wire: Any, field_name: str = "reward_spec") -> RewardSpec:
        """Decode a record's ``reward_spec``; any value is a spec or a :class:`RewardError`
        naming the field. A term whose function is not installed decodes (a verifier refuses
        it later, by name); an installed one's parameters must be exactly its own."""
        if not isinstance(wire, list):
            raise RewardError(field_name, f"expected an array of terms, got {type(wire).__name__}")
        if len(wire) > MAX_TERMS:
            raise RewardError(field_name, f"{len(wire)} terms exceeds the limit of {MAX_TERMS}")
        return cls(tuple(_term_from_wire(item, f"{field_name}[{i}]") for i, item in enumerate(wire)))

    def digest(self) -> bytes:
        """The spec's identity: what a policy announcement or a log names it by."""
        return hashlib.sha256(SPEC_DOMAIN + canonical_bytes(self.to_wire())).digest()

    def __str__(self) -> str:
        return " + ".join(map(str, self.terms)) or "0"

    # -- the v2 record's form (correct, format, tag) --------------------------------------------
    @classmethod
    def legacy(cls, correct: float, format: float = 0.0, tag: str = "") -> RewardSpec:
        """The v2 record's ``(correct, format, tag)``: the exact-answer term weighted
        ``correct``, plus the format term weighted ``format`` when it is positive."""
        for name, value in (("correct", correct), ("format", format)):
            if not (isinstance(value, float | int) and not isinstance(value, bool) and 0.0 <= value <= MAX_WEIGHT):
                raise RewardError(f"reward_spec.{name}", f"must be a number in [0, 1e6], got {shown(value)}")
        if format and not tag:
            raise RewardError("reward_spec.format", "needs reward_spec.tag: the format reward checks the answer tag")
        terms = [term("answer/v1", float(correct), tag=tag)]
        if format:
            terms.append(term("format/v1", float(format), tag=tag))
        return cls(tuple(terms))

    def as_legacy(self) -> tuple[float, float, str] | None:
        """``(correct, format, tag)`` when this spec is one a v2 record can state, else None."""
        ids = [t.id for t in self.terms]
        if ids not in (["answer/v1"], ["answer/v1", "format/v1"]):
            return None
        answer, *rest = self.terms
        tag = answer.param("tag")
        if not isinstance(tag, str) or not 0.0 <= answer.weight <= MAX_WEIGHT:
            return None
        if rest and (rest[0].param("tag") != tag or not 0.0 < rest[0].weight <= MAX_WEIGHT):
            return None
        return answer.weight, rest[0].weight if rest else 0.0, tag

    # -- computing ----------------------------------------------------------------------------
    def unknown(self) -> list[str]:
        """The terms' rewards this machine does not have, as ``name/vN``."""
        return [t.id for t in self.terms if (t.name, t.version) not in registry()]

    def unavailable(self) -> list[str]:
        """Why this machine cannot compute installed terms with their parameters, one line
        each (``code/v1: ...``): empty when it can compute every installed term."""
        found = []
        for t in self.terms:
            function = registry().get((t.name, t.version))
            if function is not None and (problem := _guarded(t, function.unavailable, dict(t.params))):
                found.append(f"{t.id}: {problem}")
        return found

    def runs_code(self) -> list[str]:
        """The terms whose rewards run code the record and its task carry, as ``name/vN``."""
        known = registry()
        return [t.id for t in self.terms if (t.name, t.version) in known and known[t.name, t.version].runs_code]

    def reward(self, task: Task, completion: str) -> float:
        """The reward of ``completion`` for ``task``. A committed reference is a ValueError: its
        correctness is proven with the answer key (specs/zk.md §7), not recomputed."""
        _refuse_committed(task)
        return _total((t.weight, _score(t, task, completion)) for t in self.terms)

    def is_correct(self, task: Task, completion: str) -> bool:
        """Whether every answer-checking term (exact, numeric, choice, code) scores 1: an
        evaluation's accuracy. False for a spec without one."""
        _refuse_committed(task)
        checking = [t for t in self.terms if t.function().checks_answer]
        return bool(checking) and all(_score(t, task, completion) >= 1.0 for t in checking)

    # -- committed references (specs/zk.md §7, §11) --------------------------------------------
    def provable(self) -> str | None:
        """Why a committed reference cannot be rewarded with this spec, or None: only the
        exact-answer term's correctness can be proven; a term that reads the reference in the
        clear (numeric, choice, code) cannot be computed without it."""
        clear = [t.id for t in self.terms if (t.name, t.version) != ANSWER and t.function().uses_reference]
        if clear:
            return (f"reward {', '.join(clear)} needs the reference in the clear, which a committed (zk:) reference "
                    "hides; only answer/v1's correctness can be proven (specs/rewards.md §4)")
        return None

    def reward_given(self, correct: bool, completion: str) -> float:
        """The reward of a completion whose exact-answer correctness is known (proven, or
        assumed false): the ``answer`` term scores ``correct``, the others (format, length)
        are computed. A term that needs the reference in the clear is a :class:`RewardError`."""
        if problem := self.provable():
            raise RewardError("reward_spec", problem)
        no_reference = Task("", "", "")
        return _total((t.weight, float(correct) if (t.name, t.version) == ANSWER
                       else _score(t, no_reference, completion)) for t in self.terms)

    def public_reward(self, task: Task, completion: str) -> float:
        """The reward anyone can compute: :meth:`reward` for an ordinary reference; for a
        committed one, the reward of an answer not proven correct, which is all a producer
        without the answer key can claim (specs/zk.md §11)."""
        if committed_reference(task.answer) is not None:
            return self.reward_given(False, completion)
        return self.reward(task, completion)

    def given_form(self, completion: str) -> bytes | None:
        """The form (:func:`~vrl.tasks.answers.answer_form`) of the answer the completion gives
        as the exact-answer term reads it; None when it gives none, or the spec has no such
        term: what a private reference's proof compares."""
        answer = next((t for t in self.terms if (t.name, t.version) == ANSWER), None)
        given = None if answer is None else extract_answer(completion, str(answer.param("tag")) or None)
        return None if given is None else answer_form(given)


def _refuse_committed(task: Task) -> None:
    if committed_reference(task.answer) is not None:
        # Compared as text, a committed reference would match a completion that quotes it.
        raise ValueError(f"task {shown(task.id)} has a committed reference: its correctness is proven "
                         "with the answer key (specs/zk.md §7), not recomputed")


def _score(t: RewardTerm, task: Task, completion: str) -> float:
    function = t.function()
    try:
        value = function.score(task, completion, dict(t.params))
    except RewardUnavailable as error:  # this machine's limitation, not the record's fault
        raise RewardUnavailable("reward_spec", f"reward {t.id} is not computable here: {error.problem}") from None
    except Exception as error:  # an installed function's bug, on one completion: named, never a crash
        raise RewardError("reward_spec", f"reward {t.id} failed: {type(error).__name__}: {error}") from None
    if type(value) is not float or not math.isfinite(value):
        # A third-party function's bug must not become a float that differs between verifiers.
        raise RewardError("reward_spec", f"reward {t.id} returned {shown(value)}, not a finite float")
    return value


def _total(weighted: Iterable[tuple[float, float]]) -> float:
    """``0.0 + w0*s0 + w1*s1 + ...`` in term order: float addition is not associative, so the
    order is part of the spec (specs/rewards.md §2)."""
    total = 0.0
    for weight, score in weighted:
        total += weight * score
    if not math.isfinite(total):
        raise RewardError("reward_spec", f"the weighted sum is {total}, not finite")
    return total


def _check_terms(terms: tuple[RewardTerm, ...]) -> None:
    if not isinstance(terms, tuple) or not all(isinstance(t, RewardTerm) for t in terms):
        raise RewardError("reward_spec", "expected a tuple of RewardTerm")
    if len(terms) > MAX_TERMS:
        raise RewardError("reward_spec", f"{len(terms)} terms exceeds the limit of {MAX_TERMS}")
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise RewardError("reward_spec", f"reward {twice} appears twice: a spec names each reward once")


def _term_from_wire(item: Any, where: str) -> RewardTerm:
    if not isinstance(item, dict):
        raise RewardError(where, f"expected a map, got {type(item).__name__}")
    if set(item) != {"name", "params", "version", "weight"}:
        extra = sorted(map(repr, set(item) ^ {"name", "params", "version", "weight"}))
        raise RewardError(where, f"a term has exactly the keys name, params, version, weight ({extra[0]} is not so)")
    name, version, weight, params = item["name"], item["version"], item["weight"], item["params"]
    if not (isinstance(name, str) and NAME.fullmatch(name)):
        raise RewardError(f"{where}.name", f"a reward name is {NAME.pattern}")
    if not (type(version) is int and 1 <= version <= MAX_VERSION):
        raise RewardError(f"{where}.version", f"expected an integer in [1, {MAX_VERSION}]")
    if type(weight) is not float or not math.isfinite(weight) or abs(weight) > MAX_WEIGHT:
        raise RewardError(f"{where}.weight", f"expected a finite float64 in [-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}]")
    if not isinstance(params, dict) or len(params) > MAX_PARAMS:
        raise RewardError(f"{where}.params", f"expected a map of at most {MAX_PARAMS} parameters")
    for key, value in params.items():
        if not (isinstance(key, str) and PARAM.fullmatch(key)):
            raise RewardError(f"{where}.params", f"a parameter name is {PARAM.pattern}, got {str(key)[:40]!r}")
        if not _param_value_ok(value):
            raise RewardError(f"{where}.params.{key}", _PARAM_VALUE_PROBLEM)
    made = RewardTerm(name, version, weight, tuple(sorted(params.items())))
    if (name, version) in registry():
        _check_params(registry()[(name, version)], made.params, where)
    return made


_PARAM_VALUE_PROBLEM = "expected a str (<= 1024 bytes), an int64, a finite float64 or a bool"


def _param_value_ok(value: Any) -> bool:
    if type(value) is str:
        return len(value.encode("utf-8", "surrogatepass")) <= MAX_PARAM_TEXT_BYTES
    if type(value) is int:
        return -(1 << 63) <= value < 1 << 63
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is bool


def _check_params(function: RewardFunction, params: tuple[tuple[str, Param], ...], where: str) -> None:
    """The record decoder's rules for an installed function's parameters, applied wherever a
    term is made (decoded, :func:`term`, :func:`parse_term`), so no term is made here that a
    record could not carry."""
    given = dict(params)
    if set(given) != set(function.defaults):
        differ = sorted(set(given) ^ set(function.defaults))[0]
        expected = ", ".join(sorted(function.defaults)) or "(none)"
        raise RewardError(f"{where}.params",
                          f"{function.id} has exactly the parameters {expected}; {shown(differ)} is not so")
    for key, value in given.items():
        if type(value) is not type(function.defaults[key]):
            raise RewardError(f"{where}.params.{key}", f"expected {type(function.defaults[key]).__name__}, "
                                                       f"got {type(value).__name__}")
        if not _param_value_ok(value):
            raise RewardError(f"{where}.params.{key}", _PARAM_VALUE_PROBLEM)
        if type(value) is str:
            try:
                value.encode()
            except UnicodeEncodeError:
                raise RewardError(f"{where}.params.{key}", "not valid Unicode text") from None
    if problem := _guarded(RewardTerm(function.name, function.version, 0.0, params), function.check, given):
        raise RewardError(f"{where}.params", f"{function.id}: {problem}")


def _guarded(t: RewardTerm, check: Callable[[Params], str | None], params: Params) -> str | None:
    """An installed function's ``check`` or ``unavailable``: what raises is a problem named by
    the term, so a decoder still raises only its own error."""
    try:
        problem = check(params)
    except Exception as error:
        return f"{t.id}'s {getattr(check, '__name__', 'check')} raised {type(error).__name__}: {error}"
    if problem is not None and not isinstance(problem, str):
        return f"{t.id}'s {getattr(check, '__name__', 'check')} returned {type(problem).__name__}, not a str or None"
    return problem


# -- making terms (code, the CLI, configs) -------------------------------------------------------


def term(reference: str, weight: float = 1.0, **params: Param) -> RewardTerm:
    """The term of the installed reward ``name`` or ``name/vN`` (the newest version when none
    is given) with ``params`` over its defaults; a :class:`RewardError` names what is wrong."""
    function = _lookup(reference)
    unknown = sorted(set(params) - set(function.defaults))
    if unknown:
        raise RewardError("reward_spec", f"{function.id} has no parameter {shown(unknown[0])} (it has "
                                         f"{', '.join(sorted(function.defaults)) or 'none'})")
    merged = {**function.defaults, **{k: float(v) if type(function.defaults[k]) is float and type(v) is int else v
                                      for k, v in params.items()}}
    if isinstance(weight, int) and not isinstance(weight, bool):
        weight = float(weight)
    if type(weight) is not float or not math.isfinite(weight) or abs(weight) > MAX_WEIGHT:
        raise RewardError("reward_spec",
                          f"{function.id}: a weight is a finite number in [-1e6, 1e6], got {shown(weight)}")
    made = RewardTerm(function.name, function.version, weight, tuple(sorted(merged.items())))
    _check_params(function, made.params, function.id)
    return made


def _lookup(reference: str) -> RewardFunction:
    name, _, version = reference.partition("/v")
    installed = registry()
    if version:
        if not version.isdigit() or (name, int(version)) not in installed:
            raise RewardUnknown("reward_spec", f"reward {reference} is not installed here ({_installed()})")
        return installed[(name, int(version))]
    versions = [v for n, v in installed if n == name]
    if not versions:
        raise RewardUnknown("reward_spec", f"no reward named {shown(name)} is installed here ({_installed()})")
    return installed[(name, max(versions))]


def parse_term(text: str) -> RewardTerm:
    """A term from its text form ``NAME[/vN][:WEIGHT][:KEY=VALUE,...]``, e.g. ``answer``,
    ``format:0.1``, ``numeric:abs_tol=0.01`` or ``choice/v1:2:choices=ABCDE,tag=answer``
    (specs/rewards.md §5). Values take the parameter's type (``true``/``false`` for a bool)."""
    reference, *parts = text.strip().split(":")
    weight, params = 1.0, {}
    for part in parts:
        if "=" not in part:
            try:
                weight = float(part)
            except ValueError:
                raise RewardError("reward", f"{text!r}: {part!r} is neither a weight nor KEY=VALUE") from None
            continue
        for pair in part.split(","):
            key, _, value = pair.partition("=")
            params[key.strip()] = value.strip()
    function = _lookup(reference)
    typed = {}
    for key, value in params.items():
        if key not in function.defaults:
            raise RewardError("reward", f"{text!r}: {function.id} has no parameter {key!r} "
                                        f"(it has {', '.join(sorted(function.defaults)) or 'none'})")
        typed[key] = _typed(text, key, value, type(function.defaults[key]))
    try:
        return term(function.id, weight, **typed)
    except RewardError as error:
        raise RewardError("reward", f"{text!r}: {error.problem}") from None


def _typed(text: str, key: str, value: str, kind: type) -> Param:
    try:
        if kind is bool:
            if value not in ("true", "false"):
                raise ValueError
            return value == "true"
        made: Param = kind(value)  # kind is a default's type: str, int or float
        return made
    except ValueError:
        raise RewardError("reward", f"{text!r}: {key}={value!r} is not a {kind.__name__}") from None


def parse_spec(texts: Iterable[str]) -> RewardSpec:
    """A spec from term texts (``--reward`` flags, a config's ``reward`` array)."""
    return RewardSpec(tuple(parse_term(t) for t in texts))


def term_problem(text: str) -> str | None:
    """What is wrong with one term's text, or None (config field metadata)."""
    try:
        parse_term(text)
    except RewardError as error:
        return error.problem
    return None


# -- the registry --------------------------------------------------------------------------------


def _installed() -> str:
    return "installed: " + ", ".join(f"{n}/v{v}" for n, v in sorted(registry()))


@functools.cache
def registry() -> dict[tuple[str, int], RewardFunction]:
    """Every reward function here: the built-ins, then each one an installed package declares
    in the ``vrl.rewards`` entry point group (its object is a :class:`RewardFunction`). A
    package's function never replaces a built-in or another package's of the same name and
    version: such a clash is refused when the registry is first built, naming both.

    Cached: entry points are read once per process (call ``registry.cache_clear()`` after
    installing a package into a running one)."""
    found: dict[tuple[str, int], RewardFunction] = {(f.name, f.version): f for f in BUILT_IN + LIBRARY_BACKED}
    origin = {key: "vrl" for key in found}
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, p.value)):
        where = f"entry point {point.name} = {point.value}"
        try:
            function = point.load()
        except Exception as error:  # a broken plugin is named, never a traceback in a verifier
            raise RewardError("reward", f"{where} does not load: {type(error).__name__}: {error}") from None
        if not isinstance(function, RewardFunction):
            raise RewardError("reward",
                              f"{where} is a {type(function).__name__}, not a vrl.tasks.rewards.RewardFunction")
        key = (function.name, function.version)
        if key in found:
            raise RewardError("reward", f"{where} defines {function.id}, which {origin[key]} already defines")
        found[key], origin[key] = function, where
    return found


# -- the built-in rewards (specs/rewards.md §3) ------------------------------------------------

_TAG_PROBLEM = "tag must be empty or an identifier of at most 32 characters"


def _tag_ok(tag: str, required: bool = False) -> bool:
    return len(tag) <= 32 and (tag.isidentifier() or not required and tag == "")


def _answer(task: Task, completion: str, params: Params) -> float:
    return float(answers_match(extract_answer(completion, str(params["tag"]) or None), task.answer))


def _numeric(task: Task, completion: str, params: Params) -> float:
    given = extract_answer(completion, str(params["tag"]) or None)
    value, expected = None if given is None else parse_number(given), parse_number(task.answer)
    if value is None or expected is None:
        return 0.0
    # Exact rationals, no rounding anywhere; a float64 tolerance counts as the shortest decimal
    # that reads back as it (repr), so abs_tol = 0.3 is 3/10, not 0.29999999999999998889...
    bound = max(Fraction(repr(params["abs_tol"])), Fraction(repr(params["rel_tol"])) * abs(expected))
    return float(abs(value - expected) <= bound)


def _check_numeric(params: Params) -> str | None:
    if not _tag_ok(str(params["tag"])):
        return _TAG_PROBLEM
    # Each parameter has its default's type here (checked before a check runs): float() is the identity.
    if not (0.0 <= float(params["abs_tol"]) <= MAX_WEIGHT and 0.0 <= float(params["rel_tol"]) <= MAX_WEIGHT):
        return "abs_tol and rel_tol must be in [0, 1e6]"
    return None


_CHOICE_TEXT = re.compile(r"\(?([A-Z])\)?\.?", re.ASCII)
_CHOICE_TOKEN = re.compile(r"(?<![A-Za-z0-9])([A-Z])(?![A-Za-z0-9])", re.ASCII)


def _letter(text: str) -> str | None:
    match = _CHOICE_TEXT.fullmatch(" ".join(unicodedata.normalize("NFKC", text).split()))
    return match[1] if match else None


def _choice(task: Task, completion: str, params: Params) -> float:
    choices, tag = str(params["choices"]), str(params["tag"])
    if tag:
        given = extract_answer(completion, tag)
        letter = None if given is None else _letter(given)
    else:
        letters = [m for m in _CHOICE_TOKEN.findall(unicodedata.normalize("NFKC", completion)) if m in choices]
        letter = letters[-1] if letters else None
    return float(letter is not None and letter in choices and letter == _letter(task.answer))


def _check_choice(params: Params) -> str | None:
    choices = str(params["choices"])
    if not (2 <= len(choices) <= 26 and choices.isascii() and choices.isupper() and choices.isalpha()
            and len(set(choices)) == len(choices)):
        return f"choices must be 2 to 26 distinct uppercase letters, got {choices!r}"
    return None if _tag_ok(str(params["tag"])) else _TAG_PROBLEM


def _format(task: Task, completion: str, params: Params) -> float:
    return float(has_format(completion, str(params["tag"])))


def _length_penalty(task: Task, completion: str, params: Params) -> float:
    over = len(completion) - int(params["free"])
    return 0.0 if over <= 0 else -(min(over, int(params["span"])) / int(params["span"]))


def _check_length(params: Params) -> str | None:
    if not (0 <= int(params["free"]) <= 1 << 20 and 1 <= int(params["span"]) <= 1 << 20):  # ints, as above
        return "free must be in [0, 2^20] and span in [1, 2^20] characters"
    return None


def _code(task: Task, completion: str, params: Params) -> float:
    from vrl.tasks.sandbox import (  # the subprocess machinery, only where code is rewarded
        SandboxUnavailable,
        code_reward,
    )

    if params["python"] != PYTHON:
        raise RewardUnavailable("reward_spec", _other_python(params))
    try:
        return code_reward(completion, task.answer, params)
    except SandboxUnavailable as error:
        raise RewardUnavailable("reward_spec", str(error)) from None


def _check_code(params: Params) -> str | None:
    from vrl.tasks.sandbox import limits_problem

    return limits_problem(params)


def _code_unavailable(params: Params) -> str | None:
    """code/v1 runs only under the Python minor version it names, in the sandbox's namespaces
    (specs/rewards.md §3.6)."""
    from vrl.tasks.sandbox import sandbox_problem

    return _other_python(params) if params["python"] != PYTHON else sandbox_problem()


def _other_python(params: Params) -> str:
    return (f"it runs under Python {params['python']}, this verifier has {PYTHON}: "
            "a code reward is computed only under the Python it names")


BUILT_IN: tuple[RewardFunction, ...] = (
    RewardFunction("answer", 1, {"tag": ""}, _answer, lambda p: None if _tag_ok(str(p["tag"])) else _TAG_PROBLEM,
                   checks_answer=True, summary="1 when the answer equals the reference (as numbers, else as text)"),
    RewardFunction("numeric", 1, {"tag": "", "abs_tol": 0.0, "rel_tol": 0.0}, _numeric, _check_numeric,
                   checks_answer=True, summary="1 when the number is within max(abs_tol, rel_tol*|reference|)"),
    RewardFunction("choice", 1, {"tag": "", "choices": "ABCD"}, _choice, _check_choice, checks_answer=True,
                   summary="1 when the chosen letter is the reference's"),
    RewardFunction("format", 1, {"tag": "answer"}, _format,
                   lambda p: None if _tag_ok(str(p["tag"]), required=True) else "tag must be a short identifier",
                   uses_reference=False, summary="1 for exactly one <tag>number</tag> at the end"),
    RewardFunction("length-penalty", 1, {"free": 512, "span": 512}, _length_penalty, _check_length,
                   uses_reference=False, summary="-min(1, max(0, chars - free) / span)"),
    RewardFunction("code", 1, {"time_ms": 5000, "memory_mb": 512, "python": PYTHON}, _code, _check_code,
                   checks_answer=True, runs_code=True, unavailable=_code_unavailable,
                   summary="1 when the completion's last ```python block passes the reference's tests"),
)


# -- rewards a pinned library scores (specs/rewards.md §3.7) -------------------------------------


def _gym(task: Task, completion: str, params: Params) -> float:
    try:
        return gym.score(task, completion, str(params["tag"]))
    except gym.GymUnavailable as error:  # another release of the library, or none: this machine cannot tell
        raise RewardUnavailable("reward_spec", str(error)) from None


#: Built in, scored by a pinned library; their vectors need a whole task: specs/vectors/gym.json.
LIBRARY_BACKED: tuple[RewardFunction, ...] = (
    RewardFunction("gym", 1, {"tag": "answer", "library": gym.VETTED}, _gym, gym.check_params, checks_answer=True,
                   unavailable=gym.params_unavailable,
                   summary="reasoning-gym's own score_answer of the <tag> answer, for the entry the task id names"),
)
