"""``node.toml``: everything one node needs to join a network, as a plain dataclass.

Every key is checked where the file is read: its type (from the field's annotation, so a new
field is checked without another list to keep), its range or form (next to the field, in its
metadata), and its spelling (unknown keys are refused). A mistake is one :class:`ConfigError`
naming the file and the key. The checks are per dataclass (:func:`check_fields`,
:func:`build`), so a table of the file that becomes a dataclass of its own is checked the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import base58
import tomli_w
from multiaddr import Multiaddr
from multiaddr.exceptions import Error as MultiaddrError

from p2p.transport import TransportLimits
from vrl.node.protocol import ROLES
from vrl.rollouts.record import MAX_GROUP_SIZE


# What a node may be configured to cheat at (``adversary``, ``vrl devnet --adversaries``): the
# config's vocabulary. vrl.adversary.CheatingWork carries each out, at the top of the stack.
ADVERSARIES = {
    "fabricated-reward": "claims reward 1 for every sample",
    "quantized-model": "generates with an int8-quantized copy of the policy, claims the real one",
    "other-model": "generates with a different model of the same shape, claims the policy",
    "tampered-tokens": "edits a completion token and re-commits it by one honest prefill (TOPLOC's gap)",
    "replay": "re-signs another node's submitted groups as its own",
    "lazy-verifier": "approves what it is asked to check without running the model",
}


class ConfigError(ValueError):
    """A node.toml that is not usable; names the file (when there is one) and the key."""


# A node.toml is a few hundred bytes; reading more than this is refused before parsing, so a
# wrong path (a model file, /dev/zero) costs neither the memory nor the time.
MAX_TOML_BYTES = 1 << 20
# Linux's PATH_MAX (limits.h): no longer path can be opened.
MAX_PATH_BYTES = 4096
U63 = 2**63 - 1  # policy versions and step counts: 0 .. 2^63-1 (specs/record.md §1)


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low <= x <= high`` (``low < x`` when ``open_low``)."""

    low: float
    high: float
    open_low: bool = False

    def __contains__(self, x: float) -> bool:  # NaN is in no range: every comparison is false
        return (self.low < x if self.open_low else self.low <= x) and x <= self.high

    def __str__(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low}, {self.high}]"


def bounded(low: float, high: float, *, open_low: bool = False) -> dict:
    """Field metadata: the range of a number."""
    return {"range": Range(low, high, open_low)}


def checked(check: Callable[[str], str | None]) -> dict:
    """Field metadata: ``check(item)`` returns what is wrong with one string (or each string of
    a tuple), or None."""
    return {"check": check}


# -- the forms of strings --------------------------------------------------------------------------

_HEX_ID = re.compile(r"[0-9a-fA-F]{64}")
_LOOPBACK = re.compile(r"loopback/[0-9a-f]{64}")  # p2p.loopback.ADDRESS_PREFIX + a hex peer id
_DEVICE = re.compile(r"auto|cpu|cuda(?::\d{1,4})?")  # vrl.rollouts.model.resolve_device's forms
# A libp2p peer id of an Ed25519 key: the identity multihash (0x00, length 36) of the key's
# protobuf encoding (field 1 KeyType = 1 Ed25519, field 2 Data of 32 bytes): libp2p peer-ids spec.
_ED25519_PEER_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
# The forms the libp2p transport dials and listens on (p2p.libp2p_transport: TCP over IPv4).
_LISTEN_FORM, _BOOTSTRAP_FORM = ["ip4", "tcp"], ["ip4", "tcp", "p2p"]
MAX_PORT = 65535  # TCP ports are 16-bit (RFC 9293 §3.1)


def _multiaddr(text: str, form: list[str]) -> Multiaddr | str:
    """``text`` parsed by the multiaddr library, or what is wrong with it; the library checks
    each part (an IPv4 address, a port in 0..65535, a peer id's base58 and multihash)."""
    try:
        address = Multiaddr(text)
    except (MultiaddrError, ValueError) as error:  # its parse errors are ValueErrors too
        return f"not a multiaddr: {error}"
    if [p.name for p in address.protocols()] != form:
        return f"expected /{'/<...>/'.join(form)}/<...>, got {text!r}"
    return address


def listen_host_port(text: str) -> tuple[str, int]:
    """The IPv4 host and TCP port of a checked ``listen`` address."""
    address = _multiaddr(text, _LISTEN_FORM)
    if isinstance(address, str):
        raise ConfigError(f"listen: {address}")
    return address.value_for_protocol("ip4"), int(address.value_for_protocol("tcp"))


def hex_node_id(text: str) -> str | None:
    return None if _HEX_ID.fullmatch(text) else f"expected a 64-hex-digit node id, got {text!r}"


def path_like(text: str) -> str | None:
    if not text:
        return "must not be empty"
    if "\x00" in text:
        return "must not contain a NUL character"
    if len(text.encode()) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    return None


def task_spec(text: str) -> str | None:
    """A task file's path (read when the node starts) or an arithmetic spec (checked here)."""
    if problem := path_like(text):
        return problem
    if text == "arithmetic" or text.startswith("arithmetic:"):
        from vrl.tasks import Arithmetic

        try:
            Arithmetic.parse(text)
        except ValueError as error:
            return str(error)
    return None


def device_spec(text: str) -> str | None:
    return None if _DEVICE.fullmatch(text) else f"expected auto, cpu, cuda or cuda:N, got {text!r}"


def listen_address(text: str) -> str | None:
    address = _multiaddr(text, _LISTEN_FORM)  # port 0 asks the system for a free port
    return address if isinstance(address, str) else None


def bootstrap_address(text: str) -> str | None:
    if _LOOPBACK.fullmatch(text):
        return None  # checked against the transport in NodeConfig.__post_init__
    address = _multiaddr(text, _BOOTSTRAP_FORM)
    if isinstance(address, str):
        return address
    if address.value_for_protocol("tcp") == "0":
        return f"port 0 cannot be dialled, in {text!r}"
    peer = base58.b58decode(address.value_for_protocol("p2p"))
    if len(peer) != len(_ED25519_PEER_PREFIX) + 32 or not peer.startswith(_ED25519_PEER_PREFIX):
        return f"the peer id in {text!r} is not an Ed25519 libp2p peer id (12D3KooW...)"
    return None


def one_of(choices: typing.Iterable[str]) -> Callable[[str], str | None]:
    allowed = tuple(choices)
    return lambda text: None if text in allowed else f"expected one of {', '.join(map(repr, allowed))}, got {text!r}"


# -- generic checks, from the dataclass fields ---------------------------------------------------

def _show(value) -> str:
    """A value for an error message: its repr, cut short (a hostile one may be a megabyte)."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr would refuse past 4300 digits
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _kind(value) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             tuple: "an array", dict: "a table"}
    return next((name for kind, name in names.items() if type(value) is kind), f"a {type(value).__name__}")


def _scalar(name: str, hint, value, meta: typing.Mapping):
    """``value`` checked as one ``hint`` (str, int, float or bool); returns it normalized."""
    expected = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}[hint]
    ok = (type(value) is hint or (hint is float and type(value) is int))  # TOML writes 1 for 1.0
    if not ok:
        raise ConfigError(f"{name}: expected {expected}, got {_show(value)} ({_kind(value)})")
    if "range" in meta and value not in meta["range"]:
        raise ConfigError(f"{name}: must be in {meta['range']}, got {_show(value)}")
    if hint is float:
        value = float(value)  # in range, so finite and no OverflowError
        if not math.isfinite(value):
            raise ConfigError(f"{name}: must be finite, got {value!r}")
    if hint is str:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"{name}: not valid Unicode text: {_show(value)}") from None
        if "check" in meta and (problem := meta["check"](value)):
            raise ConfigError(f"{name}: {problem}")
    return value


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def check_fields(instance, prefix: str = "") -> None:
    """Check every field of a dataclass instance against its annotation (``str``, ``int``,
    ``float``, ``bool``, ``tuple[X, ...]`` of those, or another dataclass, given as a table) and
    its metadata (``range``, ``check``); ints given for floats become floats. Raises
    :class:`ConfigError` naming ``prefix + field``."""
    hints = _hints(type(instance))
    for spec in dataclasses.fields(instance):
        name, hint, value = prefix + spec.name, hints[spec.name], getattr(instance, spec.name)
        if dataclasses.is_dataclass(hint):
            value = _table(hint, value, name)
        elif typing.get_origin(hint) is tuple:
            (item,) = {a for a in typing.get_args(hint) if a is not Ellipsis}
            if type(value) is not tuple:
                raise ConfigError(f"{name}: expected an array, got {_show(value)} ({_kind(value)})")
            value = tuple(_scalar(f"{name}[{i}]", item, v, spec.metadata) for i, v in enumerate(value))
        else:
            value = _scalar(name, hint, value, spec.metadata)
        object.__setattr__(instance, spec.name, value)  # normalized (1 -> 1.0); frozen otherwise


def _table(cls, value, name: str):
    """A nested dataclass field: a TOML table built and checked like the file itself, then by
    the class's own checks (a library dataclass raises ValueError, named here by its table)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table, got {_show(value)} ({_kind(value)})")
    try:
        table = build(cls, value, prefix=name + ".")
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{name}: {error}") from None
    check_fields(table, prefix=name + ".")
    return table


def build(cls, data, prefix: str = ""):
    """An instance of dataclass ``cls`` from a TOML table: unknown and missing keys refused by
    name, arrays read as tuples, every field then checked by ``cls`` itself."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'file'}: expected a table, got {_kind(data)}")
    known = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)  # not 'transport' for 'port'
            hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
            name = key if re.fullmatch(r"[A-Za-z0-9_-]{1,64}", str(key)) else _show(key)  # one printable line
            raise ConfigError(f"{prefix}{name}: unknown key {_show(key)} ({hint})")
    for spec in dataclasses.fields(cls):
        if spec.name not in data and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{spec.name}: required, and missing")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


@dataclass(frozen=True)
class NodeConfig:
    # Paths: a relative data_dir is resolved once, against the folder of the TOML file that
    # gives it (from_toml); key is relative to data_dir; task and model name a spec, or a file or
    # directory relative to where the node is started.
    data_dir: str = field(metadata=checked(path_like))  # the node's store, key, blobs and (trainer) checkpoints
    # hex node id of the trainer whose policies this network follows
    trainer: str = field(metadata=checked(hex_node_id))
    roles: tuple[str, ...] = field(default=("worker", "verifier"), metadata=checked(one_of(ROLES)))
    key: str = field(default="node.pem", metadata=checked(path_like))  # relative to data_dir; created on first start
    listen: str = field(default="/ip4/127.0.0.1/tcp/0", metadata=checked(listen_address))
    # multiaddrs ending in /p2p/<peer id> (loopback/<hex id> on the in-process transport)
    bootstrap: tuple[str, ...] = field(default=(), metadata=checked(bootstrap_address))
    # hex node ids trusted from the start besides self and trainer
    pretrusted: tuple[str, ...] = field(default=(), metadata=checked(hex_node_id))
    model: str = field(default="base", metadata=checked(path_like))  # architecture and tokenizer; weights come from the trainer
    # where this node runs its models (vrl.rollouts.model.resolve_device; whether the device exists is checked at start)
    device: str = field(default="auto", metadata=checked(device_spec))
    task: str = field(default="arithmetic:digits=2,ops=+", metadata=checked(task_spec))
    # GRPO compares the samples of a group, so at least 2; at most MAX_GROUP_SIZE (specs/record.md §3).
    group_size: int = field(default=8, metadata=bounded(2, MAX_GROUP_SIZE))
    # A group's index is a u32 (specs/record.md §1).
    groups_per_round: int = field(default=4, metadata=bounded(1, 2**32))
    # sampling.max_new_tokens of a record is 1 .. 2^20 (specs/record.md §1).
    max_new_tokens: int = field(default=8, metadata=bounded(1, 2**20))
    # The trainer role builds a vrl.rl.train.TrainConfig from it, which needs (0, 10] for GRPO.
    temperature: float = field(default=1.0, metadata=bounded(0, 10, open_low=True))
    # trainer: groups per GRPO step; a step holds its batch in memory, and 2^16 groups is far
    # past any batch measured here (bench/learning.py uses 16)
    batch_groups: int = field(default=12, metadata=bounded(1, 2**16))
    # trainer: most of a batch one node may fill; a share, as vrl.node.reputation.AdmissionConfig checks
    node_cap: float = field(default=0.34, metadata=bounded(0, 1, open_low=True))
    trusted_share: float = field(default=0.5, metadata=bounded(0, 1))  # a share (AdmissionConfig)
    # Seconds (specs/network.md §4: 4 s and 60 s by default). A day is longer than any round
    # should wait, and keeps every deadline the node computes finite.
    verdict_wait: float = field(default=4.0, metadata=bounded(0, 86400, open_low=True))
    round_timeout: float = field(default=60.0, metadata=bounded(0, 86400, open_low=True))
    # A node keeps max_staleness + 1 copies of the policy in memory (vrl.node.daemon: Work.install),
    # so this bounds its memory: 17 copies of the 156M-parameter small preset are about 10 GiB.
    max_staleness: int = field(default=2, metadata=bounded(0, 16))
    lazy_audit_rate: float = field(default=0.25, metadata=bounded(0, 1))  # a probability
    plant_every: int = field(default=0, metadata=bounded(0, U63))  # in rounds, which are policy versions
    rounds: int = field(default=0, metadata=bounded(0, U63))  # trainer: stop announcing after this version (0: never)
    # Adam moves each weight by about the learning rate per step; 1e-4 already wrecks the base
    # model (bench/learning.py), so 1 is no learning rate at all.
    learning_rate: float = field(default=2e-5, metadata=bounded(0, 1, open_low=True))
    warmup_steps: int = field(default=5, metadata=bounded(1, U63))  # steps (TrainConfig needs >= 1)
    eval_every: int = field(default=1, metadata=bounded(1, U63))  # versions (TrainConfig needs >= 1)
    # Held-out problems evaluated (twice) at every eval_every-th version; 2^16 is 50 times
    # GSM8K's test split, and keeps one evaluation's time bounded.
    held_out: int = field(default=128, metadata=bounded(1, 2**16))
    metrics_port: int = field(default=0, metadata=bounded(0, MAX_PORT))  # Prometheus on 127.0.0.1:port (0: off)
    # devnets only: one of ADVERSARIES
    adversary: str = field(default="", metadata=checked(one_of(("", *ADVERSARIES))))
    # torch.set_num_threads; several nodes share a machine in devnets. 1024 is more cores than
    # any machine here has, and stops a typo from starting a million threads.
    torch_threads: int = field(default=1, metadata=bounded(1, 1024))
    transport: str = field(default="libp2p", metadata=checked(one_of(("libp2p", "loopback"))))  # loopback: in-process tests
    # [transport_limits]: peer scoring and bans, handshake deadline, pending-connection cap;
    # each default's source is in p2p.transport.TransportLimits, which also checks the values.
    transport_limits: TransportLimits = field(default_factory=TransportLimits)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.roles or len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"roles: must be a non-empty subset of {list(ROLES)}, got {list(self.roles)}")
        for address in self.bootstrap:
            if (self.transport == "loopback") != bool(_LOOPBACK.fullmatch(address)):
                raise ConfigError(f"bootstrap: {address!r} is not an address of the {self.transport} transport")

    @property
    def path(self) -> Path:
        return Path(self.data_dir)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> NodeConfig:
        """Read and check a node.toml; every error is a :class:`ConfigError` that starts with the path."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_TOML_BYTES + 1)
        except OSError as error:
            raise ConfigError(f"{path}: {error.strerror or error}") from None
        return cls.from_toml_bytes(data, path, **overrides)

    @classmethod
    def from_toml_bytes(cls, data: bytes, path: str | Path, **overrides) -> NodeConfig:
        """A node.toml's content, as if read from ``path`` (which names it in errors and anchors
        a relative data_dir). Any input gives a config or a :class:`ConfigError`."""
        try:
            if len(data) > MAX_TOML_BYTES:
                raise ConfigError(f"larger than {MAX_TOML_BYTES} bytes; not a node.toml")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ConfigError(f"not UTF-8 text (byte {error.start})") from None
            try:
                table = tomllib.loads(text)
            except ValueError as error:  # TOMLDecodeError, or an integer past Python's 4300 digits
                raise ConfigError(str(error)) from None
            except RecursionError:  # arrays nested thousands deep
                raise ConfigError("nested too deeply") from None
            return cls.from_dict(table, base=Path(path).resolve().parent, **overrides)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None

    @classmethod
    def from_dict(cls, data: dict, base: Path | None = None, **overrides) -> NodeConfig:
        """A config from a table (what tomllib returns); a relative data_dir is taken relative
        to ``base`` when one is given, so the result holds the path to use from anywhere."""
        config = build(cls, {**data, **overrides} if isinstance(data, dict) else data)
        if base is not None and not config.path.is_absolute():
            config = dataclasses.replace(config, data_dir=str(base / config.data_dir))
        return config

    def to_toml(self) -> str:
        return tomli_w.dumps(dataclasses.asdict(self))
