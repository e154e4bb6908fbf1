"""The named models: the built-in presets, and ``base``, the preset trained by a fixed recipe.

A preset is a Qwen2-style architecture with weights drawn from a seeded generator per
parameter name and a byte-level tokenizer built in code, so the same preset has the same
``model_hash`` on every machine with the same torch. ``base`` is the ``tiny`` preset after
the supervised recipe of :class:`BaseModelConfig`, built once by ``vrl build-base-model``
(:mod:`vrl.rl.base_model`) into a directory named by the recipe's digest, so
:func:`vrl.rollouts.model.load_model` finds it without knowing how it is trained.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

# torch and transformers are imported where a model or tokenizer is built: the recipe and the
# presets' shapes are read by configs (vrl.rollouts.config) that `vrl train --help` imports.

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


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
    # Qwen2Config's own defaults, which the first presets were built with (specs/record.md §5).
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


PRESETS = {
    # About 3.3M parameters: fast enough for the whole test suite on 2 CPU cores.
    "tiny": Preset(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, vocab=512,
                   tie_embeddings=True, seed=0),
    # About 156M parameters: the shape TOPLOC was first measured with on this machine kind (not
    # reproduced in bench/results/ yet). bench/calibrate.py --model small judges TOPLOC beside
    # our checks on it and calibrates the bfloat16 profile; bench/cost.py times it.
    # About 0.27M parameters, vocabulary 256 and hidden size 64: the largest LM head whose
    # logits ezkl proves at k=15 in seconds on a CPU (shared/research/ezkl.md section 4), so its
    # sampled tokens can carry zk proofs (specs/zk.md section 8). ``base-micro`` trains it.
    "micro": Preset(hidden=64, intermediate=256, layers=4, heads=4, kv_heads=2, vocab=256,
                    tie_embeddings=True, seed=0),
    "small": Preset(hidden=1024, intermediate=2816, layers=8, heads=16, kv_heads=4, vocab=32000,
                    tie_embeddings=False, seed=0),
    # About 494M parameters: Qwen2.5-0.5B's shape, with seeded random weights and the byte
    # tokenizer (no weights can be downloaded here), so what a 0.5B model costs to generate,
    # verify, train and replay is measured on the real architecture (bench/scale_model.py).
    # Every value is Qwen/Qwen2.5-0.5B's config.json (huggingface.co/Qwen/Qwen2.5-0.5B): hidden_size
    # 896, intermediate_size 4864, num_hidden_layers 24, num_attention_heads 14,
    # num_key_value_heads 2, vocab_size 151936, tie_word_embeddings true, rope_theta 1000000.0,
    # rms_norm_eps 1e-06, max_position_embeddings 32768, initializer_range 0.02 (its sliding
    # window is off, use_sliding_window false, as Qwen2Config's default is).
    "qwen2.5-0.5b": Preset(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936,
                           tie_embeddings=True, seed=0, max_positions=32768, rope_theta=1_000_000.0),
    # The same shape cut to 2 layers (166M parameters, 136M of them the tied embedding):
    # what CI runs end to end (tests/test_qwen_shape.py), so GQA at 7 query heads per KV head,
    # the tied head and a 151,936-entry vocabulary go through generate, verify, train and export.
    "qwen2.5-0.5b-2layer": Preset(hidden=896, intermediate=4864, layers=2, heads=14, kv_heads=2, vocab=151936,
                                  tie_embeddings=True, seed=0, max_positions=32768, rope_theta=1_000_000.0),
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


#: Bytes that never occur in UTF-8 text (RFC 3629 section 1): a vocabulary of 256 drops them to
#: make room for the two special tokens and still tokenizes every string.
NON_UTF8_BYTES = (0xFE, 0xFF)


def build_tokenizer(vocab_size: int = 258) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: token id = byte value, then the special tokens.

    One token per byte keeps digits separate (good for arithmetic) and is fully specified by
    this function, so prover and verifier tokenize identically without any downloaded file.
    Below 258 entries the two bytes UTF-8 never uses are left out (:data:`NON_UTF8_BYTES`), so
    the special tokens are 254 and 255.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256:
        raise ValueError(f"a byte-level vocabulary needs at least 256 entries, not {vocab_size}")
    dropped = NON_UTF8_BYTES if vocab_size < 258 else ()
    vocab = {char: byte for byte, char in _byte_to_unicode().items() if byte not in dropped}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN, PAD_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def build_preset(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Build a preset's network (float32) and tokenizer from code alone; ``name`` is one of
    :data:`PRESETS` (``load_model`` says so to a user who names another)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    preset = PRESETS[name]
    tokenizer = build_tokenizer(preset.vocab)
    config = Qwen2Config(
        vocab_size=preset.vocab,
        hidden_size=preset.hidden,
        intermediate_size=preset.intermediate,
        num_hidden_layers=preset.layers,
        num_attention_heads=preset.heads,
        num_key_value_heads=preset.kv_heads,
        max_position_embeddings=preset.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": preset.rope_theta},
        rms_norm_eps=preset.rms_eps,
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
                # Drawn into the parameter and scaled in place: the same bits as
                # ``randn(...) * init_std``, without two temporaries the size of the largest
                # tensor (545 MB each for qwen2.5-0.5b's embedding).
                torch.randn(tensor.shape, generator=generator, out=tensor).mul_(preset.init_std)
    return network, tokenizer


META_FILE = "vrl-base.json"


@dataclass(frozen=True)
class BaseModelConfig:
    preset: str = "tiny"
    tasks: str = "arithmetic:digits=2,ops=+"  # an Arithmetic spec
    # 1000 steps give held-out accuracy of 21.9% sampled at T=1 and 50.0% greedy on problems
    # it never saw (the pinned build, 76b580a8..., 163 s on one thread here: vrl.rl.base_model,
    # specs/vectors/base_model.json): sampling inside issue 3's 20-50% band, with room for GRPO.
    # (Unpinned builds on AVX-512 machines gave 27.3% and 76.2%: the same recipe, other kernels.)
    steps: int = 1000
    batch_size: int = 64
    learning_rate: float = 1e-3  # AdamW, as nanoGPT uses for models of this size
    warmup_steps: int = 50
    # Share of training answers replaced by a near miss (off by 1 or 2). The model learns the
    # arithmetic, with the right answer as its mode, but samples sloppily: like a pretrained
    # model that knows more than its sampling shows, which is what RL with a verifiable
    # reward is for (bench/learning.py measures what GRPO makes of it).
    label_noise: float = 0.5
    seed: int = 0
    held_out: int = 256
    # Train only on problems that assignment can draw, never on the evaluation set. (Builds
    # before the held-out split, issue 3, trained on every problem; as a config field it also
    # gives this build another digest, so their cached directories are not reused.)
    excludes_held_out: bool = True

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


DEFAULT = BaseModelConfig()
#: The trained models by name: ``base``, and ``base-micro``, the ``micro`` preset after the same
#: recipe (a small-vocabulary policy whose sampled tokens zk proofs can cover).
BUILT = {"base": DEFAULT, "base-micro": BaseModelConfig(preset="micro")}


def data_dir() -> Path:
    """``$VRL_DATA_DIR``, else ``$XDG_CACHE_HOME/vrl``, else ``~/.cache/vrl``: never the repo."""
    if os.environ.get("VRL_DATA_DIR"):
        return Path(os.environ["VRL_DATA_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vrl"


def base_model_dir(config: BaseModelConfig = DEFAULT) -> Path:
    return data_dir() / "base" / f"{config.preset}-{config.digest()}"


def read_meta(directory: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((directory / META_FILE).read_text())  # written by the build, a JSON map
    return meta
