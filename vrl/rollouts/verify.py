"""The verification pipeline (specs/verification.md).

Ordered stages, cheapest first; a rollout stops at the first stage it fails:

1. schema and bounds        5. sampling: each token won its seeded race
2. signature                6. termination: a sampled stop, or the length limit
3. seed and assignment      7. behaviour logprobs
   binding, model hash      8. reward, recomputed
4. activation commitment, against one batched prefill

Every rollout gets a :class:`Verdict`; verdicts are data, never exceptions. Stages 1 to 3 need
no model work; stage 4 onward share one batched prefill per batch of surviving rollouts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from proofs import commitment, sampler
from proofs.circuits import ANSWER_BYTES
from proofs.errors import MalformedCommitment, ProofsError
from proofs.sampling_params import SamplingParams
from vrl.rollouts.forward import HOST, Prefilled, prefill
from vrl.rollouts.model import Model, context_length
from vrl.rollouts.profiles import Tolerances, profile_of
from vrl.rollouts.record import RecordError, RecordFault, Rollout
from vrl.rollouts.sequential import RaceTest
from vrl.rollouts.workers import map_in_slices
from vrl.tasks import RewardError, RewardSpec, Task, TaskSet, assign, in_order
from vrl.tasks.answers import committed_reference
from vrl.tasks.chat import ChatTemplateError
from vrl.tasks.rewards import RewardUnavailable


class Stage(IntEnum):
    SCHEMA = 1
    SIGNATURE = 2
    BINDING = 3
    COMMITMENT = 4
    SAMPLING = 5
    TERMINATION = 6
    LOGPROBS = 7
    REWARD = 8
    ACCEPTED = 9


class Reason(StrEnum):
    """Why a record was rejected, by stage (specs/verification.md §1); ``ok`` when it was not.
    The value is the code that verdicts, rollout files' reports and node messages carry."""

    OK = "ok"
    # 1. schema and bounds: the record does not decode (vrl.rollouts.record.RecordFault)
    MALFORMED_RECORD = "malformed_record"
    TRUNCATED_RECORD = "truncated_record"
    OVERSIZED_RECORD = "oversized_record"
    CORRUPT_RECORD = "corrupt_record"
    UNKNOWN_VERSION = "unknown_version"
    # 2. signature
    BAD_SIGNATURE = "bad_signature"
    # 3. binding: model, round, sampling, reward, assignment, the group, bounds before the prefill
    MODEL_MISMATCH = "model_mismatch"
    ROUND_SEED_MISMATCH = "round_seed_mismatch"
    SAMPLING_PARAMS_MISMATCH = "sampling_params_mismatch"
    REWARD_SPEC_MISMATCH = "reward_spec_mismatch"
    # A reward (name/version) this verifier does not have, or cannot compute here (another
    # Python, no sandbox): the verifier's limitation, not the producer's fault (specs/rewards.md §6)
    REWARD_UNKNOWN = "reward_unknown"
    STOP_TOKENS_MISMATCH = "stop_tokens_mismatch"
    ASSIGNMENT_INVALID = "assignment_invalid"
    TOO_MANY_TOKENS = "too_many_tokens"
    TASK_NOT_ASSIGNED = "task_not_assigned"
    TASK_MISMATCH = "task_mismatch"
    PROMPT_MISMATCH = "prompt_mismatch"
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    GROUP_INCONSISTENT = "group_inconsistent"
    DUPLICATE_SAMPLE = "duplicate_sample"
    GROUP_INCOMPLETE = "group_incomplete"
    # 4. activation commitment
    COMMITMENT_MALFORMED = "commitment_malformed"
    COMMITMENT_MISMATCH = "commitment_mismatch"
    # 5. sampling
    SAMPLING_UNDEFINED = "sampling_undefined"
    SAMPLING_MISMATCH = "sampling_mismatch"
    # 6. termination
    CONTINUED_AFTER_STOP = "continued_after_stop"
    FAKE_STOP = "fake_stop"
    STOP_NOT_SAMPLED = "stop_not_sampled"
    FINISH_REASON_MISMATCH = "finish_reason_mismatch"
    TRUNCATED = "truncated"
    # 7. behaviour logprobs
    LOGPROB_MISMATCH = "logprob_mismatch"
    # 8. reward
    REWARD_MISMATCH = "reward_mismatch"
    REWARD_UNPROVEN = "reward_unproven"  # a committed reference's correctness, unproven (specs/zk.md §7)

    @property
    def stage(self) -> Stage:
        """The stage that emits this reason."""
        return _STAGES[self]


_STAGES: dict[Reason, Stage] = {
    Reason.OK: Stage.ACCEPTED,
    **dict.fromkeys((Reason.MALFORMED_RECORD, Reason.TRUNCATED_RECORD, Reason.OVERSIZED_RECORD, Reason.CORRUPT_RECORD,
                     Reason.UNKNOWN_VERSION), Stage.SCHEMA),
    Reason.BAD_SIGNATURE: Stage.SIGNATURE,
    **dict.fromkeys((Reason.MODEL_MISMATCH, Reason.ROUND_SEED_MISMATCH, Reason.SAMPLING_PARAMS_MISMATCH,
                     Reason.REWARD_SPEC_MISMATCH, Reason.REWARD_UNKNOWN, Reason.STOP_TOKENS_MISMATCH,
                     Reason.ASSIGNMENT_INVALID,
                     Reason.TOO_MANY_TOKENS, Reason.TASK_NOT_ASSIGNED, Reason.TASK_MISMATCH, Reason.PROMPT_MISMATCH,
                     Reason.TOKEN_OUT_OF_VOCAB, Reason.GROUP_INCONSISTENT, Reason.DUPLICATE_SAMPLE,
                     Reason.GROUP_INCOMPLETE), Stage.BINDING),
    **dict.fromkeys((Reason.COMMITMENT_MALFORMED, Reason.COMMITMENT_MISMATCH), Stage.COMMITMENT),
    **dict.fromkeys((Reason.SAMPLING_UNDEFINED, Reason.SAMPLING_MISMATCH), Stage.SAMPLING),
    **dict.fromkeys((Reason.CONTINUED_AFTER_STOP, Reason.FAKE_STOP, Reason.STOP_NOT_SAMPLED,
                     Reason.FINISH_REASON_MISMATCH, Reason.TRUNCATED), Stage.TERMINATION),
    Reason.LOGPROB_MISMATCH: Stage.LOGPROBS,
    Reason.REWARD_MISMATCH: Stage.REWARD,
    Reason.REWARD_UNPROVEN: Stage.REWARD,
}

#: The stage-1 reason of each way a record can fail to decode.
_UNDECODABLE = {
    RecordFault.MALFORMED: Reason.MALFORMED_RECORD, RecordFault.TRUNCATED: Reason.TRUNCATED_RECORD,
    RecordFault.OVERSIZED: Reason.OVERSIZED_RECORD, RecordFault.CORRUPT: Reason.CORRUPT_RECORD,
    RecordFault.UNKNOWN_VERSION: Reason.UNKNOWN_VERSION,
}


@dataclass(frozen=True, slots=True)
class Expectations:
    """What the verifier knows independently of the rollouts (all optional).

    ``tasks`` pins the task set, so each group's task must be its assignment; ``round_seed``
    pins the round; ``sampling`` and ``reward_spec`` pin what the protocol prescribes.
    ``max_tokens`` caps prompt plus completion tokens per record below the model's context,
    which always applies: the prefill's time and memory grow with it (specs/verification.md
    section 2).
    """

    tasks: TaskSet | None = None
    round_seed: bytes | None = None
    sampling: SamplingParams | None = None
    reward_spec: RewardSpec | None = None
    max_tokens: int | None = None
    # An evaluation's records: group g answers task g of the list, every task once, held-out
    # ones included (specs/zk.md §9), rather than the task the assignment hash picks.
    in_order: bool = False
    # A network's private tasks (specs/zk.md §11): the answer holder proves a committed
    # reference's correctness after the check, so a record with no proof is held to its public
    # reward (RewardSpec.public_reward), the only one its producer can know.
    correctness_later: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None and not (isinstance(self.max_tokens, int)
                                                and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")


#: ``vrl verify --max-tokens``'s default: the context of the built-in presets
#: (``vrl.rollouts.model.Preset.max_positions``), so no record a preset can verify is refused by default,
#: while a model directory with a longer context needs the flag to spend more. Measured with
#: ``bench/hostile_files.py long`` on the ``tiny`` preset (``vrl verify``, one record, 2 shared
#: cores): 4,096 tokens cost 10.5 s and 644 MB; 32,768 tokens cost 139 s and 6.2 GB before any
#: bound (issue 13), and are now refused in 5 s and 434 MB, the cost of loading the model.
DEFAULT_MAX_TOKENS = 4096


def _rendered(model: Model, task: Task | None) -> str | ChatTemplateError | None:
    """The prompt text ``model`` is given for ``task`` (:meth:`Model.render`), or why it has none."""
    if task is None:
        return None
    try:
        return model.render(task)
    except ChatTemplateError as error:
        return error


def commit(model: Model, prompt_tokens: list[int], completion_tokens: list[int]) -> bytes:
    """Recompute, by one prefill of ``model``, the commitment an honest prover would attach."""
    (recomputed,) = prefill(model, [(list(prompt_tokens), list(completion_tokens))])
    return commitment.build(recomputed.hidden)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one record: where it stopped, why, and the scores measured on the way."""

    index: int
    accepted: bool
    stage: Stage
    reason: Reason
    message: str  # one human sentence
    node_id: str = ""
    task_id: str = ""
    sample_index: int = -1
    scores: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # The commitment this verifier rebuilt from its own prefill (empty for a record stopped
    # before stage 4): what a node's signed verdict digests to show the check was run
    # (specs/network.md §3.2).
    recomputed: bytes = b""

    @property
    def race_evidence(self) -> tuple[int, int]:
        """``(races replayed, races lost)``: the sequential test's evidence (specs/verification.md
        §7); ``(0, 0)`` for a record that stopped before stage 5."""
        return int(self.scores.get("race_tokens", 0)), int(self.scores.get("races_lost", 0))

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "accepted": self.accepted, "stage": self.stage.name.lower(),
            "reason": self.reason, "message": self.message, "node_id": self.node_id,
            "task_id": self.task_id, "sample_index": self.sample_index, "scores": dict(self.scores),
        }


class _Rejected(Exception):
    """Internal control flow of a stage check: never escapes :func:`verify`."""

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason, self.message = reason, message


def _binding(rollout: Rollout, model: Model, expect: Expectations, seen: dict[tuple[object, ...], Any]) -> None:
    """Stage 3. ``seen`` memoises, within one call of :func:`verify`, the tokenization of each
    prompt and the assignment of each group: a group's members repeat both."""
    if rollout.model_hash != model.model_hash:
        raise _Rejected(Reason.MODEL_MISMATCH, f"claims model {rollout.model_hash.hex()[:16]}, "
                   f"verifier has {model.model_hash.hex()[:16]}")
    if expect.round_seed is not None and rollout.round_seed != expect.round_seed:
        raise _Rejected(Reason.ROUND_SEED_MISMATCH, "round seed is not this round's")
    if expect.sampling is not None and rollout.sampling != expect.sampling:
        raise _Rejected(Reason.SAMPLING_PARAMS_MISMATCH,
                        f"sampled with {rollout.sampling}, protocol says {expect.sampling}")
    if expect.reward_spec is not None and rollout.reward_spec != expect.reward_spec:
        raise _Rejected(Reason.REWARD_SPEC_MISMATCH,
                        f"rewarded with {rollout.reward_spec}, protocol says {expect.reward_spec}")
    # A reward that runs code runs the record's own (its completion, its task's tests): only a
    # spec this verifier pinned itself is run, never one a record asserts (specs/rewards.md §6).
    if expect.reward_spec is None and (running := rollout.reward_spec.runs_code()):
        raise _Rejected(Reason.REWARD_SPEC_MISMATCH, f"rewarded with {', '.join(running)}, which runs code the "
                        "record carries: a verifier runs it only under a reward it pins itself (vrl verify --reward)")
    # Before the prefill: a reward this verifier cannot recompute is refused, never accepted,
    # and costs no model work (specs/rewards.md §6).
    if unknown := rollout.reward_spec.unknown():
        raise _Rejected(Reason.REWARD_UNKNOWN, f"rewarded with {', '.join(unknown)}, which this verifier does not "
                        f"have installed: it cannot recompute the reward (specs/rewards.md §6)")
    if unavailable := rollout.reward_spec.unavailable():
        raise _Rejected(Reason.REWARD_UNKNOWN, f"this verifier cannot compute the reward: {'; '.join(unavailable)} "
                        "(specs/rewards.md §6)")
    if rollout.sampling.stop_token_ids != model.stop_token_ids:
        raise _Rejected(Reason.STOP_TOKENS_MISMATCH, f"stop tokens {rollout.sampling.stop_token_ids} "
                   f"are not the model's {model.stop_token_ids}")
    if rollout.sample_index >= rollout.group_size:
        raise _Rejected(Reason.ASSIGNMENT_INVALID, f"sample {rollout.sample_index} of a group of {rollout.group_size}")
    # Before the prefill, whose time and memory grow with the length: an unpinned 32k-token
    # record took 6.2 GB (issue 13). The prefill runs prompt and completion through the model.
    length = len(rollout.prompt_tokens) + len(rollout.completion_tokens)
    context = context_length(model)
    if context is not None and length > context:
        raise _Rejected(Reason.TOO_MANY_TOKENS,
                        f"{len(rollout.prompt_tokens)} prompt and {len(rollout.completion_tokens)} "
                        f"completion tokens exceed the model's context of {context} positions")
    if expect.max_tokens is not None and length > expect.max_tokens:
        raise _Rejected(Reason.TOO_MANY_TOKENS,
                        f"{len(rollout.prompt_tokens)} prompt and {len(rollout.completion_tokens)} "
                        f"completion tokens exceed the verifier's limit of {expect.max_tokens} (--max-tokens)")
    if expect.tasks is not None:
        slot: tuple[object, ...] = ("task", rollout.round_seed, rollout.node_id, rollout.group_index)
        if slot not in seen:
            assigned = (in_order(expect.tasks, rollout.group_index) if expect.in_order
                        else assign(expect.tasks, rollout.round_seed, rollout.node_id, rollout.group_index))
            seen[slot] = (assigned, _rendered(model, assigned))
        task, prompt = seen[slot]
        if task is None:
            raise _Rejected(Reason.TASK_NOT_ASSIGNED, f"group {rollout.group_index} is past the task list's end")
        if task.id != rollout.task_id:
            raise _Rejected(Reason.TASK_NOT_ASSIGNED, f"group {rollout.group_index} was assigned task {task.id!r}, "
                       f"not {rollout.task_id!r}")
        if isinstance(prompt, ChatTemplateError):
            raise _Rejected(Reason.TASK_MISMATCH, str(prompt))
        # The prompt the model is given: a chat task's is its messages rendered by this model.
        if (prompt, task.answer) != (rollout.prompt, rollout.reference):
            raise _Rejected(Reason.TASK_MISMATCH, f"prompt or reference differ from task {task.id!r}")
    slot = ("prompt", rollout.prompt)
    if slot not in seen:
        seen[slot] = tuple(model.encode(rollout.prompt))
    if rollout.prompt_tokens != seen[slot]:
        raise _Rejected(Reason.PROMPT_MISMATCH, "prompt tokens are not the tokenization of the prompt")
    if max(rollout.completion_tokens, default=-1) >= model.vocab_size:
        raise _Rejected(Reason.TOKEN_OUT_OF_VOCAB, f"a completion token is >= the vocabulary size {model.vocab_size}")


def _group_problems(rollouts: dict[int, Rollout]) -> dict[int, _Rejected]:
    """Whole-group rules: every sample index once, members agreeing on the group's terms."""
    groups: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for index, rollout in rollouts.items():
        groups[rollout.group_key].append(index)
    problems: dict[int, _Rejected] = {}
    for members in groups.values():
        first = rollouts[members[0]]
        seen: dict[int, int] = {}
        for index in members:
            rollout = rollouts[index]
            if (rollout.group_size, rollout.sampling, rollout.model_hash, rollout.task_id, rollout.reward_spec) != (
                    first.group_size, first.sampling, first.model_hash, first.task_id, first.reward_spec):
                problems[index] = _Rejected(Reason.GROUP_INCONSISTENT,
                                            "group members disagree on task, group size, sampling, reward or model")
            elif rollout.sample_index in seen:
                problems[index] = _Rejected(Reason.DUPLICATE_SAMPLE,
                                            f"sample {rollout.sample_index} appears twice in the group")
            seen.setdefault(rollout.sample_index, index)
        missing = sorted(set(range(first.group_size)) - set(seen))
        if missing:
            for index in members:
                problems.setdefault(index, _Rejected(
                    Reason.GROUP_INCOMPLETE,
                    f"group submitted without samples {missing[:8]}{'...' if len(missing) > 8 else ''}"))
    return problems


def _exceeds(score: float, tolerance: float) -> bool:
    """``score > tolerance``, failing closed: a NaN score compares false with everything, so it
    must count as exceeding rather than pass."""
    return not score <= tolerance


def proven_answer(reward_spec: RewardSpec, completion: str) -> bytes | None:
    """The answer form a committed reference's proof is about (specs/zk.md §7); None when the
    completion gives no answer, or one longer than answer-match/v1 holds: either counts as not
    correct, with nothing to prove."""
    given = reward_spec.given_form(completion)
    return given if given is not None and len(given) <= ANSWER_BYTES else None


def _checks_after_prefill(rollout: Rollout, agreement: commitment.CommitmentCheck | MalformedCommitment,
                          races: sampler.RaceReplay | ProofsError, model: Model, tol: Tolerances,
                          scores: dict[str, float],
                          proof: bool | str | None = None, correctness_later: bool = False) -> None:
    """Stages 4 to 8 for one rollout, given the batch-wide commitment check and race replay,
    and, for a committed reference, what its zk proof showed (``verify``'s ``proven``) or
    whether its correctness is proven later (``Expectations.correctness_later``)."""
    # 4. Activation commitment: the hidden states the prover committed are the claimed model's.
    if isinstance(agreement, MalformedCommitment):
        raise _Rejected(Reason.COMMITMENT_MALFORMED, str(agreement))
    scores["commitment_miss_rate"] = agreement.miss_rate
    scores["commitment_misses"] = agreement.misses
    scores["commitment_comparisons"] = agreement.comparisons
    scores["commitment_mantissa_error"] = agreement.mantissa_error_mean
    scores["commitment_rows_fully_missed"] = agreement.rows_fully_missed
    scores["commitment_closing_misses"] = agreement.closing_misses
    if (_exceeds(agreement.misses, tol.allowed_misses(agreement.comparisons))
            or _exceeds(agreement.mantissa_error_mean, tol.commitment_mantissa_error)
            or _exceeds(agreement.rows_fully_missed, tol.commitment_rows_fully_missed)
            or _exceeds(agreement.closing_misses, tol.commitment_closing_misses)):
        raise _Rejected(Reason.COMMITMENT_MISMATCH,
                        f"{agreement.misses} of {agreement.comparisons} committed values disagree, "
                        f"{agreement.rows_fully_missed} rows entirely, {agreement.closing_misses} of "
                        f"{commitment.CLOSING_VALUES} after the last token "
                        f"(mantissa error {agreement.mantissa_error_mean:.2f} ulp)")

    # 5. Sampling: every seeded race replayed; the final token of a "stop" rollout is stage 6's.
    if isinstance(races, ProofsError):
        raise _Rejected(Reason.SAMPLING_UNDEFINED, f"the seeded races cannot be replayed: {races}")
    n = len(rollout.completion_tokens)
    body = n - 1 if rollout.finish_reason == "stop" else n
    margins = races.margins[:body]
    # The sequential test's evidence (vrl.rollouts.sequential): every race replayed, the stop
    # token's included, and how many the claimed token lost by any margin at all.
    scores["race_tokens"] = n
    scores["races_lost"] = int((races.margins > 0).sum())
    scores["race_margin_max"] = float(margins.max()) if body else 0.0
    if body and _exceeds(scores["race_margin_max"], tol.race_margin):
        position = int(np.argmax(margins))
        lost_by = "outside the sampling masks" if math.isinf(margins[position]) else f"by {margins[position]:.3f}"
        raise _Rejected(Reason.SAMPLING_MISMATCH,
                        f"token {position} did not win its seeded race ({lost_by}; "
                        f"{int((margins > tol.race_margin).sum())} of {body} tokens did not)")

    # 6. Termination: a stop token ends the rollout only if it was really sampled there.
    stops = set(rollout.sampling.stop_token_ids)
    early = [i for i, t in enumerate(rollout.completion_tokens[:-1]) if t in stops]
    if early:
        raise _Rejected(Reason.CONTINUED_AFTER_STOP, f"a stop token at {early[0]} did not end the rollout")
    last = rollout.completion_tokens[-1]
    if rollout.finish_reason == "stop":
        if last not in stops:
            raise _Rejected(Reason.FAKE_STOP, "finish reason is stop but the last token is not a stop token")
        if _exceeds(races.margins[-1], tol.race_margin):
            raise _Rejected(Reason.STOP_NOT_SAMPLED,
                            f"the stop token lost its seeded race by {races.margins[-1]:.3f}")
    else:
        if last in stops:
            raise _Rejected(Reason.FINISH_REASON_MISMATCH, "ends in a stop token but claims length")
        if n != rollout.sampling.max_new_tokens:
            raise _Rejected(Reason.TRUNCATED,
                            f"claims the length limit after {n} of {rollout.sampling.max_new_tokens} tokens")

    # 7. Behaviour logprobs: what GRPO's importance ratios will be computed against.
    error = np.abs(races.logprobs - np.asarray(rollout.behaviour_logprobs, dtype=np.float64))
    scores["logprob_error_max"] = float(error.max())
    if _exceeds(scores["logprob_error_max"], tol.logprob_error):
        raise _Rejected(Reason.LOGPROB_MISMATCH,
                        f"behaviour logprob of token {int(np.argmax(error))} is off by {error.max():.4f}")

    # 8. Reward, recomputed from the completion text; for a committed reference, the
    #    correctness is what its proof showed (specs/zk.md §7).
    text = model.decode(list(rollout.completion_tokens))
    try:
        committed = committed_reference(rollout.reference)
    except ValueError as error:
        raise _Rejected(Reason.REWARD_UNPROVEN, str(error)) from None
    if committed is None:
        try:
            recomputed_reward = rollout.reward_spec.reward(rollout.task, text)
        except RewardUnavailable as error:  # no fork, no temporary space here: not the record's fault
            raise _Rejected(Reason.REWARD_UNKNOWN,
                            f"this verifier cannot compute the reward: {error.problem}") from None
        except RewardError as error:  # an installed function that raised or returned no finite float
            raise _Rejected(Reason.REWARD_MISMATCH, error.problem) from None
    elif problem := rollout.reward_spec.provable():
        raise _Rejected(Reason.REWARD_UNPROVEN, problem)
    else:
        public = rollout.reward_spec.reward_given(False, text)
        if proven_answer(rollout.reward_spec, text) is None:
            proof = False  # no answer, or none a proof can hold: not correct, nothing to prove
        if proof is None and correctness_later:
            recomputed_reward = public  # the answer holder proves the rest (specs/zk.md §11)
        elif not isinstance(proof, bool):
            raise _Rejected(Reason.REWARD_UNPROVEN, "the reference is committed and no proof of the answer's "
                            "correctness was given" if proof is None else f"its correctness proof fails: {proof}")
        elif rollout.reward == public:
            # A producer without the key claims no correctness; the proof adds it (§7, §11).
            recomputed_reward = public
        else:
            recomputed_reward = rollout.reward_spec.reward_given(proof, text)
    scores["reward_recomputed"] = recomputed_reward
    if recomputed_reward != rollout.reward:
        raise _Rejected(Reason.REWARD_MISMATCH,
                        f"claims reward {rollout.reward}, recomputed {recomputed_reward}")


def _replay(sequences: list[tuple[torch.Tensor, torch.Tensor, bytes, SamplingParams]],
            slack: float) -> list[sampler.RaceReplay | ProofsError]:
    """The race replay of a batch, with the sampler's refusal kept per record: records that
    share sampling parameters are replayed together, so when the sampler refuses a batch
    (its own error type, such as a ``z / T`` that overflows float64) each record is replayed
    alone to find which ones it refuses. The others keep their replay."""
    try:
        return list(sampler.replay_sequences(sequences, slack))
    except ProofsError:
        results: list[sampler.RaceReplay | ProofsError] = []
        for sequence in sequences:
            try:
                results.extend(sampler.replay_sequences([sequence], slack))
            except ProofsError as error:
                results.append(error)
        return results


def verify(
    records: Iterable[Rollout | RecordError],
    model: Model,
    *,
    expect: Expectations | None = None,
    tolerances: Tolerances | None = None,
    batch_size: int = 4,
    on_progress: Callable[[int], None] | None = None,
    prefilled: Mapping[int, Prefilled] | None = None,
    signatures_checked: bool = False,
    rebuild_commitments: bool = False,
    proven: Mapping[int, bool | str] | None = None,
) -> list[Verdict]:
    """Verify rollouts (or the :class:`RecordError` of records that did not decode).

    Returns one verdict per input, in input order. ``on_progress(n)`` is called as ``n`` more
    records are finished. With ``rebuild_commitments``, each verdict of a record that reached the
    prefill carries the commitment the verifier rebuilt from its own hidden states
    (``Verdict.recomputed``): what a node's signed verdict digests. Only a node needs it, and
    building costs about 7% of verification (tiny preset, 16 x 64 tokens, measured here), so
    it is asked for.
    ``prefilled`` holds, by record index, recomputations the caller already made with ``model``
    over the record's own prompt and completion tokens (the trainer's GRPO forward pass); the
    other records get the verifier's own prefill. ``signatures_checked`` says the caller already
    checked every record's signature (a node's :func:`~vrl.node.messages.decode_group` does,
    before a group is stored or forwarded), so stage 2 does not check them again.
    ``proven`` holds, by record index, what the zk proof of a committed reference showed
    (vrl.zk.proven_correctness): the answer's correctness, or the reason its proof failed.
    """
    expect = expect or Expectations()
    tolerances = tolerances or profile_of(model).tolerances
    items = list(records)
    verdicts: dict[int, Verdict] = {}
    alive: dict[int, Rollout] = {}

    def finish(index: int, rejected: _Rejected | None, scores: dict[str, float] | None = None,
               recomputed: bytes = b"") -> None:
        item = items[index]
        node_id, task_id, sample_index = "", "", -1  # Verdict's defaults, for a record that did not decode
        if isinstance(item, Rollout):
            node_id, task_id, sample_index = item.node_id.hex(), item.task_id, item.sample_index
        reason, message = (Reason.OK, "all checks passed") if rejected is None else (rejected.reason, rejected.message)
        verdicts[index] = Verdict(index, rejected is None, reason.stage, reason, message, node_id=node_id,
                                  task_id=task_id, sample_index=sample_index,
                                  scores=MappingProxyType(scores or {}), recomputed=recomputed)
        if on_progress is not None:
            on_progress(1)

    # Ed25519 verification releases the GIL: the records' signatures are checked on every core.
    rollouts = {index: item for index, item in enumerate(items) if isinstance(item, Rollout)}
    decoded = list(rollouts)
    signed = dict.fromkeys(decoded, True) if signatures_checked else dict(
        zip(decoded, map_in_slices(lambda index: rollouts[index].signature_valid(), decoded)))
    for index, item in enumerate(items):
        if isinstance(item, RecordError):
            finish(index, _Rejected(_UNDECODABLE[item.kind], str(item.at(index))))
        elif not signed[index]:
            finish(index, _Rejected(Reason.BAD_SIGNATURE, "signature does not verify under node_id"))
        else:
            alive[index] = item
    for index, problem in _group_problems(alive).items():
        finish(index, problem)
        del alive[index]
    seen: dict[tuple[object, ...], Any] = {}
    for index in list(alive):
        try:
            _binding(alive[index], model, expect, seen)
        except _Rejected as rejected:
            finish(index, rejected)
            del alive[index]

    # One batched prefill per batch. Records with the caller's forward pass go first; the rest
    # are sorted by prompt, so a group's shared prompt is computed once, then by length, so
    # padding stays small.
    given = {i: p for i, p in (prefilled or {}).items() if i in alive}
    for index, result in given.items():
        if result.hidden.shape[0] != len(alive[index].completion_tokens) + 1:
            raise ValueError(f"prefilled[{index}] has {result.hidden.shape[0]} hidden rows for "
                             f"{len(alive[index].completion_tokens)} completion tokens")
    order = sorted(alive, key=lambda i: (i not in given, len(alive[i].prompt_tokens), alive[i].prompt_tokens,
                                         len(alive[i].completion_tokens)))
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        own = [i for i in batch if i not in given]
        computed = dict(zip(own, prefill(model, [(list(alive[i].prompt_tokens), list(alive[i].completion_tokens))
                                                 for i in own]))) if own else {}
        prefilled_batch = [given[i] if i in given else computed[i] for i in batch]
        rebuilt = (commitment.build_many([r.hidden for r in prefilled_batch]) if rebuild_commitments
                   else [b""] * len(batch))
        # The commitment check and the race replay run vectorized across the whole batch; the
        # per-rollout stages then only compare numbers with the tolerances.
        agreements = commitment.check_many([alive[i].commitment for i in batch], [r.hidden for r in prefilled_batch])
        races = _replay(
            [(result.logits, torch.tensor(alive[i].completion_tokens, dtype=torch.long, device=HOST),
              alive[i].sample_seed, alive[i].sampling) for i, result in zip(batch, prefilled_batch)],
            tolerances.race_margin,
        )
        for index, agreement, race, own_commitment in zip(batch, agreements, races, rebuilt):
            scores: dict[str, float] = {}
            try:
                _checks_after_prefill(alive[index], agreement, race, model, tolerances, scores,
                                      (proven or {}).get(index), expect.correctness_later)
            except _Rejected as rejected:
                finish(index, rejected, scores, own_commitment)
            else:
                finish(index, None, scores, own_commitment)
    return [verdicts[i] for i in range(len(items))]


def producer_tests(verdicts: Iterable[Verdict], q0: float) -> dict[str, RaceTest]:
    """Each producer's sequential test over the races of all of its records among ``verdicts``
    (specs/verification.md §7), by node id (hex) in order, under ``q0``, its profile's honest
    loss rate per token. A producer none of whose records reached the race replay (stage 5)
    has no test: it gave no evidence either way."""
    tests: dict[str, RaceTest] = {}
    for v in verdicts:
        if "race_tokens" in v.scores:
            tests[v.node_id] = (tests.get(v.node_id) or RaceTest(q0)).add(*v.race_evidence)
    return dict(sorted(tests.items()))
