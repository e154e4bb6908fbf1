"""A tiny base model that can learn: supervised fine-tuning on the arithmetic format.

A random-init model never gets a reward, so GRPO has nothing to amplify. This trains the
``tiny`` preset for a short, fixed budget on ``prompt + answer + <eos>`` so that it knows the
format and some of the arithmetic, and stops well short of mastering it: GRPO then has room
to improve it (issue 3 asks for 20-50% held-out accuracy). ``scripts/build-base-model`` runs
it once and caches the result under the data directory; ``load_model("base")`` reads it.

Bit-reproducible on every x86-64 machine with AVX2 and this torch (issue 15 §3). Every node
builds ``base`` itself, so two machines must get the same ``model_hash``. What decides the
bits, measured on this machine kind (AMD EPYC, 2 cores, AVX-512, torch 2.13.0+cpu with MKL
2024.2) by building the recipe under each setting and comparing hashes:

* **The CPU's vector instruction set: this was the cause.** ATen dispatches its vectorized
  kernels (softmax, norms, activations, reductions, Adam's update) by the best ISA the CPU
  has, and each width sums in another order. The whole 1000-step recipe built with 1 thread
  gives ``e2cfc16b…`` under AVX-512 (the default here), ``76b580a8…`` under
  ``ATEN_CPU_CAPABILITY=avx2`` and ``f78f3c50…`` under ``default``: the first two are two of
  the three hashes issue 15 reported from three machines of one kind (``76b580a8…`` the one
  with 21.7% held-out accuracy), so those machines differed in AVX-512, not in anything else.
  Already after 30 steps the hashes differ (``8c07973b…`` against ``8a40e3c5…``).
* **Not the thread count**: 1, 2, 3 and 4 threads gave the same hash after 100 steps
  (``dbe816f2…``), and 1 and 2 threads the same after 1000 (``e2cfc16b…``, the cached
  2-thread build's). **Not the hash seed** (``PYTHONHASHSEED`` 0 and 123: same hash; the
  data come from ``random.Random(seed)`` and the task generator's hashes, in a fixed order).
  **Not** ``torch.use_deterministic_algorithms`` (same hash on or off), **not oneDNN**
  (``ONEDNN_MAX_CPU_ISA=AVX2``: same hash; float32 training calls MKL's SGEMM, not oneDNN),
  and **not the preset's initial weights**, which are the same under AVX-512 and AVX2 (tiny:
  ``407539d6…``; only ATen's scalar ``default`` kernels draw other normals, ``bb7329f4…``).
* **MKL**: on this AMD CPU ``MKL_CBWR`` set to ``AVX2``, ``AVX512`` or ``SSE4_2`` gives the
  same hash as unset (MKL_VERBOSE shows it falls back to ``CNR:AUTO`` on a non-Intel CPU);
  only ``COMPATIBLE`` (SSE2) changes it, at 2.0-2.4x the time (100 steps: 41-49 s against
  20 s). On an Intel CPU, MKL's automatic dispatch would pick its AVX-512 SGEMM.

So :func:`build_base_model` trains in a child process whose environment pins the ISA
(:data:`PINNED_ENV`: ATen's kernels at AVX2, which every x86-64 CPU since 2013 has and AVX-512
machines run at the same speed here, 212 s against 244 s for the whole recipe; MKL's CNR branch
at AVX2, which makes Intel CPUs agree with each other), one thread, deterministic algorithms and
a fixed hash seed, whatever the caller's process has already set: ATen reads
``ATEN_CPU_CAPABILITY`` once, at its first kernel, so it cannot be changed inside a running
process. What stays open, and why: a CPU without AVX2 (ATen falls back to ``default``, another
hash); an ARM CPU (other kernels and no MKL); another torch or transformers (other kernels,
other attention code); and **Intel against AMD: they differ**. On an Intel Xeon of this kind
(AVX-512, 2 cores) the 20-step vector recipe gives ``b705ef27…`` at 1 thread and ``276a8931…``
at 2 under ``MKL_CBWR=AVX2``, where AMD gave ``fa38c0c7…`` at either: MKL honours its AVX2
branch on Intel, whose sums depend on the thread count. ``AVX2,STRICT`` (MKL's strict CNR mode,
documented as independent of the thread count) gives ``0a615459…`` at 1 and 2 threads, and
``COMPATIBLE`` ``b3ec8f79…`` at both; none gives AMD's. So the pin is ``AVX2,STRICT``, and the
vector keeps one entry per vendor, each with the pins it was measured under (an entry made
under other pins is stale, and its test says so). A base model is therefore per vendor: a
network of both builds two, which is harmless where the trainer publishes its weights (workers
fetch them by content hash) and wrong only where every node builds ``base`` itself. The
build's ``vrl-base.json`` records the platform it ran on, and ``specs/vectors/base_model.json``
the hashes (``tests/test_base_model.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from vrl.rl.evaluate import accuracy, held_out
from vrl.rollouts.forward import right_padded
from vrl.rollouts.model import Model
from vrl.rollouts.presets import DEFAULT, META_FILE, BaseModelConfig, base_model_dir, build_preset, read_meta
from vrl.tasks import Arithmetic, RewardSpec, Task, is_held_out

# -- what decides the bits (the module docstring has the measurements) ------------------------------

#: The build child's environment, over the caller's. ATen's vector kernels at AVX2 (read once per
#: process, at the first kernel); MKL's and oneDNN's at AVX2 too (MKL honours its CNR branch on
#: Intel CPUs); one thread; a fixed hash seed.
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
}
#: What torch.backends.cpu.get_cpu_capability() says in the child when the pin took.
PINNED_CAPABILITY = "AVX2"
# One thread. The count did not change the bits (1 to 4 threads, above), but MKL documents its
# results as reproducible only for a fixed count, and on this shared 2-core machine 2 threads
# were 18x slower than 1 when another job held a core (100 steps: 355 s against 20 s; OpenMP
# threads wait for each other), while on an idle machine 2 threads gain about 1.5x (30 steps:
# 4.5 s against 7.1 s).
BUILD_THREADS = 1

#: A small budget of the recipe, for the test against specs/vectors/base_model.json: AVX-512
#: and AVX2 already give different hashes after 20 steps, and it builds in seconds.
VECTOR_RECIPE = replace(DEFAULT, steps=20, batch_size=32, warmup_steps=5, held_out=16)
_STEP_TAG = "vrl-step"  # the child's progress lines on its stdout
VECTOR_FILE = Path(__file__).resolve().parents[2] / "specs" / "vectors" / "base_model.json"


def cpu_vendor() -> str:
    """The CPU's vendor as the kernel names it (``GenuineIntel``, ``AuthenticAMD``), or ``""``
    where /proc/cpuinfo says nothing: MKL takes another code path on each vendor, so the bits
    of a build are a function of it (the module docstring)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "vendor_id":
                return value.strip()
    return ""


def platform() -> dict[str, Any]:
    """What the bits of a build depend on, for ``vrl-base.json`` and the vector."""
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_vendor": cpu_vendor(),
            "threads": torch.get_num_threads(), "pinned": PINNED_ENV}


@contextlib.contextmanager
def _pinned_torch(threads: int) -> Iterator[None]:
    """Thread count and deterministic algorithms for the duration, restored afterwards."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


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


def train_base_model(config: BaseModelConfig, on_step: Callable[[int, float], None] | None = None,
                     threads: int = BUILD_THREADS) -> Model:
    """Fine-tune the preset in memory, on ``threads`` threads with deterministic algorithms
    (both restored afterwards); returns the trained model (float32). Its bits depend on this
    process's CPU capability: :func:`build_base_model` pins that too."""
    tasks = Arithmetic.parse(config.tasks)
    with _pinned_torch(threads):
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
        model.model_hash  # noqa: B018 (hashed here, under the pinned threads)
    return model


def _build_here(config: BaseModelConfig, directory: Path, threads: int,
                on_step: Callable[[int, float], None] | None = None) -> None:
    """Train, measure held-out accuracy, and write the model and its ``vrl-base.json`` into
    ``directory``: the build child's work, in the pinned environment."""
    started = time.perf_counter()
    model = train_base_model(config, on_step, threads)
    seconds = time.perf_counter() - started
    evaluation = held_out(Arithmetic.parse(config.tasks), config.held_out)
    spec = RewardSpec()
    with _pinned_torch(threads):
        meta = {
            "config": asdict(config),
            "model_hash": model.model_hash.hex(),
            "train_seconds": round(seconds, 1),
            "threads": threads,
            "platform": platform(),
            "held_out_accuracy": accuracy(model, evaluation, spec, temperature=1.0),
            "held_out_accuracy_greedy": accuracy(model, evaluation, spec, temperature=0.0),
        }
    model.save(directory)
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def pinned_env(threads: int = BUILD_THREADS) -> dict[str, str]:
    """The caller's environment with :data:`PINNED_ENV` over it, and this ``vrl`` importable."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **PINNED_ENV, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": path}


def build_base_model(
    config: BaseModelConfig = DEFAULT,
    out: Path | None = None,
    on_step: Callable[[int, float], None] | None = None,
    threads: int = BUILD_THREADS,
) -> Path:
    """Train in a child process with the pinned environment (:data:`PINNED_ENV`), measure
    held-out accuracy, and publish the directory atomically (rename). ``on_step(step, loss)``
    follows the child's progress. Raises ``RuntimeError`` with the child's last words if it fails."""
    out = out or base_model_dir(config)
    staging = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    command = [sys.executable, "-m", "vrl.rl.base_model", "--child", json.dumps(asdict(config)), str(staging),
               str(threads)]
    with tempfile.TemporaryFile("w+") as errors:
        with subprocess.Popen(command, env=pinned_env(threads), stdout=subprocess.PIPE, stderr=errors,
                              text=True) as child:
            assert child.stdout is not None
            for line in child.stdout:  # one "vrl-step STEP LOSS" line per step; anything else is not ours
                tag, _, rest = line.partition(" ")
                if tag == _STEP_TAG and on_step is not None:
                    step, loss = rest.split()
                    on_step(int(step), float(loss))
        if child.returncode != 0:
            errors.seek(0)
            shutil.rmtree(staging, ignore_errors=True)
            raise RuntimeError(f"building the base model failed (exit {child.returncode}): "
                               f"{errors.read()[-2000:].strip()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging, out)
    return out


def is_pinned_build(path: Path) -> bool:
    """Whether ``path`` holds a build made under today's pins (its ``vrl-base.json`` records
    them). One made without them has the bits of the machine it ran on, not those every other
    machine builds, so it is rebuilt rather than used."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return bool(read_meta(path).get("platform", {}).get("pinned") == PINNED_ENV)
    return False


def ensure_base_model(config: BaseModelConfig = DEFAULT) -> Path:
    """The cached base model's directory, built first if it is not there yet or not a pinned
    build (:func:`is_pinned_build`)."""
    path = base_model_dir(config)
    return path if is_pinned_build(path) else build_base_model(config, path)


def vector() -> dict[str, Any]:
    """specs/vectors/base_model.json with this machine's vendor's entry made anew: :data:`VECTOR_RECIPE`
    built as :func:`build_base_model` builds it (the full recipe's hash is added by hand, with its time)."""
    with tempfile.TemporaryDirectory() as tmp:
        meta = read_meta(build_base_model(VECTOR_RECIPE, Path(tmp) / "base"))
    document: dict[str, Any] = json.loads(VECTOR_FILE.read_text())
    document["recipe"] = meta["config"]
    document["builds"][meta["platform"]["cpu_vendor"]] = {"model_hash": meta["model_hash"],
                                                          "platform": meta["platform"]}
    return document


def _child(argv: list[str]) -> None:
    config, directory, threads = BaseModelConfig(**json.loads(argv[0])), Path(argv[1]), int(argv[2])
    _build_here(config, directory, threads, on_step=lambda step, loss: print(_STEP_TAG, step, repr(loss), flush=True))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    elif sys.argv[1:] == ["--vector"]:
        VECTOR_FILE.write_text(json.dumps(vector(), indent=1) + "\n")
    else:
        sys.exit("usage: python -m vrl.rl.base_model --vector  (rewrites this CPU vendor's entry of "
                 "specs/vectors/base_model.json; the build itself: vrl build-base-model)")
