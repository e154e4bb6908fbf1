"""The audit's ``committees`` check (specs/audit.md §3, specs/committee.md): every committee
drawn again from the log. Each finding is made here from stores written as a node writes them
(vrl.node.store), each holding one kind of bad claim; a member's honest claim is no finding."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vrl.audit
from proofs import vrf
from tests import fuzzing
from vrl.audit import Severity
from vrl.node import committee
from vrl.node.committee import SEATS, Draw
from vrl.node.messages import (
    ManifestLists,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    Submission,
    audit_ticket,
)
from vrl.node.store import Store
from vrl.rollouts.keys import NodeKey

TRAINER = NodeKey.from_seed(hashlib.sha256(b"audit committee trainer").digest())
A, B, STRANGER = (NodeKey.from_seed(hashlib.sha256(b"audit committee %d" % i).digest()) for i in range(3))
K = 1  # with A and B at full weight, each sits on a group's committee with probability 1/2
GROUPS = tuple(sorted(hashlib.sha256(b"group %d" % i).digest() for i in range(16)))
WEIGHTS = tuple(sorted(((A.node_id, 65536), (B.node_id, 65536))))


Manifest = tuple  # (the signed header, the lists behind it: committee.PagedManifest)


def manifest(round_: int = 0, weights: tuple = WEIGHTS, groups: tuple = GROUPS) -> Manifest:
    content = committee.ManifestContent(round_, committee.WeightsTable(K, weights), groups,
                                        ((fuzzing.KEY.node_id, len(groups)),))
    paged = committee.PagedManifest(content)
    return RoundManifest.of(TRAINER.node_id, paged.header).signed(TRAINER), paged


def claim(key: NodeKey, m: Manifest, group: bytes, draw: Draw) -> dict:
    """The claim fields of ``key``'s verdict on ``group`` (specs/committee.md §4): its place and
    path, and for a drawn check ``key``'s weights entry (A's, for a key not in the list)."""
    paged = m[1]
    at = paged.content.groups.index(group) if group in paged.content.groups else 0
    fields = {"seat": at, "seat_path": paged.trees[committee.List.GROUPS].prove([at])}
    if draw in SEATS:
        nodes = [n for n, _ in paged.content.weights.entries]
        j = nodes.index(key.node_id) if key.node_id in nodes else nodes.index(A.node_id)
        fields.update(weight_at=j, weight=paged.content.weights.entries[j][1],
                      weight_path=paged.trees[committee.List.WEIGHTS].prove([j]))
    return fields


def seat(key: NodeKey, m: Manifest, member: bool, draw: Draw = Draw.COMMITTEE) -> tuple[bytes, bytes]:
    """(pi, a group of ``m`` on whose committee ``key`` sits, or does not)."""
    header, content = m[1].header, m[1].content
    pi = vrf.prove(key.private_seed(), header.alpha(draw))
    beta = vrf.proof_to_hash(pi)
    threshold = header.threshold(content.weights.weight(key.node_id))
    return pi, next(d for i, d in enumerate(content.groups) if (header.seat_value(beta, i) < threshold) == member)


def verdict(key: NodeKey, group: bytes, draw: Draw, pi: bytes = b"", outcome: str = "pass",
            round_: int = 0, m: Manifest | None = None) -> SignedVerdict:
    """(A skip with a seat does not decode at all (vrl.node.messages): no finding needed.) With
    ``m``, the claim its round's lists give (:func:`claim`)."""
    fields = claim(key, m, group, draw) if m is not None and draw != Draw.TICKET else {}
    return SignedVerdict(key.node_id, fuzzing.KEY.node_id, group, round_, round_,
                         audit_ticket(key, group) if draw == Draw.TICKET else b"", 1.0, outcome, (),
                         b"" if outcome == "skipped" else b"\x05" * 32, "p", draw=draw, pi=pi, **fields).signed(key)


def write(path: Path, owner: NodeKey, manifests=(), verdicts=(), groups=(), policies=(),
          announced: float = 2.0) -> Path:
    """A store as ``owner``'s node writes it: version 0 at 1.0, ``policies`` at ``announced``, the
    manifests at 3.0, the groups at 4.0, and the i-th verdict at 5.0 + i."""
    store = Store(path / owner.node_id.hex()[:8] / "node.sqlite")
    store.claim(owner.node_id)
    store.put_policy(PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 5).signed(TRAINER), 1.0)
    for a in policies:
        store.put_policy(a, announced)
    for header, paged in manifests:  # the lists behind each header are the trainer's alone
        store.put_manifest(header, 3.0, ManifestLists.of(paged.content) if owner == TRAINER else None)
    for g in groups:
        store.put_group(g, fuzzing.KEY.node_id, 0, 4.0)
    for i, v in enumerate(verdicts):
        store.put_verdict(v, 5.0 + i)
    store.close()
    return store.path


def committee_findings(*paths: Path) -> list:
    with vrl.audit.open(list(paths)) as audit:
        report = audit.run(checks=["committees"])
    return [f for f in report.findings if f.check == "committees"]


def test_a_members_claim_stands_and_every_bad_claim_is_found_against_its_signer(tmp_path):
    m = manifest()
    pi_a, member = seat(A, m, True)
    _, not_member = seat(A, m, False)
    pi_b, _ = seat(B, m, True)
    forged = bytearray(pi_a)
    forged[40] ^= 1
    pi_stranger = vrf.prove(STRANGER.private_seed(), m[1].header.alpha(Draw.COMMITTEE))
    unlisted = hashlib.sha256(b"not listed").digest()
    cases = {  # code -> the verdict that must make it
        None: verdict(A, member, Draw.COMMITTEE, pi_a, m=m),
        "not_drawn": verdict(A, not_member, Draw.COMMITTEE, pi_a, m=m),
        "bad_proof": verdict(B, member, Draw.COMMITTEE, bytes(forged), m=m),
        "not_eligible": verdict(STRANGER, member, Draw.COMMITTEE, pi_stranger, m=m),  # A's entry
        "not_in_manifest": verdict(B, unlisted, Draw.COMMITTEE, pi_b, m=m),
        "no_claim": verdict(A, next(d for d in GROUPS if d not in (member, not_member)), Draw.NONE, m=m),
    }
    # One verdict per (group, verifier) is stored (vrl.node.store): the others on other groups.
    ticket = verdict(B, GROUPS[-1] if GROUPS[-1] != member else GROUPS[0], Draw.TICKET)
    path = write(tmp_path, A, manifests=[m], verdicts=[*cases.values(), ticket,
                                                       verdict(TRAINER, GROUPS[3], Draw.NONE, m=m)])
    found = committee_findings(path)
    by_verdict = {f.evidence["verdict"]: f for f in found}
    assert cases[None].id.hex() not in by_verdict  # the member's claim stands
    for code, v in cases.items():
        if code is not None:
            f = by_verdict.get(v.id.hex())
            assert f is not None, (code, sorted(f.code for f in found))
            assert (f.code, f.severity, f.subject) == (code, Severity.ERROR, v.verifier.hex()), f
    assert by_verdict[ticket.id.hex()].code == "not_eligible"
    assert len(found) == len(cases)  # the trainer's own check (draw none) is no finding either
    # The trainer's reveal of a plant its round's manifest does not list (planted after the round
    # closed, or in a round never closed) claims no seat: no finding; any other signer's is.
    reveal = SignedVerdict(TRAINER.node_id, fuzzing.KEY.node_id, unlisted, 9, 9, b"", 1.0, "hard_fail", ("planted",),
                           b"\x05" * 32, "p", planted=True, draw=Draw.NONE).signed(TRAINER)
    assert committee_findings(write(tmp_path / "p", A, manifests=[m], verdicts=[reveal])) == []
    # A recheck seat is drawn from its own alpha: the committee draw's proof does not stand for it.
    recheck_pi, recheck_member = seat(A, m, True, Draw.RECHECK)
    path = write(tmp_path / "r", A, manifests=[m], verdicts=[
        verdict(A, recheck_member, Draw.RECHECK, recheck_pi, m=m),
        verdict(A, next(d for d in GROUPS if d != recheck_member), Draw.RECHECK, pi_a, m=m)])
    assert [f.code for f in committee_findings(path)] == ["bad_proof"]


def test_a_claim_without_its_manifest_is_a_warning_that_incriminates_no_one(tmp_path):
    m = manifest()
    pi, member = seat(A, m, True)
    path = write(tmp_path, A, verdicts=[verdict(A, member, Draw.COMMITTEE, pi, m=m)],
                 manifests=[manifest(round_=1)])  # another round's: the run is a committee run
    [f] = committee_findings(path)
    assert (f.code, f.severity, f.subject) == ("manifest_missing", Severity.WARNING, "")


def test_two_manifests_of_one_round_are_the_trainers_equivocation(tmp_path):
    one = write(tmp_path / "a", A, manifests=[manifest()])
    two = write(tmp_path / "b", B, manifests=[manifest(groups=GROUPS[:4])])
    found = committee_findings(one, two)
    assert [(f.code, f.severity, f.subject) for f in found] == [
        ("manifest_equivocation", Severity.ERROR, TRAINER.node_id.hex())]


@pytest.mark.parametrize("weights, differs", [((), False), (WEIGHTS, True)])
def test_the_weights_table_is_rederived_from_the_trainers_store(tmp_path, weights, differs):
    """No reports in the trainer's store: its view weighs no one, so the only table it can sign
    is the empty one (specs/committee.md §3.1); a table naming A and B is not its view's."""
    path = write(tmp_path, TRAINER, manifests=[manifest(weights=weights)])
    found = committee_findings(path)
    assert [(f.code, f.severity, f.subject) for f in found] == (
        [("weights_differ", Severity.WARNING, TRAINER.node_id.hex())] if differs else [])
    if differs:
        assert found[0].evidence["signed"] == {A.node_id.hex(): 65536, B.node_id.hex(): 65536}


def test_a_trained_group_its_rounds_manifest_does_not_list_is_found(tmp_path):
    group = fuzzing.group()
    announced = PolicyAnnouncement(TRAINER.node_id, 1, b"\x03" * 32, b"\x04" * 32, 5,
                                   batch=((group.digest, 1.0),)).signed(TRAINER)
    # Checked against the lists the trainer's store holds (the header alone lists nothing).
    path = write(tmp_path, TRAINER, manifests=[manifest(weights=(), groups=GROUPS)], groups=[group],
                 policies=[announced])
    assert [(f.code, f.subject) for f in committee_findings(path)] == [("trained_unlisted", TRAINER.node_id.hex())]
    listed = write(tmp_path / "ok", TRAINER, manifests=[manifest(weights=(), groups=tuple(sorted((*GROUPS,
                                                                                                  group.digest))))],
                   groups=[group], policies=[announced])
    assert committee_findings(listed) == []


def test_a_members_verdict_replays_as_the_drawn_evidence_its_node_counted(tmp_path):
    """The reputation check rebuilds a store's view from its verdicts: a member's claim is drawn
    evidence (vrl.node.reputation.report_of), so a rebuild that lost the claim weighed every
    committee network's races otherwise, and found its own nodes' snapshots forged."""
    from vrl.audit.checks import stored_reports
    from vrl.audit.index import index_run
    from vrl.audit.sources import open_inputs
    from vrl.node.reputation import report_of

    m = manifest()
    group = fuzzing.group()
    pi, _ = seat(A, m, True)
    claimed = SignedVerdict(**{**verdict(A, group.digest, Draw.COMMITTEE, pi, m=m).__dict__, "race_tokens": 16,
                               "signature": b""}).signed(A)
    inputs = open_inputs(write(tmp_path, B, manifests=[m], groups=[group], verdicts=[claimed]))
    try:
        [index] = index_run(inputs, lambda *_: None, []).stores
        [(_, report)] = stored_reports(index)
    finally:
        inputs.close()
    assert report == report_of(claimed, fuzzing.KEY.node_id, 0) and report.drawn


def test_a_ticket_network_has_no_committees_to_check(tmp_path):
    path = write(tmp_path, A, verdicts=[verdict(A, GROUPS[0], Draw.TICKET)])
    with vrl.audit.open([path]) as audit:
        report = audit.run(checks=["committees"])
    assert not [f for f in report.findings if f.check == "committees"]


@pytest.fixture(scope="module")
def committee_store(tmp_path_factory) -> Path:
    m = manifest()
    pi, member = seat(A, m, True)
    return write(tmp_path_factory.mktemp("committee"), TRAINER, manifests=[m, manifest(round_=1, weights=())],
                 verdicts=[verdict(A, member, Draw.COMMITTEE, pi, m=m),
                           verdict(TRAINER, GROUPS[1], Draw.NONE, m=m)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["manifests", "manifest_lists", "verdicts"]), row=st.integers(0, 1),
       column=st.integers(0, 7),
       payload=st.one_of(st.binary(max_size=300), st.text(max_size=50), st.integers(-2**63, 2**63 - 1),
                         st.floats(allow_nan=True), st.none()))
def test_any_value_in_a_manifest_or_verdict_column_is_a_finding_or_an_audit_error(committee_store, tmp_path_factory,
                                                                                   table, row, column, payload):
    """Hostile bytes where the committees check reads: a finding or an AuditError naming the
    store, never a traceback (specs/audit.md §1)."""
    target = fuzzing.store_with_column_set(committee_store, tmp_path_factory.mktemp("h"), table, row, column, payload)
    if target is None:
        return  # the database itself refuses it
    try:
        with vrl.audit.open([target]) as audit:
            report = audit.run(checks=["committees"])
    except vrl.audit.AuditError as error:
        assert str(target) in str(error)
        return
    assert all(isinstance(f, vrl.audit.Finding) for f in report.findings)


# -- admission's trusted share in the committee design (specs/committee.md §8, reputation.md §6) ------
#
# Four groups of fuzzing.KEY, a node no anchor ever checked (score below trusted_score in every
# view here), trained at version 1. At trusted_share 0.5 a batch may hold at most as many
# untrusted groups as trusted ones, so the four are within it only if each counts as checked:
# a pass before the announcement by an anchor, or in the committee design by a member of its
# committee. The trainer's own store is audited, as the node wrote it.

CANDIDATES = tuple(Submission.of([fuzzing.rollout(i, 2, group_index=g) for i in range(2)]) for g in range(16))


@pytest.fixture(scope="module")
def seated() -> tuple[Manifest, tuple[Submission, ...], tuple[SignedVerdict, ...]]:
    """Round 0's manifest listing the candidates, four of them, and on each a member's pass whose
    claim the manifest proves: the first from a recheck seat (so that the arrival-time test below
    fails if a recheck pass does not count), the other three from committee seats."""
    m = manifest(groups=tuple(sorted(g.digest for g in CANDIDATES)))
    seats = []  # (draw, key, pi, beta, threshold)
    header, content = m[1].header, m[1].content
    for draw in (Draw.COMMITTEE, Draw.RECHECK):
        for key in (A, B):
            pi = vrf.prove(key.private_seed(), header.alpha(draw))
            seats.append((draw, key, pi, vrf.proof_to_hash(pi), header.threshold(content.weights.weight(key.node_id))))
    chosen: list[tuple[Submission, SignedVerdict]] = []
    for wanted, count in ((Draw.RECHECK, 1), (Draw.COMMITTEE, 3)):
        for g in (g for g in CANDIDATES if g not in [c[0] for c in chosen]):
            at = content.groups.index(g.digest)
            seat_ = next(((key, pi) for draw, key, pi, beta, threshold in seats
                          if draw == wanted and header.seat_value(beta, at) < threshold), None)
            if seat_ is not None and count > 0:
                chosen.append((g, verdict(seat_[0], g.digest, wanted, seat_[1], m=m)))
                count -= 1
    assert len(chosen) == 4  # 16 groups, two verifiers each seated with probability 1/2: never short
    return m, tuple(g for g, _ in chosen), tuple(v for _, v in chosen)


KEYS = {A.node_id: A, B.node_id: B}


def announce(groups) -> PolicyAnnouncement:
    return PolicyAnnouncement(TRAINER.node_id, 1, b"\x03" * 32, b"\x04" * 32, 5,
                              batch=tuple((d, 1.0) for d in sorted(g.digest for g in groups))).signed(TRAINER)


def share_findings(path: Path) -> tuple[list, list]:
    """(the trusted_share findings as (untrusted, allowed, subject), the committees check's errors)."""
    with vrl.audit.open([path]) as audit:
        report = audit.run(checks=["committees", "admission"])
    return ([(f.evidence["untrusted"], f.evidence["allowed"], f.subject) for f in report.findings
             if f.code == "trusted_share"],
            [f for f in report.findings if f.check == "committees" and f.severity == Severity.ERROR])


def test_members_passes_before_the_announcement_make_untrusted_groups_count_as_checked(tmp_path, seated):
    m, groups, passes = seated
    path = write(tmp_path, TRAINER, manifests=[m], groups=groups, verdicts=passes, policies=[announce(groups)],
                 announced=100.0)
    share, committee_errors = share_findings(path)
    assert committee_errors == []  # every claim is a member's: the passes are the committee's own
    assert {v.draw for v in passes} == {Draw.COMMITTEE, Draw.RECHECK}
    assert share == []


@pytest.mark.parametrize("on_time", range(5))
def test_a_members_pass_counts_only_if_it_arrived_before_the_announcement(tmp_path, seated, on_time):
    """The i-th pass arrives at 5.0 + i; the batch is announced between the ``on_time``-th and the
    next. Trusted = on_time, untrusted = 4 - on_time, allowed = min(8, trusted): a breach below 2."""
    m, groups, passes = seated
    path = write(tmp_path, TRAINER, manifests=[m], groups=groups, verdicts=passes, policies=[announce(groups)],
                 announced=4.5 + on_time)
    share, committee_errors = share_findings(path)
    assert committee_errors == []
    assert share == ([(4 - on_time, on_time, TRAINER.node_id.hex())] if on_time < 2 else [])


@pytest.mark.parametrize("passes", ["none", "ticket_draw"])
def test_without_a_members_pass_the_untrusted_groups_breach_the_trusted_share(tmp_path, seated, passes):
    """No verdicts at all; or the same verifiers' passes drawn by ticket, which claim no seat (the
    committees check finds each not_eligible) and make no group checked."""
    m, groups, seated_passes = seated
    verdicts = [] if passes == "none" else [verdict(KEYS[v.verifier], v.group, Draw.TICKET)
                                            for v in seated_passes]
    path = write(tmp_path, TRAINER, manifests=[m], groups=groups, verdicts=verdicts, policies=[announce(groups)],
                 announced=100.0)
    share, committee_errors = share_findings(path)
    assert share == [(4, 0, TRAINER.node_id.hex())]
    assert [f.code for f in committee_errors] == ["not_eligible"] * len(verdicts)


@pytest.mark.parametrize("verification, manifests, anchors, breach", [
    ("committee", True, False, False),  # node.toml says committee: the members' passes count
    ("tickets", True, False, True),  # node.toml says tickets: a stored manifest does not make it a committee run
    (None, False, False, True),  # no node.toml, no manifest: a ticket network
    ("tickets", True, True, False),  # an anchor's pass counts in either design (A and B configured pre-trusted)
])
def test_in_a_ticket_network_only_an_anchors_pass_counts(tmp_path, seated, verification, manifests, anchors, breach):
    m, groups, passes = seated
    path = write(tmp_path, TRAINER, manifests=[m] if manifests else [], groups=groups, verdicts=passes,
                 policies=[announce(groups)], announced=100.0)
    if verification is not None:
        pretrusted = ", ".join(f'"{k.node_id.hex()}"' for k in ((A, B) if anchors else ()))
        (path.parent / "node.toml").write_text(f'data_dir = "."\ntrainer = "{TRAINER.node_id.hex()}"\n'
                                               f'pretrusted = [{pretrusted}]\n'
                                               f'[protocol]\nverification = "{verification}"\n')
    share, _ = share_findings(path)
    assert share == ([(4, 0, TRAINER.node_id.hex())] if breach else [])


@pytest.mark.parametrize("toml", [False, True])
def test_a_store_without_its_node_toml_is_held_to_a_nodes_own_admission_defaults(tmp_path, toml):
    """A node whose node.toml sets no [admission] takes ceil(0.34 x 12) = 5 groups of one node
    (vrl.node.config.NODE_OVERRIDES); an audit of its bare store must not hold it to
    AdmissionConfig's own 0.25 x 16 (vrl train's), a cap of 4: no node_cap, whether or not the
    node.toml is among the inputs. The five are the trainer's own passes, so trusted."""
    groups = CANDIDATES[:5]
    path = write(tmp_path, TRAINER, groups=groups, verdicts=[verdict(TRAINER, g.digest, Draw.NONE)
                                                             for g in groups], policies=[announce(groups)],
                 announced=100.0)
    if toml:
        (path.parent / "node.toml").write_text(f'data_dir = "."\ntrainer = "{TRAINER.node_id.hex()}"\n')
    with vrl.audit.open([path]) as audit:
        report = audit.run(checks=["admission"])
    assert [f.code for f in report.findings if f.check == "admission"] == []
    assert report.stats["admission"]["node cap"] == 5


def test_the_weights_table_is_rederived_with_the_withheld_slots_of_earlier_manifests(tmp_path):
    """specs/committee.md §3.1, §7.1: a seat weighs reporter weight times score, and the slots a
    manifest shows a worker withheld lower its score from then on, at the trainer as in the
    audit's replay. W earns the trainer's passes, manifest 0 lists 1 of its 4 slots, and the
    trainer signs manifest 1 with the withheld slots counted: no finding. An audit that left
    them out warned weights_differ on a 12-node devnet (W's 44,694 replayed, 34,808 signed)."""
    from vrl.node.committee import WeightsTable, seat_weights
    from vrl.node.reputation import Reputation, report_of, withheld_of

    worker = fuzzing.KEY
    groups = [Submission.of([fuzzing.rollout(i, 2, group_index=g) for i in range(2)]) for g in range(3)]
    passes = [SignedVerdict(TRAINER.node_id, worker.node_id, g.digest, 0, 0, b"", 1.0, "pass", (), b"\x05" * 32,
                            "p", draw=Draw.NONE).signed(TRAINER) for g in groups]
    view = Reputation(frozenset({TRAINER.node_id}))
    for v in passes:
        view.add(report_of(v, worker.node_id, 0))

    def signed(round_: int, group: Submission) -> Manifest:
        table = WeightsTable.heaviest(K, seat_weights(view.standings(round_), TRAINER.node_id))
        paged = committee.PagedManifest(committee.ManifestContent(round_, table, (group.digest,),
                                                                  ((worker.node_id, 1),)))
        return RoundManifest.of(TRAINER.node_id, paged.header).signed(TRAINER), paged

    first = signed(0, groups[0])
    without = signed(1, groups[1])
    for record in withheld_of(first[1].content, 4):  # ProtocolParams().groups_per_round: 3 slots withheld
        view.add_withheld(record)
    second = signed(1, groups[1])
    weight = {m: dict(m[1].content.weights.entries)[worker.node_id] for m in (second, without)}
    assert abs(weight[second] - weight[without]) > 1  # they matter

    store = Store(tmp_path / "trainer" / "node.sqlite")
    store.claim(TRAINER.node_id)
    store.put_policy(PolicyAnnouncement(TRAINER.node_id, 0, b"\x01" * 32, b"\x02" * 32, 5).signed(TRAINER), 1.0)
    for i, (g, v) in enumerate(zip(groups, passes, strict=True)):
        store.put_group(g, worker.node_id, 0, 1.5)
        store.put_verdict(v, 2.0 + i / 10)
    store.put_manifest(first[0], 3.0, ManifestLists.of(first[1].content))
    store.put_manifest(second[0], 4.0, ManifestLists.of(second[1].content))
    store.close()
    # (Passes on groups 1 and 2 of round 0, which manifest 0 does not list, are not_in_manifest.)
    assert "weights_differ" not in [f.code for f in committee_findings(store.path)]
