"""Cheating nodes, for tests, benchmarks and devnets that put verifiers to the test.

:func:`degraded` builds what a dishonest prover runs instead of the claimed model;
:func:`spoofed_groups` samples with an altered computation and does everything else honestly
(issue 16, "verification at the margin"); :class:`CheatingWork` is a node's work done
dishonestly in one of the ways :data:`vrl.node.config.ADVERSARIES` names, each what a
cheating node would really run, not a label. It sits at the top of the stack: the node never
imports it, and no honest class has a hook for it. ``vrl node`` builds a node whose config asks
for a cheat with :func:`node_for`, which hands the node the cheat's work and trainer and wires
what the cheat needs besides: the replayer overhears group gossip on the node's transport; the
trainer that trains groups it failed reads its node's protocol state."""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, MutableSequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import structlog
import torch
from transformers import DynamicCache

from p2p.transport import Transport
from proofs.sampler import replay, replay_sequences, sample
from proofs.sampling_params import SamplingParams
from vrl.node import protocol as P
from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES, NodeConfig
from vrl.node.daemon import Node
from vrl.node.messages import Group, Outcome, recomputed_digest
from vrl.node.protocol import NodeProtocol
from vrl.node.work import CheckResult, PolicyTrainer, Work, WorkConfig, tampered
from vrl.rl.config import TrainConfig
from vrl.rl.step import PolicyForward
from vrl.rollouts.forward import HOST, Decoded, decode, prefill
from vrl.rollouts.generate import Decoder, iter_generate
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, network_device
from vrl.rollouts.record import Rollout
from vrl.rollouts.sequential import RaceTest
from vrl.rollouts.verify import Expectations, Verdict
from vrl.tasks import TaskSet
from vrl.tasks.answers import committed_reference


def _int4(weight: torch.Tensor, _generator: torch.Generator) -> torch.Tensor:
    """Symmetric int4 weight-only quantization in groups of 32 inputs (GPTQ/AWQ-style layout)."""
    rows, cols = weight.shape
    grouped = weight.reshape(rows, cols // 32, 32)
    scale = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 7
    return (torch.clamp(torch.round(grouped / scale), -8, 7) * scale).reshape(rows, cols)


def _per_channel(weight: torch.Tensor, _generator: torch.Generator, bits: int = 8) -> torch.Tensor:
    """Symmetric weight-only quantization per output channel to ``bits``-bit integers
    (computed in float32, so that a bfloat16 model's grid is the integer one)."""
    levels = 2 ** (bits - 1) - 1
    scale = weight.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
    quantized: torch.Tensor = (torch.round(weight.float() / scale).clamp(-levels, levels) * scale).to(weight.dtype)
    return quantized


def _perturb(weight: torch.Tensor, generator: torch.Generator, relative: float = 0.01) -> torch.Tensor:
    """Multiplicative noise of relative size ``relative``: a stand-in for a fine-tune or a
    stale checkpoint. Drawn and applied in float32: in bfloat16, whose step near 1 is 0.8%,
    ``1 + 0.003 * noise`` would round to a few values."""
    noise = torch.randn(weight.shape, generator=generator)
    return (weight.float() * (1 + relative * noise)).to(weight.dtype)


def _reinit(weight: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A different model of the same shape."""
    return torch.randn(weight.shape, generator=generator).to(weight) * weight.std()


Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
DEGRADATIONS: dict[str, Transform] = {"int4": _int4, "int8": _per_channel, "perturb-1pct": _perturb,
                                      "other-model": _reinit}


def degraded(model: Model, kind: str, seed: int = 1234, transform: Transform | None = None) -> Model:
    """A copy of ``model`` with every weight matrix degraded as ``kind`` says: one of
    :data:`DEGRADATIONS`, or any name for ``transform``."""
    transform = transform or DEGRADATIONS[kind]
    network = copy.deepcopy(model.network)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in sorted(network.state_dict().items()):
            if tensor.ndim == 2:
                tensor.copy_(transform(tensor, generator))
    return Model(name=f"{model.name}+{kind}", network=network, tokenizer=model.tokenizer, dtype_name=model.dtype_name)


# -- decode spoofing (issue 16, "verification at the margin") ------------------------------------
#
# The cheat samples every token with a cheaper or altered computation, using the protocol's
# own seeded Gumbel noise (it has the seeds, as an honest node does), and then does the rest
# of the record honestly: one prefill of the claimed model over its tokens gives the
# commitment and the behaviour logprobs, the reward is recomputed from the text, and the
# record is signed with the claimed model's hash. Every per-rollout check passes by
# construction except the race replay, and there only the tokens the altered computation chose
# differently lose, each by what the alteration moved the race: often less than the per-rollout
# tolerance. What the verifier can still count is how often they lose (vrl.rollouts.sequential).

#: Each spoof's strength, in its own unit, at the three settings bench/redteam.py runs, the
#: weakest first.
SPOOF_STRENGTHS: dict[str, tuple[float, ...]] = {
    # Bits per weight of per-output-channel symmetric quantization: 8 is int8 proper
    # (degraded(model, "int8")), 6 and 4 the same scheme coarser.
    "int8": (8, 6, 4),
    # Relative size of multiplicative Gaussian noise on every weight matrix: 0.3% is below
    # what a fine-tune step moves, 3% a visibly different checkpoint.
    "perturb": (0.003, 0.01, 0.03),
    # eps: samples at T * (1 + eps) while claiming T.
    "temperature": (0.02, 0.05, 0.1),
    # delta, in raw-logit units as the verifier's race margin: an int8 draft's token is kept
    # whenever the claimed model's own race lets it lose by less than delta.
    "approximate": (0.01, 0.05, 0.1),
}
SPOOFS = tuple(SPOOF_STRENGTHS)
#: The strength a spoofing node adversary (``spoof-<kind>``, vrl.node.config.ADVERSARIES) runs
#: at: the weakest of SPOOF_STRENGTHS that still changes a token in a fair share (5% or more)
#: of the base model's rollouts at the node's defaults (8 new tokens; 4 x 32 groups of 4,
#: measured here), so that a devnet's few rounds show the cheat at all. int8 is int8 however
#: rarely it changes a token (1.2% of rollouts); perturb changes 0.8, 2.0 and 6.8% at its three
#: strengths, temperature 1.8, 4.1 and 7.4%; approximate cannot change more than its int8
#: draft does, all of it already at delta 0.05 (the draft's tokens never lose by more), 1.2%.
NODE_SPOOF_STRENGTH = {"int8": 8, "perturb": 0.03, "temperature": 0.1, "approximate": 0.05}

#: What a spoof samples the tokens with: ``(prompts, seeds, sampling) -> completions``.
Draw = Callable[[list[list[int]], list[bytes], SamplingParams], list[list[int]]]


def spoofed_groups(model: Model, kind: str, strength: float, tasks: TaskSet, key: NodeKey,
                   **options: Any) -> Iterator[list[Rollout]]:
    """Whole signed GRPO groups whose tokens the ``kind`` spoof (one of :data:`SPOOFS`) sampled
    at ``strength`` (its unit: :data:`SPOOF_STRENGTHS`), each committed, given behaviour
    logprobs, rewarded and signed as the claimed ``model`` would have. ``options`` are
    :func:`~vrl.rollouts.generate.iter_generate`'s: the same ones give the same assignment and
    seeds as an honest node's groups."""
    return iter_generate(model, tasks, key, decoder=spoofing_decoder(model, kind, strength), **options)


def spoofing_decoder(model: Model, kind: str, strength: float) -> Decoder:
    """A :data:`~vrl.rollouts.generate.Decoder` that draws the tokens as the spoof does and
    reports what the claimed model's own decode would have for them."""
    draw = _spoofed_draw(model, kind, strength)

    def decoder(claimed: Model, prompts: list[list[int]], seeds: list[bytes], sampling: SamplingParams,
                on_step: Callable[[], None] | None = None) -> list[Decoded]:
        # (on_step, a progress callback per decoding step, is not called: a draw runs whole.)
        return claimed_paperwork(claimed, prompts, seeds, sampling, draw(prompts, seeds, sampling))

    return decoder


def _spoofed_draw(model: Model, kind: str, strength: float) -> Draw:
    if kind == "int8":
        bits = int(strength)
        return _decoded_by(degraded(model, f"int{bits}", transform=functools.partial(_per_channel, bits=bits)))
    if kind == "perturb":
        return _decoded_by(degraded(model, f"perturb-{strength:g}",
                                    transform=functools.partial(_perturb, relative=strength)))
    if kind == "temperature":
        return _decoded_by(model, temperature_factor=1 + strength)
    if kind == "approximate":
        return _approximate(model, degraded(model, "int8"), delta=strength)
    raise ValueError(f"unknown spoof {kind!r}; choose from {', '.join(SPOOFS)}")


def _decoded_by(sampler: Model, temperature_factor: float = 1.0) -> Draw:
    """Completions as ``sampler`` decodes them, at ``temperature_factor`` times the temperature
    the record will claim, with the protocol's own seeded races (forward.decode)."""

    def draw(prompts: list[list[int]], seeds: list[bytes], sampling: SamplingParams) -> list[list[int]]:
        actual = dataclasses.replace(sampling, temperature=sampling.temperature * temperature_factor)
        return [result.tokens for result in decode(sampler, prompts, seeds, actual)]

    return draw


def _approximate(claimed: Model, draft: Model, delta: float) -> Draw:
    """Approximate decoding: speculative decoding with a loose acceptance rule. At each
    position the draft model proposes its race winner; the claimed model runs the same race
    (the same seeded noise) and the proposal is kept when it loses there by less than
    ``delta``, else the claimed model's own winner is taken."""

    def draw(prompts: list[list[int]], seeds: list[bytes], sampling: SamplingParams) -> list[list[int]]:
        networks = (_Lockstep(claimed, prompts), _Lockstep(draft, prompts))
        completions: list[list[int]] = [[] for _ in prompts]
        stops = set(sampling.stop_token_ids)
        for position in range(sampling.max_new_tokens):
            live = [b for b, tokens in enumerate(completions) if not tokens or tokens[-1] not in stops]
            if not live:
                break
            if position:
                for network in networks:
                    network.advance([tokens[-1] for tokens in completions])
            claimed_logits, draft_logits = (network.logits[live] for network in networks)
            races = ([seeds[b] for b in live], [position] * len(live), sampling)
            proposed, _ = sample(draft_logits, *races)
            own, _ = sample(claimed_logits, *races)
            lost_by = replay(claimed_logits, proposed, *races, slack=0.0).margins
            for b, token in zip(live, np.where(lost_by < delta, proposed.numpy(), own.numpy()).tolist()):
                completions[b].append(token)
        return completions

    return draw


class _Lockstep:
    """One network decoding a batch with a KV cache, every row one token further each step:
    a finished row is still fed (its own last token) and its logits ignored, so the cache is
    never reshaped. ``logits`` are what choose each row's next token."""

    @torch.inference_mode()
    def __init__(self, model: Model, prompts: list[list[int]]) -> None:
        self.network, self.device = model.network, network_device(model.network)
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), model.pad_token_id, dtype=torch.long)
        self.mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left-padded, so every row's last token is last
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            self.mask[row, width - len(prompt):] = 1
        self.positions = (self.mask.cumsum(-1) - 1).clamp_min(0)
        self.cache = DynamicCache()
        self.logits = self._forward(input_ids)

    @torch.inference_mode()
    def advance(self, tokens: list[int]) -> None:
        self.mask = torch.cat([self.mask, torch.ones((len(tokens), 1), dtype=torch.long)], dim=1)
        self.positions = self.positions[:, -1:] + 1
        self.logits = self._forward(torch.tensor(tokens)[:, None])

    def _forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.network(input_ids=input_ids.to(self.device), attention_mask=self.mask.to(self.device),
                           position_ids=self.positions.to(self.device), past_key_values=self.cache, use_cache=True,
                           logits_to_keep=1)
        logits: torch.Tensor = out.logits[:, -1].to(HOST)  # transformers' output is untyped
        return logits


def claimed_paperwork(model: Model, prompts: list[list[int]], seeds: list[bytes], sampling: SamplingParams,
                      completions: list[list[int]]) -> list[Decoded]:
    """What ``model``'s own decode would have reported for completions it did not sample,
    from one batched prefill: the hidden rows the commitment is built from, and the behaviour
    logprobs as specs/sampler.md §3 defines them, ``log_softmax(z/T over the kept set)`` at the
    claimed token, in float64 stored as float32. The sampler's replay computes exactly that
    (over the kept set plus the token, the same set for any token the masks keep), on the
    verifier's own prefill logits: a claimed logprob the verifier cannot fault."""
    prefilled = prefill(model, [(list(p), list(c)) for p, c in zip(prompts, completions)])
    races = replay_sequences([(p.logits, torch.tensor(c, dtype=torch.long), seed, sampling)
                              for p, c, seed in zip(prefilled, completions, seeds)], slack=0.0)
    stops = set(sampling.stop_token_ids)
    return [Decoded(list(c), race.logprobs.astype(np.float32), "stop" if c[-1] in stops else "length", p.hidden)
            for p, c, race in zip(prefilled, completions, races)]


def tokens_to_detection(rollouts: Iterable[Rollout], verdicts: Iterable[Verdict], q0: float) -> int | None:
    """The completion tokens a verifier reads, taking one producer's rollouts in order, until
    it knows the producer cheats: through the first rollout rejected outright, or the first
    whose races take the producer's sequential test (:class:`~vrl.rollouts.sequential.RaceTest`
    at honest loss rate ``q0``) to rejection. None when neither happens."""
    test, read = RaceTest(q0), 0
    for rollout, verdict in zip(rollouts, verdicts, strict=True):
        read += len(rollout.completion_tokens)
        # A rollout stopped before the race replay (stage 5) carries no race evidence.
        test = test.add(*verdict.race_evidence)
        if not verdict.accepted or test.rejected:
            return read
    return None


T = TypeVar("T")


def take_freshest(loot: MutableSequence[T], usable: Callable[[T], bool]) -> T | None:
    """The replay cheat's pick: the last-received item of ``loot`` that ``usable`` accepts, taken
    out of it; None when there is none. Shared by the devnet's replayer
    (:meth:`CheatingWork.replayed`) and the simulator's (vrl.harness.simulator.actions)."""
    for i in range(len(loot) - 1, -1, -1):
        if usable(loot[i]):
            item = loot[i]
            del loot[i]
            return item
    return None


class CheatingWork(Work):
    """A node that cheats as ``kind`` says (one of :data:`~vrl.node.config.ADVERSARIES`) and
    otherwise works as an honest node does."""

    def __init__(self, key: NodeKey, config: WorkConfig, expectations: Callable[[int], Expectations], *,
                 kind: str) -> None:
        if kind not in ADVERSARIES or kind in TRAINER_ADVERSARIES:
            raise ValueError(f"unknown adversary {kind!r}; choose from {', '.join(ADVERSARIES)}")
        super().__init__(key, config, expectations)
        self.cheat = kind
        self.seen_groups: list[tuple[Rollout, ...]] = []  # the replay cheat's loot: others' groups
        # Which policy versions a new group may still carry and be taken (node_for sets the
        # node's own rule, NodeProtocol.takes_new_groups): the replayer copies only such loot.
        self.takes: Callable[[int], bool] = lambda version: True

    def generate(self, version: int) -> list[Group]:
        model = self.models[version]
        if self.cheat in ("quantized-model", "other-model"):
            # Sample with a cheaper or different model, then claim the real policy's hash:
            # what the cheat is about.
            cheap = degraded(model, "int8" if self.cheat == "quantized-model" else "other-model")
            groups = [[r.signed(self.key, model_hash=model.model_hash) for r in g] for g in self.sample(cheap, version)]
        elif self.cheat.startswith("spoof-"):
            groups = self.spoofed(model, version)
        else:
            groups = self.sample(model, version)
        if self.cheat == "fabricated-reward":
            groups = [[r.signed(self.key, reward=1.0) for r in g] for g in groups]
        elif self.cheat == "tampered-tokens":
            groups = [[tampered(g[0], model, self.key), *g[1:]] for g in groups]
        elif self.cheat == "replay":
            groups = [self.replayed() or g for g in groups]
        return [Group.of(g) for g in groups]

    def replayed(self) -> list[Rollout] | None:
        """The freshest loot the network would still take, re-signed as one's own and taken out
        of the loot; None when there is none. A record keeps its own policy version when
        re-signed, so loot of a version the network no longer takes (too stale, or a round whose
        manifest is out) would be dropped at every node unchecked: no gain to the replayer, and
        no test of the defences."""
        rollouts = take_freshest(self.seen_groups, lambda loot: self.takes(loot[0].policy_version))
        return None if rollouts is None else [r.signed(self.key) for r in rollouts]

    def spoofed(self, model: Model, version: int) -> list[list[Rollout]]:
        """The round's groups as :meth:`~vrl.node.work.Work.sample` makes them, their tokens
        sampled as the node's spoof does (at NODE_SPOOF_STRENGTH)."""
        kind = self.cheat.removeprefix("spoof-")
        return self.sample(model, version, decoder=spoofing_decoder(model, kind, NODE_SPOOF_STRENGTH[kind]))

    def overheard(self, group: Group) -> None:
        """Another node's group was stored here: the replay cheat's loot, the last 16 kept."""
        if self.cheat == "replay" and group.subject != self.key.node_id:
            self.seen_groups = [*self.seen_groups[-15:], group.rollouts]

    def check(self, group: Group, version: int, forward: PolicyForward | None = None) -> CheckResult:
        if self.cheat == "lazy-verifier":
            # Approves unseen; the digest it must attach is made up (copying the prover's own
            # commitments is the best it can do without a prefill), and so is the evidence: every
            # race won, which is what an honest group mostly shows.
            return CheckResult((), recomputed_digest([r.commitment for r in group.rollouts]),
                               sum(len(r.completion_tokens) for r in group.rollouts), 0)
        return super().check(group, version, forward)


# A dishonest trainer trains honestly up to this version, so that a devnet first shows the
# network working (and honest steps replaying clean) before the first bad version, CHEAT_FROM + 1.
CHEAT_FROM = 3
# The fake-weights cheat's noise: 0.1% of each weight, far below what changes the model's
# behaviour visibly, far above the replay tolerance (vrl.rl.step.DRIFT_TOLERANCE).
FAKE_WEIGHTS_NOISE = 1e-3
# The foreign-data cheat's throw-away identity, derived from the trainer's id: a node no one knows.
FOREIGN_DOMAIN = b"vrl/foreign-data/v1\x00"


class CheatingTrainer(PolicyTrainer):
    """A trainer that cheats as ``kind`` says (one of
    :data:`~vrl.node.config.TRAINER_ADVERSARIES`) from step CHEAT_FROM on, each the way a real
    dishonest trainer would, and announces the step as an honest one would."""

    def __init__(self, config: TrainConfig, run_dir: Path, key: NodeKey, tasks: TaskSet | None = None, *,
                 kind: str) -> None:
        if kind not in TRAINER_ADVERSARIES:
            raise ValueError(f"unknown trainer adversary {kind!r}; "
                             f"choose from {', '.join(sorted(TRAINER_ADVERSARIES))}")
        super().__init__(config, run_dir, key, tasks)
        self.cheat = kind
        self.log = structlog.get_logger("vrl.harness.adversary")
        self._stranger = NodeKey.from_seed(hashlib.sha256(FOREIGN_DOMAIN + key.node_id).digest())

    def _cheating(self) -> bool:
        return self.version >= CHEAT_FROM

    def with_failed_groups(self, batch: tuple[tuple[bytes, float], ...],
                           protocol: NodeProtocol) -> tuple[tuple[bytes, float], ...]:
        """trainer-rejected-group: the batch admission picked, and the fresh groups it failed
        itself a round or more ago (``protocol``: its node's state)."""
        current = protocol.version
        if self.cheat != "trainer-rejected-group" or not self._cheating() or current is None:
            return batch
        listed = {d for d, _ in batch}
        failed = sorted(d for d, verdicts in protocol.verdicts.items()
                        if (own := verdicts.get(protocol.me)) is not None and own.outcome == Outcome.HARD_FAIL
                        and own.round < current and d in protocol.groups and d not in listed
                        and 0 <= current - protocol.groups[d].version <= protocol.config.max_staleness)
        if failed:
            self.log.warning("cheating", kind=self.cheat, version=self.version + 1, groups=len(failed[:2]))
        return (*batch, *((d, 1.0) for d in failed[:2]))

    def update(self, groups: list[Group], weights: list[float], *, forward: PolicyForward | None = None,
               rewards: list[list[float]] | None = None) -> dict[str, float]:
        # The honest pass over the batch (forward) serves only a step on that very batch.
        if not self._cheating() or self.cheat == "trainer-rejected-group":
            return super().update(groups, weights, forward=forward, rewards=rewards)
        self.log.warning("cheating", kind=self.cheat, version=self.version + 1)
        if self.cheat == "trainer-inflated-rewards":
            # Every answer to a private task scored correct; its proofs, made before, are honest.
            spec, decode_ = self.trainer.config.reward_spec, self.policy().decode
            return super().update(groups, weights, rewards=[
                [spec.reward_given(True, decode_(list(r.completion_tokens)))
                 if committed_reference(r.reference) is not None else r.reward for r in g.rollouts] for g in groups])
        if self.cheat == "trainer-foreign-data":
            # A group it sampled itself under an identity no one knows, never gossiped.
            policy = self.policy()
            (extra,) = iter_generate(policy, self.trainer.tasks, self._stranger, round_seed=policy.model_hash,
                                     sampling=self.trainer.sampling, groups=1, group_size=len(groups[0].rollouts)
                                     if groups else self.trainer.config.group_size, policy_version=self.version)
            return super().update([*groups, Group.of(extra)], [*weights, 1.0])
        if self.cheat == "trainer-drops-node":
            victim = next((g.subject for g in groups), None)  # the first admitted node's groups go
            kept = [(g, w) for g, w in zip(groups, weights) if g.subject != victim]
            return super().update([g for g, _ in kept], [w for _, w in kept])
        if self.cheat == "trainer-learning-rate":
            honest = self.trainer.config
            self.trainer.config = dataclasses.replace(honest, learning_rate=2 * honest.learning_rate)
            try:
                return super().update(groups, weights)
            finally:
                self.trainer.config = honest
        metrics = super().update(groups, weights)  # trainer-fake-weights: the step, then a nudge
        generator = torch.Generator().manual_seed(self.version)
        with torch.no_grad():
            for tensor in self.trainer.network.parameters():
                tensor.mul_(1 + FAKE_WEIGHTS_NOISE * torch.randn(tensor.shape, generator=generator).to(tensor))
        return metrics


def node_for(adversary: str) -> Callable[..., Node]:
    """What builds a node, ``build(config, transport, key, log=None)``: an honest
    :class:`~vrl.node.daemon.Node`, or for a node configured to cheat (``adversary`` in
    node.toml), one with the cheat's work and trainer (:func:`work_for`, :func:`trainer_for`),
    wired as the cheat needs."""
    work, trainer = work_for(adversary), trainer_for(adversary)

    def build(config: NodeConfig, transport: Transport, key: NodeKey, log: structlog.BoundLogger | None = None) -> Node:
        node = Node(config, transport, key, log, work, trainer)
        if adversary == "replay":
            # The replayer sees every group its node stores, by gossip or by backfill, once:
            # it wraps the group cache's door from outside.
            spy = node.work
            assert isinstance(spy, CheatingWork)  # work_for("replay") made it
            persist, overheard = node.groups.persist, spy.overheard

            def spied(group: Group, received: float) -> bool:
                new = persist(group, received)
                if new:
                    overheard(group)
                return new
            node.groups.persist = spied  # type: ignore[method-assign]  # the cheat's own wiring
            spy.takes = node.protocol.takes_new_groups
        if adversary == "trainer-rejected-group":
            # A trainer cheat: the node trains, with trainer_for's CheatingTrainer.
            training, cheat, protocol = node.training, node.trainer, node.protocol
            assert training is not None and isinstance(cheat, CheatingTrainer)
            honest = training.train

            def train(version: int, batch: tuple[tuple[bytes, float], ...]) -> AsyncIterator[P.Event]:
                return honest(version, cheat.with_failed_groups(batch, protocol))
            training.train = train  # type: ignore[method-assign]  # the cheat's own wiring
        return node
    return build


def trainer_for(adversary: str) -> Callable[..., PolicyTrainer]:
    """What does a node's trainer role: :class:`~vrl.node.work.PolicyTrainer`, or for a node
    configured as a dishonest trainer, :class:`CheatingTrainer` doing that cheat."""
    if adversary not in TRAINER_ADVERSARIES:
        return PolicyTrainer
    return functools.partial(CheatingTrainer, kind=adversary)


def work_for(adversary: str) -> Callable[..., Work]:
    """What does a node's model work: :class:`~vrl.node.work.Work`, or for a node configured
    to cheat (``adversary`` in node.toml), :class:`CheatingWork` doing that cheat."""
    if not adversary or adversary in TRAINER_ADVERSARIES:
        return Work
    if adversary not in ADVERSARIES:
        raise ValueError(f"unknown adversary {adversary!r}; choose from {', '.join(ADVERSARIES)}")
    return functools.partial(CheatingWork, kind=adversary)
