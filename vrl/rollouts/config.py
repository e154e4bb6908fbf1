"""What a run's rollouts are and where they are made (:class:`GenerationConfig`), in a module
that imports neither torch nor transformers: ``vrl train --help`` shows these defaults (issue 18,
item 7) in the time a help takes, and a config file is checked before any model loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from vrl.config import ConfigError, bounded, check_fields, checked, path_like
from vrl.rollouts.presets import DEFAULT
from vrl.rollouts.record import MAX_GROUP_SIZE
from vrl.tasks import RewardError, RewardSpec, columns_spec, parse_spec, task_spec
from vrl.tasks.rewards import term_problem

# The forms resolve_device takes, for a config to check before anything is loaded (whether the
# device exists is only known on the machine, when the model is loaded).
_DEVICE_FORM = re.compile(r"auto|cpu|cuda(?::\d{1,4})?")


def device_spec(text: str) -> str | None:
    """What is wrong with the form of a device name (config field metadata), or None."""
    return None if _DEVICE_FORM.fullmatch(text) else f"expected auto, cpu, cuda or cuda:N, got {text!r}"



@dataclass(frozen=True)
class GenerationConfig:
    """What a run's rollouts are and where they are made: the top-level keys of ``vrl train``'s
    TOML (:class:`vrl.rl.config.TrainConfig` is one) and a node's ``[work]`` table
    (:class:`vrl.node.work.WorkConfig`). On a network, every node's model, task, group size,
    temperature and max_new_tokens must agree: verifiers pin them (specs/verification.md)."""

    # The base model (vrl build-base-model), what this repository's RL runs start from; a node
    # builds its skeleton from it and takes the weights from the trainer by hash.
    model: str = field(default="base", metadata=checked(path_like))
    # What the base model was fine-tuned on (its recipe, vrl.rollouts.presets.DEFAULT.tasks).
    task: str = field(default=DEFAULT.tasks, metadata=checked(task_spec))
    # A task file's own column names for the fields its rows are read by, as
    # "prompt=question,answer=solution" (vrl.tasks.files.parse_columns); none by default.
    columns: str = field(default="", metadata=checked(columns_spec))
    # Where the policy runs: CUDA when there is one (vrl.rollouts.model.resolve_device, which
    # also says, when the model loads, whether the device exists).
    device: str = field(default="auto", metadata=checked(device_spec))
    # TRL's num_generations default. GRPO compares the samples of a group, so at least 2; at
    # most MAX_GROUP_SIZE (specs/record.md §3).
    group_size: int = field(default=8, metadata=bounded(2, MAX_GROUP_SIZE))
    # Sample from the policy itself: TRL and DeepSeekMath use 1.0. At 0 (greedy) a group's
    # samples are alike and GRPO has no signal; records allow up to 100 (specs/sampler.md §1),
    # this stops at 10, far past any temperature a run here has used.
    temperature: float = field(default=1.0, metadata=bounded(0, 10, open_low=True))
    # 0: chosen from the task set when the model is loaded (vrl.rollouts.generate.choose_max_new_tokens), and recorded
    # as chosen: 8 for arithmetic, the reference solutions' length for worked problems. A record
    # allows 1 .. 2^20 (specs/record.md §1).
    max_new_tokens: int = field(default=0, metadata=bounded(0, 2**20))
    # Rollouts decoded (and prefilled) per forward pass: a whole step's 16 x 8 at once, as TRL
    # generates its batch. On a small model each pass costs about the same at 64 rows as at
    # 128, so halving the passes took generation from 145 to 108 ms/step here (bench/vs_trl.py).
    # 2^16 rows is far past any batch a device here holds.
    generation_batch: int = field(default=128, metadata=bounded(1, 2**16))
    # The reward: terms in their text form (specs/rewards.md §5), such as ["answer:tag=answer",
    # "format:0.1"]. Empty is the default spec, the exact answer untagged (what the base model
    # answers); on a network, every node's must agree, as the task's must.
    reward: tuple[str, ...] = field(default=(), metadata=checked(term_problem))

    def __post_init__(self) -> None:
        check_fields(self, GenerationConfig)  # a subclass's further fields are its own to check
        self._check_reward()

    def _check_reward(self) -> None:
        """The terms together (each reward once), beyond each term's own check."""
        try:
            self.reward_spec  # noqa: B018 (the property parses the spec: a bad one fails here, when read)
        except RewardError as error:
            raise ConfigError(error.problem, ("reward",), type(self).__name__) from None

    @cached_property  # parsed once per config: the trainer reads it every step
    def reward_spec(self) -> RewardSpec:
        return parse_spec(self.reward) if self.reward else RewardSpec()
