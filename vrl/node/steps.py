"""The trainer's steps judged (specs/training.md §5-6): a sub-machine of
:class:`vrl.node.protocol.NodeProtocol`, fed the step events and answering with actions as the
protocol does.

A verifier judges each announced step by the rules signed data alone can check
(:func:`step_rule_faults`), replays the steps its own step ticket draws (or that a verifier
whose word counts reported as fraud), publishes a step verdict on each, counts the others',
and convicts the trainer once fraud is confirmed: from then on the node follows none of its
versions. What it reads of the rest of the node's state (policies, groups, verdicts, the clock,
reputation) it reads through :class:`Ledger`, which the protocol is.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from vrl.node.events import (
    Abandoned,
    Action,
    ConvictTrainer,
    Event,
    FetchGroup,
    PersistStep,
    Publish,
    ReplayStep,
    StepReplayed,
    StepStateMissing,
    StepVerdictReceived,
)
from vrl.node.messages import (
    STEP_TICKET_DOMAIN,
    TOPIC_STEPS,
    Outcome,
    PolicyAnnouncement,
    SignedVerdict,
    StepFault,
    StepOutcome,
    StepVerdict,
    ticket_selected,
)
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import bit_exact_platform

# Step faults that signed data alone proves (specs/training.md §5): the announcements, the
# trainer's own verdicts and the groups' records, and the reward proofs file the announcement
# binds by hash (a proof fails or is missing for every node with the network's SRS alike). One
# node's finding of them is conviction enough; so is a replay on the trainer's own platform,
# which must be bit-exact. The rest (a replay on another platform, within a calibrated
# tolerance; what the network did not deliver) needs a second reporter whose word counts.
SELF_EVIDENT_FAULTS = frozenset({StepFault.WRONG_PARENT, StepFault.WRONG_OPTIMIZER_BEFORE, StepFault.WRONG_CONFIG,
                                 StepFault.REJECTED_GROUP, StepFault.STALE_GROUP, StepFault.REWARD_UNPROVEN})


def step_rule_faults(a: PolicyAnnouncement, parent: PolicyAnnouncement, group_versions: dict[bytes, int],
                     trainer_fails: dict[bytes, int], max_staleness: int) -> tuple[str, ...]:
    """The faults of specs/training.md §5's rules: what signed data alone shows wrong with the
    step that made ``a``, given its parent's announcement, the policy versions of the batch
    groups known (digest -> version) and the rounds of the trainer's own hard fails on them
    (digest -> the verdict's round)."""
    faults = set()
    if a.parent != parent.model_hash:
        faults.add(StepFault.WRONG_PARENT)
    if a.optimizer_before != parent.optimizer:
        faults.add(StepFault.WRONG_OPTIMIZER_BEFORE)
    if a.config != parent.config:  # a run's step config is fixed at version 0
        faults.add(StepFault.WRONG_CONFIG)
    for digest in a.groups:
        # The trainer's own hard fail, signed while an earlier version was current: it knew
        # before this step's round began (a fail signed in that round may follow the step).
        if trainer_fails.get(digest, a.version - 1) < a.version - 1:
            faults.add(StepFault.REJECTED_GROUP)
        if digest in group_versions and not 0 <= (a.version - 1) - group_versions[digest] <= max_staleness:
            faults.add(StepFault.STALE_GROUP)
    return tuple(sorted(faults))


class Ledger(Protocol):
    """What the step judge reads of the rest of a node's protocol state."""

    policies: dict[int, PolicyAnnouncement]
    loaded: set[int]
    verdicts: dict[bytes, dict[bytes, SignedVerdict]]
    round_started: dict[int, float]
    now: float

    def group_version(self, digest: bytes) -> int | None: ...

    def trust(self, node: bytes) -> float: ...

    def counts(self, verifier: bytes) -> bool: ...

    def pretrusted(self, node: bytes) -> bool: ...


class StepJudge:
    """One verifier's judgement of the trainer's steps. ``max_staleness``, ``step_audit_rate``
    and ``step_wait`` are the protocol's ([protocol] table); ``stranger_cap`` is how many step
    verdicts of one version it takes from verifiers of weight 0."""

    def __init__(self, key: NodeKey, platform: str, *, max_staleness: int, step_audit_rate: float,
                 step_wait: float, stranger_cap: int) -> None:
        self.key, self.me, self.platform = key, key.node_id, platform
        self.max_staleness, self.step_audit_rate, self.step_wait = max_staleness, step_audit_rate, step_wait
        self.stranger_cap = stranger_cap
        # Step verdicts by version and verifier, this node's step-ticket draws, and the
        # conviction, once trainer fraud is confirmed.
        self.verdicts: dict[int, dict[bytes, StepVerdict]] = defaultdict(dict)
        self._draws: dict[int, bool] = {}
        self.convicted: ConvictTrainer | None = None
        self._frauds_found: set[int] = set()  # versions this node itself reported as fraud
        self._replaying: set[int] = set()  # versions whose ReplayStep is under way

    def follows(self, version: int) -> bool:
        """Whether this node still follows a version: every one before a convicted step."""
        return self.convicted is None or version < self.convicted.version

    # -- events ------------------------------------------------------------------------------
    def handle(self, event: Event, ledger: Ledger) -> list[Action]:
        """The actions a step event calls for; other events call for none here."""
        match event:
            case StepVerdictReceived(verdict):
                return self._received(verdict, ledger)
            case StepReplayed(version, faults, replayed, drift):
                self._replaying.discard(version)
                return self._publish(version, faults, replayed, drift, ledger)
            case StepStateMissing(version):
                # The daemon could not get a step's config or optimizer files: fraud once the
                # trainer has had ``step_wait`` seconds to serve them, else asked again later.
                self._replaying.discard(version)
                if ledger.now - ledger.round_started.get(version, ledger.now) < self.step_wait:
                    return []
                return self._publish(version, (StepFault.UNAVAILABLE_STATE,), b"", 0.0, ledger)
            case Abandoned(ReplayStep(a)):
                self._replaying.discard(a.version)
        return []

    # -- what is still to do ----------------------------------------------------------------
    def _judgeable(self, ledger: Ledger, current: int) -> list[int]:
        """Steps this node may still judge, oldest first: not its own, and its parent's weights
        still among those a node keeps (max_staleness + 1 versions before ``current``, the
        protocol's round). A window, so the work per event does not grow with every version."""
        return [v for v in range(max(1, current - self.max_staleness + 1), current + 1)
                if v in ledger.policies and ledger.policies[v].trainer != self.me]

    def _to_replay(self, ledger: Ledger, current: int) -> list[PolicyAnnouncement]:
        """Steps drawn (or reported) for replay, judged by the rules, not yet judged here."""
        out = []
        for version in self._judgeable(ledger, current):
            a = ledger.policies[version]
            if (self.me not in self.verdicts[version] and self._rule_faults(a, ledger) == ()
                    and (self._drawn(a) or self._reported(version, ledger))):
                out.append(a)
        return out

    def pending(self, ledger: Ledger, current: int) -> tuple[list[PolicyAnnouncement], list[Action]]:
        """What the steps call for at round ``current``, asked once: the steps to replay (whose
        weights the node must hold: each and its parent), then the step verdicts the rules call
        for and the replays not already under way."""
        return self._to_replay(ledger, current), self._pending(ledger, current)

    def _pending(self, ledger: Ledger, current: int) -> list[Action]:
        actions: list[Action] = []
        for version in self._judgeable(ledger, current):
            if self.me in self.verdicts[version]:
                continue
            a = ledger.policies[version]
            faults = self._rule_faults(a, ledger)
            if faults:
                actions += self._publish(version, faults, b"", 0.0, ledger)
            elif faults is not None and (self._drawn(a) or self._reported(version, ledger)):
                if missing := [d for d in a.groups if ledger.group_version(d) is None]:
                    if getattr(ledger, "committee", False):
                        # Groups are fetched by digest in the committee design (specs/network.md §3.5).
                        for d in missing:
                            actions += ledger._once(FetchGroup(d, ledger.rounds.round_of.get(d, a.version - 1)))
                    if ledger.now - ledger.round_started.get(version, ledger.now) >= self.step_wait:
                        actions += self._publish(version, (StepFault.UNAVAILABLE_GROUP,), b"", 0.0, ledger)
                elif version in ledger.loaded and version - 1 in ledger.loaded and version not in self._replaying:
                    self._replaying.add(version)
                    actions.append(ReplayStep(a))
        return actions

    def _rule_faults(self, a: PolicyAnnouncement, ledger: Ledger) -> tuple[str, ...] | None:
        """What signed data alone shows wrong with a step (:func:`step_rule_faults`); None
        while its parent's announcement is unknown."""
        parent = ledger.policies.get(a.version - 1)
        if parent is None:
            return None
        fails = {d: own.round for d in a.groups
                 if (own := ledger.verdicts.get(d, {}).get(a.trainer)) is not None and own.outcome == Outcome.HARD_FAIL}
        versions = {d: v for d in a.groups if (v := ledger.group_version(d)) is not None}
        return step_rule_faults(a, parent, versions, fails, self.max_staleness)

    def _drawn(self, a: PolicyAnnouncement) -> bool:
        """This node's step ticket for the announcement: its own signature, drawn after the
        step exists, so the trainer cannot know which verifiers will replay which steps."""
        if a.version not in self._draws:
            ticket = self.key.sign(STEP_TICKET_DOMAIN + a.id)
            self._draws[a.version] = ticket_selected(ticket, self.step_audit_rate)
        return self._draws[a.version]

    def _reported(self, version: int, ledger: Ledger) -> bool:
        """Whether a verifier whose word counts reported the step as fraud: then every
        verifier replays it, as a failed group is re-checked (specs/network.md §5.1)."""
        return any(v.outcome == StepOutcome.FRAUD and verifier != self.me and ledger.counts(verifier)
                   for verifier, v in self.verdicts[version].items())

    # -- verdicts ----------------------------------------------------------------------------
    def _publish(self, version: int, faults: tuple[str, ...], replayed: bytes, drift: float,
                 ledger: Ledger) -> list[Action]:
        a = ledger.policies.get(version)
        if a is None or self.me in self.verdicts[version]:
            return []
        verdict = StepVerdict(verifier=self.me, trainer=a.trainer, version=version, announcement=a.id,
                              outcome=StepOutcome.FRAUD if faults else StepOutcome.PASS,
                              reasons=tuple(sorted(set(faults))), replayed=replayed, drift=drift,
                              platform=self.platform).signed(self.key)
        self.verdicts[version][self.me] = verdict
        if faults:
            self._frauds_found.add(version)
        if not faults and getattr(ledger, "committee", False):
            # No other node acts on a pass (only fraud reports make others replay or convict): in
            # the committee design it is stored, not gossiped, or every node receives
            # step_audit_rate x N of them a round (specs/network.md §3.5).
            return [PersistStep(verdict)]
        return [Publish(TOPIC_STEPS, verdict.to_bytes())]

    def _received(self, verdict: StepVerdict, ledger: Ledger) -> list[Action]:
        """Count another verifier's step verdict on a known announcement: one per verifier
        and version, at most ``stranger_cap`` from verifiers of weight 0."""
        a = ledger.policies.get(verdict.version)
        known = self.verdicts[verdict.version]
        if a is None or verdict.announcement != a.id or verdict.trainer != a.trainer or verdict.verifier in known:
            return []
        if ledger.trust(verdict.verifier) == 0 and sum(
                1 for v in known if ledger.trust(v) == 0) >= self.stranger_cap:
            return []
        known[verdict.verifier] = verdict
        if verdict.verifier == self.me and verdict.outcome == StepOutcome.FRAUD:
            self._frauds_found.add(verdict.version)  # this node's own, replayed from its store
        return [PersistStep(verdict)]

    def convictions(self, ledger: Ledger) -> list[Action]:
        """Trainer fraud is confirmed when this node found it itself, and either the evidence
        is self-evident (SELF_EVIDENT_FAULTS, or a replay on the trainer's own platform) or
        another verifier whose word counts found it too (specs/training.md §6)."""
        if self.convicted is not None:
            return []
        for version in sorted(self._frauds_found):
            verdicts = self.verdicts[version]
            mine, a = verdicts[self.me], ledger.policies[version]
            others = tuple(sorted(v for v, sv in verdicts.items() if v != self.me and sv.outcome == StepOutcome.FRAUD
                                  and (ledger.counts(v) or ledger.pretrusted(v))))
            evident = bool(set(mine.reasons) & SELF_EVIDENT_FAULTS) or (
                mine.platform == a.platform and bit_exact_platform(a.platform) and mine.replayed != b"")
            if evident or others:
                self.convicted = ConvictTrainer(a.trainer, version, mine.reasons, (self.me, *others))
                return [self.convicted]
        return []
