"""The simulator shows withholding penalized and a flood's cost per fresh key within the bound of
specs/committee.md §7 (the committee design; small N and few rounds, so it takes seconds)."""

from __future__ import annotations

from vrl.harness.simulator import SimConfig, Simulation, parse_adversaries


def test_withholders_lose_score_not_freedom_and_a_flood_costs_no_verdict_signature_or_state():
    config = SimConfig(nodes=8, rounds=3, design="committee", adversaries=parse_adversaries("withhold:0.25,sybil"))
    run = Simulation(config).run(cpu_limit_s=240).summary
    assert run["stopped"] == "done" and run["unhandled"] == {}
    held = run["withholding"]
    assert held["withheld_slots_in_manifests"] > 0 and held["withhold"]["withheld_slots"] > 0
    assert held["withhold"]["median_score"] < held["honest"]["median_score"]
    assert held["withhold"]["median_failures"] > 0 == held["honest"]["median_failures"]
    assert held["withhold"]["quarantined"] == 0 and held["honest"]["quarantined"] == 0
    assert run["honest_false_quarantines"] == 0 and run["bad_groups_trained"] == 0
    cost = run["sybil_cost_at_honest_nodes"]
    assert cost["verdict_deliveries"] > 0 and cost["group_deliveries"] > 0
    # Every one of the keys' verdicts refused before its signature; only their groups' records are checked.
    refused = sum(v for k, v in cost.items() if k.startswith("verdicts_refused_") and k != "verdicts_refused_not")
    assert refused == cost["verdict_deliveries"]
    assert cost["signature_checks"] == cost["group_deliveries"] * config.group_size
    assert cost["state_trainer_verdicts_per_key"] == 0 and cost["trainer_reports_by_strangers"] == 0
    assert cost["state_trainer_groups_per_key"] <= 4 * (2 + 2)  # groups_per_round x (max_staleness + 2)


def test_honest_nodes_that_leave_for_a_round_are_absent_not_withholding():
    run = Simulation(SimConfig(nodes=8, rounds=3, design="committee", churn=0.2)).run(cpu_limit_s=240).summary
    assert run["churn"]["left"] > 0
    assert run["honest_false_quarantines"] == 0
    assert run["withholding"]["honest"]["withheld_slots"] == 0 and run["withholding"]["honest"]["quarantined"] == 0
