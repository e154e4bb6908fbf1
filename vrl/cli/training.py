"""Training and models: ``vrl train``, ``export`` and ``build-base-model``."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from vrl.cli.common import (
    COLUMNS_HELP,
    DEVICE_HELP,
    MODELS,
    TASK_HELP,
    RewardOption,
    app,
    configure_logging,
    fail,
    log,
    out,
    progress,
    task_set,
)
from vrl.errors import VrlError

if TYPE_CHECKING:  # typer vendors click, and exports its HelpFormatter nowhere public
    from typer._click import Context, HelpFormatter


class _TrainCommand(typer.core.TyperCommand):
    """``vrl train``, whose help shows each flag's default: the default of the config key the
    flag sets, defined once, in :class:`vrl.rl.config.TrainConfig` (or its ``[grpo]`` table).
    The flags' own defaults are None, so that a --config file's keys apply where no flag is
    given; their ranges are the config's too (a value out of range is refused naming the key).
    Read when the help is shown: every other command starts without importing the configs."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        from vrl.rl.config import TrainConfig

        defaults = TrainConfig()
        owners = {f.name: config for config in (defaults, defaults.grpo) for f in dataclasses.fields(config)}
        for param in self.params:
            # typer's own parameters have a help (click's base class has none); added once a process.
            if (isinstance(param, (typer.core.TyperOption, typer.core.TyperArgument)) and param.name in owners
                    and "[default:" not in (param.help or "")):
                value = getattr(owners[param.name], param.name)
                shown = (",".join(value) or "none") if isinstance(value, tuple) else value
                param.help = f"{param.help or ''}  [default: {shown}]".strip()
        super().format_help(ctx, formatter)


@app.command(cls=_TrainCommand)
def train(
    run_dir: Annotated[Path, typer.Option("--out", help="Run directory (metrics, checkpoints, rollouts, plot).")],
    config: Annotated[Path | None, typer.Option(help="TOML config (the keys of vrl.rl.config.TrainConfig): its "
                                                   "values replace the defaults below, and flags given here "
                                                   "override it.")] = None,
    model: Annotated[str | None, typer.Option(help=f"The model to start from: {MODELS}.")] = None,
    task: Annotated[str | None, typer.Option(help=TASK_HELP)] = None,
    columns: Annotated[str | None, typer.Option(help=COLUMNS_HELP)] = None,
    steps: Annotated[int | None, typer.Option(help="GRPO steps, each a policy version.")] = None,
    group_size: Annotated[int | None, typer.Option(help="Samples per task.")] = None,
    groups_per_step: Annotated[int | None, typer.Option()] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="0: chosen from the task set (8 for arithmetic, the "
                                                          "reference solutions' length), and recorded in "
                                                          "RUN/config.toml.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    learning_rate: Annotated[float | None, typer.Option("--lr")] = None,
    verify_fraction: Annotated[float | None, typer.Option(help="Share of groups verified (1 = all).")] = None,
    advantage: Annotated[str | None, typer.Option(help="std (GRPO) or mean (Dr. GRPO).")] = None,
    aggregation: Annotated[str | None, typer.Option(help="token (DAPO), sequence (GRPO), constant (Dr. GRPO).")] = None,
    kl_beta: Annotated[float | None, typer.Option(help="Weight of the KL penalty.")] = None,
    iterations: Annotated[int | None, typer.Option(help="Optimizer steps per batch (GRPO's mu).")] = None,
    reward: RewardOption = None,
    device: Annotated[str | None, typer.Option(help=DEVICE_HELP)] = None,
    report_to: Annotated[list[str] | None, typer.Option(metavar="<name,...>", help=(
        "Where each step's metrics go besides RUN/metrics.jsonl, as TRL's report_to: wandb, tensorboard, all "
        "(those installed) or none; repeat it or separate with commas. wandb reads its own environment "
        "(WANDB_MODE=offline: files only)."))] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its newest checkpoint.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="JSON logs and a JSON summary; no progress bar.")] = False,
) -> None:
    """GRPO on verified rollouts: generate, verify, update, publish a policy version; repeat."""
    configure_logging(json_output, logging.INFO)  # --json: a JSON line per step on stderr, as promised
    from vrl.rl.config import TrainConfig
    from vrl.rl.plots import plot_run
    from vrl.rl.trackers import report_to as trackers_named
    from vrl.rl.train import Trainer

    try:
        trackers = None if report_to is None else trackers_named(report_to)
    except VrlError as error:
        raise fail(str(error)) from None
    flags = {"model": model, "task": task, "columns": columns, "steps": steps, "group_size": group_size,
             "groups_per_step": groups_per_step, "max_new_tokens": max_new_tokens, "temperature": temperature,
             "learning_rate": learning_rate, "verify_fraction": verify_fraction, "device": device,
             "report_to": trackers, "reward": tuple(reward) if reward else None,
             "grpo": {"advantage": advantage, "aggregation": aggregation, "kl_beta": kl_beta,
                      "iterations": iterations}}
    saved = run_dir / "config.toml"
    try:
        if config is not None:
            settings = TrainConfig.from_toml(config, **flags)
        elif resume and saved.exists():
            settings = TrainConfig.from_saved(saved, **flags)
        else:
            settings = TrainConfig.from_dict({}, **flags)
        # The task set opened as generate opens it: a skipped line is the same warning in both.
        trainer = Trainer(settings, run_dir, resume=resume, log=log.info, fall_back=True,  # past damaged ones, logged
                          tasks=task_set(settings.task, settings.columns))
    except VrlError as error:  # a config, model, task set, checkpoint, run directory or tracker, named
        raise fail(str(error)) from None
    log.info("training", model=settings.model, task=settings.task, steps=settings.steps, start=trainer.step_index,
             node_id=trainer.key.node_id.hex()[:16])
    with progress(json_output) as bar:
        steps_bar = bar.add_task("GRPO steps", total=settings.steps, completed=trainer.step_index)
        unlearnable: list[int] = []  # steps no group could be learned from, said once

        def report(record: dict[str, Any]) -> None:
            if record["groups_used"] == 0 and record["groups_zero_variance"] and not unlearnable:
                unlearnable.append(record["step"])
                # GRPO learns from differences within a group (specs/training.md §4; DAPO §3.2):
                # a group whose samples all score alike has no advantage, hence no gradient.
                log.warning("no group could be learned from: within every group the samples scored alike "
                            f"(mean reward {record['reward_mean']:g}), so the step changed nothing; a longer "
                            "--max-new-tokens, a higher --temperature or an easier task set gives groups "
                            "that differ", step=record["step"], max_new_tokens=trainer.config.max_new_tokens,
                            truncated_fraction=record.get("truncated_fraction"))
            accuracy = record.get("held_out_accuracy")
            bar.update(steps_bar, advance=1, description=(
                f"GRPO step {record['step'] + 1}: reward {record['reward_mean']:.2f}"
                + (f", held-out {accuracy:.0%}" if accuracy is not None else "")
                + (f", [red]{record['rejected']} rejected[/]" if record["rejected"] else "")))
            if json_output:
                log.info("step", **{k: v for k, v in record.items() if not k.startswith("seconds")})

        final = trainer.run(report)
    png = plot_run(trainer.metrics_path, run_dir / "curves.png", title=f"{settings.model} on {settings.task}")
    summary = {"run": str(run_dir), "steps": final["step"], "model_hash": final["model_hash"],
               "held_out_accuracy": final["held_out_accuracy"], "plot": str(png),
               **({"trackers_failed": trainer.trackers.failures} if trainer.trackers.failures else {})}
    for name, what in trainer.trackers.failures.items():  # said when it happened; again, where it is read
        log.warning("a tracker stopped during the run; metrics.jsonl has every step", tracker=name, error=what)
    if json_output:
        out.print_json(data=summary)
    else:
        out.print(f"{final['step']} steps; held-out accuracy {final['held_out_accuracy']:.1%}; "
                  f"policy {final['model_hash'][:16]}; curves in {png}", highlight=False)


@app.command()
def export(
    policy: Annotated[str, typer.Argument(help="A run directory (its newest checkpoint), a checkpoint directory, "
                                               "a node or devnet folder (the newest policy it holds), or a "
                                               "policy's model hash (8+ hex digits) with --from.",
                                          show_default=False)],
    out_dir: Annotated[Path, typer.Option("--out", help="The Hugging Face directory to write (must not exist).")],
    source: Annotated[Path | None, typer.Option("--from", help="Where a model hash is looked up: a run, a "
                                                                   "node folder or a devnet folder.")] = None,
    base: Annotated[str | None, typer.Option(help="The model a checkpoint outside its run was trained from "
                                                     "(default: the run's config.toml).")] = None,
    dtype: Annotated[str, typer.Option(help="How the weights are stored: float32 keeps the version's model "
                                            "hash; bfloat16 or float16 halve the size.")] = "float32",
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write a trained policy as a standard Hugging Face directory (model and tokenizer,
    safetensors) that transformers, vLLM and TRL load as is."""
    configure_logging(json_output)
    from vrl.audit.sources import STORE_FILE, announced_policy
    from vrl.rl.export import PROVENANCE_FILE, ExportError, is_checkpoint, is_run, open_checkpoint, open_version
    from vrl.rl.export import export as write

    try:
        if Path(policy).is_dir() and (is_run(Path(policy)) or is_checkpoint(Path(policy))):
            trained = open_checkpoint(Path(policy), base=base)
        elif Path(policy).is_dir():  # a node or a devnet folder: the newest policy it holds
            if not any(Path(policy).glob(f"{STORE_FILE}")) and not any(Path(policy).glob(f"node-*/{STORE_FILE}")):
                raise ExportError(f"{policy}: neither a run directory (config.toml and checkpoints/), a checkpoint "
                                  f"(MANIFEST.json), a node folder ({STORE_FILE}) nor a devnet folder "
                                  f"(node-*/{STORE_FILE})")
            trained = announced_policy(None, Path(policy))
        elif source is None:
            raise ExportError(f"{policy}: not a directory; to name a policy by its model hash, say where it is "
                              "(--from a run, a node folder or a devnet folder)")
        elif is_run(source):
            trained = open_version(policy, source)
        else:
            trained = announced_policy(policy, source)
        target = write(trained, out_dir, dtype=dtype)
    except ExportError as error:
        raise fail(str(error)) from None
    facts = {**trained.provenance(), "out": str(target), "stored_dtype": dtype}
    if json_output:
        out.print_json(data=facts)
        return
    out.print(f"exported policy version {trained.version} of {trained.base} (model {facts['model_hash'][:16]}) "
              f"to {target}", highlight=False, soft_wrap=True)
    out.print(f"transformers loads it as is: AutoModelForCausalLM.from_pretrained({str(target)!r}); where it came "
              f"from is in {PROVENANCE_FILE}", highlight=False, soft_wrap=True)


@app.command("build-base-model")
def build_base_model_command(
    steps: Annotated[int | None, typer.Option(min=1, help="SFT steps (default: the measured default).")] = None,
    model: Annotated[str, typer.Option(help="Which built model: base (the tiny preset) or base-micro (the micro "
                                            "preset, whose tokens zk proofs can cover).")] = "base",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Directory (default: the data directory).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if it is cached.")] = False,
) -> None:
    """Supervised fine-tuning of a preset on the arithmetic format (cached; about 3 minutes for base)."""
    configure_logging(False)
    from vrl.rl.base_model import build_base_model, is_pinned_build
    from vrl.rollouts.presets import BUILT, base_model_dir, read_meta

    if model not in BUILT:
        raise fail(f"--model {model}: choose one of {', '.join(BUILT)}")
    config = dataclasses.replace(BUILT[model], steps=steps) if steps else BUILT[model]
    target = out_dir or base_model_dir(config)
    if is_pinned_build(target) and not force:  # one built before the pins is built again
        meta = read_meta(target)
        out.print(f"{model} model already built: {target} (held-out accuracy {meta['held_out_accuracy']:.1%})",
                  highlight=False)
        return
    with progress(False) as bar:
        sft = bar.add_task("supervised fine-tuning", total=config.steps)
        path = build_base_model(config, target, on_step=lambda step, loss: bar.update(
            sft, advance=1, description=f"supervised fine-tuning, loss {loss:.3f}"))
    meta = read_meta(path)
    out.print(f"built {path} in {meta['train_seconds']:.0f} s: held-out accuracy {meta['held_out_accuracy']:.1%} "
              f"sampled, {meta['held_out_accuracy_greedy']:.1%} greedy; model {meta['model_hash'][:16]}",
              highlight=False)
