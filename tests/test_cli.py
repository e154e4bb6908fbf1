"""The command line, end to end on the tiny preset: exit codes and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import vrl
from vrl.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n'
                       '{"id": "b", "prompt": "2+2=", "answer": "4"}\n'
                       'not json\n'
                       '{"id": "c", "prompt": "3+3="}\n')
    key = root / "node.pem"
    assert runner.invoke(app, ["keygen", "--out", str(key)]).exit_code == 0
    out = root / "r.msgpack"
    result = runner.invoke(app, ["generate", "--model", "tiny", "--task", str(prompts), "--key", str(key),
                                 "--out", str(out), "--groups", "2", "--group-size", "2", "--max-new-tokens", "16",
                                 "--round-seed", "7", "--json"])
    assert result.exit_code == 0, result.output
    return root, prompts, key, out


def test_keygen_refuses_to_overwrite(workspace):
    _, _, key, _ = workspace
    result = runner.invoke(app, ["keygen", "--out", str(key)])
    # rich wraps at the terminal's width, and the path's length varies: compare words.
    assert result.exit_code == 2 and "refusing to overwrite" in " ".join(result.output.split())


def test_keygen_into_a_missing_folder_or_onto_a_folder_says_so(tmp_path):
    result = runner.invoke(app, ["keygen", "--out", str(tmp_path / "no" / "such" / "node.pem")])
    assert result.exit_code == 2 and "no such folder" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    (tmp_path / "taken").mkdir()
    result = runner.invoke(app, ["keygen", "--out", str(tmp_path / "taken")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no partial file left behind


def test_the_commands_that_answer_at_once_never_load_torch(workspace):
    """--help, --version, keygen and inspect read no model: they must not pay for torch and
    transformers (issue 18: 9 s before; bench/cli_startup.py measures it)."""
    import subprocess
    import sys

    root, _, _, rollouts = workspace
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from vrl.cli import app\n"
        "runner = CliRunner()\n"
        f"for argv in (['--help'], ['--version'], ['keygen', '--out', {str(root / 'fresh.pem')!r}], "
        f"['inspect', {str(rollouts)!r}], ['train', '--help']):\n"
        "    result = runner.invoke(app, argv)\n"
        "    assert result.exit_code == 0, (argv, result.output)\n"
        "loaded = sorted(m for m in ('torch', 'transformers', 'numpy', 'ezkl') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"loaded {done.stdout.strip()}"


def test_help_and_tables_are_whole_at_80_columns(workspace):
    """Nothing cut mid-word: every inspect and verify header whole, every help line within 80 columns."""
    import os
    import subprocess
    import sys

    _, _, _, rollouts = workspace
    env = {**os.environ, "COLUMNS": "80"}
    vrl_cli = [sys.executable, "-m", "vrl.cli"]
    shown = subprocess.run([*vrl_cli, "inspect", str(rollouts)], capture_output=True, text=True, env=env, timeout=120)
    header = shown.stdout.splitlines()[1].split()
    assert header == ["#", "node", "group", "task", "sample", "version", "prompt", "tokens", "finish", "reward", "T",
                      "commit", "B"], shown.stdout
    # verify's table too, rejections and all: codes whole, each sentence on a line of its own.
    forged = rollouts.parent / "forged.vrl"
    records = list(vrl.read_rollouts(rollouts))
    key = vrl.NodeKey.load(rollouts.parent / "node.pem")
    vrl.write_rollouts(forged, [records[0].signed(key, reward=9.0), *records[1:]])
    shown = subprocess.run([*vrl_cli, "verify", str(forged), "--model", "tiny"], capture_output=True, text=True,
                           env=env, timeout=120)
    lines = shown.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))  # the title wraps with the path
    assert lines[header].split() == ["#", "node", "task", "sample", "verdict", "reason"], shown.stdout
    assert lines[header + 2].split()[-2:] == ["rejected", "reward_mismatch"], shown.stdout
    # The honest reward: tiny's sixteen tokens end in the right digit now and then (2% of draws).
    assert f"0 (reward): claims reward 9.0, recomputed {records[0].reward}" in shown.stdout
    assert max(map(len, lines)) <= 80, shown.stdout
    for command in ([], ["train"], ["node"], ["verify"], ["export"]):
        shown = subprocess.run([*vrl_cli, *command, "--help"], capture_output=True, text=True, env=env, timeout=120)
        assert shown.returncode == 0 and max(map(len, shown.stdout.splitlines())) <= 80, (command, shown.stdout)
        assert "…" not in shown.stdout


def test_generation_past_the_models_context_is_refused_before_it_starts(workspace, tmp_path):
    _, prompts, key, _ = workspace
    out = tmp_path / "long.vrl"
    result = runner.invoke(app, ["generate", "--model", "tiny", "--task", str(prompts), "--key", str(key),
                                 "--out", str(out), "--groups", "1", "--max-new-tokens", "100000"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "pass the model's context of" in said and "Traceback" not in said, said
    assert list(tmp_path.iterdir()) == []  # no OUT, and no empty OUT.partial


def test_version_names_the_package():
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"vrl {version('vrl')}"


def test_generate_skips_bad_lines_and_writes_whole_groups(workspace):
    _, _, _, out = workspace
    rollouts = list(vrl.read_rollouts(out))
    assert [(r.group_index, r.sample_index) for r in rollouts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r.task_id for r in rollouts} <= {"a", "b"}
    assert rollouts[0].round_seed == (7).to_bytes(32, "big")
    assert not out.with_name(out.name + ".partial").exists()


def test_verify_accepts_and_reports_json(workspace):
    _, prompts, _, out = workspace
    result = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--task", str(prompts),
                                 "--round-seed", "7", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["accepted"] == 4 and report["rejected"] == 0
    # specs/verification.md §7: the producer's races over all of its records, under the profile.
    assert report["profile"] == "cpu/float32/sdpa/same"
    (producer,) = report["producers"].values()
    tokens = sum(len(r.completion_tokens) for r in vrl.read_rollouts(out))
    assert producer["race_tokens"] == tokens and producer["races_lost"] == 0 and not producer["rejected"]


def test_verify_with_an_uncalibrated_producer_device_falls_back_to_a_calibrated_profile(workspace):
    _, _, _, out = workspace
    result = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--producer-device", "cuda", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["profile"] == "cpu/float32/sdpa/cuda"


@pytest.mark.parametrize("device", ["", "a/b/c", "x" * 5000, "CUDA", "cuda:0"])
def test_verify_refuses_a_producer_device_that_names_no_device_kind(workspace, device):
    _, _, _, out = workspace
    result = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--producer-device", device])
    assert result.exit_code == 2 and "device kind" in " ".join(result.output.split())


def test_verify_rejects_tampered_with_exit_1(workspace, tmp_path):
    _, _, key, out = workspace
    node = vrl.NodeKey.load(key)
    rollouts = list(vrl.read_rollouts(out))
    rollouts[1] = rollouts[1].signed(node, reward=1.0 - rollouts[1].reward)
    tampered = tmp_path / "t.msgpack"
    vrl.write_rollouts(tampered, rollouts)
    result = runner.invoke(app, ["verify", str(tampered), "--model", "tiny", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["reasons"] == {"reward_mismatch": 1}
    assert report["verdicts"][1]["stage"] == "reward"


def test_unusable_input_exit_2(workspace, tmp_path):
    _, _, _, out = workspace
    junk = tmp_path / "junk"
    junk.write_bytes(b"junk")
    no_such_device = "cuda:64" if torch.cuda.is_available() else "cuda"
    for args in (["verify", str(junk), "--model", "tiny"], ["verify", str(out), "--model", str(tmp_path / "nope")],
                 ["verify", str(tmp_path / "missing"), "--model", "tiny"],
                 ["verify", str(out), "--model", "tiny", "--device", no_such_device],
                 ["verify", str(out), "--model", "tiny", "--device", "mps"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output and "Traceback" not in result.output


def test_inspect_lists_records(workspace):
    _, _, _, out = workspace
    result = runner.invoke(app, ["inspect", str(out), "--json"])
    assert result.exit_code == 0
    assert [row["group_index"] for row in json.loads(result.stdout)] == [0, 0, 1, 1]


def test_model_directory_loads_like_the_preset(tiny, tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    directory = tiny.save(tmp_path / "tiny-hf")
    hf_logging.enable_progress_bar()  # as a fresh Python session has it
    loaded = vrl.load_model(directory)
    assert "Loading weights" not in capsys.readouterr().err  # the library prints no progress bar of its own
    assert hf_logging.is_progress_bar_enabled()  # and leaves the caller's setting as it was
    assert loaded.model_hash == tiny.model_hash
    assert loaded.encode("12+3=") == tiny.encode("12+3=") and loaded.stop_token_ids == tiny.stop_token_ids


def test_record_text_that_looks_like_markup_is_shown_as_text(tmp_path, tiny, node):
    """A task id is whatever a record says: "[/x]" is rich markup that would raise if printed as
    such, in verify's table and inspect's."""
    import vrl

    (record,) = vrl.generate(tiny, vrl.TaskList("t", (vrl.Task("[/oops]", "1+1=", "2"),)), node,
                             round_seed=bytes(32), sampling=vrl.sampling_for(tiny, max_new_tokens=4), groups=1,
                             group_size=1)
    path = tmp_path / "r.vrl"
    vrl.write_rollouts(path, [record])
    for command in (["inspect", str(path)], ["verify", str(path), "--model", "tiny"]):
        result = runner.invoke(app, [*command, "--json"])  # the whole text, not a column cut to fit
        assert result.exit_code in (0, 1) and "[/oops]" in result.output, result.output
        shown = runner.invoke(app, command)  # the table: no crash on the markup
        assert not isinstance(shown.exception, Exception), shown.exception  # exits are SystemExit, not Exception


@pytest.mark.parametrize("json_mode", [True, False])
def test_a_librarys_log_records_come_out_as_the_nodes_log_lines(json_mode):
    """py-libp2p logs through the standard library, and cuts its "libp2p" logger off when
    imported (propagate off, no handler): its warnings came out as bare text among a node's JSON
    lines (issue 18, item 8). In JSON mode each is a JSON line now, and readable in plain mode.
    A process of its own, as a node is: pytest hangs capture handlers on loggers."""
    import subprocess
    import sys

    script = (
        "import logging, sys\n"
        "from vrl.cli import configure_logging\n"
        f"configure_logging({json_mode}, level=logging.INFO)\n"
        "configure_logging({json_mode}, level=logging.INFO)\n"  # each command calls it: still one line a record
        "import libp2p\n"  # after, as a node imports it: its import sets its loggers up
        "logging.getLogger('libp2p.network.swarm').warning('dial to %s failed', 'peer-a')\n"
        "logging.getLogger('some.library').error('no route')\n"
        "logging.getLogger('some.library').info('below the root logger level: not shown')\n"
    ).replace("{json_mode}", str(json_mode))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2, lines
    if json_mode:
        records = [json.loads(line) for line in lines]
        assert [(r["level"], r["logger"], r["event"]) for r in records] == [
            ("warning", "libp2p.network.swarm", "dial to peer-a failed"), ("error", "some.library", "no route")]
        assert all("timestamp" in r for r in records)
    else:
        assert "dial to peer-a failed" in lines[0] and "warning" in lines[0] and "libp2p.network.swarm" in lines[0]
        assert not lines[0].lstrip().startswith("{")


def test_train_help_shows_each_flags_default_from_the_config():
    """Issue 18, item 7: the flags default to None (a --config file's keys apply where no flag is
    given), so the help reads each default from TrainConfig, where it is defined once."""
    from vrl.rl.config import TrainConfig

    result = runner.invoke(app, ["train", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    defaults = TrainConfig()
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith("--")}
    for flag, value in [("--lr", defaults.learning_rate), ("--steps", defaults.steps), ("--model", defaults.model),
                        ("--task", defaults.task), ("--group-size", defaults.group_size),
                        ("--groups-per-step", defaults.groups_per_step), ("--max-new-tokens", defaults.max_new_tokens),
                        ("--temperature", defaults.temperature), ("--verify-fraction", defaults.verify_fraction),
                        ("--device", defaults.device), ("--advantage", defaults.grpo.advantage),
                        ("--aggregation", defaults.grpo.aggregation), ("--kl-beta", defaults.grpo.kl_beta),
                        ("--iterations", defaults.grpo.iterations)]:
        assert lines[flag].endswith(f"[default: {value}]"), lines[flag]


def test_the_bounds_written_out_for_a_fast_help_are_the_librarys():
    """--positions' bound is written out in vrl.cli.common (importing vrl.zk.sampling loads
    torch before --help); it must stay the library's."""
    from vrl.cli.common import MAX_POSITIONS
    from vrl.zk.sampling import MAX_POSITIONS as LIBRARY_MAX_POSITIONS

    assert MAX_POSITIONS == LIBRARY_MAX_POSITIONS


def test_verifys_producer_lines_are_the_librarys_fold_over_each_producers_records():
    """specs/verification.md §7: one test per producer over all of its records in the file; a
    producer none of whose records reached the race replay has no test (no evidence)."""
    from types import MappingProxyType

    from vrl.rollouts.sequential import RaceTest
    from vrl.rollouts.verify import Reason, Stage, Verdict, producer_tests

    def verdict(index, node, tokens=None, lost=0):
        scores = {} if tokens is None else {"race_tokens": tokens, "races_lost": lost}
        return Verdict(index, True, Stage.ACCEPTED, Reason.OK, "all checks passed", node_id=node,
                       scores=MappingProxyType(scores))

    tests = producer_tests([verdict(0, "bb", 10, 1), verdict(1, "aa", 5), verdict(2, "bb", 7, 2),
                            verdict(3, "cc")], q0=1e-3)
    assert list(tests) == ["aa", "bb"]  # by node id; cc gave no races
    assert tests["bb"] == RaceTest(1e-3, 17, 3) and tests["aa"] == RaceTest(1e-3, 5, 0)
    assert tests["bb"].rejected and not tests["aa"].rejected
