"""The trainer's budget of loss confirmations per member (vrl/node/claims.py; specs/committee.md
§8 "Lost races"): a member's claims of lost races ask for the trainer's check only while it has
fewer than ``loss_claim_budget`` open or unconfirmed charges over the rounds still kept."""

from __future__ import annotations

import dataclasses
from functools import cache

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.test_protocol_committee import VERIFIERS, WORKER, round_zero, verifier
from vrl.harness.simulator.payloads import liar_claim
from vrl.node import protocol as P
from vrl.node.committee import Draw
from vrl.node.events import Send
from vrl.node.messages import Outcome, SignedVerdict
from vrl.node.params import ProtocolParams
from vrl.node.pooling import pooled_evidence

TOKENS = 200  # each group's replayed races
K_CLAIMS = 5  # of the six verifiers: p_v = 5/6, so the busiest member sits on three or four of the four groups
KEYS = {key.node_id: key for key in VERIFIERS}


@cache
def passes() -> dict[bytes, dict[bytes, SignedVerdict]]:
    """member -> {digest: its honest committee pass (no race lost)} over its round-0 seats. The
    round-0 manifest is a function of the keys alone (round_zero signs the same bytes each time)."""
    trainer, manifest, received = round_zero(lazy_audit_rate=0.0, committee_size=K_CLAIMS)
    out: dict[bytes, dict[bytes, SignedVerdict]] = {}
    for key in VERIFIERS:
        proto, actions = verifier(key, manifest, received, trainer)
        for check in (a for a in actions if isinstance(a, P.Check)):
            (sent,) = [a for a in proto.handle(P.Checked(check.group, (), b"\x09" * 32, TOKENS, 0))
                       if isinstance(a, Send)]
            verdict = SignedVerdict.from_bytes(sent.data)
            assert verdict.outcome == Outcome.PASS and verdict.draw == Draw.COMMITTEE
            out.setdefault(key.node_id, {})[check.group] = verdict
    return out


def stating(member: bytes, digest: bytes, lost: int) -> SignedVerdict:
    """``member``'s pass of its seat ``digest``, re-signed stating ``lost`` races lost."""
    honest = passes()[member][digest]
    return dataclasses.replace(honest, races_lost=lost, signature=b"").signed(KEYS[member])


def trainer_with(budget: int) -> P.NodeProtocol:
    trainer, manifest, _ = round_zero(lazy_audit_rate=0.0, loss_claim_budget=budget,  # no audits: only claims ask
                                      committee_size=K_CLAIMS)
    return trainer


def checks(actions: list) -> list[bytes]:
    return [a.group for a in actions if isinstance(a, P.Check)]


def busiest() -> bytes:
    """The member with the most seats (three or four of the four groups with these keys)."""
    member = max(passes(), key=lambda m: (len(passes()[m]), m))
    assert len(passes()[member]) >= 3
    return member


def test_a_liar_stating_losses_on_every_seat_costs_the_trainer_at_most_its_budget():
    """The simulator's liar (every race of every committee pass stated lost): with a budget of 1,
    its first claim brings the trainer's check; while that check is under way its next claims wait,
    and once the check finds none of the losses they ask for nothing more."""
    liar = busiest()
    trainer = trainer_with(1)
    digests = sorted(passes()[liar])
    lies = [SignedVerdict.from_bytes(liar_claim(passes()[liar][d].to_bytes(), KEYS[liar])) for d in digests]
    assert all(v.races_lost == v.race_tokens == TOKENS for v in lies)
    asked = checks(trainer.handle(P.VerdictReceived(lies[0])))
    assert asked == [digests[0]]
    for lie in lies[1:]:
        asked += checks(trainer.handle(P.VerdictReceived(lie)))
    assert asked == [digests[0]], "a second claim waits while the first charge is open"
    asked += checks(trainer.handle(P.Checked(digests[0], (), b"\x09" * 32, TOKENS, 0)))  # found none
    asked += checks(trainer.handle(P.Tick(7.0)))
    assert asked == [digests[0]], "an unconfirmed claim spent the budget: the liar's claims ask for nothing"
    # Without a budget every claim asks (what the budget bounds).
    unbounded = trainer_with(0)
    assert sum(len(checks(unbounded.handle(P.VerdictReceived(lie)))) for lie in lies) == len(lies)


def test_confirmed_claims_spend_nothing_so_an_honest_member_gets_every_loss_confirmed():
    """A spoofer's groups: the member states the losses its check found, the trainer's check finds
    the same, so each charge is released and every claim is checked, at a budget of 1; the
    confirmed losses enter the pooled test (vrl.node.pooling)."""
    member = busiest()
    trainer = trainer_with(1)
    digests = sorted(passes()[member])
    asked = []
    for digest in digests:
        asked += checks(trainer.handle(P.VerdictReceived(stating(member, digest, 1))))
        for check in list(asked):
            if trainer.me not in trainer.verdicts.get(check, {}):
                asked += checks(trainer.handle(P.Checked(check, (), b"\x09" * 32, TOKENS, 1)))
    assert sorted(asked) == digests
    view = trainer.reputation
    evidence = pooled_evidence(view.reports(), view.pretrusted, {v: 1.0 for v in view.pretrusted})[WORKER.node_id]
    assert evidence.lost == len(digests)


def test_a_claim_that_waited_for_an_open_charge_is_checked_once_that_charge_is_confirmed():
    member = busiest()
    trainer = trainer_with(1)
    first, second, *_ = sorted(passes()[member])
    assert checks(trainer.handle(P.VerdictReceived(stating(member, first, 1)))) == [first]
    assert checks(trainer.handle(P.VerdictReceived(stating(member, second, 1)))) == []  # waits: no room
    # The trainer's check of the first group finds the loss: the charge is released, the second asks.
    assert checks(trainer.handle(P.Checked(first, (), b"\x09" * 32, TOKENS, 1))) == [second]


def test_a_group_is_charged_to_the_claimant_with_room_stating_the_fewest_losses():
    liar, *_ = sorted(passes(), key=lambda m: -len(passes()[m]))
    trainer = trainer_with(1)
    first, second = sorted(passes()[liar])[:2]
    others = [m for m in passes() if m != liar and second in passes()[m]]
    assert others, "another member sits on the liar's second group"
    assert checks(trainer.handle(P.VerdictReceived(stating(liar, first, TOKENS)))) == [first]
    trainer.handle(P.Checked(first, (), b"\x09" * 32, TOKENS, 0))  # the liar's budget is spent
    assert checks(trainer.handle(P.VerdictReceived(stating(liar, second, TOKENS)))) == []
    # An honest member's claim on the same group asks, charged to it, not the liar.
    assert checks(trainer.handle(P.VerdictReceived(stating(others[0], second, 1)))) == [second]


def test_the_default_budget_is_the_pooled_tests_need():
    """ProtocolParams.loss_claim_budget's note: 8 losses reject a spoofer at 10 q0 (float32 CPU)
    within ~2,500 tokens, and 7 do not reject it at that rate's token count."""
    from vrl.rollouts.profiles import profile_of_platform
    from vrl.rollouts.sequential import ALPHA, log_e_value, threshold

    q0 = profile_of_platform("torch-2.13.0+cpu/cpu-AVX512/float32/sdpa/threads-1").race_loss_rate
    budget = ProtocolParams().loss_claim_budget
    assert log_e_value(2_500, budget, q0) >= threshold(ALPHA)
    assert log_e_value(round((budget - 1) / (10 * q0)), budget - 1, q0) < threshold(ALPHA)


def test_charges_are_forgotten_with_their_round():
    liar = busiest()
    trainer = trainer_with(1)
    digest = sorted(passes()[liar])[0]
    trainer.handle(P.VerdictReceived(stating(liar, digest, TOKENS)))
    assert trainer.rounds.claims.held() == 1
    trainer.rounds.forget(1)
    assert trainer.rounds.claims.held() == 0


def test_the_budget_spans_the_rounds_kept_so_a_liar_costs_it_once_per_window_not_each_round():
    """Unconfirmed charges of one round leave a member no room in the next ones until their
    round is forgotten (max_staleness + 2 rounds kept): a liar costs the trainer ``B`` checks per
    window of kept rounds, not ``B`` a round."""
    from vrl.node.claims import LossClaims

    liar, other = sorted(passes())[:2]
    found_none = {}  # digest -> the trainer's own verdict, stating no loss (a refuted claim)

    def own(digest):
        return found_none.get(digest)

    def claim(member, round_, i, lost=TOKENS):
        digest = bytes([round_, i]) * 16
        return dataclasses.replace(next(iter(passes()[member].values())), group=digest, races_lost=lost)

    refuted = stating(liar, sorted(passes()[liar])[0], 0)
    claims, budget = LossClaims(), 2
    for i in range(budget):
        lie = claim(liar, 0, i)
        assert claims.pick([lie], budget, own) == lie
        claims.charge(0, lie, budget)
        found_none[lie.group] = dataclasses.replace(refuted, group=lie.group)
    for round_ in (1, 2, 3):  # rounds 0-3 kept: round 0's refuted charges leave no room
        assert claims.pick([claim(liar, round_, 0)], budget, own) is None
        honest = claim(other, round_, 0, lost=1)
        assert claims.pick([claim(liar, round_, 0), honest], budget, own) == honest  # others unaffected
    claims.forget(1)  # round 4 begins: round 0 is no longer kept
    assert claims.held() == 0
    lie = claim(liar, 4, 0)
    assert claims.pick([lie], budget, own) == lie


STEPS = st.lists(st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(sorted(KEYS)), st.integers(0, 3), st.integers(1, 3)),
    st.tuples(st.just("done"), st.integers(0, 3), st.integers(0, 3)),
), max_size=24)


@settings(max_examples=100, deadline=None)
@given(budget=st.integers(1, 2), steps=STEPS)
@example(budget=1, steps=[("claim", VERIFIERS[2].node_id, 0, 1), ("claim", VERIFIERS[2].node_id, 1, 1)])  # 3 seats
def test_the_trainers_unconfirmed_checks_never_exceed_the_budget_per_claimant(budget, steps):
    """Over any sequence of claims (member, one of its seats, races stated) and the trainer's
    checks completing (a group under way, races found): every check the trainer asks for either
    found at least the fewest losses stated on its group when it was asked (confirmed), or is one
    of at most ``budget`` per member that stated losses."""
    trainer = trainer_with(budget)
    asked: dict[bytes, int] = {}  # digest -> the fewest races stated on it when the check was asked
    stated: dict[bytes, dict[bytes, int]] = {}
    found: dict[bytes, int] = {}
    claimants: set[bytes] = set()
    for step in steps:
        if step[0] == "claim":
            _, member, seat, lost = step
            seats = sorted(passes().get(member, {}))
            if not seats:
                continue
            digest = seats[seat % len(seats)]
            if member in stated.get(digest, {}):
                continue  # a member's one verdict on a group (a second is not a new claim)
            claimants.add(member)
            stated.setdefault(digest, {})[member] = lost
            actions = trainer.handle(P.VerdictReceived(stating(member, digest, lost)))
        else:
            _, which, races = step
            running = sorted(d for d in asked if d not in found)
            if not running:
                continue
            digest = running[which % len(running)]
            found[digest] = races
            actions = trainer.handle(P.Checked(digest, (), b"\x09" * 32, TOKENS, races))
        for digest in checks(actions):
            assert digest not in asked, "one check a group"
            asked[digest] = min(stated[digest].values())
        assert trainer.rounds.claims.held() <= budget * len(claimants)  # the state is bounded too
    confirmed = sum(1 for d, fewest in asked.items() if found.get(d, -1) >= fewest)
    assert len(asked) - confirmed <= budget * len(claimants)
    # One claimant alone: its unconfirmed checks are at most the budget, whatever it stated.
    if len(claimants) == 1:
        assert len(asked) - confirmed <= budget


def test_the_simulators_liars_state_every_race_lost_and_cost_the_trainer_fewer_checks_within_the_budget():
    """The simulator's ``liar`` adversary (vrl.harness.simulator.payloads.liar_claim): its committee
    passes reach the trainer stating every race lost, on a platform the trainer does not share bit
    for bit (so it is not hard-failed at its first refuted claim); the budget cuts the trainer's checks."""
    from vrl.harness.simulator import SimConfig, Simulation, parse_adversaries
    from vrl.harness.simulator.payloads import LIAR_PLATFORM

    def run(budget: int) -> tuple[float, list[SignedVerdict]]:
        sim = Simulation(SimConfig(nodes=12, rounds=3, design="committee", adversaries=parse_adversaries("liar:0.2"),
                                   admission={"batch_groups": 44}, protocol={"loss_claim_budget": budget}))
        sim.run()
        liars = {n.key.node_id for n in sim.nodes if n.kind == "liar"}
        trainer = sim.nodes[0].protocol
        lies = [v for held in trainer.verdicts.values() for v in held.values()
                if v.verifier in liars and v.draw == Draw.COMMITTEE and v.outcome == Outcome.PASS]
        return sim.metrics.counters["checks"][0], lies

    bounded, lies = run(1)
    assert lies and all(v.races_lost == v.race_tokens > 0 and v.platform == LIAR_PLATFORM for v in lies)
    unbounded, _ = run(0)
    assert bounded < unbounded
