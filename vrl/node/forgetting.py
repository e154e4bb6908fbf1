"""What a node forgets over a run (specs/network.md §2.1): the groups no rule can read any more,
with their verdicts and the memos kept per group, once their policy version is below a floor
that follows the current round.

A part of :class:`vrl.node.protocol.NodeProtocol`, pure like it: no I/O, no clock. Nothing
accepted is lost: the store keeps every group and verdict (specs/storage.md), and a node's
reputation keeps every report a forgotten verdict gave (its scores decay but never drop
evidence, specs/reputation.md §2). What is kept of a forgotten group is its digest and version,
which the step judge's stale-group rule reads (specs/training.md §5), and the trainer's own hard
fail on it, which its rejected-group rule reads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vrl.node.messages import Outcome
from vrl.node.reputation import Report

#: The protocol this part reads (vrl.node.protocol.NodeProtocol; not imported: it imports this module).
NodeProtocol = Any


def group_floor(version: int, max_staleness: int) -> int:
    """The oldest policy version whose groups a node at round ``version`` still holds. A group
    counts while fresh (``version - max_staleness``); a step the judge may still judge
    (``version - max_staleness + 1`` on) may list groups ``max_staleness + 1`` rounds older than
    itself (specs/training.md §5), so its batch reaches ``version - 2 max_staleness``; and one
    to spare, as :meth:`vrl.node.rounds.Rounds.forget` keeps, for a peer a round behind whose
    fetch of such a group this node may serve."""
    return version - 2 * max_staleness - 1


def forget(node: NodeProtocol, version: int) -> None:
    """At round ``version``, drop the groups below :func:`group_floor` with their verdicts, their
    slots, their check draws and the trainer's lazy-audit draws of their verdicts; a group whose
    check is under way is kept until the floor next moves. A group below the floor is never taken
    again (:meth:`NodeProtocol._accept_group`), so no verdict on it counts again."""
    floor = group_floor(version, node.config.max_staleness)
    if floor <= node.group_floor:
        return
    node.group_floor = floor
    trainer = node.config.trainer
    for version in sorted(v for v in node._by_version if v < floor):
        kept = []
        for digest in node._by_version.pop(version):
            if ("check", digest) in node._in_flight:
                kept.append(digest)  # its verdict will be signed; forgotten at the next floor
                continue
            node.groups.pop(digest)
            node.forgotten[digest] = version
            verdicts = node.verdicts.pop(digest, {})
            own = verdicts.get(trainer)
            if own is not None and own.outcome == Outcome.HARD_FAIL:
                node.forgotten_fails[digest] = own.round
            for verdict in verdicts.values():
                node._audit_draws.pop(verdict.signature, None)
            node._draws.pop(digest, None)
            node.abandoned_checks.pop(digest, None)
            node.rounds.late_failures.discard(digest)
            node.scans.forget(digest)
        if kept:
            node._by_version[version] = kept
    for slot in [s for s in node._slots if s[1] < floor and node._slots[s] not in node.groups]:
        del node._slots[slot]


def compact(node: NodeProtocol, report: Report, group: Any) -> Report:
    """The same report (equal field by field), sharing one copy of its verifier id, platform,
    group digest and recomputed digest with the reports already held: a report outlives its
    verdict and group (the reputation keeps every one, specs/reputation.md §2), and each verdict
    decoded brings its own copy of each, ~250 of a report's ~600 bytes (bench/results/protocol-memory.json).
    The verifier ids and platforms are one per node and platform; the digests are the group's."""
    shared = node.shared
    reporter = shared.setdefault(report.reporter, report.reporter)
    platform = shared.setdefault(report.platform, report.platform)
    if report.digest and not group.recomputed:
        group.recomputed = report.digest
    digest = group.recomputed if report.digest == group.recomputed else report.digest
    return dataclasses.replace(report, reporter=reporter, platform=platform, group=group.digest or report.group,
                               digest=digest)
