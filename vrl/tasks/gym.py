"""reasoning-gym task sets (specs/tasks.md §6): the procedural, verifiable tasks RL Swarm and
SAPO train on, offline, with their rewards recomputed by every verifier.

``gym:chain_sum:min_terms=2`` names reasoning-gym's ``chain_sum`` dataset with one config key
set; ``gym:chain_sum+leg_counting`` mixes two, task by task. Task ``index`` is the one entry of
the dataset built with a seed hashed from the part's canonical name and the index, so a machine
builds the same problem from the same index with no shared state, and nothing is materialised
beyond that one entry. A task's id names the library version, the part and the index
(``gym/0.1.25/chain_sum:min_terms=2/000000000000002a``): that is all the ``gym/v1`` reward
needs to build the entry again and score a completion with the dataset's own ``score_answer``.

reasoning-gym is imported only when a gym spec is opened or a gym reward computed: importing it
builds every dataset module, seconds of work no other task set should pay.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import hashlib
import importlib.metadata
import math
import numbers
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from vrl.errors import VrlError, shown
from vrl.tasks.answers import extract_answer
from vrl.tasks.core import MAX_TASK_ID_BYTES, Task, oversized

#: The distribution's name, as pyproject.toml's dependency names it and importlib.metadata reads it.
LIBRARY = "reasoning-gym"
#: The one version whose datasets vrl has vetted (the lists below were measured on it) and the
#: one pyproject.toml pins: a task's text and its score are the library's, so another version
#: is refused rather than trusted to make the same problems.
VETTED = "0.1.25"
PREFIX = "gym"
#: Seeds of a part's entries and the choice of part in a mix: SHA-256 under these tags (specs/README.md).
SEED_DOMAIN = b"vrl/gym-seed/v1\x00"
MIX_DOMAIN = b"vrl/gym-mix/v1\x00"
#: The most datasets one spec mixes, as many as a reward spec's terms (rewards.py MAX_TERMS): far
#: past the handful a curriculum mixes, and a bound on what one config string makes a node parse.
MAX_PARTS = 16
#: Seeds are u32: several datasets hand the seed to numpy (pool_matrix: "Seed must be between 0
#: and 2**32 - 1"), and Python's random takes any int, so 32 bits suit every dataset.
SEED_BYTES = 4
#: An answer longer than this many characters, or than twice its reference, whichever is more,
#: scores 0.0 without reaching the dataset's scorer, whose time on a hostile answer is bounded
#: only by its length. The longest reference of an offered dataset at its default config is
#: 4,063 characters (tower_of_hanoi's moves; 20 seeds of each dataset measured on 0.1.25), so
#: about twice that; a config that makes longer references is covered by the factor of two.
MIN_ANSWER_LIMIT = 8192
#: Entries kept built: a group's samples and its verifier score the same task, and a node
#: re-draws a handful per group; building one costs up to a second (arc_agi reads its JSON).
ENTRY_CACHE = 256

#: Datasets vrl refuses, each with the reason a verifier cannot trust it (measured on VETTED).
#: Scorers that evaluate the completion's answer as Python, directly (``eval``, ``exec``) or
#: through sympy's ``parse_expr`` (which calls ``eval``): a hostile completion would run code
#: in every verifier. Found by reading each ``score_answer`` of reasoning-gym 0.1.25.
EVALUATES_ANSWERS = frozenset({
    "binary_matrix", "codeio", "countdown", "intermediate_integration", "n_queens", "polynomial_multiplication",
    "puzzle24", "simple_integration", "spiral_matrix", "string_insertion",
})
#: Datasets whose entry for a seed differs between processes (they read the string hash seed,
#: or the global random state): each dataset's entries for 20 seeds (question, answer, metadata
#: and the reference's score) built in two processes, PYTHONHASHSEED 0 and 4242, global
#: ``random`` and ``numpy.random`` seeded 1 and 77, the datasets in opposite orders, on 0.1.25.
#: What only other configs or rarer seeds reach is not covered by that measurement.
NOT_DETERMINISTIC = frozenset({
    "codeio", "intermediate_integration", "isomorphic_strings", "knight_swap", "list_functions",
    "polynomial_multiplication", "ransom_note", "word_ladder",
})
#: Datasets whose scorer gives full marks to wrong answers: game_of_life_halting compares
#: ``bool(answer) == bool(reference)``, so any non-empty answer scores 1.0. Found by scoring the
#: answer "zzz" on 3 tasks of every offered dataset of 0.1.25 (the others score it below 0.3).
SCORES_ANY_ANSWER = frozenset({"game_of_life_halting"})
#: reasoning-gym's own mixer: a gym spec mixes datasets itself (``a+b``), by a hash of the index.
NOT_OFFERED = frozenset({"composite"})

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
_KEY = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)
_TEXT = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
_INT = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_FLOAT = re.compile(r"-?(?:[0-9]{1,18}(?:\.[0-9]{1,18})?|\.[0-9]{1,18})", re.ASCII)
_RELEASE = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}", re.ASCII)
_ID = re.compile(r"gym/([0-9A-Za-z.+-]{1,32})/([^/]{1,200})/([0-9a-f]{16})", re.ASCII)
#: Keys a spec never sets: vrl derives the seed from the index and builds one entry at a time.
_OURS = frozenset({"seed", "size"})

Value = int | float | bool | str


class GymError(VrlError, ValueError):
    """A gym task spec, or a gym task id, that cannot be used; the message names the part and key."""


class GymUnavailable(GymError):
    """reasoning-gym is missing here, or is not the version vrl vetted (VETTED) or a task names:
    this machine cannot build the task, through no fault of the task."""


class _Dataset(Protocol):
    """What vrl uses of a reasoning_gym.dataset.ProceduralDataset."""

    def __getitem__(self, index: int) -> dict[str, Any]: ...

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float: ...


@functools.cache
def installed() -> str | None:
    """The installed reasoning-gym's version (its distribution metadata, no import), or None.
    Read once a process: every task built asks."""
    try:
        return importlib.metadata.version(LIBRARY)
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable() -> str | None:
    """Why this machine cannot build gym tasks, or None."""
    have = installed()
    if have is None:
        return f"{LIBRARY} is not installed (pip install '{LIBRARY}=={VETTED}')"
    if have != VETTED:
        return (f"{LIBRARY} {have} is installed; vrl's gym tasks are vetted on {VETTED} only (its problems and "
                f"scores are the library's, so another version may make others)")
    return None


def _registry() -> Mapping[str, tuple[type, type]]:
    """reasoning-gym's datasets, by name: (dataset class, config class)."""
    if problem := unavailable():
        raise GymUnavailable(f"gym tasks: {problem}")
    from reasoning_gym.factory import DATASETS  # type: ignore[import-untyped]  # untyped; imported only here

    return cast(Mapping[str, tuple[type, type]], DATASETS)


# -- parts: one dataset with its config ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Part:
    """One reasoning-gym dataset with the config keys a spec sets (sorted, canonical values)."""

    dataset: str
    config: tuple[tuple[str, Value], ...] = ()

    @property
    def name(self) -> str:
        """``dataset[:key=value,...]``, keys sorted and values canonical: what seeds and ids use."""
        settings = ",".join(f"{key}={_canonical(value)}" for key, value in self.config)
        return self.dataset + (f":{settings}" if settings else "")

    def seed(self, index: int) -> int:
        """``u32be(SHA-256(SEED_DOMAIN || utf8(name) || u64be(index))[0:4])`` (specs/tasks.md §6)."""
        digest = hashlib.sha256(SEED_DOMAIN + self.name.encode() + index.to_bytes(8, "big")).digest()
        return int.from_bytes(digest[:SEED_BYTES], "big")

    def task_id(self, index: int) -> str:
        return f"{PREFIX}/{VETTED}/{self.name}/{index:016x}"

    def built(self, index: int) -> tuple[_Dataset, dict[str, Any]]:
        """The dataset made for ``index`` and its one entry (cached: building is pure)."""
        return _build(self.dataset, self.config, self.seed(index))

    def task(self, index: int) -> Task:
        _, entry = self.built(index)
        question = entry.get("question")
        if not isinstance(question, str) or not question:
            raise GymError(f"gym {self.name}: entry {index} has no question text")
        # Some datasets have many right answers and no single reference (answer None): gym/v1
        # scores those through the dataset's own scorer, which needs none.
        task = Task(id=self.task_id(index), prompt=prompt_text(question), answer=reference(entry))
        if problem := oversized(task):
            raise GymError(f"gym {self.name}: task {index}: {problem}")
        return task


@functools.lru_cache(maxsize=ENTRY_CACHE)
def _build(dataset: str, config: tuple[tuple[str, Value], ...], seed: int) -> tuple[_Dataset, dict[str, Any]]:
    """A fresh dataset of one entry, seeded ``seed``, and that entry. Fresh each time (no
    dataset object is reused across indices), so no state one entry leaves can change the next."""
    dataset_class, config_class = _registry()[dataset]
    try:
        made = config_class(**dict(config), seed=seed, size=1)
        built = cast(_Dataset, dataset_class(config=made))
        entry = built[0]
    except Exception as error:  # the library's own failure on one seed: named, deterministic
        raise GymError(f"gym {dataset}: building the entry of seed {seed} raised {type(error).__name__}: "
                       f"{shown(str(error))}") from None
    if not isinstance(entry, dict):
        raise GymError(f"gym {dataset}: an entry is a {type(entry).__name__}, not a dict")
    return built, entry


def reference(entry: Mapping[str, Any]) -> str:
    """An entry's answer as a task's reference: its text; "" for a dataset with many right
    answers and no single one (answer None); any other value as ``str`` gives it."""
    answer = entry.get("answer")
    return answer if isinstance(answer, str) else "" if answer is None else str(answer)


def prompt_text(question: str) -> str:
    """The task's prompt: reasoning-gym's default system prompt (which asks for the answer in
    ``<answer>`` tags and ends in a line feed), a line feed, the question, a line feed."""
    from reasoning_gym.utils import SYSTEM_PROMPTS  # type: ignore[import-untyped]

    return f"{SYSTEM_PROMPTS['default']}\n{question}\n"


def _canonical(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def parse_part(text: str) -> Part:
    """``dataset[:key=value,...]`` as a :class:`Part`, each value read as its config field's
    type; a :class:`GymError` names the dataset or key that cannot be used."""
    dataset, _, options = text.partition(":")
    if not _NAME.fullmatch(dataset):
        raise GymError(f"gym: {shown(dataset)} is not a dataset name (lowercase letters, digits and _)")
    datasets = _registry()
    if dataset not in datasets or dataset in NOT_OFFERED:
        close = difflib.get_close_matches(dataset, sorted(set(datasets) - NOT_OFFERED), n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else "reasoning_gym.factory.DATASETS lists its datasets"
        raise GymError(f"gym: reasoning-gym {VETTED} has no dataset {dataset!r}; {hint}")
    if dataset in EVALUATES_ANSWERS:
        raise GymError(f"gym: {dataset} is refused: its scorer evaluates the answer as Python (eval or sympy's "
                       "parse_expr), so a hostile completion would run code in every verifier")
    if dataset in NOT_DETERMINISTIC:
        raise GymError(f"gym: {dataset} is refused: its problems differ between processes (hash seed or global "
                       "random state), so a verifier would not rebuild the task it was given")
    if dataset in SCORES_ANY_ANSWER:
        raise GymError(f"gym: {dataset} is refused: its scorer gives full marks to any non-empty answer, a reward "
                       "every completion earns")
    fields = _fields(datasets[dataset][1])
    config: dict[str, Value] = {}
    for item in options.split(",") if options else ():
        key, equals, raw = item.partition("=")
        if not equals or not _KEY.fullmatch(key):
            raise GymError(f"gym: {dataset}: cannot read {shown(item)} (expected key=value)")
        if key in _OURS:
            raise GymError(f"gym: {dataset}: {key} is set by vrl (one entry per index, seeded from it), not by a spec")
        if key not in fields:
            keys = ", ".join(sorted(k for k in fields if k not in _OURS))
            raise GymError(f"gym: {dataset} has no config key {key!r} (it has {keys or 'none'})")
        if key in config:
            raise GymError(f"gym: {dataset}: {key} is given twice")
        config[key] = _value(dataset, key, raw, fields[key])
    part = Part(dataset, tuple(sorted(config.items())))
    _validate(part, datasets[dataset][1])
    if len(part.task_id(0).encode()) > MAX_TASK_ID_BYTES:
        raise GymError(f"gym: {dataset}: its task ids would be longer than a record carries ({MAX_TASK_ID_BYTES} "
                       "bytes); set fewer keys")
    return part


def _fields(config_class: type) -> dict[str, Any]:
    """A config dataclass's fields and their types (resolved where the module's hints allow)."""
    try:
        hints = typing.get_type_hints(config_class)
    except Exception:  # a hint that names what its module never imported: the raw annotation
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(config_class)}


def _value(dataset: str, key: str, raw: str, kind: Any) -> Value:
    """``raw`` read as a field of type ``kind``: an int, float, bool, text, one of a Literal's
    texts, or an Optional of one of those (a spec never sets None: it leaves the key out)."""
    where = f"gym: {dataset}: {key}={shown(raw)}"
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(options) == 1:
            kind = options[0]
    if kind is bool:
        if raw not in ("true", "false"):
            raise GymError(f"{where}: expected true or false")
        return raw == "true"
    if kind is int:
        if not _INT.fullmatch(raw):
            raise GymError(f"{where}: expected an integer")
        return int(raw)
    if kind is float:
        if not _FLOAT.fullmatch(raw):
            raise GymError(f"{where}: expected a decimal number")
        number = float(raw)
        if not math.isfinite(number):
            raise GymError(f"{where}: expected a finite number")
        return number + 0.0  # -0.0 is 0.0: one canonical name
    if typing.get_origin(kind) is Literal and all(isinstance(a, str) for a in typing.get_args(kind)):
        allowed = typing.get_args(kind)
        if raw not in allowed:
            raise GymError(f"{where}: expected one of {', '.join(allowed)}")
        return raw
    if kind is str:
        if not _TEXT.fullmatch(raw):
            raise GymError(f"{where}: expected 1 to 64 of A-Z a-z 0-9 _ . -")
        return raw
    shown_kind = getattr(kind, "__name__", None) if isinstance(kind, type) else None
    raise GymError(f"gym: {dataset}: {key} is a {shown_kind or kind}; a task spec sets only integer, number, "
                   "true/false and text keys")


def _validate(part: Part, config_class: type) -> None:
    """The dataset's own checks of its config (its ``validate``, asserts mostly), as a GymError."""
    try:
        made = config_class(**dict(part.config), seed=0, size=1)
        check = getattr(made, "validate", None)
        if callable(check):
            check()
    except Exception as error:
        reason = str(error) or type(error).__name__
        raise GymError(f"gym: {part.name}: the dataset refuses this config: {shown(reason)}") from None


# -- task sets -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GymTasks:
    """A task set of one reasoning-gym dataset or a mix of several (specs/tasks.md §6)."""

    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.parts) <= MAX_PARTS:
            raise GymError(f"gym: a spec mixes 1 to {MAX_PARTS} datasets, got {len(self.parts)}")
        names = [p.dataset for p in self.parts]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise GymError(f"gym: {twice} appears twice; a mix names each dataset once")

    @property
    def name(self) -> str:
        return f"{PREFIX}:" + "+".join(p.name for p in self.parts)

    @classmethod
    def parse(cls, spec: str) -> GymTasks:
        """``gym:DATASET[:KEY=VALUE,...][+DATASET[:KEY=VALUE,...]...]``."""
        prefix, colon, rest = spec.partition(":")
        if prefix != PREFIX or not colon or not rest:
            raise GymError(f"task spec {shown(spec)}: expected gym:DATASET[:KEY=VALUE,...][+DATASET...]")
        texts = rest.split("+")
        if len(texts) > MAX_PARTS:
            raise GymError(f"gym: a spec mixes 1 to {MAX_PARTS} datasets, got {len(texts)}")
        return cls(tuple(parse_part(text) for text in texts))

    def part(self, index: int) -> Part:
        """Which dataset index ``index`` draws from: ``u64be(SHA-256(MIX_DOMAIN || utf8(name)
        || u64be(index))[0:8]) mod parts`` (bias below parts / 2^64), the only dataset when one."""
        if len(self.parts) == 1:
            return self.parts[0]
        digest = hashlib.sha256(MIX_DOMAIN + self.name.encode() + index.to_bytes(8, "big")).digest()
        return self.parts[int.from_bytes(digest[:8], "big") % len(self.parts)]

    def task(self, index: int) -> Task:
        if not 0 <= index < 1 << 64:
            raise GymError(f"gym task index must be a u64, got {shown(index)}")
        return self.part(index).task(index)


# -- the reward: gym/v1 (specs/rewards.md §3.7) ---------------------------------------------------


def task_part(task_id: str) -> tuple[Part, int]:
    """The part and index a gym task id names; GymUnavailable when it names another version
    of the library than this machine's, GymError when it is no gym id."""
    match = _ID.fullmatch(task_id)
    if match is None:
        raise GymError(f"task {shown(task_id)} is not a gym task (gym/VERSION/DATASET[:KEYS]/INDEX)")
    version, name, index = match.groups()
    if version != VETTED:
        raise GymUnavailable(f"task {shown(task_id)} was built by {LIBRARY} {version}; this verifier builds "
                             f"{VETTED}'s tasks only")
    part = parse_part(name)
    if part.name != name:  # one id per task: a non-canonical spelling is not one vrl makes
        raise GymError(f"task {shown(task_id)}: its part is not written canonically ({shown(part.name)})")
    return part, int(index, 16)


def score(task: Task, completion: str, tag: str) -> float:
    """reasoning-gym's ``score_answer`` of the answer in the completion's last ``<tag>...</tag>``
    (None when there is none), for the entry the task's id names. The task's prompt must be
    that entry's: a task whose prompt is not is not the id's, and scoring it would be a guess."""
    part, index = task_part(task.id)
    dataset, entry = part.built(index)
    if task.prompt != prompt_text(str(entry.get("question"))):
        raise GymError(f"task {shown(task.id)}: its prompt is not the one {part.name} builds for index {index}")
    answer = extract_answer(completion, tag)
    if answer is not None and len(answer) > max(MIN_ANSWER_LIMIT, 2 * len(reference(entry))):
        return 0.0
    try:
        # A copy: a scorer may write into the entry, which the cache shares.
        value = dataset.score_answer(answer, copy.deepcopy(entry))
    except (MemoryError, RecursionError):
        raise  # this machine's limits, not the answer's: never a score
    except Exception:  # a scorer that cannot read an answer finds it wrong, alike everywhere
        return 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise GymError(f"task {shown(task.id)}: {part.dataset}'s scorer returned {shown(value)}, not a finite number")
    return float(value)


def check_params(params: Mapping[str, object]) -> str | None:
    """What is wrong with gym/v1's parameters, or None: ``tag`` an identifier of at most 32
    characters (an answer is read from a tag), ``library`` a release number."""
    tag = str(params["tag"])
    if not (tag.isidentifier() and len(tag) <= 32):
        return "tag must be a short identifier: the answer is read from <tag>...</tag>"
    if not _RELEASE.fullmatch(str(params["library"])):
        return f"library must be a reasoning-gym release number such as {VETTED}, got {shown(params['library'])}"
    return None


def params_unavailable(params: Mapping[str, object]) -> str | None:
    """Why this machine cannot compute gym/v1 with ``params``, or None: it scores with the
    release it names, and vrl scores only the one it vetted, installed here."""
    if params["library"] != VETTED:
        return (f"it scores with {LIBRARY} {params['library']}, this verifier with {VETTED}: a gym reward is "
                "computed only by the release it names")
    return unavailable()
