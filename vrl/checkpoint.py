"""Training checkpoints: safetensors weights and optimizer state, published atomically.

A checkpoint is a directory ``step-NNNNNNNN`` holding ``model.safetensors``,
``optimizer.safetensors``, ``state.json`` and, written last, ``MANIFEST.json`` with the
SHA-256 of every other file. It is built under a temporary name, fsynced, and renamed into
place, so a crash leaves either the whole checkpoint or none. Loading verifies the manifest
and every tensor's name and shape before touching the live model or optimizer: a corrupt
checkpoint is refused with a message, never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model

MANIFEST = "MANIFEST.json"
PREFIX = "step-"


class CheckpointError(Exception):
    """A checkpoint that is missing, corrupt, or does not fit the model; names the file."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into tensors (for safetensors) and the JSON-able rest."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value.contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def save(directory: str | Path, step: int, network: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> Path:
    """Write checkpoint ``step`` under ``directory``; returns its path."""
    directory = Path(directory)
    final = directory / f"{PREFIX}{step:08d}"
    staging = directory / f".{final.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_model(network, str(staging / "model.safetensors"))  # drops tied duplicates
    tensors, rest = _optimizer_tensors(optimizer)
    save_file(tensors, str(staging / "optimizer.safetensors"))
    (staging / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": rest}, sort_keys=True))
    files = {path.name: _sha256(path) for path in sorted(staging.iterdir())}
    (staging / MANIFEST).write_text(json.dumps({"step": step, "files": files}, sort_keys=True))
    for path in staging.iterdir():
        _fsync(path)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    _fsync(directory)
    return final


def latest(directory: Path) -> Path | None:
    steps = sorted(p for p in directory.glob(f"{PREFIX}*") if p.is_dir()) if directory.is_dir() else []
    return steps[-1] if steps else None


def prune(directory: Path, keep: int) -> None:
    for old in sorted(directory.glob(f"{PREFIX}*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load(path: str | Path, network: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Verify ``path`` completely, then load it into ``network`` and ``optimizer``; returns its state."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        for name, expected in files.items():
            if _sha256(path / name) != expected:
                raise CheckpointError(f"{path / name}: content does not match its manifest hash (corrupt)")
        state = json.loads((path / "state.json").read_text())
        weights = load_file(str(path / "model.safetensors"))
        moments = load_file(str(path / "optimizer.safetensors"))
    except CheckpointError:
        raise
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {Path(error.filename).name}") from None
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as error:
        raise CheckpointError(f"{path}: unreadable checkpoint: {error}") from None

    live = network.state_dict()
    for name, tensor in weights.items():
        if name not in live or live[name].shape != tensor.shape or live[name].dtype != tensor.dtype:
            raise CheckpointError(f"{path / 'model.safetensors'}: tensor {name!r} does not fit the model")
    saved_storage = {live[name].data_ptr() for name in weights}
    missing = [n for n in live if n not in weights and live[n].data_ptr() not in saved_storage]
    if missing:
        raise CheckpointError(f"{path / 'model.safetensors'}: missing tensor {missing[0]!r}")
    rest = state.pop("optimizer")
    optimizer_state: dict = {"state": {}, "param_groups": rest["param_groups"]}
    for key, value in [*moments.items(), *rest["scalars"].items()]:
        index, _, slot = key.partition(".")
        optimizer_state["state"].setdefault(int(index), {})[slot] = value
    if len(rest["param_groups"]) != len(optimizer.param_groups) or any(
            len(saved["params"]) != len(own["params"]) for saved, own in zip(rest["param_groups"], optimizer.param_groups)):
        raise CheckpointError(f"{path / 'state.json'}: optimizer state is for a different set of parameters")

    network.load_state_dict(weights, strict=False)
    optimizer.load_state_dict(optimizer_state)
    return state
