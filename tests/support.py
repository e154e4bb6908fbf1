"""What several test files share: the quick base model's recipe and the keys and round seed
of the single-step tests. Test files import from here, never from each other."""

from __future__ import annotations

from vrl.rollouts.keys import NodeKey
from vrl.rollouts.presets import BaseModelConfig

# A smaller, faster build than scripts/build-base-model: one-digit sums, which a few hundred
# examples teach well enough that sampled groups have mixed rewards. Built once per test run
# (conftest.py's quick_base).
QUICK = BaseModelConfig(tasks="arithmetic:digits=1,ops=+", steps=60, batch_size=32, learning_rate=3e-3,
                        warmup_steps=10, held_out=64)

TRAINER, WORKER, STRANGER = (NodeKey.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
ROUND = bytes(32)  # the round seed the groups are sampled (and checked) with
