"""The ``committees`` check (specs/audit.md §3, specs/committee.md): every committee of the run
drawn again from the log.

For each round the trainer closed with a signed manifest it re-derives the manifest's root and
both VRF inputs (``alpha``) from the header's own fields, and for every stored verdict of the
round checks its claim as a node does (specs/committee.md §4): the weights path of a seat, the
groups path of its place, the VRF proof over that ``alpha``, and the seat value against the
verifier's threshold. From the trainer's own store, which holds the lists behind each header,
it re-derives the weights table (specs/committee.md §3.1: the trainer's reputation view over the
reports it had stored when it closed the round) and flags a table that differs, and flags a
trained group its round's lists do not hold.

Who a finding incriminates is derived from signatures (specs/security.md §1): a verdict's
verifier is its signer, a manifest's trainer its signer.
"""

from __future__ import annotations

from collections.abc import Mapping

from proofs import vrf
from vrl.audit.checks import committee_network, reputation_view, stored_reports
from vrl.audit.findings import Finding, Severity
from vrl.audit.index import Progress, Run, StoreIndex, VerdictHead, finding, short
from vrl.audit.registry import REGISTRY, CheckContext
from vrl.node import committee
from vrl.node.committee import SEATS, Draw, Refusal, Weighable, WeightsTable
from vrl.node.messages import RoundManifest
from vrl.node.params import Verification
from vrl.node.reputation import ReputationError, withheld_of

CHECK = "committees"
#: The codes a verdict's claim may be found under (:func:`_refusal` picks one; specs/audit.md §3):
#: a node's refusals but those a stored verdict cannot carry (its signature was checked as the
#: log was read; a skip is the ``signatures`` pass's) and the ticket design's.
CLAIM_CODES = (Refusal.MANIFEST_MISSING, Refusal.NO_CLAIM, Refusal.NOT_IN_MANIFEST, Refusal.NOT_ELIGIBLE,
               Refusal.BAD_PROOF, Refusal.NOT_DRAWN)


def manifests_of(run: Run, findings: list[Finding]) -> dict[int, RoundManifest]:
    """The trainer's manifest of each round, across stores (its own store's first): one per
    round, or a signed contradiction (``manifest_equivocation``); another signer's is a warning."""
    order = sorted(run.stores, key=lambda index: index.node.owner != run.trainer)
    chosen: dict[int, RoundManifest] = {}
    for index in order:
        for version, (manifest, _) in sorted(index.manifests.items()):
            if manifest.trainer != run.trainer:
                findings.append(finding("committees", "foreign_manifest", Severity.WARNING,
                                        f"{index.node.store.path}: round {version}'s manifest is signed by "
                                        f"{short(manifest.trainer)}, not the network's trainer", manifest.trainer,
                                        round=version))
                continue
            first = chosen.setdefault(version, manifest)
            if first.to_bytes() != manifest.to_bytes():
                findings.append(finding("committees", "manifest_equivocation", Severity.ERROR,
                                        f"the trainer signed two different manifests of round {version} "
                                        f"(roots {first.header.root.hex()[:12]} and "
                                        f"{manifest.header.root.hex()[:12]})", manifest.trainer,
                                        round=version, roots=[first.header.root.hex(), manifest.header.root.hex()]))
    return dict(sorted(chosen.items()))


@REGISTRY.runs(CHECK)
def check_committees(audit: CheckContext) -> None:
    """Every claim, every table, every trained group's listing (module docstring). The sample
    is not used: the check reads the whole log (one VRF verification per verifier, round and draw)."""
    run, findings, progress = audit.run, audit.findings, audit.progress
    if not committee_network(run):
        run.stats[CHECK] = {"design": Verification.TICKETS.value}
        return
    manifests = manifests_of(run, findings)
    stats = {"manifests": len(manifests), "claims": 0, "proofs_verified": 0, "tables_rederived": 0}
    _claims(run, manifests, findings, stats, progress)
    _tables(run, manifests, findings, stats)
    _trained_listed(run, manifests, findings)
    run.stats[CHECK] = stats


def _claims(run: Run, manifests: dict[int, RoundManifest], findings: list[Finding], stats: dict[str, int],
            progress: Progress) -> None:
    """Each distinct stored verdict of the committee design against its round's manifest, in
    the order of specs/committee.md §4 (its steps 2 to 6; step 1, holding the manifest, is a
    warning here: the audited stores may lack it)."""
    anchors = ({run.trainer} if run.trainer is not None else set()) | (
        {bytes.fromhex(p) for p in run.config.pretrusted} if run.config else set())
    betas: dict[tuple[bytes, int, Draw, bytes], bytes | None] = {}
    seen: set[bytes] = set()
    for index in run.stores:
        for v in index.verdicts:
            progress(CHECK, 1)  # every stored copy: the work estimate counts the stores' rows
            if v.id in seen:
                continue
            seen.add(v.id)
            stats["claims"] += 1
            if v.verifier == run.trainer and v.planted:
                continue  # the trainer's reveal of its own plant (network.md §5.3): no claim to a seat
            reason = _refusal(v, manifests.get(v.policy_version), anchors, betas, stats)
            head = run.groups.get(v.group)
            if reason is None and v.draw in SEATS and head is not None and head.subject == v.verifier:
                reason = (Refusal.NOT_DRAWN, Severity.ERROR, "claims a seat on its signer's own group, never its seat")
            if reason is None:
                continue
            code, severity, why = reason
            assert code in CLAIM_CODES, code  # noqa: S101 (the codes the spec lists, made nowhere else)
            findings.append(finding("committees", code, severity, f"{short(v.verifier)}'s {v.outcome} on group "
                                    f"{v.group.hex()[:16]} of round {v.policy_version} (draw {v.draw}) {why}",
                                    v.verifier if severity == Severity.ERROR else b"", verdict=v.id.hex(),
                                    group=v.group.hex(), round=v.policy_version, draw=v.draw,
                                    store=str(index.node.store.path)))


def _refusal(v: VerdictHead, manifest: RoundManifest | None, anchors: set[bytes],
             betas: dict[tuple[bytes, int, Draw, bytes], bytes | None],
             stats: dict[str, int]) -> tuple[Refusal, Severity, str] | None:
    if manifest is None:
        return (Refusal.MANIFEST_MISSING, Severity.WARNING,
                "cannot be checked: no audited store holds its round's manifest")
    header = manifest.header
    threshold = 0
    if v.draw == Draw.NONE:
        if v.verifier not in anchors:
            return (Refusal.NO_CLAIM, Severity.ERROR,
                    "claims no seat, and its signer is neither the trainer nor an anchor")
    elif v.draw not in SEATS:
        return Refusal.NOT_ELIGIBLE, Severity.ERROR, "carries an audit ticket in a committee network"
    else:
        try:
            threshold = committee.check_weight(header, v.verifier, (v.weight_at, v.weight), v.weight_path)
        except committee.CommitteeError:
            return (Refusal.NOT_ELIGIBLE, Severity.ERROR,
                    "claims a seat, but its weights path does not prove its signer in the round's weights list")
    try:
        committee.check_place(header, v.seat, v.group, v.seat_path)
    except committee.CommitteeError:
        return (Refusal.NOT_IN_MANIFEST, Severity.ERROR,
                "judges a group its path does not prove in its round's groups list")
    if v.draw == Draw.NONE:
        return None
    draw = Draw(v.draw)
    key = (v.verifier, manifest.round, draw, v.pi)
    if key not in betas:  # one VRF verification per (verifier, round, draw, proof)
        stats["proofs_verified"] += 1
        try:  # alpha re-derived here from the header's own fields (its root)
            betas[key] = vrf.verify(v.verifier, v.pi, header.alpha(draw))
        except vrf.VrfError:
            betas[key] = None
    beta = betas[key]
    if beta is None:
        return Refusal.BAD_PROOF, Severity.ERROR, "carries a VRF proof that does not verify over the round's alpha"
    if header.seat_value(beta, v.seat) >= threshold:
        return Refusal.NOT_DRAWN, Severity.ERROR, "claims a seat the verifier's VRF output does not give it"
    return None


def trainer_store(run: Run) -> StoreIndex | None:
    """The trainer's own store, if among the inputs: what it knew when it closed each round."""
    return next((s for s in run.stores if s.node.owner == run.trainer and run.trainer is not None), None)


def expected_table(standings: Mapping[bytes, Weighable], trainer: bytes | None, committee_size: int) -> WeightsTable:
    """specs/committee.md §3.1: the table the trainer's view implies."""
    return WeightsTable.heaviest(committee_size, committee.seat_weights(standings, trainer or b""))


def _tables(run: Run, manifests: dict[int, RoundManifest], findings: list[Finding], stats: dict[str, int]) -> None:
    """Each manifest's weights table against the trainer's view replayed from its own store over
    the reports it had stored when it stored the manifest (its own, stored as it was published).
    A rebuild from arrival times, as the ``admission`` check's trust is: a difference is a
    warning, and one quantum (2^-16) of weight is float summation order, not a choice. The
    withheld slots of the manifests stored before it count too, as they did at the trainer:
    without them a 12-node devnet's audit found a worker that had missed slots weighing 44,694
    where the trainer had signed 34,808."""
    index = trainer_store(run)
    if index is None:
        return
    view = reputation_view(run, run.trainer)
    groups_per_round = run.protocol.groups_per_round
    reports = stored_reports(index)
    pending = next(reports, None)
    for version, (stored, at) in sorted(index.manifests.items(), key=lambda item: item[1][1]):
        while pending is not None and pending[0] <= at:
            view.add(pending[1])
            pending = next(reports, None)
        manifest, lists = manifests.get(version), index.lists.get(version)
        if manifest is None or manifest.to_bytes() != stored.to_bytes() or lists is None:
            continue
        stats["tables_rederived"] += 1
        expected = dict(expected_table(view.standings(version), run.trainer, manifest.committee_size).entries)
        # The withheld slots it implies count from here on, as the trainer noted them after
        # signing it (vrl.node.rounds.note_withheld): a seat weighs the score, which they lower.
        try:
            for record in withheld_of(lists, groups_per_round):
                view.add_withheld(record)
        except ReputationError:
            pass  # it lists a worker with more groups than a round holds: it implies nothing, as at the trainer
        signed = dict(lists.weights.entries)
        differ = sorted(node for node in expected.keys() | signed.keys()
                        if abs(expected.get(node, 0) - signed.get(node, 0)) > 1)
        if differ:
            findings.append(finding("committees", "weights_differ", Severity.WARNING,
                                    f"round {version}'s signed weights table differs from the trainer's view replayed "
                                    f"from its store for {len(differ)} node(s), e.g. {short(differ[0])}: signed "
                                    f"{signed.get(differ[0], 0)}, replayed {expected.get(differ[0], 0)}",
                                    run.trainer or b"", round=version, nodes=[n.hex() for n in differ],
                                    signed={n.hex(): signed.get(n, 0) for n in differ},
                                    replayed={n.hex(): expected.get(n, 0) for n in differ}))


def _trained_listed(run: Run, manifests: dict[int, RoundManifest], findings: list[Finding]) -> None:
    """A trained group must be listed in its round's manifest (specs/committee.md §1: a group
    that arrived after its round closed is never trained): checked against the lists the
    trainer's store holds (each proven to give its signed header)."""
    index = trainer_store(run)
    listed = {v: frozenset(lists.groups) for v, lists in index.lists.items()} if index else {}
    for version, announcement in run.policies.items():
        for digest, _ in run.batches.get(version, ()):
            head = run.groups.get(digest)
            if head is None or head.version not in listed or digest in listed[head.version]:
                continue
            findings.append(finding("committees", "trained_unlisted", Severity.ERROR,
                                    f"version {version}'s batch trains group {digest.hex()[:16]}, which round "
                                    f"{head.version}'s manifest does not list", announcement.trainer,
                                    version=version, group=digest.hex(), round=head.version))
