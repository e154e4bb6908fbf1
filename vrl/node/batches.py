"""The trainer's batches (specs/network.md §5.2, specs/reputation.md §6): when it steps, which
decided groups a step trains on (admission by reputation), and the groups it planted, which it
reveals once the batch is fixed.

Rules of :class:`vrl.node.protocol.NodeProtocol`, functions of its state as the committee
design's :mod:`vrl.node.rounds` rules are; pure like it: no I/O, no clock.
"""

from __future__ import annotations

import hashlib

from vrl.node import rounds as routing
from vrl.node.admission import Candidate, admit
from vrl.node.events import Action, Train
from vrl.node.messages import Outcome
from vrl.node.state import NodeState

# A round's admission draw is seeded by its policy, which no worker knows before the round
# (specs/reputation.md §6).
ADMISSION_DOMAIN = b"vrl/admission/v1\x00"


def maybe_train(node: NodeState, version: int) -> list[Action]:
    """Step when a full batch is decided; or when the round has settled (every fresh group
    decided, one of this version among them, nothing new for ``verdict_wait``); or, with
    whatever is decided, after ``round_timeout``."""
    if version not in node.loaded or node.training(version):
        return []
    if node.config.last_version and version >= node.config.last_version:
        return []
    fresh = node.fresh_groups()
    decisions = node.design.decisions(node, fresh)
    ready = [d for d, ok in decisions.items() if ok]
    started = node.round_started.get(version, node.now)
    last_arrival = max((node.groups[d].arrived for d in fresh), default=started)
    enough = len(ready) >= node.config.admission.batch_groups
    settled = (None not in decisions.values() and any(node.groups[d].version == version for d in ready)
               and node.now - last_arrival >= node.config.verdict_wait)
    timed_out = node.now - started >= node.config.round_timeout
    if not (enough or settled or timed_out) or len(ready) < node.config.min_batch_groups:
        return []
    candidates = [Candidate(d, node.groups[d].subject, node.standing(node.groups[d].subject).score,
                            verified=routing.verified(node, d)) for d in sorted(ready)]
    seed = hashlib.sha256(ADMISSION_DOMAIN + node.policies[version].model_hash).digest()
    batch = admit(candidates, node.config.admission, seed)
    if len(batch) < node.config.min_batch_groups:
        return []
    return node.once(Train(version, tuple((c.group, w) for c, w in batch)))


def reveal_plants(node: NodeState, version: int) -> list[Action]:
    """After the round's batch is fixed, the trainer says which groups it planted (those it
    still holds: a forgotten one's round is long past, vrl.node.forgetting)."""
    actions: list[Action] = []
    for digest, planted_in in sorted(node.planted.items()):
        if planted_in <= version and digest in node.groups and node.me not in node.verdicts[digest]:
            actions += node.publish_verdict(digest, Outcome.HARD_FAIL, ("planted",), b"")
    return actions
