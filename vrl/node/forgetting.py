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

from vrl.node.messages import Outcome
from vrl.node.reputation import Report
from vrl.node.state import HeldGroup, NodeState


def group_floor(version: int, max_staleness: int) -> int:
    """The oldest policy version whose groups a node at round ``version`` still holds. A group
    counts while fresh (``version - max_staleness``); a step the judge may still judge
    (``version - max_staleness + 1`` on) may list groups ``max_staleness + 1`` rounds older than
    itself (specs/training.md §5), so its batch reaches ``version - 2 max_staleness``; and one
    to spare, as :meth:`vrl.node.rounds.Rounds.forget` keeps, for a peer a round behind whose
    fetch of such a group this node may serve."""
    return version - 2 * max_staleness - 1


def forget(node: NodeState, version: int) -> None:
    """At round ``version``, drop the groups below :func:`group_floor` with their verdicts, their
    slots, their check draws and the trainer's lazy-audit draws of their verdicts; a group whose
    check is under way is kept until the floor next moves. A group below the floor is never taken
    again (:meth:`NodeProtocol.accept_group`), so no verdict on it counts again."""
    floor = group_floor(version, node.config.max_staleness)
    if floor <= node.group_floor:
        return
    node.group_floor = floor
    trainer = node.config.trainer
    for version in node.versions_below(floor):
        kept = []
        for digest in node.groups_of_version(version):
            if node.checking(digest):
                kept.append(digest)  # its verdict will be signed; forgotten at the next floor
                continue
            node.forgotten[digest] = version
            own = node.drop_group(digest).get(trainer)
            if own is not None and own.outcome == Outcome.HARD_FAIL:
                node.forgotten_fails[digest] = own.round
        node.keep_groups(version, kept)
    node.drop_slots_below(floor)


def compact(node: NodeState, report: Report, group: HeldGroup) -> Report:
    """The same report (equal field by field), sharing one copy of its verifier id, platform,
    group digest and recomputed digest with the reports already held: a report outlives its
    verdict and group (the reputation keeps every one, specs/reputation.md §2), and each verdict
    decoded brings its own copy of each, ~250 of a report's ~600 bytes (bench/results/protocol-memory.json).
    The verifier ids and platforms are one per node and platform; the digests are the group's."""
    reporter = node.shared_ids.setdefault(report.reporter, report.reporter)
    platform = node.shared_platforms.setdefault(report.platform, report.platform)
    if report.digest and not group.recomputed:
        group.recomputed = report.digest
    digest = group.recomputed if report.digest == group.recomputed else report.digest
    return dataclasses.replace(report, reporter=reporter, platform=platform, group=group.digest or report.group,
                               digest=digest)
