"""What several test files share: the quick base model's recipe and the keys and round seed
of the single-step tests. Test files import from here, never from each other."""

from __future__ import annotations

import random

from vrl.rollouts.keys import NodeKey
from vrl.rollouts.presets import BaseModelConfig

# A smaller, faster build than scripts/build-base-model: one-digit sums, which a few hundred
# examples teach well enough that sampled groups have mixed rewards. Built once per test run
# (conftest.py's quick_base).
QUICK = BaseModelConfig(tasks="arithmetic:digits=1,ops=+", steps=60, batch_size=32, learning_rate=3e-3,
                        warmup_steps=10, held_out=64)

TRAINER, WORKER, STRANGER = (NodeKey.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
ROUND = bytes(32)  # the round seed the groups are sampled (and checked) with

# The committee design at a test network's size: two seats a group, rounds closed in seconds.
COMMITTEE = {"verification": "committee", "committee_size": 2, "submission_window": 4.0}


def free_port() -> int:
    """A libp2p base port below the ephemeral range (32768+), which outgoing dials take."""
    return random.Random().randrange(20000, 27000)


def timeless(value: object) -> object:
    """A summary less what this machine's clock measured (wall and CPU seconds)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if "cpu" not in k and "wall" not in k}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value
