"""What a node checks as it starts, past what its config file shows by itself: the task set
it opens, the reward it must compute, what its model can hold, and that the work and trainer
it was given do what its config says. Each problem is a :class:`ConfigError` naming the
table and the key."""

from __future__ import annotations

import structlog

from vrl.config import ConfigError, as_kwargs
from vrl.node import protocol as P
from vrl.node.config import NodeConfig
from vrl.node.work import PolicyTrainer, Work
from vrl.rl.config import TrainConfig
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import context_length, platform_tag
from vrl.rollouts.profiles import profile_of
from vrl.tasks import TaskSet, open_task_set
from vrl.tasks.answers import committed_reference


def open_tasks(config: NodeConfig, log: structlog.BoundLogger) -> tuple[TaskSet, bool]:
    """The node's task set, opened once, and whether it is private (its references committed)."""
    tasks, problems = open_task_set(config.work.task, config.work.columns)
    for problem in problems:
        log.warning("task skipped", problem=str(problem))
    try:
        return tasks, any(committed_reference(t.answer) for t in getattr(tasks, "tasks", ()))
    except ValueError as error:
        raise ConfigError(str(error), ("work", "task")) from None


def check_reward(config: NodeConfig, private: bool) -> None:
    """The reward the network names must be one this node can compute, and prove if its task
    set is private; an answer key is for a private set only."""
    if config.zk.answers and not private:
        raise ConfigError("answers is the answer key of a private task set; this [work] task has no committed "
                          "reference (vrl commit-answers)", ("zk", "answers"))
    reward_spec = config.work.reward_spec  # checked when the config was made
    # A node that cannot compute the network's reward would refuse every honest record as
    # reward_unknown: it stops here instead, saying why (specs/rewards.md §6).
    if missing := reward_spec.unknown() + reward_spec.unavailable():
        raise ConfigError(f"this node cannot compute the network's reward: {'; '.join(missing)}", ("work", "reward"))
    if private and (problem := reward_spec.provable()):
        raise ConfigError(problem, ("work", "reward"))


def check_context(config: NodeConfig, work: Work, log: structlog.BoundLogger) -> None:
    """The model must leave room for a prompt after the tokens a record may sample."""
    context = context_length(work.skeleton)
    if context is not None and work.max_new_tokens >= context:
        raise ConfigError(f"the model has {context} positions; max_new_tokens must leave room for a prompt",
                          ("work", "max_new_tokens"))
    if not config.work.max_new_tokens:
        log.info("max_new_tokens chosen from the task set", max_new_tokens=work.max_new_tokens,
                 why=work.max_new_tokens_why)


def check_cheat(config: NodeConfig, work: Work, trainer: PolicyTrainer | None) -> None:
    """The work and trainer a node was given cheat as its config says, or not at all."""
    cheat = work.cheat or (trainer.cheat if trainer is not None else "")
    if cheat != config.adversary:
        raise ValueError(f"adversary {config.adversary!r} is configured, but the work and trainer given do "
                         f"{cheat or 'no cheat'}: build the node with vrl.harness.adversary.node_for")


def protocol_for(config: NodeConfig, key: NodeKey, work: Work) -> P.NodeProtocol:
    """The node's protocol state machine, configured by its [protocol], [reputation] and
    [admission] tables, on its model's platform."""
    return P.NodeProtocol(key, P.ProtocolConfig(
        **as_kwargs(config.protocol), roles=frozenset(config.roles), trainer=bytes.fromhex(config.trainer),
        pretrusted=frozenset(bytes.fromhex(p) for p in config.pretrusted), reputation=config.reputation,
        admission=config.admission), platform_tag(work.skeleton), profile_of(work.skeleton).race_loss_rate)


def train_config(config: NodeConfig, max_new_tokens: int) -> TrainConfig:
    """The trainer trains the network's model on its task ([work]); the rest is the node's: a
    step per admitted batch, a checkpoint per version (announced after it is on disk), one
    step past the last version."""
    return TrainConfig(
        **{**as_kwargs(config.work), "max_new_tokens": max_new_tokens}, **as_kwargs(config.train),
        grpo=config.grpo,
        steps=max(config.protocol.last_version, 1) + 1, groups_per_step=config.admission.batch_groups,
        checkpoint_every=1)
