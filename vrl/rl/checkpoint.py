"""Training checkpoints: safetensors weights and optimizer state, published atomically.

A checkpoint is a directory ``step-NNNNNNNN`` holding ``model.safetensors``,
``optimizer.safetensors``, ``state.json`` and, written last, ``MANIFEST.json`` with the
SHA-256 of every other file. It is built under a temporary name (``.step-NNNNNNNN.partial-PID``),
fsynced, and renamed into place, so a crash leaves either the whole checkpoint or none, plus at
most a staging directory, which :func:`remove_stale_partials` removes at the next start. A
writer holds the directory's lock (:func:`writing`) for the whole save, which is how a later
start tells a dead writer's staging directory from a live one's.

Loading verifies the manifest, the state and every tensor's name and shape before touching the
live model or optimizer: a damaged checkpoint is refused with a :class:`CheckpointError` that
names the file, never half-loaded. :func:`load_latest` falls back to the newest checkpoint that
verifies, and logs each one it skipped and why.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model

from vrl.errors import VrlError
from vrl.rollouts.files import fsync

MANIFEST = "MANIFEST.json"
PREFIX = "step-"
FILES = ("model.safetensors", "optimizer.safetensors", "state.json")  # what a manifest covers, exactly
LOCK = ".lock"
# A manifest is three names and three hashes, about 300 bytes; reading more is refused before
# parsing, so a damaged one costs neither memory nor time (JSON's nesting limit is far below it).
MAX_MANIFEST_BYTES = 1 << 16
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STAGING = re.compile(rf"\.{PREFIX}(\d+)\.partial-(\d+)")
MAX_STEP = 2**63 - 1  # steps are policy versions: 0 .. 2^63-1 (specs/record.md §1)

log = structlog.get_logger("vrl.rl.checkpoint")


class CheckpointError(VrlError):
    """A checkpoint that is missing, corrupt, or does not fit the model; names the file."""


@dataclass(frozen=True)
class Manifest:
    step: int
    files: dict[str, str]  # every name of FILES -> its SHA-256, hex


def _brief(value: object) -> str:
    """A JSON value for an error message: a scalar cut short, a container by its type only
    (printing one nested 900 deep could itself overflow the stack)."""
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    return repr(value)[:60]


def parse_manifest(data: bytes, source: str | Path) -> Manifest:
    """A manifest's bytes, checked: ``{"step": int, "files": {name: sha256 hex}}`` naming exactly
    :data:`FILES`. Any input gives a :class:`Manifest` or a :class:`CheckpointError` starting
    with ``source``."""
    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{source}: {problem}")

    if len(data) > MAX_MANIFEST_BYTES:
        raise bad(f"larger than {MAX_MANIFEST_BYTES} bytes; not a checkpoint manifest")
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as error:  # not UTF-8, not JSON, nested too deep
        raise bad(f"not a JSON manifest: {error}") from None
    if not isinstance(manifest, dict) or set(manifest) != {"step", "files"}:
        raise bad('expected an object with exactly "step" and "files"')
    step, files = manifest["step"], manifest["files"]
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise bad(f"step must be an integer in 0..{MAX_STEP}, got {_brief(step)}")
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        raise bad(f"files must list exactly {', '.join(FILES)}")
    for name, digest in files.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise bad(f"files.{name}: expected a SHA-256 in hex, got {_brief(digest)}")
    return Manifest(step, files)


def read_manifest(path: str | Path) -> Manifest:
    """The manifest of checkpoint directory ``path`` (:func:`parse_manifest`)."""
    file = Path(path) / MANIFEST
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {MANIFEST}") from None
    except OSError as error:
        raise CheckpointError(f"{file}: unreadable: {error.strerror or error}") from None
    return parse_manifest(data, file)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def writing(directory: str | Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``directory``'s checkpoint lock (``flock`` on ``directory/.lock``); yields whether it
    is held (always, when ``wait``). The kernel drops the lock when its holder dies, kill -9 too."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)  # releases the lock


def remove_stale_partials(directory: str | Path) -> list[Path]:
    """Remove the staging directories of writers that died mid-save; returns them (each is logged).

    Every writer holds the lock for its whole save, so when the lock can be taken no staging
    directory has a live writer, whatever its PID now names (PIDs are reused, and a container's
    trainer is often PID 1 again after a restart). When it cannot, another process is saving
    right now, and nothing is removed: the next start will."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    with writing(directory, wait=False) as held:
        if not held:
            log.info("checkpoint write in progress elsewhere; staging directories left for the next start",
                     directory=str(directory))
            return []
        for path in sorted(directory.iterdir()):
            match = _STAGING.fullmatch(path.name)
            if match is None or not path.is_dir():
                continue
            shutil.rmtree(path)
            removed.append(path)
            log.warning("removed stale partial checkpoint", path=str(path), step=int(match[1]),
                        writer_pid=int(match[2]))
    return removed


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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


def save(directory: str | Path, step: int, network: torch.nn.Module, optimizer: torch.optim.Optimizer,
         state: dict[str, Any]) -> Path:
    """Write checkpoint ``step`` under ``directory``; returns its path."""
    directory = Path(directory)
    final = directory / f"{PREFIX}{step:08d}"
    staging = directory / f".{final.name}.partial-{os.getpid()}"
    with writing(directory):
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_model(network, str(staging / "model.safetensors"))  # drops tied duplicates
        tensors, rest = _optimizer_tensors(optimizer)
        save_file(tensors, str(staging / "optimizer.safetensors"))
        (staging / "state.json").write_text(json.dumps({**state, "step": step, "optimizer": rest}, sort_keys=True))
        files = {path.name: _sha256(path) for path in sorted(staging.iterdir())}
        (staging / MANIFEST).write_text(json.dumps({"step": step, "files": files}, sort_keys=True))
        for path in staging.iterdir():
            fsync(path)
        fsync(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        fsync(directory)
    return final


def checkpoints(directory: Path) -> list[Path]:
    """The checkpoint directories, oldest first, by step number: names are zero-padded to 8
    digits, so sorting the names alone would put step 10^8 before step 99,999,999."""
    if not directory.is_dir():
        return []
    found = [(int(p.name[len(PREFIX):]), p) for p in directory.glob(f"{PREFIX}*")
             if p.is_dir() and p.name[len(PREFIX):].isdigit()]
    return [p for _, p in sorted(found)]


def latest(directory: Path) -> Path | None:
    steps = checkpoints(directory)
    return steps[-1] if steps else None


def prune(directory: Path, keep: int) -> None:
    for old in checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _optimizer_state(path: Path, rest: object, moments: dict[str, torch.Tensor],
                     optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state dict that ``state.json``'s ``optimizer`` and the moments describe,
    checked against ``optimizer``'s parameters (count, ids, shapes)."""
    where = path / "state.json"
    if not isinstance(rest, dict) or not isinstance(rest.get("param_groups"), list) or not isinstance(
            rest.get("scalars"), dict):
        raise CheckpointError(f"{where}: optimizer: expected param_groups (a list) and scalars (an object)")
    groups = rest["param_groups"]
    if len(groups) != len(optimizer.param_groups) or not all(
            isinstance(saved, dict) and isinstance(saved.get("params"), list)
            and len(saved["params"]) == len(own["params"]) for saved, own in zip(groups, optimizer.param_groups)):
        raise CheckpointError(f"{where}: optimizer state is for a different set of parameters")
    parameters = {}  # saved parameter id -> the live parameter it stands for
    for saved, own in zip(groups, optimizer.param_groups):
        for key, value in own.items():  # a hyperparameter the optimizer reads as a number is one
            number = (int, float)
            if isinstance(value, number) and not isinstance(value, bool) and (
                    not isinstance(saved.get(key), number) or isinstance(saved.get(key), bool)):
                raise CheckpointError(f"{where}: optimizer: {key} must be a number, got {_brief(saved.get(key))}")
        for index, parameter in zip(saved["params"], own["params"]):
            if type(index) is not int or index in parameters:
                raise CheckpointError(
                    f"{where}: optimizer: parameter ids must be distinct integers, got {_brief(index)}")
            parameters[index] = parameter
    state: dict[int, dict[str, Any]] = {}
    for key, value in [*moments.items(), *rest["scalars"].items()]:
        index, _, slot = key.partition(".")
        if not index.isdecimal() or int(index) not in parameters or not slot:
            raise CheckpointError(f"{where}: optimizer: state {key[:60]!r} names no parameter of the model")
        shape = parameters[int(index)].shape
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shape:
            raise CheckpointError(f"{path / 'optimizer.safetensors'}: {key!r} has shape {tuple(value.shape)}, "
                                  f"its parameter {tuple(shape)}")
        state.setdefault(int(index), {})[slot] = value
    return {"state": state, "param_groups": groups}


def verified(path: Path) -> tuple[Manifest, dict[str, Any]]:
    """Check every file of checkpoint ``path`` against its manifest, then read its state;
    loads no tensor."""
    manifest = read_manifest(path)
    if path.name.startswith(PREFIX) and path.name != f"{PREFIX}{manifest.step:08d}":
        raise CheckpointError(f"{path / MANIFEST}: step {manifest.step} is not this checkpoint's")
    try:
        for name, expected in manifest.files.items():
            if _sha256(path / name) != expected:
                raise CheckpointError(f"{path / name}: content does not match its manifest hash (corrupt)")
        state = json.loads((path / "state.json").read_text())
    except CheckpointError:
        raise
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: incomplete checkpoint, missing {Path(error.filename).name}") from None
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: unreadable checkpoint: {error}") from None
    if not isinstance(state, dict) or state.get("step") != manifest.step or type(state.get("step")) is not int:
        raise CheckpointError(f"{path / 'state.json'}: expected an object whose step is {manifest.step}")
    return manifest, state


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except FileNotFoundError:
        raise CheckpointError(f"{file.parent}: incomplete checkpoint, missing {file.name}") from None
    except (OSError, ValueError, SafetensorError) as error:
        raise CheckpointError(f"{file.parent}: unreadable checkpoint: {error}") from None


def _fitting_weights(path: Path, network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, each checked to fit ``network`` (names, shapes, dtypes; a tied
    duplicate, which the save dropped, counts as present)."""
    weights = _read_tensors(path / "model.safetensors")
    live = network.state_dict()
    for name, tensor in weights.items():
        if name not in live or live[name].shape != tensor.shape or live[name].dtype != tensor.dtype:
            raise CheckpointError(f"{path / 'model.safetensors'}: tensor {name!r} does not fit the model")
    saved_storage = {live[name].data_ptr() for name in weights}
    missing = [n for n in live if n not in weights and live[n].data_ptr() not in saved_storage]
    if missing:
        raise CheckpointError(f"{path / 'model.safetensors'}: missing tensor {missing[0]!r}")
    return weights


def load_weights(path: str | Path, network: torch.nn.Module) -> dict[str, Any]:
    """Verify ``path`` completely, then load only its weights into ``network`` (no optimizer:
    what exporting or serving a trained policy needs); returns its state."""
    path = Path(path)
    _, state = verified(path)
    weights = _fitting_weights(path, network)
    network.load_state_dict(weights, strict=False)
    return state


def load(path: str | Path, network: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Verify ``path`` completely, then load it into ``network`` and ``optimizer``; returns its state."""
    path = Path(path)
    _, state = verified(path)
    weights = _fitting_weights(path, network)
    moments = _read_tensors(path / "optimizer.safetensors")
    optimizer_state = _optimizer_state(path, state.pop("optimizer", None), moments, optimizer)

    try:  # builds the new state before it replaces the old one: a refusal changes nothing
        optimizer.load_state_dict(optimizer_state)
    except (ValueError, TypeError, KeyError, RuntimeError) as error:
        raise CheckpointError(f"{path / 'state.json'}: optimizer state does not load: {error}") from None
    network.load_state_dict(weights, strict=False)
    return state


def load_latest(directory: str | Path, network: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                fall_back: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """Load the newest checkpoint under ``directory`` that verifies: ``(its path, its state)``,
    or None if there is none at all. Each newer one skipped is logged with the reason; if none
    verifies, the :class:`CheckpointError` lists them all. Without ``fall_back`` only the newest
    is tried, and its error raised."""
    directory = Path(directory)
    candidates = checkpoints(directory)[::-1]
    if not fall_back and candidates:
        return candidates[0], load(candidates[0], network, optimizer)
    problems = []
    for path in candidates:
        try:
            return path, load(path, network, optimizer)
        except CheckpointError as error:
            problems.append(f"{path.name}: {error}")
            log.warning("skipped damaged checkpoint", checkpoint=str(path), reason=str(error))
    if problems:
        raise CheckpointError(f"{directory}: no valid checkpoint ({'; '.join(problems)})")
    return None
