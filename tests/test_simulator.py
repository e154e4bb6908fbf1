"""The simulator (vrl.harness.simulator): real NodeProtocol state machines on a simulated clock.
Small networks and few rounds, so each test takes seconds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import timeless
from vrl.harness.simulator import ALL_ADVERSARIES, SimConfig, Simulation, SpecError, parse_adversaries
from vrl.harness.simulator.driver import EVENT_FOR
from vrl.harness.simulator.spec import assign
from vrl.node.events import PolicyAnnounced, StepVerdictReceived, VerdictReceived
from vrl.node.messages import PolicyAnnouncement, SignedVerdict, StepVerdict
from vrl.node.params import Verification


def summary(**settings) -> dict:
    return Simulation(SimConfig(**settings)).run(cpu_limit_s=120).summary


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    a, b = timeless(summary(nodes=4, rounds=2, seed=3)), timeless(summary(nodes=4, rounds=2, seed=3))
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    c = timeless(summary(nodes=4, rounds=2, seed=4))
    assert c["per_round"] != a["per_round"]


def test_a_cheater_is_quarantined_and_no_honest_node_is_at_n_10():
    run = summary(nodes=10, rounds=3, adversaries=parse_adversaries("fabricated-reward"))
    row = run["rounds_to_quarantine"]["fabricated-reward"]
    assert row["nodes"] == row["cheated"] == row["quarantined_by_trainer"] == 1
    assert run["honest_false_quarantines"] == 0
    assert run["bad_groups_trained"] == 0
    assert run["stopped"] == "done" and run["rounds_measured"] == 3
    per_node = run["per_node"]
    assert per_node["checks_per_round"] > 0 and per_node["bytes_per_round"] > per_node["blob_bytes"] > 0


def test_a_replayer_copies_only_groups_the_network_still_takes():
    """Gossiped groups give the ticket design's replayer fresh loot: it copies, and is caught.
    In the committee design groups go to the trainer alone and a member fetches its seats only
    once the manifest has closed their round, so a copy would be refused: the replayer has
    nothing to copy and makes honest groups (specs/security.md, replay of another's group)."""
    tickets = summary(nodes=6, rounds=4, design="tickets",
                      adversaries=parse_adversaries("replay"))["rounds_to_quarantine"]["replay"]
    assert tickets["cheated"] == tickets["quarantined_by_trainer"] == 1
    sim = Simulation(SimConfig(nodes=8, rounds=4, design="committee", adversaries=parse_adversaries("replay")))
    run = sim.run(cpu_limit_s=120).summary
    replayer = next(node for node in sim.nodes if node.kind == "replay")
    assert run["rounds_to_quarantine"]["replay"]["cheated"] == 0
    assert all(truth.cheat == "" for truth in sim.truth.values() if truth.maker == replayer.index)
    assert run["honest_false_quarantines"] == 0
    assert replayer.seen, "it had loot (its seats), all of rounds already closed"
    # Its groups are honest and trained, but not counted as an honest node's against their groups published.
    trained_honest = run["withholding"]["honest"]["groups_trained"]
    assert trained_honest == sim.metrics.trained_by_maker["honest"] < sim.metrics.trained_by_kind["honest"]


def test_a_lazy_verifier_is_caught_by_its_digest():
    run = summary(nodes=6, rounds=3, adversaries=parse_adversaries("lazy"))
    row = run["rounds_to_quarantine"]["lazy"]
    assert row["cheated"] == 1 and row["quarantined_by_trainer"] == 1
    assert run["honest_false_quarantines"] == 0


def test_every_run_is_bounded_by_its_simulated_deadline_and_its_wall_limit():
    run = Simulation(SimConfig(nodes=4, rounds=50, deadline_s=20.0)).run(wall_limit_s=60).summary
    assert run["stopped"].startswith("simulated deadline") and run["simulated_seconds"] <= 20.0 + 1
    run = Simulation(SimConfig(nodes=4, rounds=50)).run(wall_limit_s=0.5).summary
    assert run["stopped"].startswith("wall-clock limit")


def test_a_withholder_submits_half_and_a_sybil_flood_is_counted_per_key():
    run = summary(nodes=6, rounds=2, adversaries=parse_adversaries("withhold,sybil"))
    assert run["withheld_groups"] >= 2 * 2
    assert run["sybil"]["keys"] >= 2 and run["sybil"]["bytes_per_key_per_receiver"] > 0
    assert run["honest_false_quarantines"] == 0


def test_gossip_messages_become_the_events_the_daemon_feeds():
    assert EVENT_FOR[SignedVerdict] == (VerdictReceived, False)
    assert EVENT_FOR[PolicyAnnouncement] == (PolicyAnnounced, False)
    assert EVENT_FOR[StepVerdict] == (StepVerdictReceived, False)


def test_adversaries_take_the_last_nodes_and_a_trainer_cheat_the_trainer():
    kinds = assign(parse_adversaries("collude:0.3,trainer-fake-weights,lazy:0.1"), 10)
    assert kinds[0] == "trainer-fake-weights"
    assert sorted(k for i, k in kinds.items() if i) == ["collude"] * 3 + ["lazy"]
    assert min(i for i in kinds if i) == 6


@given(st.lists(st.tuples(st.sampled_from(sorted(ALL_ADVERSARIES)), st.floats(0.01, 0.99)), max_size=4,
                unique_by=lambda t: t[0]))
def test_well_formed_specs_parse_back_to_what_they_say(parts):
    trainer_cheats = [k for k, _ in parts if k.startswith("trainer-")]
    text = ",".join(k if k.startswith("trainer-") else f"{k}:{share!r}" for k, share in parts)
    if len(trainer_cheats) > 1:
        with pytest.raises(SpecError):
            parse_adversaries(text)
        return
    specs = parse_adversaries(text)
    assert [s.kind for s in specs] == [k for k, _ in parts]
    assert all(s.share == (0.0 if k.startswith("trainer-") else share) for s, (k, share) in zip(specs, parts))


@given(st.text(max_size=40))
def test_any_text_either_parses_or_raises_spec_error_only(text):
    try:
        specs = parse_adversaries(text)
    except SpecError as error:
        assert str(error)
    else:
        assert all(s.kind in ALL_ADVERSARIES and 0 <= s.share < 1 for s in specs)


@pytest.mark.parametrize("text", ["nope:0.1", "collude:1.5", "collude:abc", "collude:0.1,collude:0.2",
                                  "trainer-fake-weights:0.1", "lazy:nan"])
def test_bad_specs_say_what_is_wrong(text):
    with pytest.raises(SpecError, match=text.split(",")[0].split(":")[0]):
        parse_adversaries(text)


def test_the_design_protocol_params_selects_runs_with_every_action_handled():
    for design in Verification:
        run = summary(nodes=6, rounds=2, design=design, adversaries=parse_adversaries("fabricated-reward"))
        assert run["unhandled"] == {} and run["rounds_measured"] == 2, design
        assert run["honest_false_quarantines"] == 0 and run["bad_groups_trained"] == 0, design


def test_bytes_by_kind_add_up_to_the_bytes_and_name_what_carried_them():
    """Each byte in or out is counted once under the topic, direct send, fetch, blob or backfill
    that carried it, so that what grows with N can be read off (specs/committee.md §9)."""
    run = summary(nodes=6, rounds=2, design="committee", adversaries=parse_adversaries("fabricated-reward"))
    for who in ("per_node", "per_node_trainer", "per_node_others"):
        row = run[who]
        kinds = row["bytes_by_kind"]
        assert sum(kinds.values()) == pytest.approx(row["bytes_per_round"], rel=1e-9), who
        assert kinds["blob"] == pytest.approx(row["blob_bytes"], rel=1e-9), who
    kinds = run["per_node_others"]["bytes_by_kind"]
    # Members fetch the groups they sit on by digest and send their verdicts to the trainer; the
    # manifest and the policy announcements are gossip (specs/network.md §3.5).
    assert {"fetch", "direct vrl/groups/1", "vrl/manifests/1", "vrl/policies/3"} <= set(kinds)
    assert all(value > 0 for kind, value in kinds.items() if kind != "direct answer"), kinds


def test_groups_of_a_round_still_open_at_the_stop_are_pending_and_of_a_closed_one_lost():
    """A run ends as the trainer announces its last version, while the newest rounds' groups
    are on their way: those are pending, not lost. A group of a round the trainer closed, or
    of one gone stale without a manifest, that it never held is lost (vrl/harness/simulator/metrics.py)."""
    sim = Simulation(SimConfig(nodes=8, rounds=4, design="committee"))
    run = sim.run(cpu_limit_s=120).summary
    assert run["groups_lost"] == run["groups_pending"] == 0 and run["rounds_never_closed"] == []
    start, end = run["versions"]
    fresh_from = end - sim.nodes[0].protocol.config.max_staleness
    closed = sorted(v for v in sim.metrics.closed_rounds if start <= v < fresh_from)
    assert closed and end - 1 not in sim.metrics.closed_rounds  # the newest round is still open
    stale_unclosed = next(v for v in range(start, fresh_from) if v not in sim.metrics.closed_rounds)
    maker = next(n.index for n in sim.nodes if n.index and n.kind == "")
    never_held = {bytes([i]) * 32: v for i, v in enumerate((closed[0], end - 1, end - 1, stale_unclosed))}
    for digest, version in never_held.items():
        sim.metrics.honest_groups[digest] = (maker, version)
        sim.metrics.published_at[digest] = sim.now
    sim.metrics.finish(sim, 1.0)
    again = sim.metrics.summary
    assert again["groups_pending"] == 2 and again["groups_lost"] == 2
    assert again["rounds_never_closed"] == [stale_unclosed]


def test_false_accusers_cost_rechecks_and_their_scores_but_no_honest_node_or_group():
    """The ``accuse`` adversary fails every honest group it is drawn for. Each failure is checked
    again by a fresh committee and the trainer, whose pass clears the group and charges the
    accuser a soft fail (specs/security.md, false accusation; specs/reputation.md §4 rule 3)."""
    sim = Simulation(SimConfig(nodes=12, rounds=5, design="committee", adversaries=parse_adversaries("accuse:0.25")))
    run = sim.run(cpu_limit_s=200).summary
    assert run["stopped"] == "done" and run["unhandled"] == {}
    assert run["honest_false_quarantines"] == 0 and run["bad_groups_trained"] == 0 and run["groups_lost"] == 0
    row = run["rounds_to_quarantine"]["accuse"]
    assert row["nodes"] == row["cheated"] == 3
    trainer = sim.nodes[0].protocol
    accusers = [trainer.standing(n.key.node_id) for n in sim.nodes if n.kind == "accuse"]
    honest = [trainer.standing(n.key.node_id) for n in sim.nodes if n.index and n.kind == ""]
    assert max(s.score for s in accusers) < min(s.score for s in honest)
    assert all(s.failures > 0 for s in accusers)
    assert run["withholding"]["honest"]["groups_trained"] > 0
    # The trainer's pass cleared nearly every accusation, those that came once their group was
    # stale too (vrl.node.rounds.late_rechecks): before, half stayed uncleared and honest
    # workers' scores fell to 0.3.
    # At the stop, every accusation is cleared or its re-check is under way at the trainer.
    passed = {v.group for v in trainer.reputation.reports() if v.reporter == trainer.me and v.outcome == "pass"}
    honest_ids = {n.key.node_id for n in sim.nodes if n.index and n.kind == ""}
    accusations = [r.group for r in trainer.reputation.reports() if r.subject in honest_ids and r.outcome != "pass"]
    assert accusations and sum(g in passed for g in accusations) >= 0.85 * len(accusations)
    assert all(g in passed or trainer.checking(g) for g in accusations)
    assert min(s.score for s in honest) > 0.5
    # They lose seats as they lose score (specs/committee.md §3.1): a quarter of the nodes, an
    # eighth of the last manifest's weight (with trust alone 0.28, their share of the nodes).
    assert row["weight_share"] < 0.2


def test_groups_made_ahead_in_another_process_change_no_result():
    """A Maker process makes workers' groups ahead (vrl.harness.simulator.making): each group's
    content is its own stream, so the run is the same, figure for figure, with or without one;
    only the CPU seconds differ."""
    def run(makers: int) -> dict:
        config = SimConfig(nodes=8, rounds=2, design="committee", makers=makers,
                           adversaries=parse_adversaries("fabricated-reward:0.2,replay:0.2"))
        simulation = Simulation(config)
        summary = simulation.run().summary
        made[makers] = simulation.maker.made_ahead
        return {k: v for k, v in summary.items() if "cpu" not in k and "wall" not in k and k != "makers"}, summary

    made: dict[int, int] = {}
    alone, _ = run(0)
    ahead, summary = run(1)
    assert made[0] == 0 and made[1] > 0  # the second run's groups did come from the maker
    for table in (alone, ahead):
        for row in table["per_round"]:
            row.pop("protocol_cpu_seconds")
        for who in ("per_node", "per_node_trainer", "per_node_others", "max_node", "totals_per_node"):
            table[who] = {k: v for k, v in table[who].items() if "cpu" not in k}
    assert ahead == alone
    assert summary["makers"] == 1 and summary["maker_cpu_seconds"] > 0
