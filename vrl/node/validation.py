"""The gossip validator: cheap, pure checks of a message before anything is stored or
forwarded (specs/network.md §3). It accepts, ignores (not forwarded, but not the forwarder's
fault) or rejects (counted against the forwarder) each message, by what the node's protocol
state already knows."""

from __future__ import annotations

from p2p.transport import Message, Validation
from vrl.node.groups import GroupCache
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_POLICIES,
    TOPIC_STEPS,
    TOPIC_VERDICTS,
    MessageError,
    PolicyAnnouncement,
    SignedVerdict,
    StepVerdict,
    decode_group,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.protocol import NodeProtocol


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
                        or protocol.slot_taken(group.subject, group.version, group.index, group.digest)):
                    return Validation.IGNORE
                self.groups.remember(message.msg_id, group)
            elif message.topic == TOPIC_VERDICTS:
                verdict = SignedVerdict.from_bytes(message.data)
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
