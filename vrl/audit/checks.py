"""The audit's checks (specs/audit.md §3) after the first pass, each a function of the run
that adds findings.

The first pass (:func:`vrl.audit.index.index_run`, the ``signatures`` check) reads every store
once and keeps a compact index of the log; these checks read that index, and fetch a group's
records by digest only when they re-execute something.

Who a finding incriminates is always derived from signatures, never from a field a message
asserts (specs/security.md §1): a group's node is the signer of its records, a verdict's
verifier is its signer, a step's trainer is the announcement's signer.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import Counter, defaultdict
from collections.abc import Iterator

from vrl.audit.findings import Finding, Severity
from vrl.audit.index import GroupHead, Run, StoreIndex, VerdictHead, file_records, finding, short
from vrl.audit.registry import REGISTRY, CheckContext
from vrl.node.admission import AdmissionConfig
from vrl.node.committee import SEATS, Draw
from vrl.node.config import node_default
from vrl.node.messages import (
    Outcome,
    PolicyAnnouncement,
    SignedVerdict,
    StepVerdict,
)
from vrl.node.params import Verification
from vrl.node.reputation import Report, Reputation, ReputationError, Standing, Withheld, report_of, withheld_of
from vrl.rollouts.profiles import profile_of_platform
from vrl.rollouts.record import Rollout
from vrl.rollouts.sequential import RACE_LOSSES, RaceTest, threshold

# -- tolerances (specs/audit.md §4 gives each its source) -------------------------------------------
# A replayed reputation score against the node's own snapshot: both are the same float64 code
# over the same reports, so they agree to the last bit when nothing differs; 1e-9 only absorbs
# the order a set of reports is summed in.
SCORE_TOLERANCE = 1e-9
# A re-measured held-out accuracy against the trainer's claim. On the trainer's own platform
# the evaluation is deterministic (fixed seeds, vrl.rl.evaluate) and must agree exactly; on
# another, a problem whose answer wins its sampling race by less than float noise may flip:
# two problems' worth for sampled accuracy, and 0.005 for expected accuracy (a sum of
# probabilities, whose float32 noise across ISAs is ~1e-6 per problem: far inside).
ACCURACY_PROBLEMS_ACROSS_PLATFORMS = 2
EXPECTED_ACCURACY_ACROSS_PLATFORMS = 0.005
# Expected accuracy on the trainer's own platform: the mean of per-problem probabilities, which
# a float32 sum in batches and a float64 sum of the same values put 4e-10 to 8e-9 apart
# (measured on a 20-version base-model devnet, python bench/devnet.py audit: 0.2150936994 against
# 0.2150936914); 1e-6 is far above that and far below one problem's share (1/128).
EXPECTED_ACCURACY_SAME_PLATFORM = 1e-6
# Which groups and versions a sampled check re-executes: a hash of the item, not a choice, so
# two audits of one run at one share re-execute the same items (steps: vrl.audit.replay.SAMPLE_DOMAIN).
ITEM_DOMAIN = b"vrl/audit-item/v1\x00"

#: A batch entry as the checks read it: the group's digest, its weight, and the group's head
#: where some store holds the group.
BatchHead = tuple[bytes, float, GroupHead | None]


def sampled(key: bytes, share: float) -> bool:
    """Whether an audit re-executing a ``share`` of the items re-executes this one."""
    return int.from_bytes(hashlib.sha256(ITEM_DOMAIN + key).digest()[:8], "big") < share * 2**64


# -- reputation ------------------------------------------------------------------------------------

def reputation_view(run: Run, owner: bytes | None) -> Reputation:
    config = run.config
    anchors = {a for a in (owner, run.trainer) if a}
    if config is not None:
        anchors |= {bytes.fromhex(p) for p in config.pretrusted}
        return Reputation(frozenset(anchors), config.reputation)
    return Reputation(frozenset(anchors))


def stored_reports(index: StoreIndex, until: float = math.inf) -> Iterator[tuple[float, Report]]:
    """``(received, report)`` for one store's verdicts received by ``until``, in that order:
    subject and round from the group the verdict names (vrl.node.reputation.report_of)."""
    for v in index.verdicts:
        if v.received > until:
            break
        head = index.groups.get(v.group)
        if head is None or v.outcome == Outcome.SKIPPED:
            continue
        report = report_of(_as_verdict(v, head), head.subject, head.version)
        if report is not None:
            yield v.received, report


def withheld_records(run: Run, index: StoreIndex, until: float = math.inf) -> Iterator[Withheld]:
    """What the round manifests whose lists ``index``'s store holds, stored by ``until``, say
    their workers withheld: in the committee design they lower a score in that node's view as
    its reports do (vrl.node.rounds.note_withheld, specs/committee.md §7.1). Lists naming a
    worker with more groups than a round holds imply nothing, as at the node."""
    for version, lists in sorted(index.lists.items()):
        held = index.manifests.get(version)
        if held is None or held[1] > until:
            continue
        try:
            yield from withheld_of(lists, run.protocol.groups_per_round)
        except ReputationError:
            continue


def _as_verdict(v: VerdictHead, head: GroupHead) -> SignedVerdict:
    return SignedVerdict(verifier=v.verifier, subject=head.subject, group=v.group, round=v.round,
                         policy_version=v.policy_version, ticket=b"", rate=0.0, outcome=Outcome(v.outcome),
                         reasons=v.reasons, digest=v.digest, platform=v.platform, planted=v.planted,
                         race_tokens=v.race_tokens, races_lost=v.races_lost, draw=Draw(v.draw), signature=b"")


@REGISTRY.runs("reputation")
def check_reputation(audit: CheckContext) -> None:
    """Each store's reputation snapshot against the same view replayed from its verdict log;
    and the per-round scores the report plots (the trainer's view where its store is here)."""
    run, findings, progress = audit.run, audit.findings, audit.progress
    check = "reputation"
    compared = 0
    for index in run.stores:
        progress(check, 1)
        owner = index.node.owner
        where = str(index.node.store.path)
        snapshot = index.node.store.snapshot()
        if not snapshot:
            continue
        if owner is None:
            findings.append(finding(check, "owner_unknown", Severity.INFO,
                                     f"{where}: whose view this store is cannot be told (no owner recorded, no "
                                     f"node.pem beside it), so its reputation snapshot is not compared", store=where))
            continue
        at = index.node.store.snapshot_at()
        view = reputation_view(run, owner)
        until = math.inf if at is None else at
        for _, report in stored_reports(index, until):
            view.add(report)
        for record in withheld_records(run, index, until):
            view.add_withheld(record)
        version = snapshot[0][1]
        standings = view.standings(version)
        for node, _, score, quarantined in snapshot:
            compared += 1
            mine = standings.get(node) or view.standing(node, version)
            if abs(mine.score - score) > SCORE_TOLERANCE or mine.quarantined != quarantined:
                findings.append(finding(
                    check, "snapshot_mismatch", Severity.ERROR if at else Severity.INFO,
                    f"{index.node.name}'s reputation of {short(node)} at round {version} is {score:.6f}"
                    f"{' (quarantined)' if quarantined else ''}, but its own verdict log gives {mine.score:.6f}"
                    f"{' (quarantined)' if mine.quarantined else ''}"
                    + ("" if at else " (the store does not say when its snapshot was taken: an older node)"),
                    # No subject: whose store it is is the store's own word, not a signature.
                    store=where, owner=owner.hex(), node=node.hex(), round=version, snapshot=score,
                    replayed=mine.score))
    run.stats[check] = {"snapshot rows compared": compared}
    _reputation_series(run)
    _views_agree(run, findings)


def trainer_index(run: Run) -> StoreIndex | None:
    """The trainer's own store, if it is among the inputs; else the first store."""
    return next((s for s in run.stores if s.node.owner == run.trainer), run.stores[0] if run.stores else None)


def rounds_of_view(run: Run, index: StoreIndex, owner: bytes | None) -> Iterator[tuple[int, dict[bytes, Standing]]]:
    """``(version, standings)`` for each round of the trainer's announcements, in ``owner``'s
    view as ``index``'s log rebuilds it: the verdicts received before that round's announcement."""
    view = reputation_view(run, owner)
    reports = stored_reports(index)
    pending = next(reports, None)
    for version in run.policies:
        announced = index.announced_at.get(version, math.inf)
        while pending is not None and pending[0] <= announced:
            view.add(pending[1])
            pending = next(reports, None)
        yield version, view.standings(version)


def _reputation_series(run: Run) -> None:
    index = trainer_index(run)
    if index is None or not run.policies:
        return
    series: dict[str, list[tuple[int, float, bool]]] = defaultdict(list)
    for version, standings in rounds_of_view(run, index, index.node.owner):
        for node, standing in standings.items():
            if node not in run.canaries:
                series[node.hex()].append((version, standing.score, standing.quarantined))
    run.series["reputation"] = {"view": index.node.name, "nodes": dict(series)}


def _views_agree(run: Run, findings: list[Finding]) -> None:
    """Signed contradictions between stores: one verifier, one group, two different checked
    outcomes (a verifier telling two peers two things); and, as information, nodes one
    honest view quarantined that another did not."""
    said: dict[tuple[bytes, bytes], VerdictHead] = {}
    for index in run.stores:
        for v in index.verdicts:
            if v.outcome == Outcome.SKIPPED:
                continue
            first = said.setdefault((v.verifier, v.group), v)
            if first.id != v.id and first.outcome != v.outcome:
                findings.append(finding("reputation", "verifier_equivocation", Severity.ERROR,
                                         f"verifier {short(v.verifier)} signed both {first.outcome} and {v.outcome} "
                                         f"on group {v.group.hex()[:16]}", v.verifier, group=v.group.hex(),
                                         verdicts=[first.id.hex(), v.id.hex()]))
    quarantined: dict[str, set[bytes]] = {}
    for index in run.stores:
        rows = index.node.store.snapshot()
        if rows:
            quarantined[index.node.name] = {node for node, _, _, q in rows if q}
    owners = {index.node.name: index.node.owner for index in run.stores}
    for node in sorted(set().union(*quarantined.values()) - run.canaries if quarantined else ()):
        views = [name for name in quarantined if owners.get(name) != node]  # a node never quarantines itself
        by = [name for name in views if node in quarantined[name]]
        if by and len(by) < len(views):
            findings.append(finding("reputation", "views_differ", Severity.INFO,
                                     f"{short(node)} is quarantined in the views of {', '.join(by)} but not of "
                                     f"{', '.join(n for n in views if n not in by)} (views differ in what verdicts "
                                     f"had arrived when each snapshot was taken)", node=node.hex(), quarantined_by=by))


# -- duplicates and replays across the whole history -------------------------------------------

@REGISTRY.runs("duplicates")
def check_duplicates(audit: CheckContext) -> None:
    """specs/verification.md §6 sees one verify call; this sees the run. A record (its bytes)
    in two groups is a replay; two different records in one sample slot (signer, round seed,
    group, sample) are a node submitting twice for one slot; two groups in one slot are the
    same at the group level."""
    run, findings, progress = audit.run, audit.findings, audit.progress
    check = "duplicates"
    records: dict[bytes, bytes] = {}  # 16 bytes of the record's SHA-256 -> its group
    slots: dict[bytes, bytes] = {}  # 16 bytes of the slot's hash -> 16 bytes of the record's hash
    group_slots: dict[tuple[bytes, int, int], bytes] = {}
    reported = set()

    def see(rollout_bytes: bytes, rollout: Rollout, where: bytes, label: str, in_group: bool = True) -> None:
        key = hashlib.sha256(rollout_bytes).digest()[:16]
        slot = hashlib.sha256(rollout.node_id + rollout.round_seed + rollout.policy_version.to_bytes(8, "big")
                              + rollout.group_index.to_bytes(4, "big")
                              + rollout.sample_index.to_bytes(4, "big")).digest()[:16]
        # A copy of signed bytes in a file is no misbehaviour: only a record in two groups is a replay.
        first = records.setdefault(key, where) if in_group else where
        if first != where and (key, "replay") not in reported:
            reported.add((key, "replay"))
            findings.append(finding(check, "replayed_record", Severity.ERROR,
                                     f"a record of {short(rollout.node_id)} (version {rollout.policy_version}, "
                                     f"sample {rollout.sample_index}) appears in {first.hex()[:16]} and in {label}",
                                     rollout.node_id, record=key.hex(), first=first.hex()))
        earlier = slots.setdefault(slot, key)
        if earlier != key and (slot, "slot") not in reported:
            reported.add((slot, "slot"))
            findings.append(finding(check, "slot_twice", Severity.ERROR,
                                     f"{short(rollout.node_id)} signed two different samples {rollout.sample_index} "
                                     f"of group {rollout.group_index} at version {rollout.policy_version} "
                                     f"(one in {label})", rollout.node_id, version=rollout.policy_version,
                                     group_index=rollout.group_index))

    seen = 0
    for digest, head in run.groups.items():
        if digest in run.planted:
            continue  # the trainer's canaries reuse its round's draws on purpose
        group = run.decoded(digest)
        if group is None:
            continue
        seen += 1
        progress(check, 1)
        slot_key = (head.subject, head.version, head.index)
        other = group_slots.setdefault(slot_key, digest)
        if other != digest:
            findings.append(finding(check, "group_slot_twice", Severity.ERROR,
                                     f"{short(head.subject)} submitted two groups for slot {head.index} of version "
                                     f"{head.version}: {other.hex()[:16]} and {digest.hex()[:16]}", head.subject,
                                     version=head.version, groups=[other.hex(), digest.hex()]))
        for record, rollout in zip(group.submission.records, group.rollouts):
            see(record, rollout, digest, f"group {digest.hex()[:16]}")
    for path in run.inputs.rollout_files:
        for item in file_records(path, []):
            if isinstance(item, Rollout):
                see(item.to_bytes(), item, hashlib.sha256(str(path).encode()).digest(), str(path), in_group=False)
    run.stats[check] = {"groups": seen, "records": len(records), "file records": run.rollout_records}


# -- planted groups, quarantine, admission: the trainer's batches against the rules -----------------

@REGISTRY.runs("lazy_verifiers")
def check_planted(audit: CheckContext) -> None:
    """A pass on a group the trainer planted is a verifier that did not check (its canary is
    known bad: specs/network.md §5.3), whoever it told."""
    run, findings, progress = audit.run, audit.findings, audit.progress
    check = "lazy_verifiers"
    passes = 0
    said = set()
    for index in run.stores:
        for v in index.verdicts:
            progress(check, 1)
            if v.group in run.planted and v.outcome == Outcome.PASS and v.id not in said:
                said.add(v.id)
                passes += 1
                findings.append(finding(check, "passed_planted", Severity.ERROR,
                                         f"verifier {short(v.verifier)} passed group {v.group.hex()[:16]}, which the "
                                         f"trainer planted as known-bad", v.verifier, group=v.group.hex(),
                                         verdict=v.id.hex()))
    run.stats.setdefault(check, {})["planted groups"] = len(run.planted)
    _race_losses(run, findings)


def _race_losses(run: Run, findings: list[Finding]) -> None:
    """A ``race_losses`` fail must follow from its signer's own evidence: the races lost over
    the checks of the subject its own tickets drew, up to and including that verdict in the
    order it signed them, under the profile its platform tag names, reach the sequential test's
    threshold (specs/verification.md §7; re-checks others prompted are not evidence, as in
    vrl.node.protocol). Less is an accusation its own signed verdicts do not support.

    The order it signed them is its own store's (a node stores its verdict as it publishes
    it). Another store's arrival order is not: a 12-node devnet's trainer received one
    verifier's three accusations in another order than it signed them, and the audit called an
    honest verifier's first one unjustified. Without the signer's store only the round is
    certain (a verdict's round is the signer's version when it signed, never decreasing), so
    every drawn check of the same round counts as possibly earlier: the audit errs toward the
    accused verifier, never against it."""
    check = "lazy_verifiers"
    by_pair: dict[tuple[bytes, bytes], list[VerdictHead]] = defaultdict(list)
    seen = set()
    signed_at: dict[bytes, float] = {}  # a verdict -> when its signer's own store took it
    for index in run.stores:
        owner = index.node.owner
        for v in index.verdicts:
            if v.verifier == owner:
                signed_at[v.id] = v.received
            head = run.groups.get(v.group)
            if v.id in seen or head is None or v.outcome == Outcome.SKIPPED:
                continue
            seen.add(v.id)
            by_pair[v.verifier, head.subject].append(v)
    accusations = 0
    for (verifier, subject), verdicts in sorted(by_pair.items()):
        own = all(v.id in signed_at for v in verdicts)
        order = sorted(verdicts, key=lambda v: (v.round, signed_at[v.id] if own else 0.0, v.id))
        rounds = [v.round for v in order]
        test, counted = None, 0  # the test over order[:counted]
        for i, v in enumerate(order):
            test = test or RaceTest(profile_of_platform(v.platform).race_loss_rate)
            # What it may have held when it signed v: everything before v in its own order, or
            # without that order every check of v's round or earlier.
            last = i + 1 if own else bisect.bisect_right(rounds, v.round)
            for u in order[counted:last]:
                if u.drawn:
                    test = test.add(u.race_tokens, u.races_lost)
            counted = max(counted, last)
            if RACE_LOSSES in v.reasons and v.outcome == Outcome.HARD_FAIL:
                accusations += 1
                if not test.rejected:
                    findings.append(finding(check, "unjustified_race_losses", Severity.ERROR,
                                             f"verifier {short(verifier)} failed {short(subject)}'s sampling "
                                             f"(race_losses) on {test.lost} of {test.tokens} races lost over the "
                                             f"checks it drew until then: ln E = {test.log_e:.2f}, below the "
                                             f"test's {threshold():.2f}", verifier, accused=subject.hex(),
                                             verdict=v.id.hex(), platform=v.platform))
    run.stats.setdefault(check, {})["race_losses accusations"] = accusations


def committee_network(run: Run) -> bool:
    """Whether the run used the committee design: its node.toml says so, or (no node.toml
    among the inputs) some store holds a round manifest."""
    if run.config is not None:
        return run.config.protocol.verification == Verification.COMMITTEE
    return any(index.manifests for index in run.stores)


def _left_out(run: Run, findings: list[Finding], index: StoreIndex, a: PolicyAnnouncement, heads: list[BatchHead],
              admission: AdmissionConfig, staleness: int, standings: dict[bytes, Standing],
              verified: dict[bytes, float]) -> None:
    """A batch that is not full, while a group the trainer itself had passed a whole round
    before (so it was decided and trusted: vrl.node.protocol.NodeProtocol.decided, Candidate.
    trusted), fresh, of a node under the cap with a score above 0, and failed by no one, was
    never trained at all: admission takes every such group when the batch has room
    (vrl.node.admission.admit), so the trainer left it out."""
    if len(heads) >= admission.batch_groups or a.version - 1 not in index.announced_at:
        return
    cap = math.ceil(admission.node_cap * admission.batch_groups)
    taken = Counter(h.subject for _, _, h in heads if h is not None)
    before = index.announced_at[a.version - 1]
    trained = run.trained_groups
    failed = {v.group for v in index.verdicts if v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)}
    left: dict[bytes, list[bytes]] = defaultdict(list)
    for digest, head in index.groups.items():
        standing = standings.get(head.subject)
        if (verified.get(digest, math.inf) <= before and digest not in trained and digest not in failed
                and digest not in run.planted and 0 <= (a.version - 1) - head.version <= staleness
                and standing is not None and standing.score > 0 and not standing.quarantined
                and taken[head.subject] < cap):
            left[head.subject].append(digest)
    for node, digests in sorted(left.items()):
        findings.append(finding("admission", "left_out", Severity.WARNING,
                                f"version {a.version} trained {len(heads)} groups of {admission.batch_groups} while "
                                f"{len(digests)} group(s) of {short(node)}, passed by the trainer a round before, "
                                f"were never trained", a.trainer, version=a.version, node=node.hex(),
                                groups=[d.hex() for d in digests]))


def _trusted_share(run: Run, findings: list[Finding], a: PolicyAnnouncement, heads: list[BatchHead],
                   admission: AdmissionConfig, standings: dict[bytes, Standing], verified: set[bytes]) -> None:
    """specs/reputation.md §6: untrusted groups fill at most ``(1 - trusted_share)`` of a batch,
    and at most ``trusted * (1 - share) / share`` of it. Trusted as the trainer's view, rebuilt
    from the log, stood when the batch was announced: a node's score reaching trusted_score,
    or an anchor's pass on the group, or in the committee design a member's pass (a ``committee``
    or ``recheck`` claim, which check_committees judges; specs/committee.md §8). A view rebuilt
    from arrival times is not the trainer's to the verdict, so a breach is a warning."""
    if admission.trusted_share <= 0:
        return
    trusted = sum(1 for d, _, h in heads if h is not None and (
        d in verified or (standings.get(h.subject) is not None
                          and standings[h.subject].score >= admission.trusted_score)))
    untrusted = len(heads) - trusted
    allowed = min(math.floor((1 - admission.trusted_share) * admission.batch_groups),
                  math.floor(trusted * (1 - admission.trusted_share) / admission.trusted_share + 1e-9))
    if untrusted > allowed:
        findings.append(finding("admission", "trusted_share", Severity.WARNING,
                                f"version {a.version} trained {untrusted} untrusted groups of {len(heads)}, more "
                                f"than trusted_share {admission.trusted_share} allows ({allowed}), as the log "
                                f"rebuilds the trainer's view", a.trainer, version=a.version, untrusted=untrusted,
                                allowed=allowed))


@REGISTRY.runs("admission", "quarantine")
def check_batches(audit: CheckContext) -> None:
    """Every announced batch against the protocol's rules (specs/reputation.md §6, network.md
    §5): known groups only, no planted group, fresh groups, the per-node cap, weights of mean
    1, no group trained twice, and no group of a node quarantined a whole round before."""
    run, findings, progress = audit.run, audit.findings, audit.progress
    check = "admission"
    # Without a node.toml among the inputs, the settings a node runs when its node.toml sets
    # none: NodeConfig's, which override AdmissionConfig's own (vrl train's) batch_groups and
    # node_cap (vrl.node.config.NODE_OVERRIDES); AdmissionConfig() would hold a default node to
    # a cap of 4 where it takes 5, and to 8 untrusted groups where it takes 6.
    admission = run.config.admission if run.config is not None else node_default("admission", AdmissionConfig)
    staleness = run.protocol.max_staleness
    cap = math.ceil(admission.node_cap * admission.batch_groups)
    index = trainer_index(run)
    views = dict(rounds_of_view(run, index, run.trainer)) if index is not None else {}
    quarantined: dict[bytes, int] = {}
    for version, standings in views.items():
        for node, standing in standings.items():
            if standing.quarantined:
                quarantined.setdefault(node, version)
    anchors = {run.trainer} | ({bytes.fromhex(p) for p in run.config.pretrusted} if run.config is not None else set())
    verified: dict[bytes, float] = {}  # group -> when an anchor's pass on it arrived (the trainer's view)
    checked: dict[bytes, float] = {}  # ... or, in the committee design, a member's (the trusted share's)
    seats = SEATS if committee_network(run) else frozenset()
    for v in index.verdicts if index is not None else ():
        if v.outcome == Outcome.PASS and v.verifier in anchors:
            verified.setdefault(v.group, v.received)
        if v.outcome == Outcome.PASS and (v.verifier in anchors or v.draw in seats):
            checked[v.group] = min(v.received, checked.get(v.group, math.inf))
    # The trainer's own store is its own record of what it knew when; another store's arrival
    # times are only an approximation of the trainer's view.
    own_view = Severity.ERROR if index is not None and index.node.owner == run.trainer else Severity.WARNING
    trained_before: dict[bytes, int] = {}
    batches = 0
    for version, a in run.policies.items():
        progress(check, 1)
        progress("quarantine", 1)  # one pass: both checks are done with this version
        if version == 0:
            continue
        batches += 1
        where = f"version {version}"
        if (batch := run.batches.get(version)) is None:
            continue  # its batch file is in no folder (a finding of the index says so)
        heads = [(d, w, run.groups.get(d)) for d, w in batch]
        announced = index.announced_at.get(version, math.inf) if index is not None else math.inf
        _trusted_share(run, findings, a, heads, admission, views.get(version, {}),
                       {d for d, t in checked.items() if t <= announced})
        if index is not None:
            _left_out(run, findings, index, a, heads, admission, staleness, views.get(version, {}), verified)
        if len(batch) > admission.batch_groups:
            findings.append(finding(check, "batch_too_large", Severity.ERROR,
                                     f"{where} trained {len(batch)} groups, more than batch_groups "
                                     f"{admission.batch_groups}", a.trainer, version=version))
        per_node = Counter(h.subject for _, _, h in heads if h is not None)
        for node, count in per_node.items():
            if count > cap:
                findings.append(finding(check, "node_cap", Severity.ERROR,
                                         f"{where} trained {count} groups of {short(node)}, more than the cap of "
                                         f"{cap} (node_cap {admission.node_cap} of {admission.batch_groups})",
                                         a.trainer, version=version, node=node.hex(), groups=count))
        weights = [w for _, w, _ in heads]
        if weights and abs(sum(weights) / len(weights) - 1) > 1e-6:
            findings.append(finding(check, "weights", Severity.ERROR,
                                     f"{where}'s batch weights average {sum(weights) / len(weights):.4f}, not 1 "
                                     f"(specs/reputation.md §6)", a.trainer, version=version))
        for digest, _, head in heads:
            if head is None:
                findings.append(finding(check, "unknown_group", Severity.WARNING,
                                         f"{where} trained group {digest.hex()[:16]}, which no audited store ever "
                                         f"received: data no one submitted", a.trainer, version=version,
                                         group=digest.hex()))
                continue
            if digest in run.planted:
                findings.append(finding(check, "trained_planted", Severity.ERROR,
                                         f"{where} trained group {digest.hex()[:16]}, which the trainer itself "
                                         f"planted as known-bad", a.trainer, version=version, group=digest.hex()))
            if not 0 <= (version - 1) - head.version <= staleness:
                findings.append(finding(check, "stale_group", Severity.ERROR,
                                         f"{where} trained group {digest.hex()[:16]} of version {head.version}, "
                                         f"outside max_staleness {staleness}", a.trainer, version=version,
                                         group=digest.hex()))
            if digest in trained_before:
                findings.append(finding(check, "trained_twice", Severity.ERROR,
                                         f"{where} trained group {digest.hex()[:16]} again (first at version "
                                         f"{trained_before[digest]})", a.trainer, version=version, group=digest.hex()))
            trained_before.setdefault(digest, version)
            since = quarantined.get(head.subject)
            if since is not None and since < version - 1:
                findings.append(finding("quarantine", "trained_quarantined", own_view,
                                         f"{where} trained group {digest.hex()[:16]} of {short(head.subject)}, "
                                         f"quarantined in the trainer's view since round {since}", a.trainer,
                                         version=version, node=head.subject.hex(), quarantined_since=since))
    run.stats[check] = {"batches": batches, "node cap": cap}
    run.stats["quarantine"] = {"nodes quarantined (trainer's view)": len(set(quarantined) - run.canaries),
                               "view": index.node.name if index is not None else ""}


# -- step verdicts in the log ------------------------------------------------------------------------

def quarantined_by_most(run: Run) -> set[bytes]:
    """The nodes more than half of the stored reputation snapshots quarantine, the node's own
    left out (a node never quarantines itself); empty when no store holds a snapshot. A majority,
    not every view: in the committee design a view counts only the failures on groups its node
    holds, so one view may lack the evidence the others hold (specs/audit.md §3)."""
    views = [(index.node.owner, {node for node, _, _, q in rows if q})
             for index in run.stores if (rows := index.node.store.snapshot())]
    candidates = set().union(*(q for _, q in views)) if views else set()
    return {n for n in candidates if 2 * sum(n in q for owner, q in views if owner != n)
            > sum(owner != n for owner, _ in views)}


def step_reports(run: Run) -> dict[int, dict[bytes, StepVerdict]]:
    """Every signed step verdict on the trainer's announcements, by version and verifier."""
    out: dict[int, dict[bytes, StepVerdict]] = defaultdict(dict)
    for index in run.stores:
        for s in index.steps:
            a = run.policies.get(s.version)
            if a is not None and s.announcement == a.id:
                out[s.version].setdefault(s.verifier, s)
    return out


def collect_latency(run: Run) -> None:
    """For the report: each store owner's own checks, from the group's arrival to its verdict;
    and the rejections by reason, once per verdict."""
    latency: dict[str, list[float]] = defaultdict(list)
    reasons: Counter[str] = Counter()
    counted = set()
    for index in run.stores:
        owner = index.node.owner
        for v in index.verdicts:
            if v.id not in counted:
                counted.add(v.id)
                if v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) and v.group not in run.planted:
                    reasons.update(set(v.reasons))
            head = index.groups.get(v.group)
            if v.verifier == owner and head is not None and v.outcome != Outcome.SKIPPED and head.received:
                latency[index.node.name].append(max(0.0, v.received - head.received))
    run.series["latency"] = dict(latency)
    run.series["rejections"] = dict(reasons.most_common())
