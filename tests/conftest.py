from __future__ import annotations

import pytest
import structlog

import vrl
from vrl.rollouts.model import Model

ROUND = bytes(range(32))
TASKS = vrl.Arithmetic(digits=1)


@pytest.fixture(scope="session")
def tiny() -> Model:
    return vrl.load_model("tiny")


@pytest.fixture(scope="session")
def node() -> vrl.NodeKey:
    return vrl.NodeKey.from_seed(b"test-node".ljust(32, b"\0"))


@pytest.fixture(scope="session")
def other_node() -> vrl.NodeKey:
    return vrl.NodeKey.from_seed(b"other-node".ljust(32, b"\0"))


@pytest.fixture(scope="session")
def sampling(tiny):
    return vrl.sampling_for(tiny, max_new_tokens=40)


@pytest.fixture(scope="session")
def honest(tiny, node, sampling) -> list[vrl.Rollout]:
    return vrl.generate(tiny, TASKS, node, round_seed=ROUND, sampling=sampling, groups=3, group_size=4, batch_size=12)


@pytest.fixture(autouse=True)
def _fresh_logging():
    """Each test starts from structlog's defaults (a CLI test configures it process-wide)."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
