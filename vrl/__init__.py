"""vrl: verifiable-compute RL rollouts.

The audit library's public API::

    model = vrl.load_model("tiny")                      # or a local Hugging Face directory
    key = vrl.NodeKey.generate()
    tasks = vrl.Arithmetic(digits=2)                      # or vrl.read_task_file(...)
    rollouts = vrl.generate(model, tasks, key, round_seed=seed, sampling=..., groups=8, group_size=4)
    vrl.write_rollouts("r.msgpack", rollouts)
    verdicts = vrl.verify(vrl.iter_records("r.msgpack"), model)
"""

from __future__ import annotations

import torch as _torch

from proofs import commitment as _commitment
from proofs.sampler import SamplingParams
from vrl.forward import prefill as _prefill
from vrl.generate import generate, iter_generate, sampling_for
from vrl.io import RolloutFileError, RolloutWriter, iter_records, read_rollouts, write_rollouts
from vrl.keys import NodeKey
from vrl.model import Model, ModelError, load_model
from vrl.rollout import RecordError, Rollout, sample_seed
from vrl.tasks import Arithmetic, RewardSpec, Task, TaskList, assign, open_task_set, read_task_file
from vrl.verify import Expectations, Stage, Tolerances, Verdict, verify

def commit(model: Model, prompt_tokens: list[int], completion_tokens: list[int]) -> bytes:
    """Recompute, by one prefill of ``model``, the commitment an honest prover would attach."""
    (recomputed,) = _prefill(model, [(list(prompt_tokens), list(completion_tokens))])
    return _commitment.build(recomputed.hidden)

__all__ = [
    "Expectations", "Model", "ModelError", "NodeKey", "RecordError", "Rollout", "RolloutFileError",
    "RolloutWriter", "SamplingParams", "Stage", "Task", "Tolerances", "Verdict", "commit", "generate",
    "iter_generate", "iter_records", "load_model", "read_rollouts", "read_task_file", "sample_seed",
    "sampling_for", "verify", "write_rollouts", "Arithmetic", "RewardSpec", "TaskList", "assign", "open_task_set",
]
