"""Decoded groups a node holds in memory, so that a group is decoded (and its signatures
checked) once: from the validator to the handler that follows it, and from its arrival to the
check and the training step that use its records. Both caches are bounded; a group that is
gone is decoded again, from the message or from the store, as when it arrived."""

from __future__ import annotations

from collections import OrderedDict

import structlog

from vrl.node.messages import Group, MessageError, decode_group
from vrl.node.store import Store

# Groups the validator decoded, held for the handler that follows it (by message id), so a
# group is decoded and its signatures checked once. A validated message is handled at once,
# so a few hundred cover any burst; one evicted early is only decoded again.
MAX_DECODED_GROUPS = 512
# Decoded groups kept for the check and the training step that may follow, least recently
# used first out, bounded by their message bytes: decoded records take about 9x their bytes
# (a 256 KiB group is 2.3 MiB of Python objects, measured in review), so 32 MiB of messages is
# at most ~300 MiB, and thousands of groups of the sizes a devnet makes. One that is gone is
# read back from the store and decoded again, signatures checked as when it arrived.
DECODED_GROUP_BYTES = 32 << 20


def _size(group: Group) -> int:
    return sum(map(len, group.submission.records))


class GroupCache:
    """The node's decoded groups: by message id until handled (:meth:`remember`,
    :meth:`group_of`), then by digest, least recently used first out (:meth:`keep`,
    :meth:`body`), read back from ``store`` when gone."""

    def __init__(self, store: Store, log: structlog.BoundLogger, *, max_decoded: int = MAX_DECODED_GROUPS,
                 max_bytes: int = DECODED_GROUP_BYTES) -> None:
        self.store, self.log = store, log
        self.max_decoded, self.max_bytes = max_decoded, max_bytes
        self.decoded: OrderedDict[bytes, Group] = OrderedDict()  # message id -> group (max_decoded)
        self.bodies: OrderedDict[bytes, Group] = OrderedDict()  # digest -> group (max_bytes)
        self.body_bytes = 0

    def remember(self, message_id: bytes, group: Group) -> None:
        """Hold a group decoded from the message ``message_id`` until it is handled."""
        self.decoded[message_id] = group
        while len(self.decoded) > self.max_decoded:
            self.decoded.popitem(last=False)

    def group_of(self, message_id: bytes, data: bytes) -> Group:
        """The group a validated message holds: decoded by the validator, else decoded now."""
        group = self.decoded.pop(message_id, None)
        return group if group is not None else decode_group(data)

    def persist(self, group: Group, received: float) -> bool:
        """Store a validated group (under the signer and version of its records) and hold it
        decoded: whether the store did not have it yet."""
        new = self.store.put_group(group.submission, group.subject, group.version, received)
        if new:
            self.keep(group)
        return new

    def keep(self, group: Group) -> None:
        """Hold a stored group's decoded records for its check and training step."""
        if group.digest in self.bodies:
            self.bodies.move_to_end(group.digest)
            return
        self.bodies[group.digest] = group
        self.body_bytes += _size(group)
        while self.body_bytes > self.max_bytes and len(self.bodies) > 1:
            _, old = self.bodies.popitem(last=False)
            self.body_bytes -= _size(old)

    def body(self, digest: bytes) -> Group | None:
        """A stored group, decoded: held since it arrived, else read back from the store."""
        group = self.bodies.get(digest)
        if group is None:
            submission = self.store.group(digest)
            if submission is None:
                return None
            try:  # the disk is trusted no more than the network was
                group = decode_group(submission.to_bytes())
            except MessageError as error:
                self.log.warning("stored group does not decode", group=digest.hex()[:12], error=str(error))
                return None
        self.keep(group)
        return group
