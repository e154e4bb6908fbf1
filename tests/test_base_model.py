"""The base model is bit-reproducible: the build recipe, at a small budget, gives the model
hash recorded in specs/vectors/base_model.json whatever the caller's thread count and
environment (vrl.rl.base_model's docstring has what decides the bits, and the measurements).

The vector is written by ``python -m vrl.rl.base_model --vector`` (the small recipe); its
``default`` entry, the full recipe's hash, by ``./scripts/build-base-model`` and checked here
only with ``VRL_FULL_BUILD=1`` (minutes, not seconds)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest
import torch

from vrl.rl import base_model
from vrl.rl.base_model import PINNED_CAPABILITY, VECTOR_FILE, VECTOR_RECIPE, build_base_model
from vrl.rollouts.presets import DEFAULT, BaseModelConfig, read_meta

VECTOR = json.loads(VECTOR_FILE.read_text())


def test_vector_is_the_recipe_in_the_code():
    assert VECTOR["recipe"] == asdict(VECTOR_RECIPE)
    assert VECTOR["default"]["recipe"] == asdict(DEFAULT)
    assert any(build["platform"]["pinned"] == base_model.PINNED_ENV for build in VECTOR["builds"].values())
    assert all(vendor == build["platform"]["cpu_vendor"] for vendor, build in VECTOR["builds"].items())


@pytest.mark.parametrize("threads", [1, 2])
def test_build_matches_the_vector_under_any_thread_count_and_caller_environment(threads, tmp_path, monkeypatch):
    # The caller's process and environment say otherwise on every count the pin covers: its
    # threads, ATen's ISA (scalar kernels, another hash: see the docstring), OpenMP's threads
    # and the hash seed. The child's environment overrides them; the build's own thread count
    # (``threads``) does not change the bits.
    before = torch.get_num_threads()
    torch.set_num_threads(3 - threads)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("PYTHONHASHSEED", str(threads + 40))
    try:
        meta = read_meta(build_base_model(VECTOR_RECIPE, tmp_path / "base", threads=threads))
    finally:
        torch.set_num_threads(before)
    if meta["platform"]["cpu_capability"] != PINNED_CAPABILITY:
        pytest.skip(f"this CPU cannot run ATen's {PINNED_CAPABILITY} kernels "
                    f"({meta['platform']['cpu_capability']}): the vector is for x86-64 with AVX2")
    # MKL takes another path on each vendor, so each has its own hash (vrl.rl.base_model's docstring).
    vendor = meta["platform"]["cpu_vendor"]
    build = VECTOR["builds"].get(vendor)
    if build is None or build["platform"]["pinned"] != base_model.PINNED_ENV:
        pytest.skip(f"no vector for {vendor or 'this CPU'} under today's pins: "
                    "`python -m vrl.rl.base_model --vector` on such a machine writes it")
    assert meta["platform"]["threads"] == threads
    assert (meta["platform"]["torch"], meta["platform"]["transformers"]) == (
        build["platform"]["torch"], build["platform"]["transformers"]), "another torch or transformers"
    assert meta["model_hash"] == build["model_hash"]


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match=r"building the base model failed \(exit 1\)") as failure:
        build_base_model(BaseModelConfig(preset="nonexistent", steps=1), tmp_path / "base")
    assert "KeyError: 'nonexistent'" in str(failure.value)  # the child's traceback, its last lines
    assert list(tmp_path.iterdir()) == []


def test_a_cache_built_without_the_pins_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("VRL_DATA_DIR", str(tmp_path))
    built = []
    monkeypatch.setattr(base_model, "build_base_model", lambda config, path: built.append(path) or path)
    path = base_model.base_model_dir(VECTOR_RECIPE)
    path.mkdir(parents=True)
    (path / "vrl-base.json").write_text(json.dumps({"model_hash": "e2cfc16b", "threads": 2}))
    assert base_model.ensure_base_model(VECTOR_RECIPE) == path and built == [path]
    (path / "vrl-base.json").write_text(json.dumps({"platform": {"pinned": base_model.PINNED_ENV}}))
    assert base_model.ensure_base_model(VECTOR_RECIPE) == path and built == [path]  # not again


@pytest.mark.skipif(not os.environ.get("VRL_FULL_BUILD"), reason="the full recipe takes minutes: VRL_FULL_BUILD=1")
def test_full_build_matches_the_vector(tmp_path):
    meta = read_meta(build_base_model(DEFAULT, tmp_path / "base"))
    assert meta["model_hash"] == VECTOR["default"]["model_hash"]
