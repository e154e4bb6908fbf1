"""``node.toml``: everything one node needs to join a network, as a plain dataclass."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from vrl.node.protocol import ROLES
from vrl.node.work import ADVERSARIES


class ConfigError(ValueError):
    """A node.toml that is not usable; names the key."""


@dataclass(frozen=True)
class NodeConfig:
    data_dir: str  # the node's store, key, blobs and (trainer) checkpoints
    trainer: str  # hex node id of the trainer whose policies this network follows
    roles: tuple[str, ...] = ("worker", "verifier")
    key: str = "node.pem"  # relative to data_dir; created on first start
    listen: str = "/ip4/127.0.0.1/tcp/0"
    bootstrap: tuple[str, ...] = ()  # multiaddrs ending in /p2p/<peer id>
    pretrusted: tuple[str, ...] = ()  # hex node ids trusted from the start besides self and trainer
    model: str = "base"  # architecture and tokenizer; the weights come from the trainer
    device: str = "auto"  # where this node runs its models (vrl.model.resolve_device)
    task: str = "arithmetic:digits=2,ops=+"
    group_size: int = 8
    groups_per_round: int = 4
    max_new_tokens: int = 8
    temperature: float = 1.0
    batch_groups: int = 12  # trainer: groups per GRPO step
    node_cap: float = 0.34  # trainer: most of a batch one node may fill
    trusted_share: float = 0.5
    verdict_wait: float = 4.0
    round_timeout: float = 60.0
    max_staleness: int = 2
    lazy_audit_rate: float = 0.25
    plant_every: int = 0
    rounds: int = 0  # trainer: stop announcing after this version (0: never)
    learning_rate: float = 2e-5
    warmup_steps: int = 5
    eval_every: int = 1
    held_out: int = 128
    metrics_port: int = 0  # Prometheus on 127.0.0.1:port (0: off)
    adversary: str = ""  # devnets only: one of vrl.node.work.ADVERSARIES
    torch_threads: int = 1  # several nodes share a machine in devnets
    transport: str = "libp2p"  # or "loopback" (in-process tests)

    def __post_init__(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ConfigError(f"roles: must be a non-empty subset of {list(ROLES)}, got {list(self.roles)}")
        if self.adversary and self.adversary not in ADVERSARIES:
            raise ConfigError(f"adversary: unknown {self.adversary!r}; choose from {', '.join(ADVERSARIES)}")
        try:
            if len(bytes.fromhex(self.trainer)) != 32:
                raise ValueError
        except ValueError:
            raise ConfigError(f"trainer: expected a 64-hex-digit node id, got {self.trainer!r}") from None
        if self.transport not in ("libp2p", "loopback"):
            raise ConfigError(f"transport: 'libp2p' or 'loopback', got {self.transport!r}")

    @property
    def path(self) -> Path:
        return Path(self.data_dir)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides) -> NodeConfig:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"{path}: {error}") from None
        return cls.from_dict(data, base=Path(path).parent, **overrides)

    @classmethod
    def from_dict(cls, data: dict, base: Path | None = None, **overrides) -> NodeConfig:
        data = {**data, **overrides}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        for name in ("roles", "bootstrap", "pretrusted"):
            if name in data:
                data[name] = tuple(data[name])
        if base is not None and "data_dir" in data and not Path(data["data_dir"]).is_absolute():
            data["data_dir"] = str(base / data["data_dir"])
        try:
            return cls(**data)
        except TypeError as error:
            raise ConfigError(str(error)) from None

    def to_toml(self) -> str:
        def value(v) -> str:
            if isinstance(v, (tuple, list)):
                return "[" + ", ".join(value(x) for x in v) + "]"
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, str):
                return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
            return repr(v)

        return "".join(f"{f.name} = {value(getattr(self, f.name))}\n" for f in dataclasses.fields(self)
                       )
