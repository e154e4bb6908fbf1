"""Qwen2.5-0.5B's architecture end to end, in its shrunken copy ``qwen2.5-0.5b-2layer``: the
same width, 14 query heads over 2 KV heads (GQA), tied embeddings and a 151,936-entry
vocabulary, in 2 layers (specs/record.md §5). Generate, commit, verify, one GRPO step, export,
and the export loads back as the trained version: the code paths a real 0.5B model takes, which
the tiny presets (vocabulary 512 or 256) never reach. bench/scale_model.py measures the full
24-layer shape."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import vrl
from proofs import commitment, sampler
from proofs.sampler import SamplingParams
from vrl.rl.export import PROVENANCE_FILE, TrainedPolicy, export
from vrl.rl.step import StepConfig, grpo_step, optimizer_for
from vrl.rollouts.model import Model, load_model, weights_hash
from vrl.rollouts.presets import PRESETS
from vrl.rollouts.verify import Expectations, verify

ROUND = bytes(range(32))
TASKS = vrl.Arithmetic(digits=1)
NAME = "qwen2.5-0.5b-2layer"


def test_the_shrunken_copy_is_the_full_shape_but_for_its_depth():
    full, small = PRESETS["qwen2.5-0.5b"], PRESETS[NAME]
    assert (small.layers, full.layers) == (2, 24)
    for field in ("hidden", "intermediate", "heads", "kv_heads", "vocab", "tie_embeddings", "max_positions",
                  "rope_theta", "rms_eps"):
        assert getattr(small, field) == getattr(full, field), field


@pytest.fixture(scope="module")
def model() -> Model:
    return load_model(NAME)


def test_the_architecture_is_qwen2_5_0_5b(model):
    config = model.network.config
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert model.vocab_size == 151936 and model.hidden_size == 896
    # Tied: the LM head is the input embedding, one tensor.
    assert model.network.get_output_embeddings().weight is model.network.get_input_embeddings().weight
    assert config.rope_parameters["rope_theta"] == 1_000_000.0


def test_generate_verify_train_and_export_on_the_qwen_shape(model, tmp_path):
    key = vrl.NodeKey.from_seed(b"qwen-shape".ljust(32, b"\0"))
    sampling = vrl.sampling_for(model, max_new_tokens=6)
    groups = list(vrl.iter_generate(model, TASKS, key, round_seed=ROUND, sampling=sampling, groups=2, group_size=4,
                                    batch_size=8))
    rollouts = [r for g in groups for r in g]
    assert len(rollouts) == 8
    # Seeded random weights spread the samples over the whole vocabulary: tokens past the
    # tokenizer's 258 entries are sampled, committed and verified like any other.
    assert max(t for r in rollouts for t in r.completion_tokens) >= 258
    for r in rollouts:
        assert len(r.commitment) == commitment.committed_size(len(r.completion_tokens) + 1)

    expect = Expectations(tasks=TASKS, round_seed=ROUND, sampling=sampling)
    verdicts = verify(rollouts, model, expect=expect, batch_size=8)
    assert [v.reason for v in verdicts] == ["ok"] * 8, [v.message for v in verdicts if not v.accepted]
    # And the check bites at this size: a record carrying another record's commitment (of the
    # same length: every completion here runs to the limit) fails at stage 4.
    assert {len(r.completion_tokens) for r in rollouts} == {6}
    forged = dataclasses.replace(rollouts[0], commitment=rollouts[1].commitment).signed(key)
    reasons = [v.reason for v in verify([forged, *rollouts[1:4]], model, expect=expect)]
    assert reasons == ["commitment_mismatch", "ok", "ok", "ok"]

    # One GRPO step. The random model answers no sum, so every reward is 0 and no group has a
    # gradient; the step is given rewards that differ (the ``rewards`` argument, what a private
    # task's proven correctness supplies) so the gradient flows through the tied head and GQA.
    parent = model.model_hash
    network = model.network.requires_grad_(True)
    config = StepConfig(learning_rate=1e-4, warmup_steps=1, grad_clip=1.0, temperature=sampling.temperature,
                        max_new_tokens=sampling.max_new_tokens)
    optimizer = optimizer_for(network, config)
    stats = grpo_step(network, optimizer, groups, [1.0, 1.0], config, 0, model.pad_token_id,
                      rewards=[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    network.requires_grad_(False)
    assert stats["groups_used"] == 2 and stats["groups_zero_variance"] == 0
    assert network.get_output_embeddings().weight is network.get_input_embeddings().weight  # still tied
    trained = Model(name=f"{NAME}@1", network=network, tokenizer=model.tokenizer, dtype_name="float32")
    assert trained.model_hash != parent
    del optimizer
    network.zero_grad(set_to_none=True)  # the gradients' 664 MB, before a second copy loads

    out = export(TrainedPolicy(trained, NAME, 1, tmp_path), tmp_path / "exported")
    assert json.loads((out / PROVENANCE_FILE).read_text())["model_hash"] == trained.model_hash.hex()
    # Stored tied: one copy of the 136M-entry embedding, not two.
    assert (out / "model.safetensors").stat().st_size < 1.2 * 4 * sum(p.numel() for p in network.parameters())
    exported = load_model(out)
    assert weights_hash(exported.network, "float32") == trained.model_hash
    assert exported.network.config.tie_word_embeddings and exported.network.config.num_key_value_heads == 2
    # The exported version's records verify under it; the parent's records bind another model.
    fresh = vrl.generate(exported, TASKS, key, round_seed=ROUND, sampling=sampling, groups=1, group_size=4)
    assert all(v.accepted for v in verify(fresh, exported, expect=expect))
    assert {v.reason for v in verify(rollouts[:4], exported, expect=expect)} == {"model_mismatch"}


@pytest.mark.parametrize("params", [
    SamplingParams(1.0, 0, 1.0, 64, (256,)), SamplingParams(0.7, 50, 0.9, 64, (256,)),
    SamplingParams(0.0, 0, 1.0, 64, (256,))], ids=["plain", "top-k-top-p", "greedy"])
def test_the_race_replay_in_blocks_is_the_replay_at_once(params, monkeypatch):
    """replay_sequences bounds its memory by replaying a large vocabulary's rows in blocks
    (proofs/sampler.py _REPLAY_BLOCK_ENTRIES): every margin and logprob stays bit-identical to
    one replay of all rows together, for sequences that straddle the blocks."""
    generator = torch.Generator().manual_seed(7)
    lengths = (12, 1, 17, 0, 5)
    logits = [torch.randn((n, 151936), generator=generator) * 3 for n in lengths]
    seeds = [bytes([i]) * 32 for i in range(len(lengths))]
    tokens = []
    for i, (z, n) in enumerate(zip(logits, lengths)):
        chosen, _ = sampler.sample(z, [seeds[i]] * n, list(range(n)), params) if n else (torch.zeros(0), None)
        chosen = chosen.to(torch.long)
        chosen[::4] = torch.randint(0, 151936, chosen[::4].shape, generator=generator)  # some lose their race
        tokens.append(chosen)
    sequences = [(z, t, seed, params) for z, t, seed in zip(logits, tokens, seeds)]
    whole = sampler.replay(torch.cat(logits), torch.cat(tokens), [s for s, n in zip(seeds, lengths) for _ in range(n)],
                           [p for n in lengths for p in range(n)], params, 0.05)
    monkeypatch.setattr(sampler, "_REPLAY_BLOCK_ENTRIES", 7 * 151936)  # blocks of 7 rows
    blocked = sampler.replay_sequences(sequences, 0.05)
    ends = np.cumsum(lengths)
    for replayed, end, n in zip(blocked, ends, lengths):
        assert np.array_equal(replayed.margins, whole.margins[end - n : end])
        assert np.array_equal(replayed.logprobs, whole.logprobs[end - n : end])
    assert (whole.margins > 0).any() and (whole.margins == 0).any()  # races both won and lost
