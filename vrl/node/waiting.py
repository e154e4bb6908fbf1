"""Verdicts a node holds before it can count them, and the cap on strangers' verdicts per group
(specs/network.md §3.2; specs/committee.md §7.4).

A part of :class:`vrl.node.protocol.NodeProtocol`, pure like it: no I/O, no clock. Gossip keeps
no order, so a verdict may come before the group it names (or, in the committee design, before
its round's manifest). It waits here, unstored, in a bounded buffer: :meth:`WaitingVerdicts.add`
holds one, :meth:`WaitingVerdicts.take` hands back those on a group that has come, and
:meth:`WaitingVerdicts.take_round` those of a round whose manifest has come. What the buffer
drops when full is said at :meth:`WaitingVerdicts.add`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from vrl.node.messages import SignedVerdict

# Verdicts that name a group this node has not seen wait for it (gossip does not keep order),
# at most this many, oldest dropped first (specs/network.md §3.2). A round brings about
# workers x groups_per_round x verifiers verdicts (the 4-node devnet: 3 x 4 x 4 = 48); 4096
# covers a whole round of 32 nodes that all work and verify (32 x 4 x 32) arriving before
# their groups, in ~2 MB (a verdict is ~450 bytes). A dropped one is not lost: backfill
# brings it again once its group is known.
MAX_PENDING_VERDICTS = 4096
# Verdicts on one group from verifiers of weight 0 (strangers: specs/reputation.md §7) that a
# node accepts; more are ignored, not stored. Such a verdict weighs nothing, but each one is a
# report that every reputation recomputation walks (20,000 reports: 1.7 s here). 16 is four
# times the verifiers per group of any devnet measured here, so honest newcomers still fit.
MAX_STRANGER_VERDICTS_PER_GROUP = 16


def room_for(verdict: SignedVerdict, held: Collection[bytes], trust: Callable[[bytes], float]) -> bool:
    """Whether a verdict may be accepted on a group whose verdicts are by ``held`` (verifier ids):
    any from a verifier with weight, and at most MAX_STRANGER_VERDICTS_PER_GROUP per group from
    verifiers of weight 0."""
    if len(held) < MAX_STRANGER_VERDICTS_PER_GROUP or trust(verdict.verifier) > 0:
        return True
    strangers = 0
    for verifier in held:  # stops at the cap: a group of the ticket design holds ~N verdicts
        strangers += trust(verifier) == 0
        if strangers >= MAX_STRANGER_VERDICTS_PER_GROUP:
            return False
    return True


class WaitingVerdicts:
    """Verdicts whose group (or round manifest) has not come yet, by verdict id, oldest first
    (dicts keep order); at most ``cap``."""

    def __init__(self, cap: int = MAX_PENDING_VERDICTS) -> None:
        self.cap = cap
        self._held: dict[bytes, SignedVerdict] = {}
        # group -> its held verdicts' ids, oldest first: a group's arrival takes its own, not a
        # pass over the whole buffer (the trainer's ~4,000 arrivals a round over a full buffer
        # were 3% of bench/simulate.py at N = 1,000)
        self._by_group: dict[bytes, dict[bytes, None]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, verdict_id: bytes) -> bool:
        return verdict_id in self._held

    def __iter__(self) -> Iterator[SignedVerdict]:
        """The waiting verdicts, oldest first (a copy: the buffer may change while it is read)."""
        return iter(list(self._held.values()))

    def add(self, verdict: SignedVerdict, usable: Callable[[int], bool], stranger: Callable[[bytes], bool]) -> None:
        """Hold a verdict (a repeat of a held one changes nothing). Past ``cap``, drop first the
        verdicts whose group version is no longer ``usable`` (NodeProtocol.may_hold), then those
        of a ``stranger`` (a verifier of weight 0), oldest first, then the oldest: a flood of fresh
        keys never pushes out a verdict of a verifier with weight (specs/committee.md §7)."""
        if verdict.id in self._held:
            return
        self._held[verdict.id] = verdict
        self._by_group.setdefault(verdict.group, {})[verdict.id] = None
        if len(self._held) <= self.cap:
            return
        for key in [k for k, v in self._held.items() if not usable(v.policy_version)]:
            self._drop(key)
        strangers = [k for k, v in self._held.items() if stranger(v.verifier)]
        for key in strangers[:max(0, len(self._held) - self.cap)]:
            self._drop(key)
        while len(self._held) > self.cap:
            self._drop(next(iter(self._held)))

    def take(self, group: bytes) -> list[SignedVerdict]:
        """The verdicts on ``group``, oldest first, no longer held: their group has come."""
        taken = [self._held[key] for key in self._by_group.get(group, ())]
        for verdict in taken:
            self._drop(verdict.id)
        return taken

    def take_round(self, version: int) -> list[SignedVerdict]:
        """The verdicts of policy version ``version``, oldest first, no longer held: that round's
        manifest has come, so their claims can be judged now."""
        taken = [v for v in self._held.values() if v.policy_version == version]
        for verdict in taken:
            self._drop(verdict.id)
        return taken

    def _drop(self, key: bytes) -> None:
        group = self._held.pop(key).group
        ids = self._by_group[group]
        del ids[key]
        if not ids:
            del self._by_group[group]
