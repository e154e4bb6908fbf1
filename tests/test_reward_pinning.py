"""A record's own claim never makes a verifier run code (specs/rewards.md §6): a reward that
runs code (code/v1) is recomputed only under a spec the verifier pins itself (`vrl verify
--reward`, a node's [work] reward), and an audit re-executes such a network only when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import vrl
import vrl.audit
from vrl.audit.index import index_run
from vrl.audit.models import Models
from vrl.cli import app
from vrl.node.config import NodeConfig
from vrl.node.store import Store
from vrl.rollouts.verify import Reason, Stage

runner = CliRunner()
TESTS = "assert add(2, 3) == 5\n"


@pytest.fixture(scope="module")
def code_records(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(a code task file, a key, records of the tiny model rewarded with code/v1)."""
    root = tmp_path_factory.mktemp("pinning")
    tasks = root / "code.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"add-{i}", "prompt": f"Write add(a, b). #{i}", "answer": TESTS}) + "\n"
                             for i in range(40)))
    key = root / "node.pem"
    vrl.NodeKey.generate().save(key)
    out = root / "code.vrl"
    result = runner.invoke(app, ["generate", "--model", "tiny", "--task", str(tasks), "--key", str(key), "--out",
                                 str(out), "--groups", "1", "--group-size", "2", "--max-new-tokens", "8",
                                 "--reward", "code:time_ms=2000"])
    assert result.exit_code == 0, result.output
    return tasks, key, out


def test_a_record_that_runs_code_is_refused_before_any_work_unless_the_verifier_pins_it(code_records, tiny):
    _, _, out = code_records
    records = list(vrl.iter_records(out))
    unpinned = vrl.verify(records, tiny)
    assert {(v.stage, v.reason) for v in unpinned} == {(Stage.BINDING, Reason.REWARD_SPEC_MISMATCH)}
    assert "runs code the record carries" in unpinned[0].message
    pinned = vrl.verify(records, tiny, expect=vrl.Expectations(reward_spec=records[0].reward_spec))
    assert all(v.accepted for v in pinned), [v.message for v in pinned]


def test_vrl_verify_runs_code_only_under_its_own_reward(code_records):
    _, _, out = code_records
    refused = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--json"])
    assert refused.exit_code == 1 and "reward_spec_mismatch" in refused.output
    accepted = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--reward", "code:time_ms=2000", "--json"])
    assert accepted.exit_code == 0, accepted.output
    other = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--reward", "answer"])
    assert other.exit_code == 1 and "reward_spec_mismatch" in other.output
    bad = runner.invoke(app, ["verify", str(out), "--model", "tiny", "--reward", "code:time_ms=5"])
    assert bad.exit_code == 2 and "--reward" in bad.output and "Traceback" not in bad.output


def test_an_audit_runs_a_networks_code_reward_only_when_asked(code_records, tmp_path):
    tasks, key, _ = code_records
    folder = tmp_path / "node-0"
    folder.mkdir()
    (folder / "node.pem").write_bytes(key.read_bytes())
    config = NodeConfig(data_dir=str(folder), trainer=vrl.NodeKey.load(key).node_id.hex(), transport="loopback",
                        work={"model": "tiny", "task": str(tasks), "group_size": 2, "max_new_tokens": 8,
                              "reward": ["code:time_ms=2000"]})
    (folder / "node.toml").write_text(config.to_toml())
    Store(folder / "node.sqlite").close()
    with vrl.audit.open(tmp_path) as audit:
        run = index_run(audit.inputs, lambda *_: None, [])
        refused = Models(run)
        assert "runs code" in refused.problem and "--allow-code-rewards" in refused.problem
        assert Models(run, allow_code=True).problem is None


def test_a_node_that_cannot_compute_its_networks_reward_refuses_to_start(tmp_path):
    """Else it would refuse every honest record as reward_unknown: here it is one ConfigError
    naming [work] reward and why (a code reward under another Python)."""
    from p2p.loopback import LoopbackNetwork
    from vrl.config import ConfigError
    from vrl.node.daemon import Node

    key = vrl.NodeKey.generate()
    config = NodeConfig(data_dir=str(tmp_path), trainer=key.node_id.hex(), transport="loopback",
                        work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 2, "max_new_tokens": 4,
                              "reward": ["code:python=3.99"]})
    with pytest.raises(ConfigError, match=r"reward.*cannot compute the network's reward: code/v1: .*3\.99"):
        Node(config, LoopbackNetwork(seed=1).transport(key.private_seed()), key)
