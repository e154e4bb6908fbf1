"""The checks that re-execute (specs/audit.md §3): groups re-verified with the weights of
their policy version, training steps replayed, held-out accuracy re-measured. Each runs on
a ``share`` of its items, drawn by a hash (:func:`vrl.audit.checks.sampled`), so two audits
at one share do the same work; ``share = 1`` (``vrl audit --all``) does all of it.

The weights, step configs and optimizer states come from the inputs' ``blobs/`` folders by
SHA-256 and are hashed again before use; nothing is fetched from a network. When a verdict's
or announcement's platform differs from this machine's only in torch's thread count, the
work runs at that count (:func:`vrl.audit.replay.threads_of`), so that equal platforms can be
held to bit-exact agreement.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from vrl.audit.checks import (
    ACCURACY_PROBLEMS_ACROSS_PLATFORMS,
    EXPECTED_ACCURACY_ACROSS_PLATFORMS,
    EXPECTED_ACCURACY_SAME_PLATFORM,
    quarantined_by_most,
    sampled,
    step_reports,
    trainer_index,
)
from vrl.audit.findings import Finding, Severity
from vrl.audit.index import Run, VerdictHead, finding, short
from vrl.audit.models import Models
from vrl.audit.registry import REGISTRY, CheckContext
from vrl.audit.replay import StepCheck, replay_steps, threads_of
from vrl.audit.sources import NodeInput
from vrl.node.messages import Outcome, StepOutcome, recomputed_digest
from vrl.node.protocol import outcome_of
from vrl.node.storage import replay_needs
from vrl.rl.evaluate import accuracy, expected_accuracy, held_out
from vrl.rollouts.model import bit_exact_platform, platform_tag
from vrl.rollouts.sequential import RACE_LOSSES
from vrl.rollouts.verify import verify


def _cannot(run: Run, findings: list[Finding], check: str, models: Models) -> bool:
    if models.problem is None:
        return False
    findings.append(finding(check, "not_reexecuted", Severity.WARNING, f"nothing re-executed: {models.problem}"))
    run.stats[check] = {"re-executed": 0}
    return True


# -- groups -----------------------------------------------------------------------------------------

def _candidates(run: Run, share: float) -> dict[bytes, set[str]]:
    """Groups to re-verify, with why: a ``share`` of each batch's admitted groups; for every
    node that some verifier failed, its failed groups at ``share`` and at least one, so no node
    is accused on a verifier's word without the auditor's own re-check; planted groups never
    (they are the trainer's canaries, bad on purpose)."""
    why: dict[bytes, set[str]] = defaultdict(set)
    for batch in run.batches.values():
        for digest, _ in batch:
            if digest in run.groups and sampled(digest, share):
                why[digest].add("admitted")
    failed: dict[bytes, list[bytes]] = defaultdict(list)
    for index in run.stores:
        for v in index.verdicts:
            head = run.groups.get(v.group)
            if v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) and head is not None and v.group not in run.planted:
                failed[head.subject].append(v.group)
    for digests in failed.values():
        ordered = sorted(set(digests))
        chosen = [d for d in ordered if sampled(d, share)] or ordered[:1]
        for digest in chosen:
            why[digest].add("failed")
    for digest in run.planted:
        why.pop(digest, None)
    return why


@REGISTRY.runs("groups")
def check_groups(audit: CheckContext) -> None:
    """Re-verify groups with their version's weights (the 8 stages of specs/verification.md),
    then hold every verdict on them against the auditor's own: a pass on a bad group, a fail
    of a good one, or (on an equal platform) another recomputed digest is a verifier that did
    not do what it signed."""
    run, findings, progress, share, models = audit.run, audit.findings, audit.progress, audit.sample, audit.loaded
    check = "groups"
    candidates = _candidates(run, share)
    if not candidates or _cannot(run, findings, check, models):
        run.stats[check] = {"candidates": len(candidates), "re-verified": 0}
        return
    trained_in = {d: version for version, batch in run.batches.items() for d, _ in batch}
    verdicts: defaultdict[bytes, list[VerdictHead]] = defaultdict(list)
    for index in run.stores:
        for v in index.verdicts:
            if v.group in candidates:
                verdicts[v.group].append(v)
    by_version: dict[int, list[bytes]] = defaultdict(list)
    for digest in sorted(candidates):
        by_version[run.groups[digest].version].append(digest)
    done, failed_groups = 0, 0
    reasons_seen: Counter[str] = Counter()
    for version in sorted(by_version):
        a = run.policies.get(version)
        model = models.version(a) if a is not None else None
        if a is None or model is None:
            findings.append(finding(check, "weights_unavailable", Severity.WARNING,
                                     f"{len(by_version[version])} groups of version {version} not re-verified: its "
                                     f"weights are not among the inputs", version=version))
            continue
        expect = models.expectations(a)
        for digest in by_version[version]:
            group = run.decoded(digest)
            progress(check, 1)
            if group is None:
                continue
            # The platform most of its verifiers named, when it is this machine's but for threads.
            platforms = Counter(v.platform for v in verdicts[digest] if v.outcome != Outcome.SKIPPED)
            platform = platforms.most_common(1)[0][0] if platforms else a.platform
            with threads_of(platform, model):
                results = verify(group.rollouts, model, expect=expect, batch_size=len(group.rollouts),
                                 signatures_checked=True, rebuild_commitments=True)
                mine = platform_tag(model)
            done += 1
            reasons = tuple(r.reason for r in results if not r.accepted)
            outcome = outcome_of(reasons)
            digest_here = recomputed_digest([r.recomputed for r in results])
            head = run.groups[digest]
            if reasons:
                failed_groups += 1
                reasons_seen.update(reasons)
                counts = ", ".join(f"{r} x{n}" for r, n in sorted(Counter(reasons).items()))
                findings.append(finding(check, "bad_group", Severity.ERROR if outcome == Outcome.HARD_FAIL
                                         else Severity.WARNING,
                                         f"{short(head.subject)}'s group {digest.hex()[:16]} of version {version} "
                                         f"fails re-verification: {counts}", head.subject, group=digest.hex(),
                                         version=version, reasons=sorted({str(r) for r in reasons}),
                                         outcome=str(outcome)))
                if digest in trained_in and outcome == Outcome.HARD_FAIL:
                    findings.append(finding(check, "trained_bad_group", Severity.ERROR,
                                             f"version {trained_in[digest]} trained group {digest.hex()[:16]} of "
                                             f"{short(head.subject)}, which fails re-verification ({counts})",
                                             run.trainer or b"", group=digest.hex(), version=trained_in[digest]))
            evidence = (sum(r.race_evidence[0] for r in results), sum(r.race_evidence[1] for r in results))
            _judge_verdicts(run, findings, verdicts[digest], digest, outcome, digest_here, mine, evidence)
    run.stats[check] = {"candidates": len(candidates), "re-verified": done, "failing": failed_groups,
                        "share": share}
    run.series["reverified"] = {"groups": done, "failing": failed_groups, "reasons": dict(reasons_seen)}


def _judge_verdicts(run: Run, findings: list[Finding], verdicts: list[VerdictHead], digest: bytes, outcome: str,
                    digest_here: bytes, platform: str, evidence: tuple[int, int]) -> None:
    check = "lazy_verifiers"
    for v in verdicts:
        if v.outcome == Outcome.SKIPPED or (v.verifier == run.trainer and v.planted):
            continue
        same = v.platform == platform and bit_exact_platform(platform)
        if same and (v.race_tokens, v.races_lost) != evidence:
            findings.append(finding(check, "evidence_mismatch", Severity.ERROR,
                                     f"verifier {short(v.verifier)}'s {v.outcome} of group {digest.hex()[:16]} "
                                     f"signs {v.races_lost} of {v.race_tokens} races lost, the auditor replays "
                                     f"{evidence[1]} of {evidence[0]} on the same platform", v.verifier,
                                     group=digest.hex(), verdict=v.id.hex(), platform=platform))
        if v.outcome == Outcome.PASS and outcome == Outcome.HARD_FAIL:
            findings.append(finding(check, "passed_bad_group", Severity.ERROR,
                                     f"verifier {short(v.verifier)} passed group {digest.hex()[:16]}, which fails "
                                     f"re-verification", v.verifier, group=digest.hex(), verdict=v.id.hex()))
        elif v.outcome == Outcome.HARD_FAIL and outcome == Outcome.PASS and set(v.reasons) != {RACE_LOSSES}:
            # (a race_losses fail is about the producer's sampling, not this group: specs/audit.md §3)
            findings.append(finding(check, "failed_good_group", Severity.ERROR if same else Severity.WARNING,
                                     f"verifier {short(v.verifier)} failed group {digest.hex()[:16]} "
                                     f"({', '.join(v.reasons)}), which passes re-verification"
                                     + ("" if same else " on another platform"), v.verifier, group=digest.hex(),
                                     verdict=v.id.hex(), platform=v.platform))
        elif same and v.digest != digest_here:
            findings.append(finding(check, "digest_mismatch", Severity.ERROR,
                                     f"verifier {short(v.verifier)}'s {v.outcome} of group {digest.hex()[:16]} "
                                     f"carries another recomputed digest than the auditor's on the same platform: "
                                     f"it did not run the prefill it signed", v.verifier, group=digest.hex(),
                                     verdict=v.id.hex(), platform=platform))


# -- steps ---------------------------------------------------------------------------------------------

@REGISTRY.runs("steps")
def check_steps(audit: CheckContext) -> None:
    """Replay a ``share`` of the trainer's steps (vrl.audit.replay), and hold the step
    verdicts in the log against the replays: a pass on a bad step, or a fraud report on a
    step that replays bit-exact, is a verifier that did not do what it signed."""
    run, findings, progress, share, models = audit.run, audit.findings, audit.progress, audit.sample, audit.loaded
    check = "steps"
    reports = step_reports(run)
    # Reports weigh by their reporter's trust: reports by verifiers most stored views quarantine
    # (a cheat its peers stopped serving cannot fetch a batch's groups, and files
    # unavailable_group) are worth knowing, not a warning against the trainer (specs/audit.md §3).
    distrusted = quarantined_by_most(run)
    for version, by in sorted(reports.items()):
        frauds = {v: s for v, s in by.items() if s.outcome == StepOutcome.FRAUD}
        if frauds:
            reasons = sorted({r for s in frauds.values() for r in s.reasons})
            severity = Severity.INFO if set(frauds) <= distrusted else Severity.WARNING
            findings.append(finding(check, "step_reported", severity,
                                     f"version {version} was reported as fraud by {len(frauds)} verifier(s) "
                                     f"({', '.join(short(v) for v in sorted(frauds))}): {', '.join(reasons)}"
                                     + (" (each quarantined in most stored views)" if severity == Severity.INFO
                                        else ""), run.trainer or b"", version=version, reasons=reasons))
    if len(run.policies) < 2 or _cannot(run, findings, check, models):
        run.stats[check] = {"steps": max(len(run.policies) - 1, 0), "replayed": 0}
        return
    if run.policies and 0 in run.policies and run.policies[0].model_hash != models.base.model_hash:
        findings.append(finding(check, "not_the_base_model", Severity.WARNING,
                                 f"version 0 ({run.policies[0].model_hash.hex()[:16]}) is not the network's model "
                                 f"as this machine builds it ({models.base.model_hash.hex()[:16]})",
                                 run.trainer or b""))
    # The trainer's own signed hard fails, by group, at their earliest round (specs/training.md §5).
    fails: dict[bytes, int] = {}
    for index in run.stores:
        for v in index.verdicts:
            if v.verifier == run.trainer and v.outcome == Outcome.HARD_FAIL:
                fails[v.group] = min(v.round, fails.get(v.group, v.round))
    if models.private and not models.srs:
        findings.append(finding(check, "not_reexecuted", Severity.WARNING,
                                "nothing re-executed: the task set is private, and its steps train on rewards its "
                                "proofs show; give the network's SRS (--srs PATH, or --allow-dev-srs)"))
        run.stats[check] = {"steps": max(len(run.policies) - 1, 0), "replayed": 0}
        return
    series = []
    replayed = 0
    # Where each replayed step's files were found (specs/audit.md §1, §7): the inputs, with their tier.
    found_in: Counter[str] = Counter()
    step_sources: set[str] = set()
    pruned = {digest: node for node in run.inputs.nodes for digest in node.store.pruned()}

    def blob(digest: bytes) -> bytes | None:
        located = run.inputs.locate(digest)
        if located is None:
            return None
        step_sources.add(located[1].label)
        return located[0]

    assert run.config is not None  # models has no problem (above): the inputs' node.toml was read
    unreplayable = []
    for result in replay_steps(run.policies.values(), blob=blob, group=run.decoded, base=models.base,
                               share=share, max_staleness=run.config.protocol.max_staleness, trainer_fails=fails,
                               rewards=models.step_rewards if models.private else None):
        progress(check, 1)
        sources = sorted(step_sources)
        step_sources.clear()
        series.append({"version": result.version, "ok": result.ok, "exact": result.exact, "drift": result.drift,
                       "seconds": result.seconds, "faults": list(result.faults), "missing": list(result.missing),
                       "sources": sources})
        if result.missing:
            unreplayable.append(result.version)
            findings.append(_unreplayable(check, result, run, pruned))
            continue
        found_in.update(sources)
        replayed += 1
        if result.faults:
            findings.append(finding(check, "step_fraud", Severity.ERROR, result.sentence(), run.trainer or b"",
                                     version=result.version, faults=list(result.faults),
                                     drift=result.drift if math.isfinite(result.drift) else "inf"))
        for verifier, s in reports.get(result.version, {}).items():
            if s.outcome == StepOutcome.PASS and result.faults:
                findings.append(finding("lazy_verifiers", "passed_bad_step", Severity.ERROR,
                                         f"verifier {short(verifier)} passed the step to version {result.version}, "
                                         f"which replays as {', '.join(result.faults)}", verifier,
                                         version=result.version))
            elif s.outcome == StepOutcome.FRAUD and not result.faults and result.exact:
                findings.append(finding("lazy_verifiers", "false_step_fraud", Severity.ERROR,
                                         f"verifier {short(verifier)} reported the step to version {result.version} "
                                         f"as {', '.join(s.reasons)}, but it replays bit for bit", verifier,
                                         version=result.version))
    run.stats[check] = {"steps": max(len(run.policies) - 1, 0), "replayed": replayed, "share": share,
                        "step verdicts in the log": sum(len(v) for v in reports.values()),
                        "not replayable (missing files)": _ranges(unreplayable),
                        "replayed from": dict(sorted(found_in.items()))}
    run.series["steps"] = series


def _unreplayable(check: str, result: StepCheck, run: Run, pruned: dict[bytes, NodeInput]) -> Finding:
    """A step whose files no input holds: which, and why where an input's prune journal says
    (its storage tier removed them: specs/storage.md); an archive among the inputs would hold them."""
    needs = replay_needs(run.policies[result.version], run.policies.get(result.version - 1))
    by = sorted({pruned[digest].label for digest in needs if digest in pruned})
    archives = [n.label for n in run.inputs.nodes if n.tier == "archive"]
    why = (f"; pruned by {', '.join(by)}" if by else "") + (
        f"; not in {', '.join(archives)} either" if archives else "; no archive among the inputs")
    return finding(check, "step_unreplayable", Severity.WARNING, result.sentence() + why, run.trainer or b"",
                   version=result.version, missing=list(result.missing), pruned_by=by, archives=archives)


def _ranges(versions: list[int]) -> str:
    """``3-7, 9``: versions as runs, short however many (the JSON series lists each)."""
    runs: list[list[int]] = []
    for v in sorted(versions):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs) or "none"


# -- held-out accuracy -----------------------------------------------------------------------------

@REGISTRY.runs("accuracy")
def check_accuracy(audit: CheckContext) -> None:
    """Re-measure each sampled version's held-out accuracy as the trainer measured it
    (vrl.rl.train.Trainer.evaluate: its temperature, max_new_tokens and held_out count), the
    first and last claimed versions always: a trainer's claimed curve is one of its outputs."""
    run, findings, progress, share, models = audit.run, audit.findings, audit.progress, audit.sample, audit.loaded
    check = "accuracy"
    # A claim is the trainer's own record (its store's trained table); another store's rows
    # under that name are no claim of the trainer's.
    index = trainer_index(run)
    own = index if index is not None and index.node.owner == run.trainer else None
    claims = {v: m for v, (_, m) in (own.trained.items() if own is not None else ())
              if "held_out_accuracy" in m and v in run.policies}
    if not claims:
        run.stats[check] = {"claimed versions": 0}
        return
    if _cannot(run, findings, check, models):
        return
    if models.private:
        # Its answers are the trainer's secret: an outsider checks accuracy by an evaluation
        # claim (vrl evaluate, the evaluation check), not by re-measuring it.
        findings.append(finding(check, "not_reexecuted", Severity.WARNING,
                                 "the task set is private: its held-out accuracy cannot be re-measured without the "
                                 "answers; an evaluation claim (vrl evaluate) makes it checkable"))
        run.stats[check] = {"claimed versions": len(claims), "re-measured": 0}
        return
    # models has no problem (above): the inputs' node.toml was read and its task set opened.
    assert run.config is not None and models.tasks is not None
    work, count = run.config.work, run.config.train.held_out
    evaluation = held_out(models.tasks, count)
    spec = work.reward_spec  # the network's reward ([work] reward), as its nodes pinned it
    versions = sorted(claims)
    chosen = [v for v in versions if v in (versions[0], versions[-1]) or sampled(run.policies[v].id, share)]
    series = []
    for version in versions:
        claim = claims[version]
        point = {"version": version, "claimed": claim["held_out_accuracy"],
                 "claimed_expected": claim.get("held_out_expected_accuracy")}
        if version in chosen:
            a = run.policies[version]
            model = models.version(a)
            progress(check, 1)
            if model is None:
                findings.append(finding(check, "weights_unavailable", Severity.WARNING,
                                         f"version {version}'s accuracy not re-measured: its weights are not among "
                                         f"the inputs", version=version))
            else:
                with threads_of(a.platform, model):
                    same = a.platform == platform_tag(model) and bit_exact_platform(a.platform)
                    sampled_now = accuracy(model, evaluation, spec, temperature=work.temperature,
                                           max_new_tokens=models.max_new_tokens)
                    expected_now = expected_accuracy(model, evaluation, temperature=work.temperature)
                point.update(measured=sampled_now, measured_expected=expected_now, same_platform=same)
                off = abs(sampled_now - claim["held_out_accuracy"])
                off_expected = abs(expected_now - claim.get("held_out_expected_accuracy", expected_now))
                allowed = 1e-12 if same else ACCURACY_PROBLEMS_ACROSS_PLATFORMS / len(evaluation)
                allowed_expected = EXPECTED_ACCURACY_SAME_PLATFORM if same else EXPECTED_ACCURACY_ACROSS_PLATFORMS
                if off > allowed or off_expected > allowed_expected:
                    findings.append(finding(
                        check, "accuracy_claim", Severity.ERROR,
                        f"version {version} claims held-out accuracy {claim['held_out_accuracy']:.1%} "
                        f"({claim.get('held_out_expected_accuracy', float('nan')):.2%} expected); re-measured on "
                        f"{len(evaluation)} problems: {sampled_now:.1%} ({expected_now:.2%})"
                        + ("" if same else " on another platform"), run.trainer or b"", version=version,
                        claimed=claim["held_out_accuracy"], measured=sampled_now,
                        claimed_expected=claim.get("held_out_expected_accuracy"), measured_expected=expected_now))
        series.append(point)
    run.stats[check] = {"claimed versions": len(claims), "re-measured": sum("measured" in p for p in series),
                        "held-out problems": len(evaluation)}
    run.series["accuracy"] = series
