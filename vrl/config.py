"""Configuration as plain dataclasses, each value checked where the dataclass is made.

A config class declares each field once, with its default and, in the field's metadata, what
the value may be: a range (:func:`bounded`) or a check of its form (:func:`checked`). Its
``__post_init__`` calls :func:`check_fields`, which checks every field against its annotation
(``str``, ``int``, ``float``, ``bool``, ``tuple[X, ...]`` of those, or another config dataclass,
given as a TOML table) and that metadata, so a new field is checked without another list to
keep. :func:`build` makes one from a TOML table: unknown keys refused with the known one they
resemble, or the table they belong in; each nested table layered on its container's defaults.

Every mistake is one :class:`ConfigError` naming the key, and the table it is in (``[grpo]
eps_low: must be in (0, 1), got 1.5``); a file's reader puts the file first. Made directly in
code, the error names the class instead (``GRPOConfig.eps_low: ...``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import enum
import functools
import math
import re
import tomllib
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tomli_w

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
from vrl.errors import VrlError, shown


class ConfigError(VrlError, ValueError):
    """A configuration that is not usable: one line naming the key (``key``: the tables it
    sits in, then its name) and what is wrong with its value (``problem``)."""

    def __init__(self, problem: str, key: tuple[str, ...] = (), owner: str = "") -> None:
        self.problem, self.key, self.owner = problem, tuple(key), owner
        super().__init__(f"{self.name}: {problem}" if self.key else problem)

    @property
    def name(self) -> str:
        """``Class.key`` for a class made in code; ``[table] key`` or ``key`` in a file."""
        if self.owner:
            return f"{self.owner}.{'.'.join(self.key)}"
        *tables, key = self.key
        return f"[{'.'.join(tables)}] {key}" if tables else key

    def within(self, table: str | None = None) -> ConfigError:
        """The same problem located by the file's keys rather than the class (and under
        ``table``, when given): what a reader reports."""
        return ConfigError(self.problem, ((table,) if table else ()) + self.key)


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Every :class:`ConfigError` raised inside starts with ``path``: the file it is about."""
    try:
        yield
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


# A config file is a few hundred bytes; reading more than this is refused before parsing, so a
# wrong path (a model file, /dev/zero) costs neither the memory nor the time.
MAX_TOML_BYTES = 1 << 20
# Linux's PATH_MAX (limits.h): no longer path can be opened.
MAX_PATH_BYTES = 4096
# TOML integers are signed 64-bit (toml.io v1.0.0, "Integer"): no file holds a larger count.
U63 = 2**63 - 1
_Config = TypeVar("_Config", bound="DataclassInstance")  # a config dataclass that build() makes from a table


def read_toml(path: str | Path) -> dict[str, Any]:
    """The table a TOML file holds; any problem is a :class:`ConfigError` (without the path:
    callers read inside :func:`reading`)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TOML_BYTES + 1)
    except OSError as error:
        raise ConfigError(error.strerror or str(error)) from None
    return parse_toml(data)


def parse_toml(data: bytes) -> dict[str, Any]:
    """A TOML document's table; any input gives a table or a :class:`ConfigError`."""
    if len(data) > MAX_TOML_BYTES:
        raise ConfigError(f"larger than {MAX_TOML_BYTES} bytes; not a config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"not UTF-8 text (byte {error.start})") from None
    try:
        return tomllib.loads(text)
    except ValueError as error:  # TOMLDecodeError, or an integer past Python's 4300 digits
        raise ConfigError(str(error)) from None
    except RecursionError:  # arrays nested thousands deep
        raise ConfigError("nested too deeply") from None


def to_toml(config: DataclassInstance) -> str:
    """A config dataclass as TOML: its scalars, then a table per nested config."""
    return tomli_w.dumps(dataclasses.asdict(config))


def as_kwargs(config: DataclassInstance) -> dict[str, Any]:
    """A config's fields by name, nested configs kept as they are (one level, unlike asdict):
    what passes one config's values on to another that shares its fields."""
    return {spec.name: getattr(config, spec.name) for spec in dataclasses.fields(config)}


# -- what a field's value may be: its metadata -----------------------------------------------------

@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low <= x <= high``, either end open when asked."""

    low: float
    high: float
    open_low: bool = False
    open_high: bool = False

    def __contains__(self, x: float) -> bool:  # NaN is in no range: every comparison is false
        above = self.low < x if self.open_low else self.low <= x
        return above and (x < self.high if self.open_high else x <= self.high)

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.open_low else '>='} {self.low}"
        return f"{'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"


def bounded(low: float, high: float = math.inf, *, open_low: bool = False, open_high: bool = False) -> dict[str, Any]:
    """Field metadata: the range of a number (a float must also be finite)."""
    return {"range": Range(low, high, open_low, open_high)}


def checked(check: Callable[[str], str | None]) -> dict[str, Any]:
    """Field metadata: ``check(item)`` returns what is wrong with one string (or each string of
    a tuple), or None."""
    return {"check": check}


def one_of(choices: typing.Iterable[str]) -> Callable[[str], str | None]:
    allowed = tuple(choices)
    return lambda text: None if text in allowed else f"expected one of {', '.join(map(repr, allowed))}, got {text!r}"


def path_like(text: str) -> str | None:
    if not text:
        return "must not be empty"
    if "\x00" in text:
        return "must not contain a NUL character"
    if len(text.encode()) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    return None


# -- the generic checks ----------------------------------------------------------------------------

def _kind(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             tuple: "an array", dict: "a table"}
    return next((name for kind, name in names.items() if type(value) is kind), f"a {type(value).__name__}")


_EXPECTED = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _scalar(hint: Any, value: Any, meta: Mapping[str, Any]) -> Any:  # a type hint; a TOML value
    """``value`` checked as one ``hint`` (str, int, float, bool or a StrEnum, whose member a
    string names); returns it normalized. Raises a keyless :class:`ConfigError` (the caller
    knows the key)."""
    if isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {shown(value)} ({_kind(value)})")
        if value not in {m.value for m in hint}:
            raise ConfigError(f"expected one of {', '.join(repr(m.value) for m in hint)}, got {shown(value)}")
        return hint(value)
    if hint is bool:
        ok = type(value) is bool
    elif hint in (int, float):  # a bool is an int to Python, never to a config; TOML writes 1 for 1.0
        ok = isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise ConfigError(f"expected {_EXPECTED[hint]}, got {shown(value)} ({_kind(value)})")
    if "range" in meta and value not in meta["range"]:
        bound = meta["range"]
        raise ConfigError(f"must be {'' if bound.high == math.inf else 'in '}{bound}, got {shown(value)}")
    if hint is float:
        try:
            value = float(value)
        except OverflowError:  # an integer past 1e308
            raise ConfigError(f"must be finite, got {shown(value)}") from None
        if not math.isfinite(value):
            raise ConfigError(f"must be finite, got {value!r}")
    elif hint is int:
        value = int(value)
    if hint is str:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"not valid Unicode text: {shown(value)}") from None
        if "check" in meta and (problem := meta["check"](value)):
            raise ConfigError(problem)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _default(spec: dataclasses.Field[Any]) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else None


def check_fields(config: DataclassInstance, cls: type[DataclassInstance] | None = None) -> None:
    """Check every field of ``config`` (those of ``cls`` only, when given: a subclass's other
    fields are its own business) against its annotation and metadata; ints given for floats
    become floats, and a table given as a dict becomes its dataclass, layered on the field's
    default. Raises :class:`ConfigError` naming the class and the field."""
    owner = type(config).__name__
    hints = _hints(cls or type(config))
    for spec in dataclasses.fields(cls or config):
        hint, value = hints[spec.name], getattr(config, spec.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a hint is a class, never an instance
            value = _table(hint, value, spec.name, _default(spec))  # its errors name the table
        else:
            try:
                if typing.get_origin(hint) is tuple:
                    (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
                    if type(value) is not tuple:
                        raise ConfigError(f"expected an array, got {shown(value)} ({_kind(value)})")
                    value = tuple(_item(spec.name, i, item, v, spec.metadata) for i, v in enumerate(value))
                else:
                    value = _scalar(hint, value, spec.metadata)
            except ConfigError as error:
                raise ConfigError(error.problem, error.key or (spec.name,), owner) from None
        object.__setattr__(config, spec.name, value)  # normalized (1 -> 1.0); frozen otherwise


def _item(name: str, index: int, hint: Any, value: Any, meta: Mapping[str, Any]) -> Any:
    try:
        return _scalar(hint, value, meta)
    except ConfigError as error:
        raise ConfigError(error.problem, (f"{name}[{index}]",)) from None


def _table(cls: type[_Config], value: object, name: str, base: _Config | None) -> _Config:
    """A nested config field: a TOML table built and checked like the file itself, on ``base``
    (the field's default: its container may set defaults of its own). Errors name the table."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"expected a table, got {shown(value)} ({_kind(value)})", (name,))
    try:
        table = build(cls, value, base)
        check_fields(table)  # again for a class that does not check itself (p2p's TransportLimits)
    except ConfigError as error:
        raise error.within(name) from None
    return table


def _printable(key: str) -> str:
    """A key for an error message: as written when it is a plain name, else its repr, cut."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", str(key)) else shown(key)


def _unknown(cls: type, key: str, known: list[str]) -> str:
    """What to say of a key ``cls`` does not have: where it went, the table it belongs in, or
    the known key it resembles."""
    moved: dict[str, str] = getattr(cls, "moved_keys", {})  # a config's retired keys: where each went
    if key in moved:
        return moved[key]
    hints = _hints(cls)
    tables = [spec.name for spec in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[spec.name])
              and key in {f.name for f in dataclasses.fields(hints[spec.name])}]
    if tables:
        return f"belongs in the {' or the '.join(f'[{t}]' for t in tables)} table"
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)  # not 'transport' for 'port'
    hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(known)
    return f"unknown key {shown(key)} ({hint})"


def build(cls: type[_Config], data: object, base: _Config | None = None) -> _Config:
    """A ``cls`` from a TOML table: the table's keys over ``base`` (an instance: the defaults
    to layer it on; else the class's own). Unknown and missing keys are refused by name, arrays
    become tuples, then ``cls`` checks every value itself. Errors name the table's keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"expected a table, got {_kind(data)}")
    known = [spec.name for spec in dataclasses.fields(cls)]
    for key in data:
        if key not in known:
            raise ConfigError(_unknown(cls, key, known), (_printable(key),))
    values = {**(as_kwargs(base) if base is not None else {}),
              **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}}
    for spec in dataclasses.fields(cls):
        if spec.name not in values and spec.default is dataclasses.MISSING and (
                spec.default_factory is dataclasses.MISSING):
            raise ConfigError("required, and missing", (spec.name,))
    try:
        return cls(**values)
    except ConfigError as error:
        raise error.within() from None
    except (ValueError, TypeError) as error:  # a class's own checks, in its own words
        raise ConfigError(str(error)) from None
