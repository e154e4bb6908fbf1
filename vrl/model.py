"""Models: built-in presets and local Hugging Face directories, with a content hash.

Nothing is ever downloaded. A preset is a Qwen2-style config, weights drawn from a seeded
generator per parameter name, and a byte-level tokenizer built in code, so the same preset
has the same ``model_hash`` on every machine with the same torch. A directory is loaded with
transformers (any causal LM with safetensors weights), offline.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
from blake3 import blake3

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: there is none here
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from transformers import (  # noqa: E402  (after the offline switch)
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

MODEL_HASH_DOMAIN = b"vrl/model/v3\x00"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


class ModelError(Exception):
    """A model spec that names nothing loadable, or a directory that is not a causal LM."""


@dataclass(frozen=True)
class Preset:
    """Architecture of a built-in model (Qwen2 layout: RMSNorm, RoPE, GQA, SwiGLU)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tie_embeddings: bool
    seed: int
    max_positions: int = 4096
    init_std: float = 0.02  # the usual initializer_range of Qwen2/Llama configs


PRESETS = {
    # About 3.3M parameters: fast enough for the whole test suite on 2 CPU cores.
    "tiny": Preset(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, vocab=512,
                   tie_embeddings=True, seed=0),
    # About 156M parameters (the shape of the TOPLOC measurements in shared research).
    "small": Preset(hidden=1024, intermediate=2816, layers=8, heads=16, kv_heads=4, vocab=32000,
                    tie_embeddings=False, seed=0),
}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (what ByteLevel expects)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: token id = byte value, then the special tokens.

    One token per byte keeps digits separate (good for arithmetic) and is fully specified by
    this function, so prover and verifier tokenize identically without any downloaded file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _byte_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN, PAD_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def build_preset(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Build a preset's network (float32) and tokenizer from code alone."""
    if name not in PRESETS:
        raise ModelError(f"unknown preset {name!r}; presets are {', '.join(PRESETS)}")
    preset = PRESETS[name]
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=preset.vocab,
        hidden_size=preset.hidden,
        intermediate_size=preset.intermediate,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        max_position_embeddings=preset.max_positions,
        tie_word_embeddings=preset.tie_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        initializer_range=preset.init_std,
    )
    network = Qwen2ForCausalLM(config)
    # Our own seeded init, per parameter name, so the weights do not depend on the order in
    # which transformers happens to initialise modules.
    with torch.no_grad():
        for param_name, tensor in sorted(network.state_dict().items()):
            if param_name.endswith("norm.weight"):
                tensor.fill_(1.0)
            elif param_name.endswith(".bias"):
                tensor.zero_()
            else:
                digest = hashlib.sha256(f"vrl/preset/{name}/{preset.seed}/{param_name}".encode()).digest()
                generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * preset.init_std)
    return network, tokenizer


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
    tokenizer: PreTrainedTokenizerFast = field(repr=False)
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

    def decode(self, tokens: list[int]) -> str:
        known = [t for t in tokens if t < len(self.tokenizer)]
        return self.tokenizer.decode(known, skip_special_tokens=True)

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


def load_model(spec: str | Path, *, dtype: str | None = None, attention: str = "sdpa", device: str = "cpu") -> Model:
    """Load a preset (``tiny``, ``small``), the built ``base`` model, or a local Hugging Face directory.

    ``dtype`` is the compute dtype, part of the model's identity; presets default to float32
    (the fast path on CPUs without bf16 units), directories to the dtype in their config.
    ``attention`` is ``sdpa`` or ``eager`` and ``device`` is where the network runs
    (:func:`resolve_device`): implementation choices, not part of identity. Whatever the
    device, the sampler and the commitments are computed on the CPU, so they agree everywhere.
    """
    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    target = resolve_device(device)
    text = str(spec)
    if text == "base":
        from vrl.base_model import base_model_dir

        path = base_model_dir()
        if not path.is_dir():
            raise ModelError(f"the base model is not built yet ({path}); run ./scripts/build-base-model")
        text = str(path)
    if text in PRESETS:
        network, tokenizer = build_preset(text)
        dtype_name = dtype or "float32"
        network.config._attn_implementation = attention
        name = text
    else:
        path = Path(text).expanduser()
        if not path.is_dir():
            raise ModelError(f"{text!r} is neither a preset ({', '.join(PRESETS)}) nor a model directory")
        if not any(path.glob("*.safetensors")):
            raise ModelError(f"{path}: no *.safetensors weights found")
        try:
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
        name = path.name
    network = network.to(device=target, dtype=DTYPES[dtype_name]).eval()
    network.requires_grad_(False)
    return Model(name=name, network=network, tokenizer=tokenizer, dtype_name=dtype_name)
