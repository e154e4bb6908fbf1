"""What a NodeProtocol keeps over a run is bounded (vrl.node.forgetting): real protocols driven
through many rounds by the simulator, once as they are and once with forgetting switched off,
give the same run (batches, scores, quarantines, every count the simulator reports), while only
the first keeps its groups, verdicts and per-group memos within a few rounds' worth."""

from __future__ import annotations

import json

import pytest

from tests.support import timeless
from vrl.harness.simulator import SimConfig, Simulation, parse_adversaries
from vrl.node import forgetting
from vrl.node.params import ProtocolParams, Verification

NODES, ROUNDS = 6, 12
S = ProtocolParams().max_staleness


def run(monkeypatch: pytest.MonkeyPatch, forget: bool, design: str) -> Simulation:
    with monkeypatch.context() as patch:
        if not forget:
            patch.setattr(forgetting, "forget", lambda node, version: None)
        sim = Simulation(SimConfig(nodes=NODES, rounds=ROUNDS, design=design, seed=5,
                                   adversaries=parse_adversaries("fabricated-reward:0.2")))
        sim.run(cpu_limit_s=240)
    return sim


def kept(p) -> dict[str, int]:
    """The sizes of what a protocol keeps per group and per verdict."""
    return p.held()


@pytest.mark.parametrize("design", list(Verification))
def test_forgetting_keeps_a_few_rounds_and_changes_nothing_of_the_run(monkeypatch, design):
    on, off = run(monkeypatch, True, design), run(monkeypatch, False, design)
    assert on.metrics.summary["stopped"] == off.metrics.summary["stopped"] == "done"
    # The same run: every count the simulator reports, every announced batch, every view's
    # scores (bit for bit) and quarantines.
    assert json.dumps(timeless(on.metrics.summary), sort_keys=True, default=str) == \
        json.dumps(timeless(off.metrics.summary), sort_keys=True, default=str)
    for a, b in zip(on.nodes, off.nodes, strict=True):
        if a.protocol is None:
            continue
        p, q = a.protocol, b.protocol
        assert p.version == q.version and p.policies == q.policies and p.quarantined == q.quarantined
        assert p.reputation.standings(p.version) == q.reputation.standings(q.version)
        assert p.reputation.reports() == q.reputation.reports()
        # Only groups of versions from the floor on are held; what was dropped is remembered
        # by digest and version only.
        assert p.group_floor == forgetting.group_floor(p.version, S) > 0
        assert all(g.version >= p.group_floor for g in p.groups.values())
        assert set(p.groups) | set(p.forgotten) == set(q.groups)
        assert all(q.groups[d].version == v for d, v in p.forgotten.items())
    # Reports outlive their verdicts, compact: one copy of each verifier id and platform
    # (forgetting.compact), whatever the verdicts decoded brought.
    reports = on.trainer.protocol.reputation.reports()
    assert len({id(r.reporter) for r in reports}) == len({r.reporter for r in reports}) < len(reports)
    assert len({id(r.platform) for r in reports}) == len({r.platform for r in reports})
    # Bounded: the trainer holds at most the groups of the rounds from the floor to the next one
    # (groups_per_round from each other node a round); without forgetting it holds every round's.
    trainer_on, trainer_off = kept(on.trainer.protocol), kept(off.trainer.protocol)
    bound = (2 * S + 3) * ProtocolParams().groups_per_round * (NODES - 1)
    assert trainer_on["groups"] <= bound < trainer_off["groups"]
    for name in trainer_on:
        assert trainer_on[name] < trainer_off[name], name
