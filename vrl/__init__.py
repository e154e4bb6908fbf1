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

from proofs.sampler import SamplingParams
from vrl.errors import VrlError
from vrl.rollouts.files import (
    RolloutFileError,
    RolloutWriter,
    iter_records,
    read_rollouts,
    write_rollouts,
)
from vrl.rollouts.generate import generate, iter_generate, sampling_for
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import Model, ModelError, load_model
from vrl.rollouts.record import RecordError, Rollout, sample_seed
from vrl.rollouts.verify import Expectations, Reason, Stage, Tolerances, Verdict, commit, verify
from vrl.tasks import (
    Arithmetic,
    RewardSpec,
    Task,
    TaskList,
    assign,
    open_task_set,
    read_task_file,
)

__all__ = [
    "Arithmetic", "Expectations", "Model", "ModelError", "NodeKey", "Reason", "RecordError", "RewardSpec",
    "Rollout", "RolloutFileError", "RolloutWriter", "SamplingParams", "Stage", "Task", "TaskList", "Tolerances",
    "Verdict", "VrlError", "assign", "commit", "generate", "iter_generate", "iter_records", "load_model",
    "open_task_set", "read_rollouts", "read_task_file", "sample_seed", "sampling_for", "verify",
    "write_rollouts",
]
