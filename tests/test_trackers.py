"""``--report-to`` (issue 18, item 6): each step's metrics.jsonl record in TensorBoard's event
files and in a wandb offline run, read back with each library's own readers; a resumed run's
curves without a step twice; a tracker that fails mid-run leaves the run and its metrics.jsonl
whole, and says so; a tracker whose package is missing is one line naming the extra."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from typer.testing import CliRunner

from vrl.cli import app
from vrl.config import ConfigError
from vrl.rl.config import TrainConfig
from vrl.rl.trackers import TrackerError, report_to, scalars
from vrl.rl.train import Trainer

# The tiny preset on one-digit sums, a few rows a step: trackers see the records, not the learning.
SMALL = ["--model", "tiny", "--task", "arithmetic:digits=1", "--group-size", "2", "--groups-per-step", "2",
         "--max-new-tokens", "3"]


def small(**changes) -> TrainConfig:
    settings = dict(model="tiny", task="arithmetic:digits=1", steps=3, group_size=2, groups_per_step=2,
                    max_new_tokens=3, held_out=8, eval_every=2, checkpoint_every=2)
    return TrainConfig(**{**settings, **changes})


def curves_of_metrics(run: Path) -> dict[str, list[tuple[int, float]]]:
    """What a tracker should hold: each metrics.jsonl record's numbers, by name, in step order."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in scalars(record).items():
            curves.setdefault(key, []).append((record["step"], value))
    return curves


def tensorboard_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of RUN/tensorboard as TensorBoard reads them (purged events left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_records(run: Path) -> list:
    """The records of the one offline run in RUN/wandb, decoded with wandb's own protobuf
    definitions. The .wandb file is a LevelDB log (wandb's header ":W&B", magic and version in
    7 bytes; then 32 KiB blocks of chunks, each a 7-byte header: CRC32C, length (2 bytes,
    little-endian), type: 1 whole, 2 first, 3 middle, 4 last). wandb 0.31 has no Python reader."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for record in wandb_records(run):
        if record.HasField("history"):
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):  # wandb's own: _step, _runtime, _timestamp
                    curves.setdefault(key, []).append((record.history.step.num, json.loads(item.value_json)))
    return curves


def test_report_to_reads_as_trl_does():
    assert report_to(["wandb,tensorboard"]) == report_to(["wandb", "tensorboard", "wandb"]) == ("wandb", "tensorboard")
    assert report_to(["none"]) == () and report_to([]) == ()
    assert report_to(["all"]) == ("wandb", "tensorboard")  # both installed here (the test extra)
    with pytest.raises(TrackerError, match="none cannot be given with wandb"):
        report_to(["none", "wandb"])
    with pytest.raises(ConfigError, match=r"report_to\[0\]: expected one of 'wandb', 'tensorboard', got 'mlflow'"):
        TrainConfig(report_to=("mlflow",))
    saved = TrainConfig(report_to=("tensorboard",)).to_toml()
    assert TrainConfig.from_dict(tomllib.loads(saved)).report_to == ("tensorboard",)
    with pytest.raises(ConfigError, match="report_to"):  # a TOML list, as TRL's list
        TrainConfig.from_dict({"report_to": "wandb"})


def test_scalars_are_a_records_numbers():
    record = {"step": 3, "model_hash": "ab" * 32, "final": True, "reward_mean": 0.5, "rejected": 1,
              "rejected_reasons": {"reward_mismatch": 1}}
    assert scalars(record) == {"reward_mean": 0.5, "rejected": 1, "rejected_reasons/reward_mismatch": 1}


def test_vrl_train_reports_each_step_to_wandb_offline_and_tensorboard(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network: the run's files only
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", *SMALL, "--steps", "3", "--out", str(run),
                                      "--report-to", "wandb,tensorboard", "--json"])
    assert result.exit_code == 0, result.output
    assert not json.loads(result.stdout).get("trackers_failed")
    for line in result.stderr.splitlines():  # neither library printed a line of its own among the JSON
        json.loads(line)
    expected = curves_of_metrics(run)
    assert [step for step, _ in expected["reward_mean"]] == [0, 1, 2]
    assert [step for step, _ in expected["held_out_accuracy"]] == [0, 3]  # every 10 steps, and the final one
    assert wandb_curves(run) == expected  # JSON both: the same numbers exactly
    board = tensorboard_curves(run)
    assert sorted(board) == sorted(expected)
    for tag, points in expected.items():  # TensorBoard keeps float32
        assert [step for step, _ in board[tag]] == [step for step, _ in points], tag
        assert [value for _, value in board[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag
    (config,) = [r.run.config for r in wandb_records(run) if r.HasField("run")]
    settings = {item.key: json.loads(item.value_json) for item in config.update}
    assert settings["model"] == "tiny" and settings["report_to"] == ["wandb", "tensorboard"]


def test_a_resumed_run_has_each_step_once_in_tensorboard(tmp_path):
    """Killed after step 2, resumed from the checkpoint of step 2: metrics.jsonl drops the line
    of step 2 and redoes it, and TensorBoard hides the killed run's points from step 2 on."""
    run = tmp_path / "run"
    killed = Trainer(small(steps=4, report_to=("tensorboard",)), run)
    for _ in range(3):
        killed.step()
    killed.trackers.close()  # what the kill leaves: each step is flushed as it is written
    assert [step for step, _ in tensorboard_curves(run)["reward_mean"]] == [0, 1, 2]
    resumed = Trainer(small(steps=4, report_to=("tensorboard",)), run, resume=True)
    assert resumed.step_index == 2
    resumed.run()
    board, expected = tensorboard_curves(run), curves_of_metrics(run)
    assert [step for step, _ in expected["reward_mean"]] == [0, 1, 2, 3]
    assert {tag: [step for step, _ in points] for tag, points in board.items()} == {
        tag: [step for step, _ in points] for tag, points in expected.items()}


def test_a_tracker_that_fails_mid_run_is_said_and_the_run_goes_on(tmp_path, monkeypatch):
    """wandb's run ends under the trainer (as when its service dies): the next log raises. The
    run goes on, metrics.jsonl has every step, and the failure is a warning and in the summary."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    trainer = Trainer(small(steps=2, report_to=("wandb", "tensorboard")), tmp_path / "run")
    trainer.step()
    wandb_tracker = next(t for t in trainer.trackers.active if t.name == "wandb")
    wandb_tracker.run.finish()
    with capture_logs() as logs:
        trainer.run()
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [
        0, 1, 2]
    assert list(trainer.trackers.failures) == ["wandb"] and "step 1" in trainer.trackers.failures["wandb"]
    (warning,) = [entry for entry in logs if entry["log_level"] == "warning"]
    assert warning["tracker"] == "wandb" and "is finished" in warning["error"]
    assert [step for step, _ in tensorboard_curves(tmp_path / "run")["reward_mean"]] == [0, 1]  # the other went on


@pytest.mark.parametrize("name, module", [("wandb", "wandb"), ("tensorboard", "torch.utils.tensorboard")])
def test_a_tracker_not_installed_is_one_line_naming_the_extra(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a package that is not there
    result = CliRunner().invoke(app, ["train", *SMALL, "--steps", "1", "--out", str(tmp_path / "run"),
                                      "--report-to", name])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in said, said
    assert f"report_to {name} needs the {name} package: pip install 'vrl[{name}]'" in said
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_unknown_tracker_is_refused_naming_the_key(tmp_path):
    result = CliRunner().invoke(app, ["train", *SMALL, "--out", str(tmp_path / "run"), "--report-to", "mlflow"])
    assert result.exit_code == 2 and "report_to[0]: expected one of 'wandb', 'tensorboard', got 'mlflow'" in " ".join(
        result.output.split())


def test_a_tracker_that_cannot_start_stops_the_run_before_its_first_step(tmp_path):
    """wandb refuses its own settings (WANDB_MODE=bogus): one line, the tracker opened before it
    closed, no step run. A process of its own: wandb reads its environment once a process."""
    import os
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import sys; from vrl.cli import app; sys.argv[0] = 'vrl'; app()",
                           "train", *SMALL, "--steps", "1", "--out", str(tmp_path / "run"),
                           "--report-to", "tensorboard,wandb"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "WANDB_MODE": "bogus", "COLUMNS": "1000"})
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2 and "Traceback" not in said, said
    assert "report_to wandb: wandb could not start a run (ValidationError:" in said and "WANDB_MODE=offline" in said
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
