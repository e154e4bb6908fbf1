"""The gossip validator: cheap, pure checks of a message before anything is stored or
forwarded (specs/network.md §3). It accepts, ignores (not forwarded, but not the forwarder's
fault) or rejects (counted against the forwarder) each message, by what the node's protocol
state already knows."""

from __future__ import annotations

from p2p.transport import Message, Validation
from vrl.node.committee import Refusal
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
    Submission,
    decode_group,
)
from vrl.node.metrics import NodeMetrics
from vrl.node.protocol import NodeProtocol
from vrl.node.wire import NewerVersion
from vrl.rollouts.record import RecordError, Rollout


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
                # A group older than that is still taken when a step this node judges lists it:
                # a replayer fetches the batch of a step made rounds before its own newest
                # version (specs/training.md §5), and refusing those groups made it report an
                # honest trainer's step unavailable_group (a 12-node devnet, 2026-11-28).
                if (group.index >= protocol.config.groups_per_round
                        or len(group.rollouts) != self.group_size
                        or not protocol.takes_group(group.version, group.digest)
                        or protocol.slot_taken(group.subject, group.version, group.index, group.digest)
                        or protocol.design.left_out(protocol, group.digest, group.version)):
                    return Validation.IGNORE
                self.groups.remember(message.msg_id, group)
            elif message.topic == TOPIC_VERDICTS:
                verdict = SignedVerdict.from_bytes(message.data)
                # The design's claim first (specs/committee.md §4): in the committee design a
                # fresh key is refused on a table lookup, before its signature is checked. Every
                # refusal but these two follows from the signed manifest alike at every node, so
                # an honest forwarder never sends one: MANIFEST_MISSING (not yet here; backfill
                # brings it again) and NO_CLAIM (whom a node pre-trusts is its own configuration).
                refusal = protocol.verdict_refusal(verdict)
                if refusal in (Refusal.MANIFEST_MISSING, Refusal.NO_CLAIM):
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
                if manifest.trainer != protocol.config.trainer or not protocol.design.manifests:
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
        except NewerVersion:  # a later release's message: not the forwarder's fault (network.md §7)
            return Validation.IGNORE
        except MessageError:
            self.metrics.invalid.labels(message.topic).inc()
            return Validation.REJECT
        return Validation.ACCEPT

    def waits(self, message: Message) -> int | None:
        """Of a message this node did not store once it was judged and handled: the policy version
        it waits in if its reason is temporary, else None (specs/network.md §6: backfill offers it
        again). Temporary: a verdict whose round's manifest (the committee design) or whose group
        is not here yet (the protocol parks it, bounded: NodeProtocol._pending); a group or a step
        verdict of a version not announced here yet (ignored above, or by the step judge). Every
        other refusal holds for good: a duplicate slot, a quarantined producer, another trainer,
        a full stranger quota, a claim or signature that fails. Cheap: no signature is checked."""
        protocol = self.protocol
        current = protocol.version
        try:
            if message.topic == TOPIC_VERDICTS:
                verdict = SignedVerdict.from_bytes(message.data)
                version = verdict.policy_version
                if protocol.design.manifests and version not in protocol.rounds.manifests:
                    return version if version >= protocol.rounds.floor else None  # (below: forgotten)
                return version if verdict.group not in protocol.groups else None
            if message.topic == TOPIC_GROUPS:
                version = Rollout.from_bytes(Submission.from_bytes(message.data).records[0]).policy_version
                return version if current is None or version > current + 1 else None
            if message.topic == TOPIC_STEPS:
                version = StepVerdict.from_bytes(message.data).version
                ahead = current is None or version > current
                return version if ahead and version not in protocol.policies else None
        except (MessageError, RecordError, IndexError):
            return None
        return None
