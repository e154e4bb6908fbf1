"""A real devnet: `vrl node` processes on libp2p over 127.0.0.1, one of them cheating.

The slowest tests here (node processes import torch and libp2p), and the only ones that run
the daemon as an operator would: CLI, TOML, TCP, Noise, gossip, chunked weights, Prometheus.
Bounded by a round count and a deadline; every process is stopped at the end. What decides
that a devnet failed (:class:`vrl.harness.devnet.Watch`) is tested on its own, on scrapes and logs.
A worker's cheat, under the default design, is tests/test_devnet_committee.py's run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from tests.support import free_port
from vrl.cli import app
from vrl.harness import devnet
from vrl.node.config import NodeConfig
from vrl.rollouts.keys import NodeKey


def test_every_honest_node_convicts_a_trainer_that_publishes_weights_no_step_made(tmp_path):
    """specs/training.md §6 on real processes: every step replayed (rate 1), the first bad
    version is confirmed by each honest node on its own replay, and nobody follows it on."""
    from vrl.harness.adversary import CHEAT_FROM

    summary = devnet.run(tmp_path / "dn", 3, ["trainer-fake-weights"], rounds=CHEAT_FROM + 4, deadline_s=240,
                         base_port=free_port(), console=Console(file=open("/dev/null", "w")),
                         work={"model": "tiny", "task": "arithmetic:digits=1", "group_size": 4, "max_new_tokens": 4},
                         protocol={"groups_per_round": 2, "verdict_wait": 1.0, "plant_every": 0,
                                   "step_audit_rate": 1.0},
                         train={"held_out": 8})
    assert summary["failure"] is None, summary
    fraud = summary["trainer_fraud"]
    assert fraud["first_bad_version"] == CHEAT_FROM + 1, fraud
    assert set(fraud["confirmed"]) == {"worker-1", "worker-2"}, fraud
    assert all(c["version"] == CHEAT_FROM + 1 and c["reasons"] == ["weights_mismatch"]
               for c in fraud["confirmed"].values()), fraud
    assert summary["convicted_by"] == ["worker-1", "worker-2"], summary
    assert all(s["pass"] >= CHEAT_FROM for s in summary["steps_replayed"].values()), summary  # honest steps passed


def test_paths_are_resolved_once_where_they_are_given(tmp_path, monkeypatch):
    """`--dir dn` and a relative task file: every node.toml, read from its own folder by a
    process started anywhere, leads to the planned directory, key and task file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks.jsonl").write_text('{"id": "a", "prompt": "1+1=", "answer": "2"}\n')
    network = devnet.plan(Path("dn"), 3, ["fabricated-reward"], base_port=29000,
                          work={"model": "tiny", "task": "tasks.jsonl"})
    monkeypatch.chdir(tmp_path.parent)
    root = (tmp_path / "dn").resolve()
    for i, planned in enumerate(network):
        config = NodeConfig.from_toml(root / f"node-{i}" / "node.toml")
        assert config.path == root / f"node-{i}"
        assert NodeKey.load(config.path / config.key).node_id == planned.key.node_id
        assert config.trainer == network[0].key.node_id.hex()
        assert config.work.task == str((tmp_path / "tasks.jsonl").resolve()) and config.work.model == "tiny"
        assert config == planned.config


def planned(tmp_path: Path, nodes: int = 3) -> list[devnet.DevnetNode]:
    return devnet.plan(tmp_path / "dn", nodes, [], base_port=29000, work={"model": "tiny"})


def metrics(peers: float, evaluated: bool = True) -> dict:
    """One node's scrape, as vrl.harness.devnet.scrape returns it."""
    return {("vrl_peers", ()): peers, ("vrl_step_seconds_count", (("kind", "evaluate"),)): float(evaluated),
            ("vrl_rollouts_produced_total", ()): 0.0, ("vrl_groups_received_total", ()): 0.0}


def test_nodes_that_never_see_a_peer_fail_the_run_within_the_bound(tmp_path):
    network = planned(tmp_path)
    watch = devnet.Watch(network)
    assert watch.observe(100.0, [{}, {}, {}]) is None  # nobody up yet: nothing to judge
    cut_off = [metrics(0), metrics(0), metrics(0)]
    assert watch.observe(110.0, cut_off) is None
    assert watch.observe(110.0 + devnet.REACH_SECONDS - 1, cut_off) is None
    failure = watch.observe(110.0 + devnet.REACH_SECONDS, cut_off)
    assert failure is not None and "cannot reach each other" in failure and "trainer" in failure


def test_slow_starters_a_trainer_still_evaluating_and_peers_that_come_and_go_are_not_a_failure(tmp_path):
    network = planned(tmp_path)
    watch = devnet.Watch(network)
    assert watch.observe(0.0, [metrics(0), metrics(0), {}]) is None
    assert watch.observe(devnet.REACH_SECONDS * 2, [metrics(0), metrics(0), {}]) is None  # worker-2 still starting
    watch = devnet.Watch(network)
    assert watch.observe(0.0, [metrics(0, evaluated=False), metrics(1), metrics(1)]) is None
    # The trainer's peer count is not live until its first evaluation: its window starts then.
    assert watch.observe(devnet.REACH_SECONDS * 2, [metrics(0, evaluated=False), metrics(0), metrics(0)]) is None
    assert watch.observe(devnet.REACH_SECONDS * 2 + 1, [metrics(0), metrics(0), metrics(0)]) is None
    assert watch.observe(devnet.REACH_SECONDS * 3, [metrics(2), metrics(0), metrics(0)]) is None  # churn later
    assert watch.observe(devnet.REACH_SECONDS * 9, [metrics(0), metrics(0), metrics(0)]) is None


def test_a_network_that_never_passes_version_0_fails_and_says_what_it_saw(tmp_path):
    network = planned(tmp_path)
    watch = devnet.Watch(network)
    failure = watch.final({"policy_version": 0.0, "seconds": 244.0}, [metrics(0), metrics(0), metrics(0)])
    assert failure.startswith("the network never got past policy version 0 in 244 s")
    assert "trainer received 0 groups" in failure and "peers: trainer 0, worker-1 0, worker-2 0" in failure
    assert watch.final({"policy_version": 1.0, "seconds": 30.0}, [metrics(1)] * 3) is None


def test_a_node_that_dies_or_runs_under_another_key_fails_the_run_at_once(tmp_path):
    network = planned(tmp_path, nodes=2)
    trainer, worker = network
    for node in network:
        node.log_path = node.config.path / "node.log"
    # A reused --dir: an older run's log said something else; only this run's lines count.
    worker.log_path.write_text(json.dumps({"event": "node started", "id": "ab" * 32}) + "\n")
    worker.log_start = worker.log_path.stat().st_size
    watch = devnet.Watch(network)
    assert watch.observe(0.0, [{}, {}]) is None
    with worker.log_path.open("a") as log:
        log.write(json.dumps({"event": "node started", "id": worker.key.node_id.hex()}) + "\n")
    assert watch.observe(1.0, [{}, {}]) is None and "worker-1" in watch.identified
    trainer.log_path.write_text(json.dumps({"event": "node started", "id": "cd" * 32}) + "\n")
    failure = watch.observe(2.0, [{}, {}])
    assert failure is not None
    assert failure.startswith(f"trainer started as node cdcdcdcd, not the planned {trainer.peer}")

    watch = devnet.Watch(network)
    with trainer.log_path.open("a") as log:
        log.write("error: /x/node.toml: model: 'no-such-model' is neither a preset nor a model directory\n")
    trainer.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    trainer.process.wait(30)
    failure = watch.observe(3.0, [{}, {}])
    assert failure is not None and failure.startswith("trainer exited with code 2 while the network ran: error: ")
    assert "no-such-model" in failure


def test_vrl_devnet_exits_non_zero_with_the_reason(tmp_path):
    """End to end, the cheap way to a network that cannot work: nodes that cannot load their model."""
    result = CliRunner().invoke(app, ["devnet", "--nodes", "2", "--rounds", "1", "--model", "no-such-model",
                                      "--dir", str(tmp_path / "dn"), "--base-port", str(free_port()),
                                      "--deadline", "200"])
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.output.splitlines() if "devnet failed" in line]
    assert "exited with code 2" in line and "model: " in line and "no-such-model" in line, result.output
