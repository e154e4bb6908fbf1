"""Trained policies out of vrl: a run, one of its checkpoints, or a policy version a node
holds, opened as a :class:`~vrl.rollouts.model.Model` and written as a standard Hugging Face
directory that transformers, vLLM and TRL load as is.

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

import structlog

from vrl.errors import VrlError
from vrl.rl import checkpoint
from vrl.rollouts.model import DTYPES, Model, ModelError, load_model

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

    def provenance(self) -> dict:
        return {"source": str(self.source), "version": self.version, "base": self.base,
                "model_hash": self.model.model_hash.hex(), "dtype": self.model.dtype_name}


def is_run(path: Path) -> bool:
    """A ``vrl train`` run directory (``config.toml`` and ``checkpoints/``)."""
    return (path / RUN_CONFIG).is_file() and (path / CHECKPOINTS).is_dir()


def is_checkpoint(path: Path) -> bool:
    """One checkpoint directory (:mod:`vrl.rl.checkpoint`)."""
    return (path / checkpoint.MANIFEST).is_file()


def _run_base(run: Path) -> str:
    """The model spec a run started from, as its ``config.toml`` records it."""
    from vrl.config import ConfigError
    from vrl.rl.train import TrainConfig

    try:
        return TrainConfig.from_saved(run / RUN_CONFIG).model
    except ConfigError as error:
        raise ExportError(str(error)) from None


def _base_model(base: str, device: str, where: Path) -> Model:
    try:
        return load_model(base, dtype="float32", device=device)
    except ModelError as error:
        raise ExportError(f"{where}: its base model {base!r} does not load: {error}") from None


def _checked(model: Model, published: object, where: Path) -> Model:
    if published is not None and model.model_hash.hex() != published:
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
    model = _base_model(base, device, path)
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


def open_version(model_hash: str, source: str | Path, *, device: str = "cpu") -> TrainedPolicy:
    """Policy version ``model_hash`` (hex, or a prefix of at least 8 digits) from a run
    directory's checkpoints, or from what a node folder or a devnet folder holds (its policy
    announcements and their weight blobs, read as an audit reads them: read-only)."""
    prefix = model_hash.strip().lower()
    if not _HASH_PREFIX.fullmatch(prefix):
        raise ExportError(f"{model_hash!r}: a policy is named by its model hash, 8 to 64 hex digits")
    source = Path(source)
    if is_run(source):
        return _version_in_run(prefix, source, device)
    return _version_in_nodes(prefix, source, device)


def _version_in_run(prefix: str, run: Path, device: str) -> TrainedPolicy:
    matches = []
    for path in checkpoint.checkpoints(run / CHECKPOINTS):
        try:
            _, state = checkpoint.verified(path)
        except checkpoint.CheckpointError as error:
            log.warning("skipped damaged checkpoint", checkpoint=str(path), reason=str(error))
            continue
        if str(state.get("model_hash", "")).startswith(prefix):
            matches.append(path)
    if len(matches) != 1:
        raise ExportError(f"{run}: {'no' if not matches else 'more than one'} checkpoint of policy {prefix}"
                          + ("" if matches else "; a run keeps only its newest checkpoints (keep_checkpoints), "
                             "and writes one every checkpoint_every steps"))
    return open_checkpoint(matches[0], base=_run_base(run), device=device)


def _version_in_nodes(prefix: str, source: Path, device: str) -> TrainedPolicy:
    from vrl.audit.sources import AuditError, open_inputs
    from vrl.node.weights import WeightsError, from_blob

    try:
        inputs = open_inputs(source)
    except AuditError as error:
        raise ExportError(f"{error}; or a run directory") from None
    try:
        found = [(node, announcement) for node in inputs.nodes for announcement in _announcements(node)
                 if announcement.model_hash.hex().startswith(prefix)]
        if len({announcement.model_hash for _, announcement in found}) > 1:
            raise ExportError(f"{source}: policy {prefix} is ambiguous: more than one model hash starts with it")
        # Versions that trained nothing keep their parent's weights: the first version named it.
        for node, announcement in sorted(found, key=lambda pair: pair[1].version):
            if node.config is None:
                raise ExportError(f"{source}: {node.name} holds policy {prefix} but no node.toml naming its model")
            blob = inputs.blob(announcement.blob)
            if blob is None:
                continue  # another folder may hold the weights
            skeleton = _base_model(node.config.work.model, device, source)
            try:
                model = from_blob(skeleton, blob, blob_hash=announcement.blob, model_hash=announcement.model_hash,
                                  name=f"{node.config.work.model}@{announcement.version}")
            except WeightsError as error:
                raise ExportError(f"{source}: {error}") from None
            return TrainedPolicy(model, node.config.work.model, announcement.version, source)
    finally:
        inputs.close()
    raise ExportError(f"{source}: no policy announced with model hash {prefix}… whose weights are on disk "
                      "(a node keeps the blobs of the versions it followed)")


def _announcements(node) -> list:
    """A node's stored policy announcements that decode (a damaged row is the audit's to report)."""
    from vrl.node.messages import MessageError, PolicyAnnouncement

    decoded = []
    for _, data, _ in node.store.policies():
        try:
            decoded.append(PolicyAnnouncement.from_bytes(data))
        except MessageError:
            continue
    return decoded


def open_policy(spec: str | Path, *, source: str | Path | None = None, base: str | None = None,
                device: str = "cpu") -> TrainedPolicy:
    """What ``vrl export`` takes: a run or checkpoint directory, or a model hash found in
    ``source`` (a run, a node folder or a devnet folder)."""
    path = Path(spec)
    if path.is_dir():
        return open_checkpoint(path, base=base, device=device)
    if source is None:
        raise ExportError(f"{spec}: not a directory; to name a policy by its model hash, say where it is "
                          "(--from RUN, NODE or DEVNET folder)")
    return open_version(str(spec), source, device=device)


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
    saved_dtype = next(network.parameters()).dtype
    try:
        network.to(DTYPES[dtype])
        # The config's dtype says how the weights are stored, so a plain from_pretrained(dtype="auto")
        # loads them as written.
        network.config.dtype = DTYPES[dtype]
        network.save_pretrained(staging, safe_serialization=True)
        policy.model.tokenizer.save_pretrained(staging)
        (staging / PROVENANCE_FILE).write_text(json.dumps({**policy.provenance(), "stored_dtype": dtype},
                                                          indent=2, sort_keys=True) + "\n")
        for file in staging.iterdir():
            file.chmod(0o644)  # safetensors writes its file private; a model directory is for sharing
            checkpoint.fsync(file)
        checkpoint.fsync(staging)
        # Checked above; a file put at out meanwhile makes this fail and change nothing
        # (only an empty directory would be replaced, which loses nothing).
        os.rename(staging, out)
        checkpoint.fsync(out.parent)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"{out}: cannot be written: {error.strerror or error}") from None
    finally:
        network.to(saved_dtype)
    return out
