"""``node.toml``: everything one node needs to join a network, as a plain dataclass.

The top level holds what is the node's own (its directory and key, addresses, roles, whom it
follows and trusts, metrics, threads, transport); each library the node runs has a table of
its own, which is that library's config dataclass: ``[work]``
(:class:`~vrl.rollouts.config.GenerationConfig`), ``[protocol]``
(:class:`~vrl.node.params.ProtocolParams`), ``[train]`` (:class:`~vrl.rl.config.LearnerConfig`),
``[grpo]`` (:class:`~vrl.rl.config.GRPOConfig`), ``[reputation]`` and ``[admission]``
(:mod:`vrl.node.reputation`), ``[transport_limits]`` (:class:`p2p.transport.TransportLimits`),
``[storage]`` (:class:`~vrl.node.storage.StorageConfig`).
Each default is defined once, in its dataclass; the node's own, where they differ, are in
:data:`NODE_OVERRIDES`, with the reasons.

Every key is checked where the file is read, by :mod:`vrl.config`: its type, its range or form
(next to the field, in its metadata) and its spelling. A mistake is one :class:`ConfigError`
naming the file, the table and the key; a key of a table written at the top level (a node.toml
from before the tables) is told the table it belongs in.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

import base58
from multiaddr import Multiaddr
from multiaddr.exceptions import Error as MultiaddrError

from p2p.transport import TransportLimits
from vrl.config import (
    ConfigError,
    bounded,
    build,
    check_fields,
    checked,
    one_of,
    parse_toml,
    path_like,
    read_toml,
    reading,
    to_toml,
)
from vrl.node.admission import AdmissionConfig
from vrl.node.params import ROLES, ProtocolParams
from vrl.node.reputation import ReputationConfig
from vrl.node.storage import StorageConfig
from vrl.rl.config import GRPOConfig, LearnerConfig
from vrl.rollouts.config import GenerationConfig

__all__ = ["ADVERSARIES", "NODE_OVERRIDES", "TRAINER_ADVERSARIES", "ConfigError", "NodeConfig", "listen_host_port",
           "node_default"]


# What a node may be configured to cheat at (``adversary``, ``vrl devnet --adversaries``): the
# config's vocabulary. vrl.harness.adversary carries each out, at the top of the stack: CheatingWork the
# worker's and verifier's cheats, CheatingTrainer the trainer's (TRAINER_ADVERSARIES, the ones
# whose node must have the trainer role).
ADVERSARIES = {
    "fabricated-reward": "claims reward 1 for every sample",
    "quantized-model": "generates with an int8-quantized copy of the policy, claims the real one",
    "other-model": "generates with a different model of the same shape, claims the policy",
    "tampered-tokens": "edits a completion token and re-commits it by one honest prefill (TOPLOC's gap)",
    "replay": "re-signs another node's submitted groups as its own",
    # The decode spoofs (vrl.harness.adversary.spoofed_groups): tokens sampled otherwise, with the
    # protocol's seeded noise; commitment, logprobs and reward made honestly for the policy. Each
    # runs at the strength vrl.harness.adversary.NODE_SPOOF_STRENGTH gives it, which says why.
    "spoof-int8": "samples with int8 weights, then commits and reports logprobs by one honest prefill",
    "spoof-perturb": "samples with 3% noise on every weight, then commits and reports logprobs honestly",
    "spoof-temperature": "samples at 10% above the protocol's temperature, claims the protocol's",
    "spoof-approximate": "keeps an int8 draft's token wherever the policy's own race loses to it by < 0.05",
    "lazy-verifier": "approves what it is asked to check without running the model",
    "trainer-rejected-group": "trains on groups it failed itself, and lists them in the batch",
    "trainer-foreign-data": "trains on a group no one submitted besides the batch it lists",
    "trainer-drops-node": "lists an honest node's admitted groups in the batch but trains without them",
    "trainer-learning-rate": "trains at twice the learning rate its step config states",
    "trainer-fake-weights": "publishes weights no step produced (the step's, nudged by 0.1% noise)",
    "trainer-inflated-rewards": "with private tasks, trains as if every answer were correct, beside honest proofs",
}
TRAINER_ADVERSARIES = frozenset(kind for kind in ADVERSARIES if kind.startswith("trainer-"))


# -- the forms of strings --------------------------------------------------------------------------

_HEX_ID = re.compile(r"[0-9a-fA-F]{64}")
_LOOPBACK = re.compile(r"loopback/[0-9a-f]{64}")  # p2p.loopback.ADDRESS_PREFIX + a hex peer id
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
        raise ConfigError(address, ("listen",))
    return address.value_for_protocol("ip4"), int(address.value_for_protocol("tcp"))


def hex_node_id(text: str) -> str | None:
    return None if _HEX_ID.fullmatch(text) else f"expected a 64-hex-digit node id, got {text!r}"


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


# -- the node's defaults, where they differ from its libraries' ------------------------------------
#
# Every default is defined once, in the dataclass that owns it, with its source; the tables of
# node.toml are those dataclasses. The node takes their defaults as they are, but for the values
# in NODE_OVERRIDES. This block is the one place that says where the node parts ways with the
# single-machine trainer (vrl train) or the specs, and why. Issue 14 §2 found four such places
# as contradictions between two classes' defaults; each has one value now:
#
# * max_staleness = 2, in [protocol] only (ProtocolParams). GRPOConfig had 4 (TRL's async GRPO
#   default), but vrl train samples every batch from its current policy, so its rollouts never
#   lag and that 4 never bound anything; nor did a node's trainer read it (the protocol decides
#   which groups are fresh). On a network it bounds how stale a group may be and still be
#   checked and trained, and a node keeps max_staleness + 1 policy copies in memory: the
#   network's 2 is the one value. GRPOConfig has no such key now; a [grpo] max_staleness is
#   refused with where it went.
# * warmup_steps = 5 in [train] (vrl train: 20). Warmup counts steps, and a node's trainer
#   makes one per round: a devnet runs 6 to 20 rounds, so 20 warmup steps would keep most of a
#   run below its learning rate; 5 still keeps Adam's first steps small (why warm up at all:
#   vrl.rl.config.LearnerConfig).
# * held_out = 128 in [train] (vrl train: 256). The node's trainer evaluates at every version
#   (eval_every below) on the one model thread its checks need too; 128 problems halve that
#   time, for a standard error of about 4 points instead of 3 (sqrt(0.3 x 0.7 / 128)).
# * node_cap = 0.34 in [admission] (AdmissionConfig: 0.25, a quarter of a batch at most, so
#   a full batch draws on four nodes or more: specs/reputation.md §6). That is for networks
#   of many workers. vrl devnet's default 4 nodes are a
#   trainer and 3 workers, with batches of 12 (batch_groups below): at 1/4 each worker could
#   fill 3 slots, 9 in all, so a batch would never fill and every step would wait for its
#   round to settle; at 0.34 each may fill ceil(0.34 x 12) = 5 (a third would be 4). A network
#   of more workers should set [admission] node_cap at 1/4 or below.
#
# And where the node's use differs:
# * eval_every = 1 in [train] (vrl train: 10): a devnet's few versions each get a held-out
#   accuracy (the devnet's summary, bench/devnet.py's learning curves).
# * batch_groups = 12 in [admission] (AdmissionConfig: 16, a vrl train step's groups): one
#   round of vrl devnet's 3 workers x 4 groups.
# * generation_batch = 32 in [work] (vrl train: 128, a step of 16 x 8). A default round of
#   4 x 8 is one pass either way; the node keeps the 32 it has always had, so a round of more
#   than 32 rollouts is batched, hence sampled, as before.
NODE_OVERRIDES: dict[str, dict[str, object]] = {
    "work": {"generation_batch": 32},
    "train": {"warmup_steps": 5, "held_out": 128, "eval_every": 1},
    "admission": {"batch_groups": 12, "node_cap": 0.34},
}


@dataclass(frozen=True)
class ZkConfig:
    """Sampling proofs at challenged positions between nodes (specs/zk.md §10, specs/network.md
    §3.4), and the reward proofs of a network's private tasks (specs/zk.md §11): a node's
    ``[zk]`` table. Off by default."""

    # worker: commit each sampled token's hidden state (a policy whose head has a circuit: the
    # micro preset) and keep the rows, to answer a verifier's challenge
    hidden_states: bool = False
    # verifier: after a group passes its check, ask its producer to prove this many positions
    # of each record, picked by the verifier's audit ticket; 0 asks for none
    sampling_positions: int = field(default=0, metadata=bounded(0, 64))
    # verifier: seconds the producer has to answer, else the check fails (sampling_missing).
    # Proving took 3.2 to 3.7 s a position here (bench/results/zk.json); a group of 4 at 4
    # positions is 16 proofs, about 60 s on one core, and 240 s leaves room for a queue of them
    # (the node refuses a timeout under twice a group's proving)
    proof_timeout: float = field(default=240.0, metadata=bounded(1, 3600))
    # worker: the most positions per record it proves for one request (one request per group
    # and peer): what a stranger can make it spend
    max_positions: int = field(default=8, metadata=bounded(1, 64))
    # trainer of a network whose [work] task set is private (its references committed, vrl
    # commit-answers): the answer key, to prove each trained record's correctness
    answers: str = ""
    # the KZG SRS file proofs are made and checked against ("" with dev_srs); the network's
    # one: a proof made against another fails (specs/zk.md §11)
    srs: str = ""
    # devnets and tests only: this machine's single-party SRS, whose maker could forge proofs
    dev_srs: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.hidden_states or self.sampling_positions) and bool(self.srs) == self.dev_srs:
            raise ConfigError("sampling proofs need one SRS: srs = PATH, or dev_srs = true (INSECURE)", ("srs",),
                              type(self).__name__)
        if self.srs and self.dev_srs:
            raise ConfigError("srs = PATH or dev_srs = true, not both", ("srs",), type(self).__name__)
        for name in ("srs", "answers"):
            if getattr(self, name) and (problem := path_like(getattr(self, name))):
                raise ConfigError(problem, (name,), type(self).__name__)


T = TypeVar("T")


def node_default(name: str, cls: type[T]) -> T:
    """Table ``name`` of a node.toml that sets none of it: ``cls``'s defaults under the node's
    own from NODE_OVERRIDES."""
    return cls(**NODE_OVERRIDES.get(name, {}))


def _table(name: str, cls: type[T]) -> T:
    """A table of node.toml: :func:`node_default`. A table given as a dict (a file's, or a
    caller's) is layered on it."""
    return field(default_factory=functools.partial(node_default, name, cls))


@dataclass(frozen=True)
class NodeConfig:
    # Paths: a relative data_dir is resolved once, against the folder of the TOML file that
    # gives it (from_toml); key is relative to data_dir; [work]'s task and model name a spec,
    # or a file or directory relative to where the node is started.
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
    metrics_port: int = field(default=0, metadata=bounded(0, MAX_PORT))  # Prometheus on 127.0.0.1:port (0: off)
    # devnets only: one of ADVERSARIES
    adversary: str = field(default="", metadata=checked(one_of(("", *ADVERSARIES))))
    # torch.set_num_threads; several nodes share a machine in devnets. 1024 is more cores than
    # any machine here has, and stops a typo from starting a million threads.
    torch_threads: int = field(default=1, metadata=bounded(1, 1024))
    # loopback: the in-process transport of tests
    transport: str = field(default="libp2p", metadata=checked(one_of(("libp2p", "loopback"))))
    # The tables. [work]: what the node's rollouts are (model, task, group_size, temperature,
    # max_new_tokens: the network's, alike on every node) and where it makes them (device,
    # generation_batch); its trainer role trains that same model on that task.
    work: GenerationConfig = _table("work", GenerationConfig)
    # [protocol]: rounds, staleness, waits, audits, planted groups, the last version.
    protocol: ProtocolParams = _table("protocol", ProtocolParams)
    train: LearnerConfig = _table("train", LearnerConfig)  # [train]: the trainer role's optimizer and evaluation
    grpo: GRPOConfig = _table("grpo", GRPOConfig)  # [grpo]: the trainer role's loss
    reputation: ReputationConfig = _table("reputation", ReputationConfig)
    admission: AdmissionConfig = _table("admission", AdmissionConfig)  # [admission]: the trainer role's batches
    # [transport_limits]: peer scoring and bans, handshake deadline, pending-connection cap;
    # each default's source is in p2p.transport.TransportLimits, which also checks the values.
    transport_limits: TransportLimits = _table("transport_limits", TransportLimits)
    zk: ZkConfig = _table("zk", ZkConfig)  # [zk]: sampling proofs, private tasks' answer key (off by default)
    # [storage]: which blobs the node keeps (tier = "default" or "archive"; specs/storage.md)
    storage: StorageConfig = _table("storage", StorageConfig)

    # A key of a table at the top level is told its table (vrl.config.build); these say more.
    moved_keys: ClassVar[dict[str, str]] = {"rounds": "renamed: it is last_version in the [protocol] table"}

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.roles or len(set(self.roles)) != len(self.roles):
            raise ConfigError(f"must be a non-empty subset of {list(ROLES)}, got {list(self.roles)}", ("roles",),
                              type(self).__name__)
        if self.adversary in TRAINER_ADVERSARIES and "trainer" not in self.roles:
            raise ConfigError(f"{self.adversary!r} is a trainer's cheat: the node needs the trainer role",
                              ("adversary",), type(self).__name__)
        for address in self.bootstrap:
            if (self.transport == "loopback") != bool(_LOOPBACK.fullmatch(address)):
                raise ConfigError(f"{address!r} is not an address of the {self.transport} transport", ("bootstrap",),
                                  type(self).__name__)

    @property
    def path(self) -> Path:
        return Path(self.data_dir)

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: object) -> NodeConfig:
        """Read and check a node.toml; every error is a :class:`ConfigError` that starts with the path."""
        with reading(path):
            return cls.from_dict(read_toml(path), base=Path(path).resolve().parent, **overrides)

    @classmethod
    def from_toml_bytes(cls, data: bytes, path: str | Path, **overrides: object) -> NodeConfig:
        """A node.toml's content, as if read from ``path`` (which names it in errors and anchors
        a relative data_dir). Any input gives a config or a :class:`ConfigError`."""
        with reading(path):
            return cls.from_dict(parse_toml(data), base=Path(path).resolve().parent, **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, object], base: Path | None = None, **overrides: object) -> NodeConfig:
        """A config from a table (what tomllib returns); a relative data_dir is taken relative
        to ``base`` when one is given, so the result holds the path to use from anywhere."""
        config: NodeConfig = build(cls, {**data, **overrides} if isinstance(data, dict) else data)
        if base is not None and not config.path.is_absolute():
            config = dataclasses.replace(config, data_dir=str(base / config.data_dir))
        return config

    def to_toml(self) -> str:
        return to_toml(self)  # the node's own keys, then a table per library
