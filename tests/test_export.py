"""Trained policies leave vrl as standard Hugging Face directories (`vrl export`), a run or a
checkpoint is a model spec of its own (`--model RUN`), and Hub ids resolve from the local
Hugging Face cache the way transformers resolves them (vrl.rollouts.model.hub_snapshot).

One short real run of a quickly built base model serves the export tests; the Hub tests use
a cache this file populates itself, in the layout huggingface_hub writes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import QUICK
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

import vrl
from vrl.cli import app
from vrl.rl.checkpoint import MANIFEST
from vrl.rl.export import PROVENANCE_FILE, ExportError, export, hash_prefix, open_checkpoint
from vrl.rl.train import TrainConfig, Trainer
from vrl.rollouts.model import ModelError, hub_snapshot, weights_hash


def flat(text: str) -> str:
    """Output as one line: the console wraps long messages at 80 columns."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def run(tmp_path_factory, quick_base) -> tuple[Path, Path, dict]:
    """(the base model's directory, a finished 4-step run, its final metrics line)."""
    root = tmp_path_factory.mktemp("export")
    base = quick_base
    # Steps 3 and 4 must move the weights, or a checkpoint cannot be told from the newest one.
    # A step moves them only if a group's rewards differ; the quick base answers about 15% of
    # sums (measured), so 4 groups of 4 learned nothing in two steps about once in 200 runs
    # (0.85^4 per group, 8 groups), as CI once drew. 16 groups of 8: 0.27^16, below 1e-9.
    config = TrainConfig(model=str(base), task=QUICK.tasks, steps=4, group_size=8, groups_per_step=8,
                         max_new_tokens=4, learning_rate=1e-3, held_out=16, eval_every=4, checkpoint_every=2,
                         keep_checkpoints=2)
    final = Trainer(config, root / "run").run()
    return base, root / "run", final


def test_an_exported_run_loads_in_plain_transformers_and_hashes_to_the_published_version(run, tmp_path):
    base, run_dir, final = run
    assert final["model_hash"] != vrl.load_model(str(base)).model_hash.hex()  # the run moved the weights
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"exported policy version 4 of {base}" in flat(result.output)

    # transformers alone, as TRL or vLLM would read it: no vrl code involved.
    network = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    prompt = tokenizer("3+4=", return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        completion = network.generate(prompt, max_new_tokens=3, do_sample=False)[0, prompt.shape[1]:]
    assert tokenizer.decode(completion, skip_special_tokens=True).strip()  # it says something
    assert network.dtype == torch.float32

    # Back in vrl it is the version the run published, so its rollouts bind that model hash.
    assert vrl.load_model(out).model_hash.hex() == final["model_hash"]
    provenance = json.loads((out / PROVENANCE_FILE).read_text())
    assert provenance["model_hash"] == final["model_hash"] and provenance["version"] == 4
    assert not list(tmp_path.glob(".exported.partial-*"))
    assert all(path.stat().st_mode & 0o044 for path in out.iterdir())  # readable by others, as save_pretrained's


def test_a_run_or_a_checkpoint_is_a_model_spec(run):
    _, run_dir, final = run
    from_run = vrl.load_model(run_dir)
    assert from_run.model_hash.hex() == final["model_hash"] and from_run.name == "run@4"
    older = run_dir / "checkpoints" / "step-00000002"
    state = json.loads((older / "state.json").read_text())
    assert vrl.load_model(older).model_hash.hex() == state["model_hash"] != final["model_hash"]
    half = vrl.load_model(run_dir, dtype="bfloat16")
    assert half.dtype_name == "bfloat16" and next(half.network.parameters()).dtype == torch.bfloat16
    # A new run can start from a trained one, and its version 0 is that policy.
    config = TrainConfig(model=str(run_dir), task=QUICK.tasks, steps=1, held_out=16)
    assert Trainer(config, run_dir.parent / "continued").policy().model_hash.hex() == final["model_hash"]


def test_a_policy_is_found_by_its_model_hash_in_a_run(run, tmp_path):
    _, run_dir, final = run
    out = tmp_path / "by-hash"
    result = CliRunner().invoke(app, ["export", final["model_hash"][:12], "--from", str(run_dir), "--out", str(out),
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["model_hash"] == final["model_hash"]
    for spec, message in [("zz", "8 to 64 hex digits"), ("0123abcd0123", "no checkpoint of policy 0123abcd0123")]:
        result = CliRunner().invoke(app, ["export", spec, "--from", str(run_dir), "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and message in flat(result.output), result.output
    result = CliRunner().invoke(app, ["export", "0123abcd0123", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--from" in flat(result.output)


def test_exports_are_refused_whole_never_half_written(run, tmp_path):
    base, run_dir, final = run
    policy = open_checkpoint(run_dir)
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ExportError, match="already exists"):
        export(policy, taken)
    with pytest.raises(ExportError, match="no such directory"):
        export(policy, tmp_path / "missing" / "out")

    # A checkpoint whose bytes changed, or whose published hash is not its weights'.
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    newest = copy / "checkpoints" / "step-00000004"
    weights = bytearray((newest / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (newest / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ExportError, match="step-00000004/model.safetensors: content does not match"):
        open_checkpoint(newest)
    assert open_checkpoint(copy).version == 2  # the run falls back to its newest sound checkpoint

    older = copy / "checkpoints" / "step-00000002"
    state = json.loads((older / "state.json").read_text())
    (older / "state.json").write_text(json.dumps({**state, "model_hash": "ab" * 32}, sort_keys=True))
    manifest = json.loads((older / MANIFEST).read_text())
    manifest["files"]["state.json"] = hashlib.sha256((older / "state.json").read_bytes()).hexdigest()
    (older / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match="the run published abababab"):
        open_checkpoint(older)

    # A checkpoint moved out of its run must be told its base; a wrong one does not fit.
    alone = tmp_path / "step-00000004"
    shutil.copytree(run_dir / "checkpoints" / "step-00000004", alone)
    with pytest.raises(ExportError, match="--base"):
        open_checkpoint(alone)
    assert open_checkpoint(alone, base=str(base)).model.model_hash.hex() == final["model_hash"]
    with pytest.raises(ExportError, match="does not fit the model"):
        open_checkpoint(alone, base="micro")
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "y")])
    assert result.exit_code == 2 and "neither a run directory" in flat(result.output)


def test_a_half_precision_export_loads_as_written_and_leaves_the_policy_as_it_was(run, tmp_path):
    _, run_dir, final = run
    policy = open_checkpoint(run_dir)
    out = export(policy, tmp_path / "bf16", dtype="bfloat16")
    assert AutoModelForCausalLM.from_pretrained(out, dtype="auto", local_files_only=True).dtype == torch.bfloat16
    assert vrl.load_model(out).dtype_name == "bfloat16"
    # The live float32 weights were not rounded through bfloat16 on the way.
    assert weights_hash(policy.model.network, "float32").hex() == final["model_hash"]
    assert policy.model.network.config.dtype == torch.float32
    assert export(policy, tmp_path / "f32").exists() and vrl.load_model(tmp_path / "f32").model_hash.hex() == (
        final["model_hash"])


# -- Hub ids -------------------------------------------------------------------------------------

def populate_hub_cache(cache: Path, repo_id: str, model_dir: Path, commit: str = "a" * 40) -> None:
    """What huggingface_hub leaves after a download: blobs named by hash, a snapshot folder of
    links to them, and refs/main naming the snapshot's commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in model_dir.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    populate_hub_cache(tmp_path / "hf" / "hub", "vrl-test/tiny", tiny.save(tmp_path / "tiny"))
    return tmp_path / "hf" / "hub"


def test_a_hub_id_loads_from_the_cache_under_hf_home_as_the_same_model(hub, tiny):
    model = vrl.load_model("vrl-test/tiny")
    assert model.name == "vrl-test/tiny"
    assert model.model_hash == tiny.model_hash  # the hash covers the weights, not the name


def test_an_uncached_hub_id_offline_says_so(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"not in the Hugging Face cache \(.*/hf/hub\) while HF_HUB_OFFLINE is set"):
        vrl.load_model("vrl-test/absent")
    with pytest.raises(ModelError, match=r"not a preset \(tiny, micro, small, qwen2\.5-0\.5b, qwen2\.5-0\.5b-2layer\), "
                       r"a built model \(base, base-micro\)"):
        vrl.load_model("no/such/thing")


def test_an_uncached_hub_id_whose_download_fails_says_why_without_a_traceback(tmp_path, tiny):
    """A fresh process, as huggingface_hub reads its endpoint when imported: online, with the
    Hub's address a closed port on 127.0.0.1."""
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}
    vrl.NodeKey.generate().save(tmp_path / "node.pem")
    result = subprocess.run([sys.executable, "-m", "vrl.cli", "generate", "--model", "vrl-test/absent", "--task",
                             "arithmetic", "--key", str(tmp_path / "node.pem"), "--out", str(tmp_path / "r.vrl")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "downloading it failed" in result.stderr and "Traceback" not in result.stderr
    # A cached one needs no network at all, online or not.
    populate_hub_cache(tmp_path / "hf" / "hub", "vrl-test/tiny", tiny.save(tmp_path / "tiny"))
    script = "import vrl; print(vrl.load_model('vrl-test/tiny').model_hash.hex())"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == tiny.model_hash.hex(), result.stderr


def test_an_uncached_hub_id_is_downloaded_weights_configs_and_tokenizer_only_and_verifies_as_its_directory(
        tmp_path, tiny):
    """The real huggingface_hub client against a Hub on 127.0.0.1 (tests/hub_server.py): a Hub
    id not in the cache is downloaded by `vrl generate`, only the files a model needs (never
    its code, its README), into the cache; the rollouts verify against the same weights as a
    plain directory, and a later run needs no Hub at all."""
    from hub_server import HubServer

    from vrl.rollouts.model import HUB_FILES

    directory = tiny.save(tmp_path / "tiny")
    files = {path.name: path.read_bytes() for path in directory.iterdir()}
    needed = set(files)
    files |= {"modeling_custom.py": b"raise SystemExit('remote code ran')\n", "README.md": b"# tiny\n",
              "pytorch_model.bin": b"pickled weights are never taken"}
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_ETAG_TIMEOUT": "10",
           "HF_HUB_DOWNLOAD_TIMEOUT": "10", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_CACHE", None)
    vrl.NodeKey.generate().save(tmp_path / "node.pem")
    generate = [sys.executable, "-m", "vrl.cli", "generate", "--model", "acme/tiny", "--task", "arithmetic:digits=1",
                "--key", str(tmp_path / "node.pem"), "--groups", "2", "--group-size", "2", "--max-new-tokens", "4"]
    with HubServer("acme/tiny", files) as hub:
        result = subprocess.run([*generate, "--out", str(tmp_path / "hub.vrl")], capture_output=True, text=True,
                                env={**env, "HF_ENDPOINT": hub.endpoint}, timeout=300)
        assert result.returncode == 0, result.stderr
        assert hub.fetched() == needed, hub.requests
        missing = subprocess.run([*generate, "--model", "acme/absent", "--out", str(tmp_path / "absent.vrl")],
                                 capture_output=True, text=True, env={**env, "HF_ENDPOINT": hub.endpoint}, timeout=300)
    assert missing.returncode == 2 and "'acme/absent': no such directory, and as a Hub id it is not in the Hugging " \
        "Face cache" in flat(missing.stderr) and "downloading it failed" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "absent.vrl").exists()
    snapshot = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / hub.commit
    assert {path.name for path in snapshot.iterdir()} == needed
    assert all(any(Path(name).match(pattern) for pattern in HUB_FILES) for name in needed)

    # The rollouts bind the weights, not the name: they verify against the directory.
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "hub.vrl"), "--model", str(directory), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["accepted"] == 4, result.output
    # The Hub gone and HF_HUB_OFFLINE set, the cache serves the id.
    result = subprocess.run([*generate, "--out", str(tmp_path / "again.vrl")], capture_output=True, text=True,
                            env={**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": hub.endpoint}, timeout=300)
    assert result.returncode == 0, result.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.text(max_size=40))
def test_any_model_spec_is_a_model_or_a_model_error(spec, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    try:
        hub_snapshot(spec)
    except ModelError as error:
        assert repr(spec) in str(error)


@given(name=st.text(max_size=80))
def test_any_policy_name_is_a_hash_prefix_or_an_export_error(name):
    """What `vrl export NAME --from ...` takes: 8 to 64 hex digits, any case, or one error."""
    try:
        prefix = hash_prefix(name)
    except ExportError as error:
        assert repr(name) in str(error)
        return
    assert 8 <= len(prefix) <= 64 and set(prefix) <= set("0123456789abcdef")
