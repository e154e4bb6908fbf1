"""The settings of a GRPO run, in a module that imports neither torch nor transformers:
:class:`GRPOConfig` (the loss), :class:`LearnerConfig` (how the policy learns and is measured)
and :class:`TrainConfig` (one machine's run, ``vrl train``). ``vrl train --help`` shows these
defaults (issue 18, item 7) in the time a help takes; :mod:`vrl.rl.grpo` and
:mod:`vrl.rl.train` use them. The GRPO references cited below are those of :mod:`vrl.rl.grpo`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import structlog

from vrl.config import U63, ConfigError, bounded, build, check_fields, checked, one_of, read_toml, reading, to_toml
from vrl.rl.trackers import TRACKERS
from vrl.rollouts.config import GenerationConfig
from vrl.tasks import RewardError, RewardSpec, parse_spec

ADVANTAGES = ("std", "mean")
AGGREGATIONS = ("token", "sequence", "constant")


@dataclass(frozen=True)
class GRPOConfig:
    """The loss's settings: ``[grpo]`` in ``vrl train``'s TOML and in a node's. Each value is
    checked where it is made (:func:`vrl.config.check_fields`)."""

    # "std": (r-mean)/(std+eps), GRPO §4.1.2; "mean": r-mean, Dr. GRPO §3.1
    advantage: str = field(default="std", metadata=checked(one_of(ADVANTAGES)))
    # "token" DAPO §3.3; "sequence" GRPO eq. 3; "constant" Dr. GRPO §3.1
    aggregation: str = field(default="token", metadata=checked(one_of(AGGREGATIONS)))
    # lower clip, DAPO §3.1 keeps PPO's 0.2; below 1, so that 1 - eps_low > 0
    eps_low: float = field(default=0.2, metadata=bounded(0, 1, open_low=True, open_high=True))
    # upper clip, DAPO §3.1 clip-higher value
    eps_high: float = field(default=0.28, metadata=bounded(0, open_low=True))
    # k3 penalty weight; DAPO §2.3 drops it (0 = no reference model needed)
    kl_beta: float = field(default=0.0, metadata=bounded(0))
    # TIS truncation C, verl's rollout_is_threshold default / TIS blog; below 1 it would damp
    # on-policy tokens
    is_cap: float = field(default=2.0, metadata=bounded(1))
    # added to the group std, as TRL's GRPOTrainer does
    std_eps: float = field(default=1e-4, metadata=bounded(0, open_low=True))
    # mu, optimiser steps per batch (GRPO Algorithm 1; TRL's num_iterations, default 1). With 1
    # the ratio is exactly 1 and the clip never binds; above 1, pi_old is the first pass. 64
    # passes over one batch is far past any setting the references use.
    iterations: int = field(default=1, metadata=bounded(1, 64))

    # How stale a rollout may be is the network's bound, not the loss's: a single-machine run
    # samples every batch from its current policy (vrl/node/config.py, NODE_OVERRIDES' notes).
    moved_keys: ClassVar[dict[str, str]] = {
        "max_staleness": "moved to the [protocol] table of node.toml, the network's bound (vrl train samples "
                         "every batch from its current policy: its rollouts never lag); delete it here"}

    def __post_init__(self) -> None:
        check_fields(self)



#: Keys an earlier vrl wrote into a run's config.toml that this one no longer has, with why:
#: resuming such a run drops them (TrainConfig.from_saved).
RETIRED_KEYS = {
    ("grpo", "max_staleness"): "a network's bound, now [protocol] max_staleness of node.toml; vrl train samples "
                               "every batch from its current policy, so it never applied here",
}


@dataclass(frozen=True)
class LearnerConfig:
    """How the policy learns and how it is measured: keys of ``vrl train``'s TOML, and a node's
    ``[train]`` table (its trainer role). Each value is checked where it is made."""

    # Measured here (bench/learning.py): 1e-4 and above wreck the base model within a few steps;
    # 2e-5 with warmup learns steadily. Adam moves each weight by about the learning rate per
    # step, so 1 is no learning rate at all.
    learning_rate: float = field(default=2e-5, metadata=bounded(0, 1, open_low=True))
    # A fresh Adam's first steps move every weight by about the full learning rate whatever
    # the gradient's size; measured here, that alone costs the base model 0.2-0.5 nats of
    # held-out likelihood at 1e-4. A linear warmup lets the moment estimates settle first:
    # 20 steps, a tenth of a default run.
    warmup_steps: int = field(default=20, metadata=bounded(1, U63))
    # The gradient norm is clipped to this: TRL's max_grad_norm (transformers' TrainingArguments) default.
    grad_clip: float = field(default=1.0, metadata=bounded(0, open_low=True))
    track_kl: bool = True  # keep the initial policy to report KL even when kl_beta is 0
    # Held-out problems evaluated (twice) every eval_every steps: at the base model's ~30%
    # sampled accuracy, 256 give a standard error of about 3 points (sqrt(0.3 x 0.7 / 256)).
    # 2^16 is 50 times GSM8K's test split, and keeps one evaluation's time bounded.
    held_out: int = field(default=256, metadata=bounded(1, 2**16))
    eval_every: int = field(default=10, metadata=bounded(1, U63))  # steps: 20 points on a default run's curve
    # The newest checkpoint and the one before: if the newest is damaged, resume falls back to
    # the other (vrl.rl.checkpoint.load_latest).
    keep_checkpoints: int = field(default=2, metadata=bounded(1, 2**16))
    # Where each step's metrics go besides the run's own record (vrl.rl.trackers; vrl train's
    # metrics.jsonl, a node's store): nowhere else, as TRL's report_to defaults to "none"
    # (transformers 5 TrainingArguments).
    report_to: tuple[str, ...] = field(default=(), metadata=checked(one_of(TRACKERS)))

    def __post_init__(self) -> None:
        check_fields(self, LearnerConfig)  # a subclass's further fields are its own to check


_LEGACY = RewardSpec().as_legacy()  # the reward's defaults are the spec's (specs/rewards.md §2): (1.0, 0.0, "")
assert _LEGACY is not None  # the default spec is one a v2 record states
_REWARD: tuple[float, float, str] = _LEGACY


@dataclass(frozen=True)
class TrainConfig(LearnerConfig, GenerationConfig):
    """One machine's run (``vrl train``): what its rollouts are (:class:`GenerationConfig`),
    how it learns (:class:`LearnerConfig`), and the run's own settings below. Its TOML is flat,
    with the GRPO keys under ``[grpo]``; ``RUN/config.toml`` records the effective one."""

    # a third of the README's 600-step run (bench/learning.py)
    steps: int = field(default=200, metadata=bounded(1, U63))
    # 16 groups x 8: the batch the README's learning runs and bench/vs_trl.py use. A step
    # holds its batch in memory; 2^16 groups is far past any measured here.
    groups_per_step: int = field(default=16, metadata=bounded(1, 2**16))
    # Without terms in `reward` (GenerationConfig), the reward is these three keys: the exact
    # answer plus a format reward, as a v2 record states it (specs/rewards.md §2).
    reward_correct: float = _REWARD[0]  # RewardSpec.legacy checks the three (reward_spec)
    reward_format: float = _REWARD[1]
    answer_tag: str = _REWARD[2]
    verify_fraction: float = field(default=1.0, metadata=bounded(0, 1))  # every group, as the README's runs
    # steps, as eval_every: a killed run redoes at most 9
    checkpoint_every: int = field(default=10, metadata=bounded(1, U63))
    grpo: GRPOConfig = field(default_factory=GRPOConfig)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.reward and (self.reward_correct, self.reward_format, self.answer_tag) != _REWARD:
            raise ConfigError("give the reward either as reward terms or as reward_correct, reward_format and "
                              "answer_tag, not both", ("reward",), type(self).__name__)
        if self.reward:
            self._check_reward()
        try:
            self.reward_spec  # noqa: B018 (the property parses the spec: a bad one fails here, when read)
        except RewardError as error:
            key = "reward_format" if error.field == "reward_spec.format" else "reward_correct"
            raise ConfigError(error.problem, (key,), type(self).__name__) from None

    @cached_property  # parsed once per config: the trainer reads it every step
    def reward_spec(self) -> RewardSpec:
        if self.reward:
            return parse_spec(self.reward)
        return RewardSpec.legacy(self.reward_correct, self.reward_format, self.answer_tag)

    @classmethod
    def from_toml(cls, path: Path, **overrides: Any) -> TrainConfig:
        """Read a TOML file (top-level keys as here, GRPO keys under ``[grpo]``), then apply
        overrides (the flags; see :meth:`from_dict`). A mistake in the file is a
        :class:`~vrl.config.ConfigError` naming the file, the table and the key."""
        with reading(path):
            config = cls.from_dict(read_toml(path))
        return cls.from_dict(asdict(config), **overrides) if overrides else config

    @classmethod
    def from_saved(cls, path: Path, **overrides: Any) -> TrainConfig:
        """A run's own ``config.toml``, as this or an earlier vrl wrote it, for ``--resume``:
        keys an earlier version wrote that this one retired (:data:`RETIRED_KEYS`) are dropped
        with a warning, so an upgrade alone does not strand a run. A file a user gives
        (:meth:`from_toml`) is refused on them instead, naming where the setting went. Values
        that this version checks more strictly than the one that wrote them (a ``group_size``
        of 1, a learning rate above 1) are refused, naming the key, as from any file."""
        with reading(path):
            data = read_toml(path)
        for (table, key), why in RETIRED_KEYS.items():
            if isinstance(data.get(table), dict) and key in data[table]:
                del data[table][key]
                structlog.get_logger().warning("retired setting in the run's config ignored", file=str(path),
                                               key=f"[{table}] {key}", why=why)
        with reading(path):
            config = cls.from_dict(data)
        return cls.from_dict(asdict(config), **overrides) if overrides else config

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> TrainConfig:
        """A config from a table (what tomllib reads) and overrides (flags, ``grpo`` a dict of
        its own; None is a flag not given). Unknown keys, wrong types and values out of range
        are a :class:`~vrl.config.ConfigError` naming the table and the key."""
        data = {**data, **{k: v for k, v in overrides.items() if v is not None and k != "grpo"}}
        grpo = {k: v for k, v in overrides.get("grpo", {}).items() if v is not None}
        if grpo:
            table = data.get("grpo", {})
            data["grpo"] = {**table, **grpo} if isinstance(table, dict) else table  # not a table: build says so
        return build(cls, data)

    def to_toml(self) -> str:
        return to_toml(self)  # the [grpo] table last, as tomli-w writes tables
