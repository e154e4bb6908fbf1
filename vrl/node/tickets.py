"""The ticket design's checks (specs/network.md §4-5): which fresh groups a node checks, and
which it skips with a signed verdict, when every verifier draws an audit ticket per group.

A rule of :class:`vrl.node.protocol.NodeProtocol`, a function of its state as the committee
design's :func:`vrl.node.rounds.committee_checks` is; pure like it: no I/O, no clock.
"""

from __future__ import annotations

from vrl.node.events import Action, Check
from vrl.node.messages import Outcome, audit_ticket, ticket_selected
from vrl.node.scans import scan_key
from vrl.node.state import NodeState


def ticket_checks(node: NodeState) -> list[Action]:
    """The checks the state calls for in the ticket design: failures re-checked, the trainer's
    lazy-verifier audits, a suspect's every group, and each group this node's own ticket draws
    at the subject's check rate; a group it does not draw gets a signed skip."""
    actions: list[Action] = []
    # Only the groups touched since the last pass, unless what every rule reads moved: at N = 100
    # a pass over every fresh group at each event (~400 groups x ~100 verdicts) was most of a
    # node's time (bench/simulate.py, profiled).
    for digest in node.scans.checks.candidates(node, scan_key(node)):
        group = node.groups[digest]
        mine = node.verdicts[digest].get(node.me)
        if (group.subject == node.me or digest in node.planted or (mine is not None and mine.checked)
                or group.version not in node.loaded or group.subject in node.quarantined):
            continue  # (a quarantined node's groups are never trained: checking them is waste)
        others = [v for verifier, v in node.verdicts[digest].items() if verifier != node.me]
        # A failure is re-checked even over one's own skip (specs/network.md §5.1): by the
        # trainer whoever reported it, since it decides what is trained; by other verifiers
        # only when the reporter's word counts, so a stranger cannot make everyone check
        # everything.
        recheck = any(v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL)
                      and (node.has("trainer") or node.counts(v.verifier))
                      for v in others)
        audit = node.has("trainer") and any(node.audits(v) for v in others)
        if recheck or audit:
            actions += node.once(Check(digest, group.version))
        elif node.suspect(group.subject) and (node.has("verifier") or node.has("trainer")):
            # A producer a counting verifier's sequential test failed: every group of it is
            # checked, so that this node's own test sees all of them, chosen by no one.
            actions += node.once(Check(digest, group.version))
        elif mine is None and node.has("verifier") and not node.checking(digest):
            rate = node.standing(group.subject).check_rate
            if ticket_selected(audit_ticket(node.key, digest), rate):
                actions += node.once(Check(digest, group.version))
            else:
                actions += node.publish_verdict(digest, Outcome.SKIPPED, (), b"", rate=rate)
    return actions
