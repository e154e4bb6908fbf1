"""The simulator's model of what the daemon's transport carries, as the calibration against the
real devnet counts it (bench/devnet.py costs, issue 30): backfill passes that page each peer's
store by cursor (SimConfig.backfill = "daemon", vrl.node.catchup), blob fetches in chunks, the empty
answer of a direct send, and the devnet run's settings carried to the simulator."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from p2p.blobs import CHUNK_BYTES
from vrl.harness.simulator import SimConfig, Simulation, SpecError
from vrl.harness.simulator.metrics import BLOB_REQUEST_BYTES
from vrl.harness.simulator.stores import PAGE_OVERHEAD_BYTES, StoreLedger, pages
from vrl.node.catchup import BACKFILL_MAX_PAGES, BACKFILL_PAGE_BYTES


def run(**settings) -> Simulation:
    sim = Simulation(SimConfig(**settings))
    sim.run(cpu_limit_s=120)
    return sim


def test_a_store_counts_a_message_once_and_a_window_holds_the_versions_asked_for():
    ledger = StoreLedger()
    ledger.grow(2)
    ledger.put(0, 3, b"a" * 100)
    ledger.put(0, 3, b"a" * 100)  # stored again: a no-op, as vrl.node.store's
    ledger.put(0, 4, b"b" * 50)
    ledger.put(0, 1, b"c" * 7)
    assert ledger.window(0, 3) == (150, 2)
    assert ledger.window(0, 0) == (157, 3)
    assert ledger.window(1, 0) == (0, 0)
    ledger.prune(4)
    assert ledger.window(0, 0) == (50, 1)


def test_a_window_is_paged_as_the_store_pages_it():
    assert pages(0, 0) == (1, PAGE_OVERHEAD_BYTES)  # an empty window is one empty page
    count, size = pages(3 * BACKFILL_PAGE_BYTES - 10, 600)
    assert count == 3 and size > 3 * BACKFILL_PAGE_BYTES - 10
    count, size = pages(200 * BACKFILL_PAGE_BYTES, 40_000)  # at most BACKFILL_MAX_PAGES a peer
    assert count == BACKFILL_MAX_PAGES and size < (BACKFILL_MAX_PAGES + 1) * BACKFILL_PAGE_BYTES


def test_the_daemon_pages_members_what_the_design_gossips_and_names_what_they_hold():
    """In the committee design a worker's groups and a member's passes go to the trainer alone.
    The daemon before ``have`` ("daemon-cursor") paged every peer's store to everyone: the
    trainer's holds every group, so a pass cost more than what was gossiped, and members got
    groups by backfill instead of a fetch. The daemon now pages a member only what the design
    gossips, and no one what it names as held: members fetch their groups as in the gossip model
    (specs/network.md §3.5, §6), and backfill costs a fraction of what it did (0.13x here)."""
    gossip = run(nodes=5, rounds=3, design="committee", backfill="gossip")
    before = run(nodes=5, rounds=3, design="committee", backfill="daemon-cursor")
    daemon = run(nodes=5, rounds=3, design="committee", backfill="daemon")
    g, b, d = gossip.metrics.summary, before.metrics.summary, daemon.metrics.summary
    for summary in (b, d):
        assert summary["unhandled"] == {} and summary["rounds_measured"] == 3
        assert summary["honest_false_quarantines"] == summary["groups_lost"] == 0
    assert b["per_node"]["backfill_bytes"] > 2 * d["per_node"]["backfill_bytes"] > 2 * g["per_node"]["backfill_bytes"]
    assert b["actions"].get("FetchGroup", 0) < g["actions"].get("FetchGroup", 0) == d["actions"].get("FetchGroup", 0)
    # The trainer's store holds every group it was sent: a worker's window from it has them.
    trainer_store = daemon.ledger.window(0, 0)[0]
    worker_store = daemon.ledger.window(1, 0)[0]
    assert trainer_store > worker_store > 0


def test_naming_what_a_node_holds_leaves_out_the_gossip_it_received():
    """``have`` (specs/network.md §6) in the gossip model: a peer pages only what the node missed,
    so with no loss a pass is its request and an empty page; with loss, what was lost."""
    settings = {"nodes": 5, "rounds": 3, "design": "committee"}
    for loss in (0.0, 0.1):
        cursor = run(backfill="gossip-cursor", loss=loss, **settings).metrics.summary
        have = run(backfill="gossip", loss=loss, **settings).metrics.summary
        assert have["rounds_measured"] == cursor["rounds_measured"] == 3
        assert have["honest_false_quarantines"] == cursor["honest_false_quarantines"] == 0
        assert have["per_node"]["backfill_bytes"] < 0.5 * cursor["per_node"]["backfill_bytes"]


def test_the_gossip_model_is_the_default_and_a_wrong_model_is_refused():
    assert SimConfig().backfill == "gossip"
    with pytest.raises(SpecError, match="backfill"):
        SimConfig(backfill="everything")


def test_a_blob_is_fetched_in_chunks_each_a_request_and_a_response():
    sim = Simulation(SimConfig(nodes=3))
    m = sim.metrics
    size = 13 * CHUNK_BYTES + 5  # 14 chunks
    m.blob(1, 0, size)
    assert m.counters["messages_in"][1] == m.counters["messages_out"][1] == 14
    assert m.counters["messages_in"][0] == m.counters["messages_out"][0] == 14
    assert m.counters["bytes_in"][1] == size and m.counters["bytes_out"][1] == 14 * BLOB_REQUEST_BYTES
    assert m.counters["blob_bytes"][0] == m.counters["blob_bytes"][1] == size + 14 * BLOB_REQUEST_BYTES


def test_a_direct_send_is_answered_empty_a_message_each_way():
    """/vrl/send/1 (specs/network.md §3.5): the sender's request and the receiver's empty answer."""
    sim = run(nodes=4, rounds=2, design="committee")
    sends = sim.metrics.actions.get("Send", 0)
    assert sends > 0
    trainer_in = sim.metrics.counters["messages_in"][0]
    trainer_out = sim.metrics.counters["messages_out"][0]
    assert trainer_out >= sends and trainer_in >= sends


def _simulate_module():
    path = Path(__file__).resolve().parent.parent / "bench" / "simulate.py"
    spec = importlib.util.spec_from_file_location("bench_simulate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_devnet_runs_settings_travel_to_the_simulator():
    """bench/simulate.py --compare runs each devnet run with its own design, [protocol] and
    [admission] overrides, group shape and token counts."""
    run_ = {"design": "committee", "overrides": {"protocol": {"groups_per_round": 2, "step_wait": 120,
                                                              "verification": "committee"}},
            "admission_overrides": {"batch_groups": 22}, "tables": {"work": {"group_size": 8}},
            "max_new_tokens": 8, "mean_prompt_tokens": 5.8, "mean_completion_tokens": 3.4, "weights_bytes": 1000,
            "optimizer_bytes": 1900, "delta_bytes": 500, "mean_commitment_bytes": 91.7, "mean_task_id_chars": 27.0}
    got = _simulate_module().run_settings({}, run_)
    assert got == {"design": "committee", "protocol": {"groups_per_round": 2, "step_wait": 120},
                   "admission": {"batch_groups": 22}, "group_size": 8, "max_new_tokens": 8, "prompt_tokens": 5.8,
                   "completion_tokens": 3.4, "weights_bytes": 1000, "optimizer_bytes": 1900, "delta_bytes": 500,
                   "commitment_bytes": 92, "task_id_chars": 27}
    config = SimConfig(nodes=12, **got)
    sim = Simulation(config)
    assert sim.nodes[1].protocol.config.groups_per_round == 2
    assert sim.admission.batch_groups == 22


def test_a_node_that_holds_the_parent_fetches_the_delta_and_a_replay_two_optimizer_states():
    """vrl.node.deltas.fetch_weights: the delta against the parent's file when the node holds it,
    else the whole file; a step replay fetches the optimizer state before and after."""
    weights, delta, optimizer = 4 * CHUNK_BYTES, CHUNK_BYTES, 3 * CHUNK_BYTES
    whole = run(nodes=3, rounds=3, weights_bytes=weights, protocol={"step_audit_rate": 0.0})
    deltas = run(nodes=3, rounds=3, weights_bytes=weights, delta_bytes=delta, optimizer_bytes=optimizer,
                 protocol={"step_audit_rate": 0.0})
    announcement = deltas.trainer.protocol.policies[2]
    assert announcement.delta_size == delta and announcement.optimizer_size == optimizer
    assert whole.trainer.protocol.policies[2].delta_size == 0
    per_worker = {name: sim.metrics.summary["per_node_others"]["blob_bytes"] for name, sim in
                  (("whole", whole), ("delta", deltas))}
    # A worker loads every version: the whole file each round, or the delta (and its requests).
    assert per_worker["whole"] == pytest.approx(weights, rel=0.01)
    assert per_worker["delta"] == pytest.approx(delta, rel=0.01)
    replays = run(nodes=3, rounds=3, weights_bytes=weights, delta_bytes=delta, optimizer_bytes=optimizer,
                  protocol={"step_audit_rate": 1.0})
    others = replays.metrics.summary["per_node_others"]
    assert others["step_replays_per_round"] == pytest.approx(1.0)
    assert others["blob_bytes"] == pytest.approx(delta + 2 * optimizer, rel=0.01)


def test_records_take_the_devnets_shape_with_fractional_token_means():
    """Whole token counts around a fractional mean, and the measured commitment and task id sizes."""
    sim = Simulation(SimConfig(nodes=3, completion_tokens=3.5, prompt_tokens=5.75, commitment_bytes=92,
                               task_id_chars=27))
    groups = [sim.records.group(sim.nodes[1].key, 1, i) for i in range(40)]
    rollouts = [r for g in groups for r in g.rollouts]
    completion = [len(r.completion_tokens) for r in rollouts]
    assert set(completion) == {3, 4} and 3.3 < sum(completion) / len(completion) < 3.7
    assert {len(r.prompt_tokens) for r in rollouts} == {5, 6}
    assert {len(r.commitment) for r in rollouts} == {92} and {len(r.task_id) for r in rollouts} == {27}
    assert sim.records.tokens == 28  # a group's completion tokens, what a check is charged on


def test_a_committee_run_is_the_same_whatever_pythons_hash_seed():
    """The trainer's checks of groups that arrived at one moment (one inbox window) come in digest
    order, not a set's (vrl.node.scans.Scan.candidates): a simulation is reproducible across
    processes. Before, two hash seeds gave different checks and bytes (bench/simulate.py --compare)."""
    import os
    import subprocess
    import sys

    code = ("import json; from vrl.harness.simulator import SimConfig, Simulation; "
            "s = Simulation(SimConfig(nodes=5, rounds=2, design='committee', backfill='daemon')).run().summary; "
            "print(json.dumps([s['per_node'][k] for k in ('checks_per_round', 'bytes_per_round', "
            "'messages_per_round')] + [s['actions'].get('Check')]))")
    root = Path(__file__).resolve().parent.parent
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                           cwd=root, env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}).stdout
            for seed in ("0", "1", "2")}
    assert len(outs) == 1, outs


def test_a_cursor_pass_pages_what_the_peer_stored_since_and_keeps_its_cursor_across_rounds():
    """specs/network.md §6 as stores.py models it: per (asker, peer) the cursor of the last pass,
    kept for the same or a larger ``since`` (a later round); a smaller ``since``, an unreachable
    peer or the "-full" models page the window whole, and "-round" a new ``since`` too."""
    ledger = StoreLedger()
    ledger.grow(2)
    ledger.put(1, 3, b"a" * 100)
    ledger.put(1, 4, b"b" * 50)
    ledger.put(1, 2, b"c" * 7)  # below since: never paged
    assert ledger.since_cursor(0, 1, 3) == (150, 2, {3: 0, 4: 0})
    assert ledger.since_cursor(0, 1, 3)[:2] == (0, 0)  # nothing stored since
    ledger.put(1, 4, b"d" * 20)
    ledger.put(1, 5, b"e" * 9)
    assert ledger.since_cursor(0, 1, 3) == (29, 2, {3: 1, 4: 1, 5: 0})
    assert ledger.since_cursor(0, 1, 3, full=True)[:2] == (179, 4)
    assert ledger.since_cursor(0, 1, 4) == (0, 0, {4: 2, 5: 1})  # a new round keeps the cursor
    ledger.put(1, 5, b"f" * 3)
    assert ledger.since_cursor(0, 1, 5, per_round=True)[:2] == (12, 2)  # "-round": a new round, whole
    ledger.put(1, 5, b"g" * 4)
    assert ledger.since_cursor(0, 1, 5, per_round=True)[:2] == (4, 1)  # ... and by cursor within it
    assert ledger.since_cursor(0, 1, 4)[:2] == (86, 5)  # a smaller since: from no cursor
    ledger.forget(0, 1)
    assert ledger.since_cursor(0, 1, 4)[:2] == (86, 5)  # the peer was away: from no cursor


@pytest.mark.parametrize("model", ["daemon", "gossip"])
def test_a_cursor_kept_across_rounds_costs_less_than_one_kept_within_a_round_and_brings_the_same(model):
    """The same network (batches of a whole round, as bench/simulate.py --batch-groups round)
    with the cursor kept across rounds and within a round only: fewer backfill bytes (0.64x
    gossip, 0.68x daemon here), and the same rounds, checks and groups trained, no honest node
    quarantined: what the node could not take yet is offered again from memory."""
    settings = {"nodes": 5, "rounds": 3, "design": "committee", "admission": {"batch_groups": 16}}
    per_round = run(backfill=f"{model}-round", **settings).metrics.summary
    kept = run(backfill=model, **settings).metrics.summary
    assert kept["unhandled"] == {} and kept["rounds_measured"] == per_round["rounds_measured"] == 3
    for key in ("honest_false_quarantines", "bad_groups_trained", "groups_lost"):
        assert kept[key] == per_round[key] == 0
    assert abs(kept["per_node"]["checks_per_round"] - per_round["per_node"]["checks_per_round"]) <= 1
    assert kept["per_node"]["backfill_bytes"] < 0.8 * per_round["per_node"]["backfill_bytes"]


@pytest.mark.parametrize("model", ["daemon-cursor", "gossip-cursor"])
def test_backfill_by_cursor_costs_a_fraction_of_full_passes_and_brings_the_same(model):
    """The same network with cursors and with the passes before them: far fewer backfill bytes,
    and what a round decides is what it was (every round measured, no honest node quarantined)."""
    full = run(nodes=5, rounds=3, design="committee", backfill=model.replace("-cursor", "-full"))
    cursor = run(nodes=5, rounds=3, design="committee", backfill=model)
    f, c = full.metrics.summary, cursor.metrics.summary
    assert c["unhandled"] == {} and c["rounds_measured"] == f["rounds_measured"] == 3
    assert c["honest_false_quarantines"] == f["honest_false_quarantines"] == 0
    # (0.47 of it here, in both models: rounds of a few passes each, the first of each round whole)
    assert c["per_node"]["backfill_bytes"] < 0.7 * f["per_node"]["backfill_bytes"]


@pytest.mark.parametrize("model", ["daemon", "daemon-round"])
def test_the_daemon_model_hands_again_at_a_new_round_what_a_pass_brought_and_the_node_did_not_store(model):
    """stores.daemon_pass: a message a peer's pass brought that the node did not store (a verdict
    whose group it lacks) is handed to it again at the first pass of a new round: from memory, at
    no cost in bytes, with the cursor kept across rounds (vrl.node.catchup.Backfill.deferred); by
    paging the window whole again in the "-round" model. Not at the passes within a round."""
    from vrl.harness.simulator.nodes import Msg
    from vrl.harness.simulator.stores import daemon_pass
    from vrl.node import events as E
    from vrl.node.messages import TOPIC_VERDICTS

    sim = Simulation(SimConfig(nodes=3, rounds=1, design="committee", backfill=model))
    node = sim.nodes[1]
    sim.ledger.grow(3)
    data = b"a verdict on a group node 1 does not hold" * 20
    sim.ledger.put(0, 1, data, Msg(TOPIC_VERDICTS, data, None, 2, 1, True))

    def a_pass() -> tuple[int, int]:
        """(messages handed to node 1 by this pass, its backfill bytes)."""
        def inbox() -> int:
            return sum(len(messages) for messages in node.slots.values())

        handed, paid = inbox(), sim.metrics.counters["backfill_bytes"][1]
        daemon_pass(sim, node, per_round=model.endswith("-round"))  # (as the driver dispatches it)
        return inbox() - handed, sim.metrics.counters["backfill_bytes"][1] - paid

    handed, paid = a_pass()  # since 0 (no version yet): paged
    assert handed == 1 and paid > len(data)
    handed, empty = a_pass()  # the same round: not again, an empty page from each peer
    assert handed == 0 and empty < len(data)
    for version in (0, 1, 2):
        node.protocol.handle(E.PolicyAnnounced(sim._announcement(sim.trainer_key, version, ())))
    handed, paid = a_pass()  # since 1: a new round, the message's version still in the window
    assert handed == 1
    assert (paid == empty) if model == "daemon" else (paid > empty + len(data))
    assert a_pass() == (0, empty)
