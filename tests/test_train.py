"""The RL loop end to end on a quickly built base model: it learns, resumes exactly, refuses
corrupt checkpoints, drops groups that fail verification, and plots its curves."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from support import QUICK
from typer.testing import CliRunner

import vrl
from proofs.sampler import SamplingParams
from vrl.cli import app
from vrl.node.work import tampered
from vrl.rl import checkpoint
from vrl.rl.base_model import build_base_model
from vrl.rl.checkpoint import CheckpointError
from vrl.rl.evaluate import held_out
from vrl.rl.grpo import GRPOConfig
from vrl.rl.plots import plot_run
from vrl.rl.train import RunError, TrainConfig, Trainer
from vrl.rollouts.forward import decode
from vrl.rollouts.presets import read_meta


@pytest.fixture(scope="module")
def base(quick_base):
    return quick_base


def config(base, **changes) -> TrainConfig:
    settings = TrainConfig(model=str(base), task=QUICK.tasks, steps=4, group_size=4, groups_per_step=4,
                           max_new_tokens=4, learning_rate=1e-3, held_out=32, eval_every=2, checkpoint_every=2)
    return dataclasses.replace(settings, **changes)


def test_base_build_is_deterministic_and_learned_the_format(base, tmp_path):
    meta = read_meta(base)
    again = build_base_model(QUICK, tmp_path / "again")
    assert read_meta(again)["model_hash"] == meta["model_hash"]
    # The format, on sums it never saw (one-digit sums have only 5 held-out ones, too few to
    # assert an accuracy): a number, then the stop token. Random init writes neither.
    model = vrl.load_model(str(base))
    tasks = held_out(vrl.Arithmetic.parse(QUICK.tasks), 64)
    results = decode(model, [model.encode(t.prompt) for t in tasks], [bytes(32)] * len(tasks),
                     SamplingParams(0.0, 0, 1.0, 4, model.stop_token_ids))
    assert [(r.finish_reason, model.decode(r.tokens[:-1]).isdigit()) for r in results] == [("stop", True)] * len(tasks)


def test_resumed_run_equals_uninterrupted_run(base, tmp_path):
    key = vrl.NodeKey.from_seed(bytes(32))  # the same node, so the same assignments and seeds
    straight = Trainer(config(base), tmp_path / "straight", key=key)
    straight.run()
    interrupted = Trainer(config(base, steps=2), tmp_path / "killed", key=key)
    interrupted.run()
    # A crash after the checkpoint of step 2 left a metrics line for a step it never saved.
    with (tmp_path / "killed" / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 2, "partial": True}) + "\n" + '{"step": 3, "reward_m')
    resumed = Trainer(config(base), tmp_path / "killed", resume=True)
    assert resumed.step_index == 2
    resumed.run()
    assert resumed.policy().model_hash == straight.policy().model_hash
    steps = [r["step"] for r in map(json.loads, (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines())]
    assert steps == [0, 1, 2, 3, 4]  # no duplicate, no partial line; 4 is the final evaluation
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["groups_used"] for r in records[:-1]), "no step had an informative group to learn from"
    for before, after in zip(records, records[1:]):  # an update publishes a new policy, no update keeps it
        assert (before["model_hash"] != after["model_hash"]) == (before["groups_used"] > 0)
    for key in ("reward_mean", "held_out_accuracy", "kl", "clip_fraction", "completion_length_mean",
                "rejected", "rejected_reasons", "seconds_verify"):
        assert key in records[0], key
    png = plot_run(tmp_path / "straight" / "metrics.jsonl", tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_makes_no_tensor_off_the_policys_device(base, tmp_path):
    """A run with a KL reference, mu = 2, checkpoints and a resume, under ``meta`` as the
    default device (see tests/test_device.py), ends at the same weights as on the CPU."""
    key = vrl.NodeKey.from_seed(bytes(32))
    settings = config(base, steps=3, grpo=GRPOConfig(kl_beta=0.05, iterations=2))
    expected = Trainer(settings, tmp_path / "cpu", key=key).run()
    first = Trainer(dataclasses.replace(settings, steps=2), tmp_path / "meta", key=key)
    with torch.device("meta"):  # loading happens outside: transformers refuses to load under meta
        first.run()
    resumed = Trainer(settings, tmp_path / "meta", resume=True)
    with torch.device("meta"):
        final = resumed.run()
    assert final["model_hash"] == expected["model_hash"]
    assert final["held_out_accuracy"] == expected["held_out_accuracy"]


def test_a_new_run_never_overwrites_an_old_one(base, tmp_path):
    Trainer(config(base, steps=1), tmp_path / "run").run()
    with pytest.raises(RunError, match="already holds a run"):
        Trainer(config(base, steps=1), tmp_path / "run")


def test_a_task_file_without_held_out_problems_is_refused_before_training(tmp_path):
    from vrl.tasks import Task, is_held_out

    sums = [(a, b) for a in range(10) for b in range(10) if not is_held_out(Task("t", f"{a}+{b}=", ""))][:20]
    tasks = tmp_path / "train-only.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"s{a}-{b}", "prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                             for a, b in sums))
    with pytest.raises(ValueError, match="no held-out problem"):
        Trainer(TrainConfig(model="tiny", task=str(tasks)), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_corrupt_checkpoint_refused_and_nothing_loaded(base, tmp_path):
    trainer = Trainer(config(base, steps=2), tmp_path / "run")
    trainer.run()
    saved = checkpoint.latest(tmp_path / "run" / "checkpoints")
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x40
    weights.write_bytes(bytes(data))
    fresh = vrl.load_model(base)
    before = {k: v.clone() for k, v in fresh.network.state_dict().items()}
    optimizer = torch.optim.AdamW(fresh.network.parameters())
    with pytest.raises(CheckpointError, match="model.safetensors.*corrupt"):
        checkpoint.load(saved, fresh.network, optimizer)
    assert all(torch.equal(before[k], v) for k, v in fresh.network.state_dict().items())
    assert not optimizer.state
    (saved / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="missing MANIFEST.json"):
        Trainer(config(base, steps=3), tmp_path / "run", resume=True)


def test_cli_resume_falls_back_past_a_damaged_checkpoint_and_removes_stale_partials(base, tmp_path):
    """A damaged newest checkpoint and a killed writer's staging directory: `vrl train --resume`
    says which checkpoint it skipped and why, resumes from the one before, and removes the
    staging directory, saying so."""
    run = tmp_path / "run"
    settings = config(base, steps=2, checkpoint_every=1, held_out=8)
    Trainer(settings, run).run()  # checkpoints at steps 1 and 2
    (run / "checkpoints" / "step-00000002" / "MANIFEST.json").write_text('{"step": 2, "files": []}')
    with pytest.raises(CheckpointError, match="step-00000002"):  # the library's default: no fall-back
        Trainer(settings, run, resume=True)
    stale = run / "checkpoints" / ".step-00000003.partial-999999999"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    result = CliRunner().invoke(app, ["train", "--out", str(run), "--resume"])
    assert result.exit_code == 0, result.output
    assert "skipped damaged checkpoint" in result.output and "step-00000002" in result.output
    assert "files must list exactly" in result.output
    assert "removed stale partial checkpoint" in result.output and stale.name in result.output
    assert not stale.exists()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # step 1 redone from the checkpoint of step 1
    assert checkpoint.load_latest(run / "checkpoints", *fresh_optimizer(base))[0].name == "step-00000002"


def fresh_optimizer(base):
    network = vrl.load_model(base).network
    return network, torch.optim.AdamW(network.parameters(), fused=True)


CHEATS = {
    # The node lies about one reward of its first group.
    "fabricated reward": (lambda rollout, model, key: rollout.signed(key, reward=1.0 - rollout.reward),
                          {"reward_mismatch"}),
    # One token edited, the commitment rebuilt by an honest prefill: the verifier checks it against
    # the trainer's own GRPO forward pass, which must catch it as its own prefill would.
    "tampered token": (lambda rollout, model, key: tampered(rollout, model, key), {"sampling_mismatch"}),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_group_with_a_rejected_member_is_dropped_and_reported(base, tmp_path, monkeypatch, cheat):
    import vrl.rl.train as train

    honest_generate = train.iter_generate
    edit, reasons = CHEATS[cheat]

    def one_cheat(model, tasks, key, **options):
        for number, group in enumerate(honest_generate(model, tasks, key, **options)):
            if number == 0:  # the longest member, so the edited first token is not its last
                victim = max(range(len(group)), key=lambda i: len(group[i].completion_tokens))
                group[victim] = edit(group[victim], model, key)
            yield group

    monkeypatch.setattr(train, "iter_generate", one_cheat)
    record = Trainer(config(base, steps=1, grpo=GRPOConfig(advantage="mean")), tmp_path / "run").step()
    assert record["rejected"] == 1 and set(record["rejected_reasons"]) <= reasons | {"commitment_mismatch"}
    assert record["groups_used"] + record["groups_zero_variance"] <= 3  # the cheating group never trains


def test_several_optimizer_steps_per_batch_clip_against_the_first_pass(base, tmp_path):
    """GRPO's mu: with one step the ratio is 1 and nothing clips; with four steps at a large rate
    the later passes move away from pi_old and the clip binds on some tokens."""
    settings = config(base, steps=1, groups_per_step=16, group_size=8, learning_rate=3e-2, warmup_steps=1)
    once = Trainer(settings, tmp_path / "once").step()
    four = Trainer(dataclasses.replace(settings, grpo=GRPOConfig(iterations=4)), tmp_path / "four").step()
    assert once["groups_used"] and four["groups_used"]
    assert once["clip_fraction"] == 0.0
    assert four["clip_fraction"] > 0.0


def test_cli_train_with_toml_and_flags(base, tmp_path):
    settings = tmp_path / "train.toml"
    settings.write_text(config(base, steps=2).to_toml().replace("steps = 2", "steps = 99"))
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--config", str(settings), "--steps", "2", "--out", str(run), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 2 and (run / "curves.png").exists()
    logged = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [e["step"] for e in logged if e["event"] == "step"] == [0, 1], result.stderr  # --json: JSON logs
    bad = CliRunner().invoke(app, ["train", "--config", str(settings), "--out", str(tmp_path / "x"),
                                   "--aggregation", "nonsense"])
    assert bad.exit_code == 2 and "[grpo] aggregation" in bad.output


def test_a_run_that_cannot_learn_says_why_once(tmp_path):
    """Two tokens cannot answer a sum: every group scores 0 throughout, and GRPO has nothing to
    learn from. The run says so once, naming the likely cause, rather than only 0.0%."""
    result = CliRunner().invoke(app, ["train", "--model", "tiny", "--task", "arithmetic:digits=1", "--steps", "2",
                                      "--group-size", "2", "--groups-per-step", "2", "--max-new-tokens", "2",
                                      "--out", str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if "no group could be learned from" in line]
    assert len(warned) == 1 and json.loads(warned[0])["max_new_tokens"] == 2, result.stderr


def test_a_run_directory_that_cannot_be_one_is_a_clear_error_not_a_traceback(tmp_path):
    """FileExistsError from mkdir escaped the CLI once its except clause became VrlError (review)."""
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("not a directory")
    with pytest.raises(RunError, match="cannot be a run directory"):
        Trainer(TrainConfig(model="tiny", steps=1), in_the_way)
    result = CliRunner().invoke(app, ["train", "--out", str(in_the_way), "--model", "tiny", "--steps", "1"])
    assert result.exit_code == 2 and "cannot be a run directory" in result.output, result.output
