"""Models: the named ones (:mod:`vrl.rollouts.presets`), Hugging Face directories and Hub
ids, with a content hash.

A directory is loaded with transformers (any causal LM with safetensors weights), offline. A
Hub id (``Qwen/Qwen2.5-0.5B``) is resolved as transformers resolves one: from the local
Hugging Face cache, which is downloaded into first unless ``HF_HUB_OFFLINE`` is set. The
model hash covers the weights, not the name, so a Hub id and a directory holding the same
weights are one model. What a run trained is a model too, one layer up
(:func:`vrl.rl.export.load_model`, which ``vrl.load_model`` is).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import cast

import torch
from blake3 import blake3
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from vrl.errors import VrlError
from vrl.rollouts.presets import BUILT, PRESETS, base_model_dir, build_preset
from vrl.tasks.chat import prompt_text
from vrl.tasks.core import Task

MODEL_HASH_DOMAIN = b"vrl/model/v3\x00"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(VrlError):
    """A model spec that names nothing loadable, or a directory that is not a causal LM."""


def network_device(network: torch.nn.Module) -> torch.device:
    """Where the network's weights live, so its inputs are made there too."""
    return next(network.parameters()).device


def weights_hash(network: torch.nn.Module, dtype_name: str) -> bytes:
    """sha256 over the canonical description of the weights (specs/record.md, model hash).

    ``domain || dtype name || for each state-dict entry in name order: len-prefixed name,
    len-prefixed dtype, rank and shape, byte length, BLAKE3-256 of the raw little-endian bytes``.
    The leaves are BLAKE3 because they cover every byte of the model and a new policy version
    is hashed at every training step: measured here (2 cores, AVX-512, no SHA extensions),
    BLAKE3 runs at about 7 GB/s against SHA-256's 400 MB/s per stream, so the base model
    hashes in 2.6 ms instead of 20 ms and a 7B model in bfloat16 in about 2 s instead of 38 s.
    BLAKE3 spreads one large input over the cores itself (``max_threads=AUTO``), with the
    same digest whatever the thread count.
    """
    h = hashlib.sha256(MODEL_HASH_DOMAIN)

    def put(text: str) -> None:
        data = text.encode()
        h.update(len(data).to_bytes(4, "big") + data)

    put(dtype_name)
    for name, tensor in sorted(network.state_dict().items()):
        put(name)
        put(str(tensor.dtype).removeprefix("torch."))
        h.update(len(tensor.shape).to_bytes(4, "big"))
        for size in tensor.shape:
            h.update(size.to_bytes(8, "big"))
        length, digest = _tensor_digest(tensor)
        h.update(length.to_bytes(8, "big") + digest)
    return h.digest()


def _tensor_digest(tensor: torch.Tensor) -> tuple[int, bytes]:
    """(byte length, BLAKE3-256) of a tensor's contiguous row-major little-endian bytes."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return len(raw), blake3(raw.data, max_threads=blake3.AUTO).digest()


@dataclass(frozen=True, eq=False)
class Model:
    """A loaded causal LM with the identity the protocol binds rollouts to."""

    name: str
    network: PreTrainedModel = field(repr=False)
    tokenizer: PreTrainedTokenizerBase = field(repr=False)  # AutoTokenizer may give a slow (SentencePiece) one
    dtype_name: str

    @cached_property
    def model_hash(self) -> bytes:
        """sha256 over the weights in the compute dtype; computed once per loaded model."""
        return weights_hash(self.network, self.dtype_name)

    @property
    def device(self) -> torch.device:
        return network_device(self.network)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    # The shape and stop tokens are part of the model's identity, like its hash, and are read
    # once per rollout by the verifier: looked up once (transformers' accessors are slow).
    @cached_property
    def vocab_size(self) -> int:
        return int(self.network.get_output_embeddings().weight.shape[0])

    @cached_property
    def hidden_size(self) -> int:
        return int(self.network.get_output_embeddings().weight.shape[1])

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        eos = self.network.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return tuple(sorted({int(i) for i in ids if i is not None}))

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else self.stop_token_ids[0])

    @property
    def attention(self) -> str:
        return str(self.network.config._attn_implementation)

    def encode(self, text: str) -> list[int]:
        """Prompt tokens: the tokenizer's encoding of the raw text, no special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render(self, task: Task) -> str:
        """The prompt text this model is given for ``task``, which a record carries and whose
        :meth:`encode` it binds: a chat task's messages through this model's chat template
        (:func:`vrl.tasks.chat.prompt_text`, raising its ChatTemplateError)."""
        return prompt_text(task, self.tokenizer)

    def decode(self, tokens: list[int]) -> str:
        known = [t for t in tokens if t < len(self.tokenizer)]
        return cast(str, self.tokenizer.decode(known, skip_special_tokens=True))  # one sequence: one text

    def save(self, directory: str | Path) -> Path:
        """Write a Hugging Face directory (safetensors) that :func:`load_model` reads back."""
        path = Path(directory)
        self.network.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        return path


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ModelError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ModelError(f"unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {name!r} asked for, but this torch build sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ModelError(f"device {name!r} asked for, but there are {torch.cuda.device_count()} CUDA devices")
    return device


#: A verdict carries its platform tag in at most this many bytes (specs/network.md §3.2).
MAX_PLATFORM_BYTES = 128


def platform_tag(model: Model) -> str:
    """What must be equal for two verifiers' recomputed commitments to be bit-identical, so
    that their digests may be compared (specs/reputation.md §4): the torch build; the device,
    by its kernels (the CPU's vector instruction set, or the GPU's name and CUDA version); the
    compute dtype; the attention implementation; and torch's thread count, which splits the
    reductions. Anything that differs may change the low bits of a hidden state, so it makes
    another tag, and digests of different tags are never held against each other."""
    device = network_device(model.network)
    if device.type == "cuda":
        kernels = f"cuda-{torch.version.cuda}/{torch.cuda.get_device_name(device)}"
    else:
        kernels = f"cpu-{torch.backends.cpu.get_cpu_capability()}"
    attention = getattr(model.network.config, "_attn_implementation", None) or "default"
    tag = f"torch-{torch.__version__}/{kernels}/{model.dtype_name}/{attention}/threads-{torch.get_num_threads()}"
    if len(tag.encode()) > MAX_PLATFORM_BYTES:  # a long device name: keep what fits, and a hash of all of it
        tag = tag.encode()[:MAX_PLATFORM_BYTES - 33].decode(errors="ignore") + "#" + hashlib.sha256(
            tag.encode()).hexdigest()[:32]
    return tag


def bit_exact_platform(tag: str) -> bool:
    """Whether the same work on this platform tag gives the same bits every time, so that a
    replay on an equal tag must be bit-exact (specs/training.md §4): a CPU at one thread. At
    two threads on this 2-core machine one training step computed twice in one process differed
    in 4 of 12 cases (up to 7.2e-6 relative drift), at one thread never (bench/replay.py,
    bench/results/replay.json). On an H200 the replay of one 0.5B step was not bit-exact
    either (bench/results/qwen0.5b-cuda.json)."""
    return "/cpu-" in tag and tag.endswith("/threads-1")


def load_model(spec: str | Path, *, dtype: str | None = None, attention: str = "sdpa", device: str = "cpu") -> Model:
    """Load a preset (``tiny``, ``micro``, ``small``), a built model (``base``, ``base-micro``),
    a local Hugging Face directory, or a Hub id from the local cache (:func:`hub_snapshot`).

    ``dtype`` is the compute dtype, part of the model's identity; presets default to float32
    (the fast path on CPUs without bf16 units), directories to the dtype in their config.
    ``attention`` is ``sdpa`` or ``eager`` and
    ``device`` is where the network runs (:func:`resolve_device`): implementation choices, not
    part of identity. Whatever the device, the sampler and the commitments are computed on the
    CPU, so they agree everywhere.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    target = resolve_device(device)
    text = str(spec)
    if text in BUILT:
        path = base_model_dir(BUILT[text])
        if not path.is_dir():
            flag = "" if text == "base" else f" --model {text}"
            raise ModelError(f"the {text} model is not built yet ({path}); run ./scripts/build-base-model{flag}")
        text = str(path)
    tokenizer: PreTrainedTokenizerBase
    if text in PRESETS:
        network, tokenizer = build_preset(text)
        dtype_name = dtype or "float32"
        network.config._attn_implementation = attention
        name = text
    else:
        path = Path(text).expanduser()
        if not path.is_dir():
            path = hub_snapshot(text)
        if not any(path.glob("*.safetensors")):
            raise ModelError(f"{path}: no *.safetensors weights found")
        try:
            with _quiet_progress():
                network = AutoModelForCausalLM.from_pretrained(
                    path, dtype=DTYPES[dtype] if dtype else "auto", attn_implementation=attention,
                    local_files_only=True,
                )
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as error:
            raise ModelError(f"{path}: not a loadable causal LM: {error}") from error
        dtype_name = str(next(network.parameters()).dtype).removeprefix("torch.")
        if dtype_name not in DTYPES:
            raise ModelError(f"{path}: unsupported weight dtype {dtype_name}")
        name = text if path != Path(text).expanduser() else path.name  # a Hub id keeps its name
    # transformers' `to` is wrapped by a decorator whose type loses the bound self.
    network = network.to(device=target, dtype=DTYPES[dtype_name]).eval()  # type: ignore[call-arg]
    network.requires_grad_(False)
    return Model(name=name, network=network, tokenizer=tokenizer, dtype_name=dtype_name)


#: What is fetched of a Hub repository: the weights, the configs and the tokenizer's files
#: (no other formats' weights, no checkpoints of other frameworks).
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def hf_cache_dir() -> Path:
    """Where transformers keeps Hub downloads, read when called (so a process may set it):
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's order)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub reads it (1, ON, YES or TRUE, any case)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of Hub model ``repo_id`` (``org/name``): its cached snapshot, or one
    downloaded now, unless ``HF_HUB_OFFLINE`` is set. Anything else is a :class:`ModelError`
    that says which of the forms the spec was tried as."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # in a computed __all__

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ModelError(f"{repo_id!r}: not a preset ({', '.join(PRESETS)}), a built model ({', '.join(BUILT)}), "
                         "a directory (a model's, a run's or a checkpoint's) or a Hub id (org/name)") from None
    cache, offline = hf_cache_dir(), hub_offline()
    missing = f"{repo_id!r}: no such directory, and as a Hub id it is not in the Hugging Face cache ({cache})"
    try:
        # The same files as a download takes: huggingface_hub checks a cached snapshot against the
        # repository's listing, which names files (README.md, .gitattributes) never fetched.
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True,
                                      allow_patterns=list(HUB_FILES)))
    except (OSError, ValueError, HfHubHTTPError):
        if offline:
            raise ModelError(f"{missing} while HF_HUB_OFFLINE is set: download it where the Hub is reachable "
                             f"(hf download {repo_id}), or unset HF_HUB_OFFLINE") from None
    try:
        with _quiet_progress():
            return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=list(HUB_FILES)))
    except (OSError, ValueError, HfHubHTTPError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelError(f"{missing}, and downloading it failed: {reason}") from None


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """transformers' "Loading weights" bar off while a model loads: a library call prints no
    progress of its own to a caller's terminal (the CLI shows its own, with rich)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def context_length(model: Model) -> int | None:
    """The most positions the model was built for (``max_position_embeddings``, or GPT-2's
    ``n_positions``), or None when its config names neither."""
    config = model.network.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
