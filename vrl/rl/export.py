"""Trained policies out of vrl: a run or one of its checkpoints, opened as a
:class:`~vrl.rollouts.model.Model` (so ``--model RUN`` works wherever a model is named) and
written as a standard Hugging Face directory that transformers, vLLM and TRL load as is. A
policy version a node holds is opened by :func:`vrl.audit.sources.announced_policy`, which
reads node folders as an audit does.

A checkpoint holds only weights (``model.safetensors``, with tied duplicates dropped); the
architecture and the tokenizer are the base model's, which the run's ``config.toml`` (or a
node's ``node.toml``) names. So opening one loads the base model, loads the checkpoint's
weights into it, and then checks the result against the hash the trainer published for that
version (the checkpoint's ``state.json``, or the node's policy announcement): a base model
that differs from the run's, or weights that changed on disk, are refused, never exported.
The exported directory's weights hash (in float32) to that same version hash, so
``vrl.load_model(out)`` is the policy the run published, and rollouts made with it bind the
same ``model_hash``.

The export is written whole or not at all: into a staging directory beside ``out``, fsynced,
then renamed into place; an existing ``out`` is never replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from safetensors import SafetensorError

from vrl.errors import VrlError
from vrl.rl import checkpoint
from vrl.rollouts.config import GenerationConfig
from vrl.rollouts.files import fsync
from vrl.rollouts.model import DTYPES, Model, ModelError
from vrl.rollouts.model import load_model as load_hf_model

log = structlog.get_logger("vrl.rl.export")

#: Written beside the Hugging Face files: where the weights came from and what they hash to.
PROVENANCE_FILE = "vrl-export.json"
RUN_CONFIG = "config.toml"
CHECKPOINTS = "checkpoints"
# A version named by its hash: at least 8 hex digits (4 bytes; a run has far fewer versions
# than the 2^16 it would take for two to share a prefix by chance), at most the whole 64.
_HASH_PREFIX = re.compile(r"[0-9a-f]{8,64}")


class ExportError(VrlError, ValueError):
    """A source that is no trained policy, or weights that do not hash to what was published;
    names the path."""


@dataclass(frozen=True, eq=False)
class TrainedPolicy:
    """A policy version's weights (float32, the training dtype), the model spec it was trained
    from, and where it was found."""

    model: Model
    base: str
    version: int
    source: Path

    def provenance(self) -> dict[str, Any]:
        return {"source": str(self.source), "version": self.version, "base": self.base,
                "model_hash": self.model.model_hash.hex(), "dtype": self.model.dtype_name}


def is_run(path: Path) -> bool:
    """A ``vrl train`` run directory (``config.toml`` and ``checkpoints/``)."""
    return (path / RUN_CONFIG).is_file() and (path / CHECKPOINTS).is_dir()


def is_checkpoint(path: Path) -> bool:
    """One checkpoint directory (:mod:`vrl.rl.checkpoint`)."""
    return (path / checkpoint.MANIFEST).is_file()


def _run_base(run: Path) -> str:
    """The model spec a run started from, as its ``config.toml`` records it (``model``; the
    generation default when the key is absent, as ``TrainConfig`` reads it)."""
    from vrl.config import ConfigError, read_toml, reading

    path = run / RUN_CONFIG
    try:
        with reading(path):
            model = read_toml(path).get("model", GenerationConfig.model)
            if not isinstance(model, str) or not model:
                raise ConfigError(f"model: expected a model spec, got {str(model)[:60]!r}")
    except ConfigError as error:
        raise ExportError(str(error)) from None
    return model


def base_model(base: str, device: str, where: Path) -> Model:
    """The model a policy was trained from, in the training dtype (float32)."""
    try:
        return load_hf_model(base, dtype="float32", device=device)
    except ModelError as error:
        raise ExportError(f"{where}: its base model {base!r} does not load: {error}") from None


def _checked(model: Model, published: object, where: Path) -> Model:
    if published is None:
        raise ExportError(f"{where}: its state.json records no model hash, so the weights cannot be checked against "
                          "what the run published")
    if model.model_hash.hex() != published:
        raise ExportError(f"{where}: the weights hash to {model.model_hash.hex()[:16]}, the run published "
                          f"{str(published)[:16]}: the base model is not the run's, or the files changed")
    return model


def open_checkpoint(path: str | Path, *, base: str | None = None, device: str = "cpu") -> TrainedPolicy:
    """The policy in a run directory (its newest checkpoint that verifies) or in one checkpoint
    directory. ``base`` is the model spec the run started from; by default the run's own
    ``config.toml`` (a checkpoint's run is two levels up)."""
    path = Path(path)
    if is_run(path):
        found = checkpoint.checkpoints(path / CHECKPOINTS)[::-1]
        if not found:
            raise ExportError(f"{path}: the run has no checkpoint yet (one is written every checkpoint_every "
                              "steps, and at the last step)")
        run, candidates = path, found
    elif is_checkpoint(path):
        run, candidates = path.parent.parent, [path]
    else:
        raise ExportError(f"{path}: neither a run directory ({RUN_CONFIG} and {CHECKPOINTS}/) nor a checkpoint "
                          f"({checkpoint.MANIFEST})")
    if base is None:
        if not is_run(run):
            raise ExportError(f"{path}: a checkpoint outside its run directory; name the model it was trained "
                              "from (--base)")
        base = _run_base(run)
    model = base_model(base, device, path)
    problems = []
    for candidate in candidates:  # newest first: a damaged newest one falls back, logged
        try:
            state = checkpoint.load_weights(candidate, model.network)
        except checkpoint.CheckpointError as error:
            problems.append(str(error))
            log.warning("skipped damaged checkpoint", checkpoint=str(candidate), reason=str(error))
            continue
        version = state["step"]
        trained = Model(name=f"{run.resolve().name}@{version}", network=model.network,
                        tokenizer=model.tokenizer, dtype_name="float32")
        return TrainedPolicy(_checked(trained, state.get("model_hash"), candidate), base, version, candidate)
    raise ExportError("; ".join(problems))


def load_model(spec: str | Path, *, dtype: str | None = None, attention: str = "sdpa",
               device: str = "cpu") -> Model:
    """:func:`vrl.rollouts.model.load_model`, and a ``vrl train`` run directory or checkpoint
    too: its trained policy, in float32 unless ``dtype`` says otherwise. What ``--model`` and
    ``vrl.load_model`` take."""
    path = Path(spec).expanduser()
    if not (path.is_dir() and (is_run(path) or is_checkpoint(path))):
        return load_hf_model(spec, dtype=dtype, attention=attention, device=device)
    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    try:
        model = open_checkpoint(path, device=device).model
    except ExportError as error:
        raise ModelError(str(error)) from None
    model.network.config._attn_implementation = attention
    if dtype in (None, model.dtype_name):
        return model
    # transformers' `to` is wrapped by a decorator whose type loses the bound self.
    return Model(name=model.name, network=model.network.to(DTYPES[dtype]),  # type: ignore[arg-type]
                 tokenizer=model.tokenizer,
                 dtype_name=dtype)


def hash_prefix(model_hash: str) -> str:
    """A policy's name on the command line: its model hash in hex, or a prefix of at least 8
    digits; lower case."""
    prefix = model_hash.strip().lower()
    if not _HASH_PREFIX.fullmatch(prefix):
        raise ExportError(f"{model_hash!r}: a policy is named by its model hash, 8 to 64 hex digits")
    return prefix


def open_version(model_hash: str, run: str | Path, *, device: str = "cpu") -> TrainedPolicy:
    """Policy version ``model_hash`` (:func:`hash_prefix`) from a run directory's checkpoints.
    (What a node or a devnet folder holds is read by :func:`vrl.audit.sources.announced_policy`.)"""
    prefix, run = hash_prefix(model_hash), Path(run)
    if not is_run(run):
        raise ExportError(f"{run}: not a run directory ({RUN_CONFIG} and {CHECKPOINTS}/)")
    matches = []
    for path in checkpoint.checkpoints(run / CHECKPOINTS):
        try:
            _, state = checkpoint.verified(path)
        except checkpoint.CheckpointError as error:
            log.warning("skipped damaged checkpoint", checkpoint=str(path), reason=str(error))
            continue
        if str(state.get("model_hash", "")).startswith(prefix):
            matches.append((path, state["model_hash"]))
    if not matches:
        raise ExportError(f"{run}: no checkpoint of policy {prefix}; a run keeps only its newest checkpoints "
                          "(keep_checkpoints), and writes one every checkpoint_every steps")
    if len({digest for _, digest in matches}) > 1:
        raise ExportError(f"{run}: policy {prefix} is ambiguous: more than one model hash starts with it")
    # Steps that trained nothing keep their weights: any checkpoint of the hash is the policy.
    return open_checkpoint(matches[0][0], base=_run_base(run), device=device)


def export(policy: TrainedPolicy, out: str | Path, *, dtype: str = "float32") -> Path:
    """Write ``policy`` to ``out`` as a Hugging Face directory: the model and the tokenizer
    (``save_pretrained``, safetensors), its generation config, and :data:`PROVENANCE_FILE`.
    ``dtype`` is the dtype the weights are stored in (``float32`` keeps the version's hash)."""
    out = Path(out)
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if out.exists():
        raise ExportError(f"{out}: already exists; exports never replace a directory")
    if not out.parent.is_dir():
        raise ExportError(f"{out.parent}: no such directory")
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    network = policy.model.network
    # A converted copy is saved, never the live network: converting it there and back would
    # round a float32 policy's weights through bfloat16 in place (its cached hash then wrong).
    weights = {name: tensor.detach().to(DTYPES[dtype]).contiguous() for name, tensor in network.state_dict().items()}
    stored = network.config.dtype
    try:
        network.save_pretrained(staging, state_dict=weights, safe_serialization=True)
        # The config's dtype says how the weights are stored, so a plain from_pretrained(dtype="auto")
        # loads them as written (save_pretrained wrote the live network's float32).
        network.config.dtype = DTYPES[dtype]
        network.config.save_pretrained(staging)
        policy.model.tokenizer.save_pretrained(staging)
        (staging / PROVENANCE_FILE).write_text(json.dumps({**policy.provenance(), "stored_dtype": dtype},
                                                          indent=2, sort_keys=True) + "\n")
        for file in staging.iterdir():
            file.chmod(0o644)  # safetensors writes its file private; a model directory is for sharing
            fsync(file)
        fsync(staging)
        # Checked above; a file put at out meanwhile makes this fail and change nothing
        # (only an empty directory would be replaced, which loses nothing).
        os.rename(staging, out)
        fsync(out.parent)
    except (OSError, SafetensorError) as error:  # a full disk is a SafetensorError from safetensors' writer
        raise ExportError(f"{out}: cannot be written: {getattr(error, 'strerror', None) or error}") from None
    finally:
        network.config.dtype = stored
        shutil.rmtree(staging, ignore_errors=True)  # gone already when renamed
    return out
