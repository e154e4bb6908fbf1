from __future__ import annotations

import fcntl
import os
from pathlib import Path

# Tests never reach the Hub: a Hub id resolves from a cache a test populates itself
# (tests/test_export.py), and the subprocesses the tests start inherit this.
os.environ["HF_HUB_OFFLINE"] = "1"
# Under pytest-xdist each worker gets its share of the cores, not all of them: two workers of
# two OpenMP threads each on two cores spin-wait on one another, and the suite ran slower on
# both cores than on one. Set before torch is imported, so its pool starts at that size; the
# node processes the tests start inherit it (they set their own count, NodeConfig.torch_threads).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_share)

import pytest  # noqa: E402
import structlog  # noqa: E402
from hypothesis import settings  # noqa: E402

import vrl  # noqa: E402
from vrl.rollouts.model import Model  # noqa: E402

# No per-example deadline: the properties run in milliseconds here, but one garbage collection
# or slow fsync on a loaded CI machine past Hypothesis's default 200 ms failed a run for nothing
# it asserts. Time belongs in bench/.
settings.register_profile("vrl", deadline=None)
settings.load_profile("vrl")

ROUND = bytes(range(32))
TASKS = vrl.Arithmetic(digits=1)

# The files whose tests take minutes, longest first (./scripts/test --durations=25 on a 2-core
# AMD EPYC, 2026-12-03: test_private_tasks' trained, proven step 329 s, test_private_network
# 128 s, test_zk_rewards' setup 107 s, test_devnet 174 s, test_export 194 s ...). With
# --dist loadfile each file is one unit of work, handed out in collection order: collected
# first, these start at once on the workers, instead of one of them starting last and being
# the whole run's tail.
SLOW_FILES = ("test_private_tasks.py", "test_export.py", "test_devnet.py", "test_private_network.py",
              "test_node_zk.py", "test_zk_rewards.py", "test_node.py", "test_devnet_committee.py",
              "test_deltas.py", "test_audit.py", "test_sampling_proofs.py", "test_base_model.py", "test_zk.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {name: rank for rank, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))  # stable: a file's order kept


@pytest.fixture(scope="session")
def tiny() -> Model:
    return vrl.load_model("tiny")


def run_shared(tmp_path_factory) -> Path:
    """A folder every xdist worker of this run shares (each worker's basetemp is a folder of
    the run's), for what is built once per run rather than once per worker."""
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if "PYTEST_XDIST_WORKER" in os.environ else shared


@pytest.fixture(scope="session")
def quick_base(tmp_path_factory):
    """The quickly taught base model (support.QUICK), built once per test run: the first xdist
    worker to ask builds it, under a lock in the run's shared folder, and the others wait and
    read it (build_base_model publishes by rename). The tests that train or replay steps read
    it; none writes to it."""
    from support import QUICK

    from vrl.rl.base_model import build_base_model

    shared = run_shared(tmp_path_factory)
    out = shared / "quick-base"
    with open(shared / "quick-base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            build_base_model(QUICK, out)
    return out


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
    """Each test starts from structlog's defaults (a CLI test configures it process-wide), and
    ends without the standard library's handler that vrl.cli.configure_logging installs."""
    import logging

    from vrl.cli.common import StderrHandler

    last_resort = logging.lastResort
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(handler)
    logging.lastResort = last_resort


@pytest.fixture(autouse=True)
def _torch_threads():
    """Each test ends with torch's thread count as it began: a node started in process sets it
    for the process (vrl/node/daemon.py, its torch_threads), and float32 reductions split over
    another count of threads give other bits, so a later test comparing tokens with a session
    fixture's would fail for a reason of order, not of code."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def zk_workdir(tmp_path_factory):
    """One work directory for every zk test of the run, on every xdist worker: the circuits are
    built, the dev SRS made and the keys set up once (ezkl's gen_srs 20 s and setup 19 s of CPU
    here), as a verifier's cache would keep them. proofs.zk locks the directory across
    processes while it builds, so the first worker to ask builds and the others read."""
    from proofs import zk
    from proofs.circuits import ANSWER_MATCH

    workdir = run_shared(tmp_path_factory) / "zk"
    zk.dev_srs(workdir, ANSWER_MATCH.logrows)
    return workdir
