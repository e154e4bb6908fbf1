"""Checkpoints: a damaged manifest or state is a ``CheckpointError`` naming the file, resuming
falls back to the newest valid checkpoint and says why, and the staging directories a killed
writer leaves are removed at the next start, never those of a writer still running."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import structlog
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrl.rl import checkpoint
from vrl.rl.checkpoint import MANIFEST, CheckpointError

REPO = Path(__file__).resolve().parent.parent


def model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    return network, torch.optim.AdamW(network.parameters(), lr=1e-2, fused=True)


def trained(steps: int, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    network, optimizer = model(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        network(torch.ones(3, 4)).square().sum().backward()
        optimizer.step()
    return network, optimizer


def snapshot(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in network.state_dict().items()}


def rehash(path: Path) -> None:
    """Rewrite the manifest to match the files as they are: damage a hash check cannot see."""
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = {name: hashlib.sha256((path / name).read_bytes()).hexdigest() for name in manifest["files"]}
    (path / MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture
def saved(tmp_path) -> Path:
    network, optimizer = trained(2)
    return checkpoint.save(tmp_path / "checkpoints", 2, network, optimizer, {"model_hash": "ab" * 32})


def test_a_saved_checkpoint_loads(saved):
    network, optimizer = model(seed=1)
    state = checkpoint.load(saved, network, optimizer)
    reference, _ = trained(2)
    assert state["step"] == 2 and state["model_hash"] == "ab" * 32
    assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(), reference.state_dict().values()))
    assert optimizer.state


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


MANIFEST_DAMAGE = {
    "not an object": b"[]",
    "null": b"null",
    "files is a list": b'{"step": 2, "files": ["model.safetensors"]}',
    "files is a number": b'{"step": 2, "files": 7}',
    "no files": b'{"step": 2}',
    "no step": None,  # filled in from the real manifest below
    "step is a string": None,
    "step of another checkpoint": None,
    "empty file list (nothing verified)": b'{"step": 2, "files": {}}',
    "a file outside the checkpoint": None,
    "a hash that is not a string": None,
    "a hash nested 900 deep": None,
    "nested 100,000 deep": _nested(100_000),
    "not UTF-8": b"\xff\xfe\x00{",
    "not JSON": b"{'step': 2}",
    "empty": b"",
    "huge": b'{"step": 2, "files": {}, "pad": "' + b"x" * (4 << 20) + b'"}',
}


def damaged_manifest(kind: str, real: dict) -> bytes:
    if MANIFEST_DAMAGE[kind] is not None:
        return MANIFEST_DAMAGE[kind]
    if kind == "no step":
        return json.dumps({"files": real["files"]}).encode()
    if kind == "step is a string":
        return json.dumps({**real, "step": "2"}).encode()
    if kind == "step of another checkpoint":
        return json.dumps({**real, "step": 3}).encode()
    if kind == "a file outside the checkpoint":
        return json.dumps({**real, "files": {**real["files"], "../../MANIFEST.json": "0" * 64}}).encode()
    if kind == "a hash that is not a string":
        return json.dumps({**real, "files": {**real["files"], "state.json": 12}}).encode()
    if kind == "a hash nested 900 deep":
        files = json.dumps({**real["files"], "state.json": 0}).replace("0}", _nested(900).decode() + "}")
        return f'{{"step": 2, "files": {files}}}'.encode()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", sorted(MANIFEST_DAMAGE))
def test_a_damaged_manifest_is_a_checkpoint_error_naming_it_and_nothing_is_loaded(saved, kind):
    real = json.loads((saved / MANIFEST).read_text())
    (saved / MANIFEST).write_bytes(damaged_manifest(kind, real))
    network, optimizer = model(seed=1)
    before = snapshot(network)
    with pytest.raises(CheckpointError, match=str(saved / MANIFEST)):
        checkpoint.load(saved, network, optimizer)
    assert all(torch.equal(before[k], v) for k, v in network.state_dict().items())
    assert not optimizer.state


STATE_DAMAGE = {
    "no optimizer": lambda s: {k: v for k, v in s.items() if k != "optimizer"},
    "no step": lambda s: {k: v for k, v in s.items() if k != "step"},
    "another step": lambda s: {**s, "step": 7},
    "param groups not a list": lambda s: {**s, "optimizer": {**s["optimizer"], "param_groups": "x"}},
    "a param group without params": lambda s: {**s, "optimizer": {**s["optimizer"], "param_groups": [{"lr": 1}]}},
    "a scalar of no parameter": lambda s: {**s, "optimizer": {**s["optimizer"], "scalars": {"abc.step": 1}}},
    "a scalar of a parameter it lacks": lambda s: {**s, "optimizer": {**s["optimizer"], "scalars": {"99.step": 1}}},
    "not an object": lambda s: [s],
}


@pytest.mark.parametrize("kind", sorted(STATE_DAMAGE))
def test_damaged_state_with_a_matching_manifest_is_a_checkpoint_error(saved, kind):
    state = json.loads((saved / "state.json").read_text())
    (saved / "state.json").write_text(json.dumps(STATE_DAMAGE[kind](state)))
    rehash(saved)
    network, optimizer = model(seed=1)
    before = snapshot(network)
    with pytest.raises(CheckpointError, match=str(saved / "state.json")):
        checkpoint.load(saved, network, optimizer)
    assert all(torch.equal(before[k], v) for k, v in network.state_dict().items())
    assert not optimizer.state


def test_optimizer_moments_of_the_wrong_shape_are_refused(saved):
    from safetensors.torch import load_file, save_file

    moments = load_file(str(saved / "optimizer.safetensors"))
    name = next(k for k, v in moments.items() if v.dim() == 2)
    moments[name] = torch.zeros(3, 3)
    save_file(moments, str(saved / "optimizer.safetensors"))
    rehash(saved)
    network, optimizer = model(seed=1)
    with pytest.raises(CheckpointError, match="optimizer.safetensors"):
        checkpoint.load(saved, network, optimizer)
    assert not optimizer.state


def test_resume_falls_back_to_the_newest_valid_checkpoint_and_says_why(tmp_path):
    directory = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        network, optimizer = trained(step)
        checkpoint.save(directory, step, network, optimizer, {})
    (directory / "step-00000003" / MANIFEST).write_text('{"files": []}')
    network, optimizer = model(seed=1)
    with structlog.testing.capture_logs() as logs:
        path, state = checkpoint.load_latest(directory, network, optimizer)
    assert path.name == "step-00000002" and state["step"] == 2
    reference, _ = trained(2)
    assert all(torch.equal(a, b) for a, b in zip(network.state_dict().values(), reference.state_dict().values()))
    (skipped,) = [e for e in logs if e["log_level"] == "warning"]
    assert skipped["checkpoint"].endswith("step-00000003") and "MANIFEST.json" in skipped["reason"]

    (directory / "step-00000002" / "model.safetensors").write_bytes(b"\0" * 64)
    (directory / "step-00000001" / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no valid checkpoint.*step-00000003.*step-00000002.*step-00000001"):
        checkpoint.load_latest(directory, *model(seed=1))
    assert checkpoint.load_latest(tmp_path / "none", *model()) is None


# -- stale staging directories ------------------------------------------------------------------

KILLED_WRITER = """
import sys, torch
from pathlib import Path
from vrl.rl import checkpoint
network = torch.nn.Linear(1024, 1024)
optimizer = torch.optim.AdamW(network.parameters(), fused=True)
network(torch.ones(1, 1024)).sum().backward()
optimizer.step()
for step in range(1, 10_000):
    checkpoint.save(Path(sys.argv[1]), step, network, optimizer, {})
"""


def test_stale_partials_are_removed_at_start_but_never_a_live_writers(tmp_path):
    """A writer saves in a loop (12 MB a checkpoint); starts that come while it runs never
    remove its staging directory (it would crash); once it is killed with SIGKILL mid-write,
    its own and an older dead writer's are removed, and logged."""
    directory = tmp_path / "checkpoints"
    dead = directory / ".step-00000004.partial-999999999"
    dead.mkdir(parents=True)
    (dead / "model.safetensors").write_bytes(b"half")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(directory)], cwd=REPO)
    live = f".partial-{writer.pid}"
    removed = []
    try:
        deadline = time.monotonic() + 120
        while not any(directory.glob(f".step-*{live}/optimizer.safetensors")):  # mid-write
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.001)
        for _ in range(50):  # starts while the writer runs
            removed += checkpoint.remove_stale_partials(directory)
            time.sleep(0.005)
        assert writer.poll() is None, "the writer crashed: its staging directory was removed under it"
        assert not any(p.name.endswith(live) for p in removed)
        while not any(directory.glob(f".step-*{live}/optimizer.safetensors")):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        writer.send_signal(signal.SIGKILL)  # kill -9 mid-write: the kernel drops its lock
    finally:
        writer.kill()
        writer.wait(30)
    # Its own staging directory, unless the kill came late, between a rename and the next mkdir.
    stale = list(directory.glob(f".step-*{live}"))
    assert len(stale) <= 1
    with structlog.testing.capture_logs() as logs:
        removed += checkpoint.remove_stale_partials(directory)
    assert sorted(removed) == sorted([*stale, dead]) and not any(directory.glob(".step-*"))
    events = [e for e in logs if e["event"] == "removed stale partial checkpoint" and e["path"] in map(str, stale)]
    assert len(events) == len(stale) and all(e["writer_pid"] == writer.pid and e["log_level"] == "warning"
                                             for e in events)
    network = torch.nn.Linear(1024, 1024)  # every finished checkpoint is whole
    path, _ = checkpoint.load_latest(directory, network, torch.optim.AdamW(network.parameters(), fused=True))
    assert path == checkpoint.latest(directory)


def test_a_start_while_another_process_saves_touches_nothing(tmp_path):
    directory = tmp_path / "checkpoints"
    staging = directory / ".step-00000002.partial-1"  # PID 1 is alive, and may be a restarted trainer's
    staging.mkdir(parents=True)
    with checkpoint.writing(directory):  # another writer: a lock is per open file, even in one process
        with structlog.testing.capture_logs() as logs:
            assert checkpoint.remove_stale_partials(directory) == []
    assert staging.is_dir() and any("in progress" in e["event"] for e in logs)
    assert checkpoint.remove_stale_partials(directory) == [staging]  # PID 1 is no proof of a live writer


# -- properties ---------------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=20), inner, max_size=3),
    max_leaves=6)


@FUZZ
@given(st.binary(max_size=512))
def test_any_bytes_are_a_manifest_or_a_checkpoint_error(data):
    try:
        manifest = checkpoint.parse_manifest(data, "MANIFEST.json")
    except CheckpointError as error:
        assert str(error).startswith("MANIFEST.json: ")
        return
    assert isinstance(manifest.step, int) and set(manifest.files) == set(checkpoint.FILES)


@FUZZ
@given(st.data())
def test_mutated_manifests_load_or_raise_checkpoint_error(saved, data):
    real = json.loads((saved / MANIFEST).read_text())
    mutated = json.loads(json.dumps(real))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["top", "files"]))
        table = mutated if where == "top" or not isinstance(mutated.get("files"), dict) else mutated["files"]
        key = data.draw(st.sampled_from(sorted(table)) | st.text(max_size=20)) if table else "step"
        if data.draw(st.booleans()):
            table[key] = data.draw(json_values)
        else:
            table.pop(key, None)
    (saved / MANIFEST).write_text(json.dumps(mutated))
    network, optimizer = model(seed=1)
    try:
        state = checkpoint.load(saved, network, optimizer)
    except CheckpointError as error:
        assert str(saved) in str(error)
    else:
        assert mutated == real or (mutated["step"] == real["step"] and mutated["files"] == real["files"])
        assert state["step"] == 2
    finally:
        (saved / MANIFEST).write_text(json.dumps(real))


def test_parse_manifest_is_bounded_in_time_on_the_largest_input_it_reads():
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / MANIFEST
        path.write_bytes(b"[" * checkpoint.MAX_MANIFEST_BYTES)
        started = time.perf_counter()
        with pytest.raises(CheckpointError):
            checkpoint.read_manifest(path.parent)
        assert time.perf_counter() - started < 1.0
