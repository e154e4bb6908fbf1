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
from dataclasses import dataclass, field
from typing import Protocol

from vrl.node.events import (
    Abandoned,
    Action,
    BatchFetched,
    ConvictTrainer,
    Event,
    FetchBatch,
    FetchGroup,
    PersistStep,
    Publish,
    ReplayStep,
    StepReplayed,
    StepStateMissing,
    StepVerdictReceived,
)
from vrl.node.manifests import Rounds
from vrl.node.messages import (
    STEP_TICKET_DOMAIN,
    TOPIC_STEPS,
    Batch,
    PolicyAnnouncement,
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
                                 StepFault.REJECTED_GROUP, StepFault.STALE_GROUP, StepFault.REWARD_UNPROVEN,
                                 StepFault.BAD_BATCH})



def step_rule_faults(a: PolicyAnnouncement, parent: PolicyAnnouncement, batch: Batch, group_versions: dict[bytes, int],
                     trainer_fails: dict[bytes, int], max_staleness: int) -> tuple[str, ...]:
    """The faults of specs/training.md §5's rules: what signed data alone shows wrong with the
    step that made ``a``, given its parent's announcement, its ``batch`` (inline or from its
    batch file), the policy versions of the batch groups known (digest -> version) and the
    rounds of the trainer's own hard fails on them (digest -> the verdict's round)."""
    faults: set[str] = set(_announcement_faults(a, parent))
    for digest, _ in batch:
        faults.update(_group_faults(a, group_versions.get(digest), trainer_fails.get(digest), max_staleness))
    return tuple(sorted(faults))


def _announcement_faults(a: PolicyAnnouncement, parent: PolicyAnnouncement) -> set[str]:
    faults: set[str] = set()
    if a.parent != parent.model_hash:
        faults.add(StepFault.WRONG_PARENT)
    if a.optimizer_before != parent.optimizer:
        faults.add(StepFault.WRONG_OPTIMIZER_BEFORE)
    if a.config != parent.config:  # a run's step config is fixed at version 0
        faults.add(StepFault.WRONG_CONFIG)
    return faults


def _group_faults(a: PolicyAnnouncement, version: int | None, fail_round: int | None,
                  max_staleness: int) -> tuple[str, ...]:
    """One batch group's part of the rules, from its policy version and the round of the
    trainer's own hard fail on it (each None when unknown)."""
    faults: tuple[str, ...] = ()
    # The trainer's own hard fail, signed while an earlier version was current: it knew
    # before this step's round began (a fail signed in that round may follow the step).
    if fail_round is not None and fail_round < a.version - 1:
        faults += (StepFault.REJECTED_GROUP,)
    if version is not None and not 0 <= (a.version - 1) - version <= max_staleness:
        faults += (StepFault.STALE_GROUP,)
    return faults


@dataclass
class _Rules:
    """One step's rule faults, kept up to date incrementally: only the batch groups touched
    since the last evaluation (a group arrived, a verdict on it came) are looked at again. The
    result is :func:`step_rule_faults` over the same state; what a finding reads of a group (its
    version, the trainer's own hard fail on it) is only ever added to a node's state, a forgotten
    group's included (vrl.node.forgetting), so the per-group findings are recomputed, never dropped."""

    against: tuple[bytes, bytes]  # the signatures of the announcement and its parent
    batch: tuple[bytes, ...]
    base: frozenset[str]  # the faults of the announcement against its parent alone
    dirty: set[bytes]
    rejected: set[bytes] = field(default_factory=set)
    stale: set[bytes] = field(default_factory=set)


class Manifested(Protocol):
    """What the step judge reads of the verification design (vrl.node.state.Design)."""

    @property
    def manifests(self) -> bool:
        """Whether the design closes rounds with a manifest: groups fetched by digest, passes kept."""
        ...


class Ledger(Protocol):
    """What the step judge reads of the rest of a node's protocol state."""

    policies: dict[int, PolicyAnnouncement]
    loaded: set[int]
    round_started: dict[int, float]
    now: float
    rounds: Rounds

    @property
    def design(self) -> Manifested: ...

    def once(self, action: Action) -> list[Action]:
        """``[action]`` unless the same action is already under way (then ``[]``)."""
        ...

    def group_version(self, digest: bytes) -> int | None:
        """The policy version of a group this node holds or held (None if it never did)."""
        ...

    def trainer_fail(self, digest: bytes, trainer: bytes) -> int | None:
        """The round of ``trainer``'s own hard fail on a group this node holds or held, if any."""
        ...

    def trust(self, node: bytes) -> float: ...

    def counts(self, verifier: bytes) -> bool: ...

    def pretrusted(self, node: bytes) -> bool: ...

    def eligible_verifiers(self) -> int:
        """Verifiers a committee is drawn from (the latest manifest's weights table); 0 without one."""
        ...


class StepJudge:
    """One verifier's judgement of the trainer's steps. ``max_staleness``, ``step_audit_rate``
    and ``step_wait`` are the protocol's ([protocol] table); ``stranger_cap`` is how many step
    verdicts of one version it takes from verifiers of weight 0."""

    def __init__(self, key: NodeKey, platform: str, *, max_staleness: int, step_audit_rate: float,
                 step_wait: float, stranger_cap: int, step_committee: int = 0) -> None:
        self.key, self.me, self.platform = key, key.node_id, platform
        self.max_staleness, self.step_audit_rate, self.step_wait = max_staleness, step_audit_rate, step_wait
        self.stranger_cap, self.step_committee = stranger_cap, step_committee
        # Step verdicts by version and verifier, this node's step-ticket draws, and the
        # conviction, once trainer fraud is confirmed.
        self.verdicts: dict[int, dict[bytes, StepVerdict]] = defaultdict(dict)
        self._draws: dict[int, bool] = {}
        self.convicted: ConvictTrainer | None = None
        self._frauds_found: set[int] = set()  # versions this node itself reported as fraud
        self._replaying: set[int] = set()  # versions whose ReplayStep is under way
        # Incremental rule faults of the judgeable steps, and which of them each batch group is
        # in: at N = 1,000 a batch holds ~4,000 groups, and a pass over every batch at each event
        # was most of a simulated node's time (bench/simulate.py, cProfile).
        self._rules: dict[int, _Rules] = {}
        self._batch_of: dict[bytes, list[int]] = defaultdict(list)
        # The batches of judgeable steps whose announcements name a batch file (specs/network.md
        # §3.3.1), fetched only when this node judges the step beyond its announcement: version ->
        # (the announcement's id, the batch); and the versions whose FetchBatch is under way.
        self._files: dict[int, tuple[bytes, Batch]] = {}
        self._batch_at: dict[int, float] = {}  # when each batch file came
        self._fetching: set[int] = set()
        # When this node's first fetch of a step's state ("state": config, optimizer files, the
        # batch file) or of a group its batch lists ("group") failed. Unavailability counts
        # step_wait from there (specs/training.md §5): a 12-node devnet on 2 loaded cores reported
        # its honest trainer after one chunk request timed out, its first try coming after
        # step_wait had passed while it loaded weights.
        self._unserved: dict[tuple[str, int], float] = {}

    def batch_of(self, a: PolicyAnnouncement) -> Batch | None:
        """The batch of the step that made ``a``: listed in it, or fetched from the batch file it
        names; None while that file is not here."""
        if a.inline is not None:
            return a.inline
        found = self._files.get(a.version)
        return found[1] if found is not None and found[0] == a.id else None

    def lists(self, digest: bytes) -> bool:
        """Whether the batch of a step this node may still judge lists ``digest``: a group it
        takes whatever its version (specs/network.md §3.1), since a step's batch reaches
        ``max_staleness + 1`` versions behind the step (vrl.node.forgetting.group_floor)."""
        return bool(self._batch_of.get(digest))

    def touch(self, digest: bytes) -> None:
        """A group, or a verdict on it, came: the steps whose batch lists it are looked at again."""
        for version in self._batch_of.get(digest, ()):
            self._rules[version].dirty.add(digest)

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
                # trainer has had ``step_wait`` seconds since this node first asked in vain,
                # else asked again later.
                self._replaying.discard(version)
                self._unserved.setdefault(("state", version), ledger.now)
                if not self._unserved_for(("state", version), ledger):
                    return []
                return self._publish(version, (StepFault.UNAVAILABLE_STATE,), b"", 0.0, ledger)
            case Abandoned(ReplayStep(a)):
                self._replaying.discard(a.version)
            case Abandoned(FetchBatch(a)):
                self._fetching.discard(a.version)
                self._unserved.setdefault(("state", a.version), ledger.now)
            case Abandoned(FetchGroup(digest, _)):
                for version in self._batch_of.get(digest, ()):
                    self._unserved.setdefault(("group", version), ledger.now)
            case BatchFetched(a, batch):
                held = ledger.policies.get(a.version)
                if held is None or held.id != a.id or a.inline is not None:
                    return []  # not the announcement this node follows: its own fetch is still under way
                self._fetching.discard(a.version)
                if batch is None:  # the file the signed announcement binds is no batch of it
                    return self._publish(a.version, (StepFault.BAD_BATCH,), b"", 0.0, ledger)
                self._files[a.version] = (a.id, batch)
                self._batch_at[a.version] = ledger.now
        return []

    def _unserved_for(self, what: tuple[str, int], ledger: Ledger) -> bool:
        """Whether what this node fetches for a step has been asked for in vain for
        ``step_wait`` seconds: its first failed fetch at least that long ago."""
        first = self._unserved.get(what)
        return first is not None and ledger.now - first >= self.step_wait

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
                    and (self._drawn(a, ledger) or self._reported(version, ledger))):
                out.append(a)
        return out

    def pending(self, ledger: Ledger, current: int) -> tuple[list[PolicyAnnouncement], list[Action]]:
        """What the steps call for at round ``current``, asked once: the steps to replay (whose
        weights the node must hold: each and its parent), then the step verdicts the rules call
        for and the replays not already under way."""
        self._forget(current)
        return self._to_replay(ledger, current), self._pending(ledger, current)

    def _forget(self, current: int) -> None:
        """Drop the rule states of steps no longer judgeable (:meth:`_judgeable`'s window)."""
        for version in [v for v in self._rules if v < current - self.max_staleness + 1]:
            self._forget_batch(version)
        for version in [v for v in self._files if v < current - self.max_staleness + 1]:
            del self._files[version]
            self._batch_at.pop(version, None)
        for key in [k for k in self._unserved if k[1] < current - self.max_staleness + 1]:
            del self._unserved[key]

    def _forget_batch(self, version: int) -> None:
        for digest in self._rules.pop(version).batch:
            versions = self._batch_of.get(digest)
            if versions is not None and version in versions:
                versions.remove(version)
                if not versions:
                    del self._batch_of[digest]

    def _pending(self, ledger: Ledger, current: int) -> list[Action]:
        actions: list[Action] = []
        for version in self._judgeable(ledger, current):
            if self.me in self.verdicts[version]:
                continue
            a = ledger.policies[version]
            faults = self._rule_faults(a, ledger)
            if faults:
                actions += self._publish(version, faults, b"", 0.0, ledger)
            elif faults is not None and (self._drawn(a, ledger) or self._reported(version, ledger)):
                if (batch := self.batch_of(a)) is None:
                    # Only a node that replays a step fetches its batch file (specs/training.md §5:
                    # the rules over the batch are the step committee's in a committee network).
                    # Unserved once its fetches have failed for step_wait, none under way now.
                    if version not in self._fetching and self._unserved_for(("state", version), ledger):
                        actions += self._publish(version, (StepFault.UNAVAILABLE_STATE,), b"", 0.0, ledger)
                    elif version not in self._fetching:
                        self._fetching.add(version)
                        actions.append(FetchBatch(a))
                elif missing := [d for d, _ in batch if ledger.group_version(d) is None]:
                    if ledger.design.manifests:
                        # Groups are fetched by digest in the committee design (specs/network.md §3.5).
                        for d in missing:
                            actions += ledger.once(FetchGroup(d, ledger.rounds.round_of.get(d, a.version - 1)))
                        # step_wait from this node's first failed fetch of one of them.
                        due = self._unserved_for(("group", version), ledger)
                    else:
                        # Gossip and backfill bring them (tickets): step_wait from when the batch
                        # was known (specs/training.md §5, unavailable_group).
                        known = max(ledger.round_started.get(version, ledger.now), self._batch_at.get(version, 0.0))
                        due = ledger.now - known >= self.step_wait
                    if due:
                        actions += self._publish(version, (StepFault.UNAVAILABLE_GROUP,), b"", 0.0, ledger)
                elif version in ledger.loaded and version - 1 in ledger.loaded and version not in self._replaying:
                    self._replaying.add(version)
                    actions.append(ReplayStep(a))
        return actions

    def _rule_faults(self, a: PolicyAnnouncement, ledger: Ledger) -> tuple[str, ...] | None:
        """What signed data alone shows wrong with a step (:func:`step_rule_faults`); None
        while its parent's announcement is unknown; the announcement's own faults alone while its
        batch file is not here."""
        parent = ledger.policies.get(a.version - 1)
        if parent is None:
            return None
        if (found := self.batch_of(a)) is None:
            return tuple(sorted(_announcement_faults(a, parent)))
        rules = self._rules.get(a.version)
        if rules is None or rules.against != (a.signature, parent.signature):
            if rules is not None:
                self._forget_batch(a.version)
            batch = tuple(digest for digest, _ in found)
            rules = self._rules[a.version] = _Rules((a.signature, parent.signature), batch,
                                                    frozenset(_announcement_faults(a, parent)), set(batch))
            for digest in batch:
                self._batch_of[digest].append(a.version)
        for digest in rules.dirty:
            one = _group_faults(a, ledger.group_version(digest), ledger.trainer_fail(digest, a.trainer),
                                self.max_staleness)
            for memo, fault in ((rules.rejected, StepFault.REJECTED_GROUP), (rules.stale, StepFault.STALE_GROUP)):
                (memo.add if fault in one else memo.discard)(digest)
        rules.dirty.clear()
        faults = set(rules.base)
        if rules.rejected:
            faults.add(StepFault.REJECTED_GROUP)
        if rules.stale:
            faults.add(StepFault.STALE_GROUP)
        return tuple(sorted(faults))

    def _drawn(self, a: PolicyAnnouncement, ledger: Ledger) -> bool:
        """This node's step ticket for the announcement: its own signature, drawn after the
        step exists, so the trainer cannot know which verifiers will replay which steps. With
        committees (``step_committee`` > 0) the rate falls to ``step_committee`` over the
        eligible verifiers: a step is replayed by ~k verifiers at any N, as a group is checked
        (specs/committee.md §6), not by a quarter of the network."""
        if a.version not in self._draws:
            rate, eligible = self.step_audit_rate, ledger.eligible_verifiers()
            if self.step_committee and eligible:
                rate = min(rate, self.step_committee / eligible)
            ticket = self.key.sign(STEP_TICKET_DOMAIN + a.id)
            self._draws[a.version] = ticket_selected(ticket, rate)
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
        if not faults and ledger.design.manifests:
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
