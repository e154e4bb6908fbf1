"""The gossip validator: cheap, pure checks of a message before anything is stored or
forwarded (specs/network.md §3). It accepts, ignores (not forwarded, but not the forwarder's
fault) or rejects (counted against the forwarder) each message, by what the node's protocol
state already knows."""

from __future__ import annotations

from p2p.transport import Message, Validation
from vrl.node.groups import GroupCache
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_MANIFESTS,
    TOPIC_POLICIES,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    MessageError,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    decode_group,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.protocol import NodeProtocol
from vrl.node.rounds import NO_CLAIM, NO_MANIFEST


class Validator:
    """``validator(message)`` judges one gossip message against ``protocol``'s state; a group
    it accepts is held, decoded, in ``groups`` for the handler that follows. ``group_size`` is
    the network's ([work] group_size)."""

    def __init__(self, protocol: NodeProtocol, group_size: int, groups: GroupCache, metrics: NodeMetrics) -> None:
        self.protocol, self.group_size, self.groups, self.metrics = protocol, group_size, groups, metrics

    def __call__(self, message: Message) -> Validation:
        protocol = self.protocol
        try:
            if message.topic == TOPIC_GROUPS:
                group = decode_group(message.data)
                if group.subject in protocol.quarantined:
                    return Validation.IGNORE  # the forwarder is not at fault
                # Network parameters (specs/network.md §3.1): a round has groups_per_round
                # groups of group_size samples per node, of a version still usable. A worker
                # free to submit any index or size could keep the groups or samples it likes.
                # Ignored, not rejected: a peer configured otherwise is not hostile.
                if (group.index >= protocol.config.groups_per_round
                        or len(group.rollouts) != self.group_size
                        or not protocol.may_hold(group.version)
                        or protocol.slot_taken(group.subject, group.version, group.index, group.digest)
                        or (protocol.committee and protocol.rounds.listed(group.digest, group.version) is False)):
                    return Validation.IGNORE
                self.groups.remember(message.msg_id, group)
            elif message.topic == TOPIC_VERDICTS:
                verdict = SignedVerdict.from_bytes(message.data)
                # The design's claim first (specs/committee.md §4): in the committee design a
                # fresh key is refused on a table lookup, before its signature is checked. Every
                # refusal but these two follows from the signed manifest alike at every node, so
                # an honest forwarder never sends one: NO_MANIFEST (not yet here; backfill brings
                # it again) and NO_CLAIM (whom a node pre-trusts is its own configuration).
                refusal = protocol.verdict_refusal(verdict)
                if refusal in (NO_MANIFEST, NO_CLAIM):
                    return Validation.IGNORE
                if refusal is not None:
                    self.metrics.invalid.labels(message.topic).inc()
                    return Validation.REJECT
                if not verdict.valid():
                    return Validation.REJECT
                if protocol.matches_group(verdict) is False or not protocol.room_for(verdict):
                    # Its subject or version is not the group's, or the group has all the
                    # strangers' verdicts it takes: not forwarded, but not the forwarder's fault
                    # (it may not have had the group yet, or seen fewer verdicts).
                    return Validation.IGNORE
            elif message.topic == TOPIC_POLICIES:
                announcement = PolicyAnnouncement.from_bytes(message.data)
                if not announcement.valid():
                    return Validation.REJECT
                if announcement.trainer != protocol.config.trainer:
                    return Validation.IGNORE
            elif message.topic == TOPIC_MANIFESTS:
                manifest = RoundManifest.from_bytes(message.data)
                if manifest.trainer != protocol.config.trainer or not protocol.committee:
                    return Validation.IGNORE
                if not manifest.valid():
                    return Validation.REJECT
            elif message.topic == TOPIC_STEPS:
                step = StepVerdict.from_bytes(message.data)
                if not step.valid():
                    return Validation.REJECT
                if step.trainer != protocol.config.trainer or not protocol.may_hold(step.version):
                    return Validation.IGNORE
            else:
                return Validation.IGNORE
        except MessageError:
            self.metrics.invalid.labels(message.topic).inc()
            return Validation.REJECT
        return Validation.ACCEPT
