"""A tiny base model that can learn: supervised fine-tuning on the arithmetic format.

A random-init model never gets a reward, so GRPO has nothing to amplify. This trains the
``tiny`` preset for a short, fixed budget on ``prompt + answer + <eos>`` so that it knows the
format and some of the arithmetic, and stops well short of mastering it: GRPO then has room
to improve it (issue 3 asks for 20-50% held-out accuracy). ``scripts/build-base-model`` runs
it once and caches the result under the data directory; ``load_model("base")`` reads it.

Deterministic: the data come from the task generator's hashes, the init from the preset's
seeded weights, and the optimizer from ``seed``; on one machine with one thread count the
same config gives the same ``model_hash`` (recorded in ``vrl-base.json``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from vrl.rl.evaluate import accuracy, held_out
from vrl.rollouts.forward import right_padded
from vrl.rollouts.model import Model
from vrl.rollouts.presets import DEFAULT, META_FILE, BaseModelConfig, base_model_dir, build_preset
from vrl.tasks import Arithmetic, RewardSpec, Task, is_held_out

def _target(answer: str, draw: random.Random, noise: float) -> str:
    """The answer, or with probability ``noise`` a near miss (off by 1 or 2 either way)."""
    if draw.random() >= noise:
        return answer
    return str(int(answer) + draw.choice((-2, -1, 1, 2)))


def _batch(model: Model, tasks: list[Task], draw: random.Random,
           noise: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt + target + eos`` with labels only on the target and the eos."""
    eos = model.stop_token_ids[0]
    rows = []
    for task in tasks:
        prompt, answer = model.encode(task.prompt), model.encode(_target(task.answer, draw, noise)) + [eos]
        rows.append((prompt + answer, [-100] * len(prompt) + answer))
    input_ids, mask = right_padded([ids for ids, _ in rows], model.pad_token_id, model.device)
    labels, _ = right_padded([target for _, target in rows], -100, model.device)
    return input_ids, labels, mask


def _training_problems(tasks: Arithmetic, draw: random.Random, count: int, excludes_held_out: bool) -> list[Task]:
    """``count`` random problems; with ``excludes_held_out``, none of them held out, so the base
    model never sees the evaluation problems either (vrl.tasks.is_held_out)."""
    drawn: list[Task] = []
    while len(drawn) < count:
        task = tasks.task(draw.getrandbits(64))
        if not (excludes_held_out and is_held_out(task)):
            drawn.append(task)
    return drawn


def train_base_model(config: BaseModelConfig, on_step: Callable[[int, float], None] | None = None) -> Model:
    """Fine-tune the preset in memory; returns the trained model (float32)."""
    tasks = Arithmetic.parse(config.tasks)
    network, tokenizer = build_preset(config.preset)
    model = Model(name="base", network=network, tokenizer=tokenizer, dtype_name="float32")
    torch.manual_seed(config.seed)
    network.train()
    optimizer = torch.optim.AdamW(network.parameters(), lr=config.learning_rate, weight_decay=0.0)
    # Linear warmup, then cosine to zero: the nanoGPT schedule.
    # (The cosine is taken in float32, as the measured and cached builds were.)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        (step + 1) / config.warmup_steps,
        0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / config.steps)).item())))
    draw = random.Random(config.seed)
    for step in range(config.steps):
        problems = _training_problems(tasks, draw, config.batch_size, config.excludes_held_out)
        input_ids, labels, mask = _batch(model, problems, draw, config.label_noise)
        loss = network(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if on_step is not None:
            on_step(step, loss.item())
    network.eval()
    network.requires_grad_(False)
    return model  # its model_hash is computed on first use, after training


def build_base_model(
    config: BaseModelConfig = DEFAULT,
    out: Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> Path:
    """Train, measure held-out accuracy, and publish the directory atomically (rename)."""
    out = out or base_model_dir(config)
    started = time.perf_counter()
    model = train_base_model(config, on_step)
    seconds = time.perf_counter() - started
    evaluation = held_out(Arithmetic.parse(config.tasks), config.held_out)
    spec = RewardSpec()
    meta = {
        "config": asdict(config),
        "model_hash": model.model_hash.hex(),
        "train_seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "held_out_accuracy": accuracy(model, evaluation, spec, temperature=1.0),
        "held_out_accuracy_greedy": accuracy(model, evaluation, spec, temperature=0.0),
    }
    staging = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save(staging)
    (staging / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    return out


def ensure_base_model(config: BaseModelConfig = DEFAULT) -> Path:
    """The cached base model's directory, built first if it is not there yet."""
    path = base_model_dir(config)
    return path if path.is_dir() else build_base_model(config, path)
