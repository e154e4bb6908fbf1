"""Where a run's step metrics go besides ``metrics.jsonl``: Weights & Biases and TensorBoard,
named as TRL names them (``report_to``). Each is an optional extra: ``pip install 'vrl[wandb]'``,
``pip install 'vrl[tensorboard]'``.

``metrics.jsonl`` is the run's record and stays so: :class:`vrl.rl.train.Trainer` writes and
fsyncs a step's line first, then hands the same dict to :meth:`Trackers.log`, which takes only
its numbers (:func:`scalars`) and never writes to the run's record. What happens when a tracker
fails:

* at the start (its package not installed, ``wandb.init`` refused: no API key, an unknown
  entity): :class:`TrackerError`, one line, before the first step; the user asked for it, and
  nothing is lost by stopping there;
* during the run (a full disk, a lost connection, a bug of the library's): the run goes on
  without it, since its metrics are whole in ``metrics.jsonl``; a warning names the tracker, the
  step and the error when it happens, and :attr:`Trackers.failures` keeps them for the run's
  summary (``vrl train`` repeats them at the end), so it never fails unnoticed.

This module imports neither torch nor a tracker's package until a tracker is opened: the names
are a config's vocabulary (:class:`vrl.rl.config.TrainConfig` ``report_to``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from vrl.errors import VrlError

#: The trackers ``report_to`` may name, as TRL names them.
TRACKERS = ("wandb", "tensorboard")


class TrackerError(VrlError, RuntimeError):
    """A tracker the run asked for that cannot start: one line, saying what to do."""


def report_to(values: Iterable[str]) -> tuple[str, ...]:
    """A ``--report-to``: tracker names, repeated or comma-separated; ``all`` is every tracker
    whose package is installed and ``none`` (alone) none, as TRL reads them (transformers'
    TrainingArguments). Unknown names are left in, for the config to refuse naming its key."""
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    if "none" in names:
        if len(names) > 1:
            raise TrackerError(f"--report-to none cannot be given with {', '.join(n for n in names if n != 'none')}")
        return ()
    if "all" in names:
        names = [name for name in TRACKERS if importlib.util.find_spec(name) is not None] + names
    return tuple(dict.fromkeys(name for name in names if name != "all"))


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` record, which a tracker plots: a nested table's
    entries as ``table/key`` (``rejected_reasons/reward_mismatch``), strings (the model hash),
    flags (``final``) and the step itself (the x-axis) left out."""
    flat: dict[str, float] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update({f"{key}/{k}": v for k, v in scalars(value).items()})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            flat[key] = value
    return flat


class Tracker(Protocol):
    name: str
    where: str  # its files or URL, for the user

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _one_line(error: BaseException) -> str:
    return " ".join(f"{type(error).__name__}: {error}".split())  # a library's message may span lines


def _missing(name: str) -> TrackerError:
    return TrackerError(f"report_to {name} needs the {name} package: pip install 'vrl[{name}]'")


class TensorBoard:
    """Event files in ``RUN/tensorboard`` (``tensorboard --logdir RUN``), through torch's
    SummaryWriter, which needs the tensorboard package."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, config_toml: str, start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises it when tensorboard is not installed
            raise _missing(self.name) from None
        # A resumed run redoes the steps after its checkpoint, as metrics.jsonl does: purge_step
        # hides the events a killed run wrote from there on, so no step has two points.
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step)
        self.where = self.writer.log_dir
        self.writer.add_text("config.toml", "\n".join("    " + line for line in config_toml.splitlines()), start_step)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # on disk each step, as metrics.jsonl is: a killed run's curves agree

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """A Weights & Biases run, its files in ``RUN/wandb``. wandb's own environment applies:
    ``WANDB_MODE=offline`` writes it there only (``wandb sync`` uploads it later),
    ``WANDB_PROJECT`` (else ``vrl``), ``WANDB_RUN_ID`` with ``WANDB_RESUME`` to continue one."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing(self.name) from None
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "vrl"), name=run_dir.resolve().name, dir=str(run_dir),
                config=config,
                # Its own lines off (vrl logs where the run is), and stdout and stderr left alone:
                # wandb's console capture would wrap the progress bar and the JSON log lines.
                settings=wandb.Settings(silent=True, console="off"))
        except Exception as error:  # noqa: BLE001  (its errors have no common base: UsageError, CommError, ...)
            raise TrackerError(f"report_to wandb: wandb could not start a run ({_one_line(error)}); "
                               "WANDB_MODE=offline writes it in the run directory only") from None
        # Offline, its files (a run directory for `wandb sync`); online, the run's page.
        self.where = str(Path(self.run.dir).parent) if self.run.offline else (self.run.url or self.run.dir)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers a run reports to; :meth:`log` takes a ``metrics.jsonl`` record after it is
    written. A tracker that raises is warned about (``warn``) and left out from then on."""

    def __init__(self, names: Iterable[str], run_dir: Path, config: dict[str, Any], config_toml: str, start_step: int,
                 warn: Callable[..., None]) -> None:
        self.warn = warn
        self.active: list[Tracker] = []
        self.failures: dict[str, str] = {}  # tracker name: what failed, for the run's summary
        openers: dict[str, Callable[[], Tracker]] = {
            "tensorboard": lambda: TensorBoard(run_dir, config_toml, start_step),
            "wandb": lambda: Wandb(run_dir, config)}
        try:
            for name in dict.fromkeys(names):
                self.active.append(openers[name]())
        except BaseException:
            self.close()  # the ones opened already
            raise

    def log(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        for tracker in list(self.active):
            try:
                tracker.log(record["step"], values)
            except Exception as error:  # noqa: BLE001  (any failure of a library's: the run goes on, said)
                self._failed(tracker, f"step {record['step']}: {_one_line(error)}")

    def close(self) -> None:
        for tracker in list(self.active):
            try:
                tracker.close()
            except Exception as error:  # noqa: BLE001
                self._failed(tracker, f"closing: {_one_line(error)}")
        self.active = []

    def _failed(self, tracker: Tracker, what: str) -> None:
        self.active.remove(tracker)
        self.failures[tracker.name] = what
        self.warn("tracker failed; the run goes on without it (metrics.jsonl, a node's store, has every step)",
                  tracker=tracker.name, error=what)
