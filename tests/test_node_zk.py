"""Sampling proofs between nodes (specs/network.md §3.4): a verifier with [zk]
sampling_positions asks each group's producer, after its own check passed, to prove the
positions its audit ticket picks; an honest worker with hidden_states answers and passes, a
worker that cannot answer fails the check like a cheat. In-process loopback, micro model,
bounded in rounds and seconds."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from test_node import drive

from p2p.loopback import LoopbackNetwork
from vrl.node.config import ConfigError, NodeConfig
from vrl.node.daemon import Node
from vrl.node.messages import MessageError, SignedVerdict
from vrl.node.requests import SamplingRequest
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(b"zk-trainer".ljust(32, b"\0"))
ANSWERING = NodeKey.from_seed(b"zk-answering".ljust(32, b"\0"))
SILENT = NodeKey.from_seed(b"zk-silent".ljust(32, b"\0"))
VERIFIER = NodeKey.from_seed(b"zk-verifier".ljust(32, b"\0"))


def config(data_dir, **changes) -> NodeConfig:
    tables = {"work": {"model": "micro", "task": "arithmetic:digits=1", "group_size": 2, "max_new_tokens": 4},
              # Tickets: the one verifier checks every group of a newcomer (specs/network.md §4);
              # a committee of four nodes might seat it on neither worker's group.
              "protocol": {"groups_per_round": 1, "verdict_wait": 0.5, "round_timeout": 5.0,
                           "verification": "tickets"},
              "admission": {"batch_groups": 2, "node_cap": 0.5, "trusted_share": 0.0},
              "train": {"held_out": 8, "eval_every": 1, "warmup_steps": 1}}
    return NodeConfig(data_dir=str(data_dir), trainer=TRAINER.node_id.hex(), transport="loopback",
                      **{**tables, **changes})


async def run(tmp_path, deadline: float = 150.0) -> dict[str, Node]:
    network = LoopbackNetwork(seed=3)
    specs = {
        "trainer": (TRAINER, config(tmp_path / "t", roles=("trainer",))),
        "answering": (ANSWERING, config(tmp_path / "a", roles=("worker",), zk={"hidden_states": True,
                                                                                "dev_srs": True})),
        "silent": (SILENT, config(tmp_path / "s", roles=("worker",))),
        "verifier": (VERIFIER, config(tmp_path / "v", roles=("verifier",), zk={"sampling_positions": 1,
                                                                                "dev_srs": True})),
    }
    nodes = {name: Node(cfg, network.transport(key.private_seed()), key) for name, (key, cfg) in specs.items()}
    for node in nodes.values():
        await node.transport.start()
    address = {name: node.transport.addresses()[0] for name, node in nodes.items()}
    # The verifier dials the workers too: a producer it cannot reach is not asked (no verdict).
    for name, node in nodes.items():
        dials = (address["trainer"],) if name != "verifier" else tuple(address[n] for n in ("trainer", "answering",
                                                                                            "silent"))
        if name != "trainer":
            node.config = dataclasses.replace(node.config, bootstrap=dials)
    return await drive(nodes, deadline, lambda nodes: {v.subject for v in _verdicts(tmp_path / "v")} >= {
        ANSWERING.node_id, SILENT.node_id})


def _verdicts(data_dir) -> list[SignedVerdict]:
    if not (data_dir / "node.sqlite").exists():
        return []
    store = Store(data_dir / "node.sqlite")
    try:
        return [v for v in (SignedVerdict.from_bytes(d) for k, d, _ in store.replay() if k == "verdict")
                if v.verifier == VERIFIER.node_id and v.checked]
    finally:
        store.close()


def test_a_verifier_asks_for_sampling_proofs_and_a_producer_that_cannot_answer_fails(tmp_path, monkeypatch,
                                                                                    zk_workdir):
    monkeypatch.setenv("VRL_ZK_DIR", str(zk_workdir))
    nodes = asyncio.run(run(tmp_path))
    verdicts = _verdicts(tmp_path / "v")
    by_subject = {}
    for verdict in verdicts:
        by_subject.setdefault(verdict.subject, []).append(verdict)
    assert by_subject.get(ANSWERING.node_id), "the verifier checked no group of the answering worker"
    assert all(v.outcome == "pass" for v in by_subject[ANSWERING.node_id])
    assert nodes["answering"].proving.answers.served, "the answering worker proved nothing"
    assert by_subject.get(SILENT.node_id), "the verifier checked no group of the silent worker"
    assert all(v.outcome == "hard_fail" and v.reasons == ("sampling_missing",) for v in by_subject[SILENT.node_id])
    witness = list((tmp_path / "a" / "hidden").iterdir())
    assert witness and all(p.suffix == ".hidden" for p in witness)
    # Asked the same again (its own check failed, say), a worker sends the very answer it sent,
    # without proving; another challenge for the same group is refused.
    worker = nodes["answering"]
    worker.proving.stopping = False  # it stopped with the run; the cache is what is tested
    (peer, group, challenge, positions), sent = next(iter(worker.proving.answers.kept.items()))
    again = asyncio.run(worker.proving.serve_sampling(peer, SamplingRequest(group, challenge, positions).to_bytes()))
    assert again == sent
    with pytest.raises(MessageError, match="answered to this peer already"):
        asyncio.run(worker.proving.serve_sampling(peer, SamplingRequest(group, bytes(32), positions).to_bytes()))


def test_zk_settings_are_checked_at_the_boundary(tmp_path):
    with pytest.raises(ConfigError, match="srs"):
        config(tmp_path, zk={"sampling_positions": 2})  # no SRS named
    with pytest.raises(ConfigError, match="sampling_positions"):
        config(tmp_path, zk={"sampling_positions": 65, "dev_srs": True})
    with pytest.raises(ConfigError, match="proof_timeout"):  # 2 x 8 positions take about 64 s to prove
        Node(config(tmp_path / "m", zk={"sampling_positions": 8, "proof_timeout": 100.0, "dev_srs": True}),
             LoopbackNetwork(seed=1).transport(TRAINER.private_seed()), TRAINER)
    with pytest.raises(ConfigError, match="base-micro"):
        Node(config(tmp_path / "n", work={"model": "tiny", "task": "arithmetic:digits=1"},
                    zk={"hidden_states": True, "dev_srs": True}),
             LoopbackNetwork(seed=1).transport(TRAINER.private_seed()), TRAINER)


def test_sampling_requests_decode_strictly():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    request = SamplingRequest(bytes(32), bytes([1]) * 32, 4)
    assert SamplingRequest.from_bytes(request.to_bytes()) == request

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=200))
    def any_bytes(data):
        try:
            SamplingRequest.from_bytes(data)
        except MessageError:
            pass

    any_bytes()
    for positions in (0, 65, True):
        with pytest.raises(MessageError):
            SamplingRequest.from_bytes(SamplingRequest(bytes(32), bytes(32), positions).to_bytes())


def test_a_prover_process_exits_when_its_node_is_killed():
    """A node's prover is a child process (ezkl holds the GIL): killed with its node, it must not
    go on proving, holding its memory, with no one to answer (seen here before prover_init)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import multiprocessing, os, sys, time\n"
              "from concurrent.futures import ProcessPoolExecutor\n"
              "from vrl.zk.sampling import prover_init\n"
              "pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),"
              " initializer=prover_init)\n"
              "print(pool.submit(os.getpid).result(), flush=True)\n"
              "time.sleep(120)\n")
    node = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(node.stdout.readline())
        node.send_signal(signal.SIGKILL)
        node.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the prover outlived its node")
    finally:
        node.kill()
