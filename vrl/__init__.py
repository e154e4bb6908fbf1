"""vrl: verifiable-compute RL rollouts.

The audit library's public API::

    model = vrl.load_model("tiny")                      # or a Hugging Face directory, a Hub id, a run
    key = vrl.NodeKey.generate()
    tasks = vrl.Arithmetic(digits=2)                      # or vrl.read_task_file(...)
    rollouts = vrl.generate(model, tasks, key, round_seed=seed, sampling=..., groups=8, group_size=4)
    vrl.write_rollouts("r.vrl", rollouts)
    verdicts = vrl.verify(vrl.iter_records("r.vrl"), model)
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives. Imported on first use (PEP 562), so that ``import vrl`` (and
# ``vrl --help``, ``vrl keygen``) does not pay for torch and transformers until a name needs them.
_EXPORTS = {
    "SamplingParams": "proofs.sampling_params",
    "VrlError": "vrl.errors",
    **dict.fromkeys(("RolloutFileError", "RolloutWriter", "iter_records", "read_rollouts", "write_rollouts"),
                    "vrl.rollouts.files"),
    **dict.fromkeys(("generate", "iter_generate", "sampling_for"), "vrl.rollouts.generate"),
    "NodeKey": "vrl.rollouts.keys",
    **dict.fromkeys(("Model", "ModelError"), "vrl.rollouts.model"),
    "load_model": "vrl.rl.export",  # the rollouts layer's, and a vrl train run or checkpoint too
    **dict.fromkeys(("RecordError", "Rollout", "sample_seed"), "vrl.rollouts.record"),
    **dict.fromkeys(("Expectations", "Reason", "Stage", "Tolerances", "Verdict", "commit", "verify"),
                    "vrl.rollouts.verify"),
    **dict.fromkeys(("Arithmetic", "RewardSpec", "Task", "TaskList", "assign", "open_task_set", "read_task_file"),
                    "vrl.tasks"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

