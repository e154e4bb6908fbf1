"""The node protocol as a pure state machine (sans-I/O, in the manner of h11).

:class:`NodeProtocol` is fed :data:`Event`s and answers with :data:`Action`s. It never touches
a socket, a file, a clock or a model: the daemon (:mod:`vrl.node.daemon`) carries actions out
and reports back with events. The whole state is a function of the events seen, which is how
a restarted node continues: it replays its store (``replaying=True`` suppresses the actions
of the past), then asks :meth:`NodeProtocol.pending` what is still to do.

Its vocabulary, the events and actions, is :mod:`vrl.node.events`; the judging of the
trainer's steps and its conviction is a sub-machine of its own, fed the step events
(:class:`vrl.node.steps.StepJudge`).

One round, in order (``specs/network.md`` §Rounds):

1. the trainer announces policy version ``r`` (a signed :class:`PolicyAnnouncement`); the
   round seed ``H(model_hash_r, r)`` exists from that moment only;
2. workers fetch the weights by content hash, generate their assigned groups and gossip each
   as a :class:`Submission`;
3. verifiers draw an audit ticket per submission (after it exists, from their own key) and
   check it at the subject's reputation-derived rate, or publish a signed *skip*; every
   verdict carries the digest of the commitments the verifier recomputed;
4. a hard fail is re-checked by every other verifier and the trainer before anyone is
   quarantined; the trainer also re-checks a share of other verifiers' passes (lazy
   verifiers) and may plant known-bad groups;
5. the trainer admits decided groups by reputation (:func:`vrl.node.admission.admit`), runs a
   GRPO step with the admission weights, and announces version ``r + 1``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from vrl.node import forgetting
from vrl.node.batches import ADMISSION_DOMAIN, maybe_train, reveal_plants
from vrl.node.committee import SEATS, CommitteeError, Draw, Refusal
from vrl.node.designs import design_of
from vrl.node.events import (
    Abandoned,
    Action,
    BatchFetched,
    Check,
    Checked,
    ConvictTrainer,
    EntriesReceived,
    Event,
    FetchBatch,
    FetchEntries,
    FetchGroup,
    FetchPolicy,
    Generate,
    Generated,
    GroupReceived,
    ManifestReceived,
    Persist,
    PersistGroup,
    PersistManifest,
    PersistPolicy,
    PersistStep,
    Plant,
    Planted,
    PolicyAnnounced,
    PolicyLoaded,
    Publish,
    Quarantine,
    Refused,
    ReplayStep,
    StepReplayed,
    StepStateMissing,
    StepVerdictReceived,
    Tick,
    Train,
    Trained,
    VerdictReceived,
)
from vrl.node.manifests import Rounds
from vrl.node.messages import (
    TOPIC_GROUPS,
    TOPIC_POLICIES,
    Batch,
    Group,
    Outcome,
    PolicyAnnouncement,
    SignedVerdict,
    StepVerdict,
    audit_ticket,
    ticket_selected,
)
from vrl.node.params import ROLES, ProtocolParams
from vrl.node.reputation import COUNTING_WEIGHT, Reputation, Standing, report_of
from vrl.node.rounds import REPUTATION_EVERY_SECONDS, note_withheld
from vrl.node.scans import Scans
from vrl.node.state import HeldGroup, ProtocolConfig
from vrl.node.steps import SELF_EVIDENT_FAULTS, StepJudge, step_rule_faults
from vrl.node.verdicts import SOFT_REASONS, drawn, outcome_of, supersedes
from vrl.node.waiting import MAX_PENDING_VERDICTS, MAX_STRANGER_VERDICTS_PER_GROUP, WaitingVerdicts, room_for
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.sequential import RACE_LOSSES, RaceTest

# The events and actions (vrl.node.events), the tunables (vrl.node.params) and the step
# judge's rules (vrl.node.steps) are named here too: the protocol's vocabulary, as its users
# know it (protocol.Tick, ...).
__all__ = [
    "ADMISSION_DOMAIN", "MAX_PENDING_VERDICTS", "MAX_STRANGER_VERDICTS_PER_GROUP", "ROLES", "SELF_EVIDENT_FAULTS",
    "SOFT_REASONS", "Abandoned", "Action", "BatchFetched", "Check", "Checked", "ConvictTrainer", "Event",
    "EntriesReceived", "FetchBatch", "FetchEntries", "FetchPolicy", "Generate", "Generated", "GroupReceived",
    "ManifestReceived", "NodeProtocol", "Persist", "PersistGroup", "PersistManifest", "PersistPolicy", "PersistStep",
    "Plant", "Planted",
    "PolicyAnnounced", "PolicyLoaded", "ProtocolConfig", "ProtocolParams", "Publish", "Quarantine", "Refused",
    "ReplayStep", "StepReplayed", "StepStateMissing", "StepVerdictReceived", "Tick", "Train", "Trained",
    "VerdictReceived", "drawn", "outcome_of", "report_of", "step_rule_faults",
]


# What an action under way is known by: its kind and what it names (a version, a digest, ...).
FlightKey = tuple[Any, ...]


def _flight_key(action: Action) -> FlightKey:
    match action:
        case FetchPolicy(a):
            return ("fetch", a.version)
        case FetchGroup(digest, _):
            return ("group", digest)
        case FetchEntries(round_, which, positions, keys):
            return ("entries", round_, which, positions, keys)
        case Check(group, _):
            return ("check", group)
        case Generate(version) | Plant(version) | Train(version, _):
            return (type(action).__name__.lower(), version)
    return ()


class NodeProtocol:
    """One node's view of the network. Feed it with :meth:`handle`; do what it returns."""

    def __init__(self, key: NodeKey, config: ProtocolConfig, platform: str, race_loss_rate: float) -> None:
        """``race_loss_rate`` is this verifier's profile's honest per-token race-loss rate, the
        q0 of its sequential tests (vrl.rollouts.profiles.profile_of)."""
        self.key, self.config, self.platform = key, config, platform
        RaceTest(race_loss_rate)  # refuses a rate outside (0, 1/2) here, not at the first check
        self.race_loss_rate = race_loss_rate
        self.me = key.node_id
        self.design = design_of(config)  # the verification design (vrl.node.designs)
        self.reputation = Reputation(frozenset({self.me, config.trainer, *config.pretrusted}), config.reputation)
        self.policies: dict[int, PolicyAnnouncement] = {}
        # (key, value): see version
        self._version: tuple[tuple[int, ConvictTrainer | None] | tuple[()], int | None] = ((), None)
        self.loaded: set[int] = set()
        self.groups: dict[bytes, HeldGroup] = {}
        self._by_version: dict[int, list[bytes]] = defaultdict(list)  # digests in arrival order
        self.verdicts: dict[bytes, dict[bytes, SignedVerdict]] = defaultdict(dict)
        self.generated: set[int] = set()
        self.planted: dict[bytes, int] = {}  # group -> round; this trainer made them bad
        self.planted_rounds: set[int] = set()
        # Groups this trainer's own GRPO pass failed (Refused): kept out of every batch even
        # where its verdict could not say so (it had published a pass on the group before).
        self.refused: set[bytes] = set()
        self.quarantined: set[bytes] = set()
        self.now = 0.0
        self.round_started: dict[int, float] = {}
        self._in_flight: set[FlightKey] = set()
        # How often each group's check was abandoned (its producer out of reach, a reward not
        # computable here): such a check is asked again behind the others waiting, so a few
        # that cannot run do not hold every slot of the check queue (vrl.node.rounds).
        self.abandoned_checks: Counter[bytes] = Counter()
        self._audit_draws: dict[bytes, bool] = {}
        # Verdicts whose group (or round manifest) has not arrived yet (vrl.node.waiting).
        self.waiting = WaitingVerdicts()
        # (subject, version, group index) -> the one group accepted in that slot. A second,
        # different group there (the same rollouts signed anew, or other samples) is ignored:
        # a round has one group per slot, and a copy must not be trained twice.
        self._slots: dict[tuple[bytes, int, int], bytes] = {}
        # Training steps (specs/training.md §5): judged by a sub-machine of their own, fed the
        # step events, which reads the rest of this state through the Ledger this class is.
        self.steps = StepJudge(key, platform, max_staleness=config.max_staleness,
                               step_audit_rate=config.step_audit_rate, step_wait=config.step_wait,
                               stranger_cap=MAX_STRANGER_VERDICTS_PER_GROUP,
                               step_committee=self.design.step_committee(config))
        # The sequential test (specs/verification.md §7): per producer, the evidence of the
        # checks this node's own tickets drew; and the producers some verifier whose word counts
        # failed it on, whose every fresh group this node then checks.
        self.race_tests: dict[bytes, RaceTest] = {}
        self.suspects: dict[bytes, int] = {}  # producer -> the newest policy version it was accused at
        # The committee design (specs/committee.md): round manifests and VRF draws; and, per
        # check under way, the draw its verdict will claim.
        self.rounds = Rounds(key, config.trainer)
        self._draws: dict[bytes, tuple[Draw, bytes]] = {}
        self._evaluated: tuple[int, float, int] | None = None  # see evaluated
        self.scans = Scans()
        self._fresh_cache: tuple[tuple[int | None, int, int] | tuple[()], list[bytes]] = ((), [])  # see fresh_groups
        # Groups of versions below group_floor are forgotten (vrl.node.forgetting): of each, its
        # digest -> version, and the trainer's own hard fail on it (digest -> its round).
        self.group_floor = 0
        self.forgotten: dict[bytes, int] = {}
        self.forgotten_fails: dict[bytes, int] = {}
        # Verifier ids and platforms, one copy each (forgetting.compact).
        self.shared_ids: dict[bytes, bytes] = {}
        self.shared_platforms: dict[str, str] = {}

    # -- reading the state ------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """The newest announced policy version this node follows: the current round. Policies are
        only ever added, so it changes only with their count or a conviction (read ~800,000 times
        a round by a ticket-design node at N = 100: every trust look-up asks it)."""
        key = (len(self.policies), self.steps.convicted)
        if key != self._version[0]:
            followed = [v for v in self.policies if self.follows(v)]
            self._version = (key, max(followed) if followed else None)
        return self._version[1]

    def follows(self, version: int) -> bool:
        """Whether this node still follows a version: every one before a convicted step."""
        return self.steps.follows(version)

    @property
    def convicted(self) -> ConvictTrainer | None:
        """The trainer's conviction, once its fraud is confirmed (:class:`StepJudge`)."""
        return self.steps.convicted

    @property
    def step_verdicts(self) -> dict[int, dict[bytes, StepVerdict]]:
        """Step verdicts counted, by version and verifier."""
        return self.steps.verdicts

    @property
    def waiting_verdicts(self) -> int:
        """Verdicts held until their group arrives (at most MAX_PENDING_VERDICTS)."""
        return len(self.waiting)

    def held(self) -> dict[str, int]:
        """How many entries each of the protocol's per-group and per-verdict maps holds now:
        what forgetting bounds (specs/network.md §2.1), as a memory measurement reads it."""
        return {"groups": len(self.groups), "verdicts": sum(len(v) for v in self.verdicts.values()),
                "slots": len(self._slots), "audit_draws": len(self._audit_draws),
                "by_version": sum(len(d) for d in self._by_version.values())}

    def has(self, role: str) -> bool:
        return role in self.config.roles

    def standing(self, node: bytes) -> Standing:
        """The last evaluation's (_evaluation_due: at batch boundaries, specs/reputation.md §2)."""
        return self.reputation.last_standing(node, self.version or 0)

    @property
    def evaluated(self) -> tuple[int, float, int] | None:
        """The last reputation evaluation's (round, time, evidence held), None before the first."""
        return self._evaluated

    def groups_of_version(self, version: int) -> Sequence[bytes]:
        """The digests of the held groups of a policy version, in arrival order."""
        return self._by_version.get(version, ())

    def versions_below(self, floor: int) -> list[int]:
        """The policy versions below ``floor`` of which groups are held, in order."""
        return sorted(v for v in self._by_version if v < floor)

    def checking(self, digest: bytes) -> bool:
        """Whether a check of the group is under way."""
        return ("check", digest) in self._in_flight

    def training(self, version: int) -> bool:
        """Whether the step on ``version`` is under way."""
        return ("train", version) in self._in_flight

    def checks_under_way(self) -> int:
        return sum(1 for key in self._in_flight if key[0] == "check")

    # -- the changes the rules make (vrl.node.state.NodeState) -------------------------------
    def request_evaluation(self) -> None:
        """Evaluate reputation at the next event, whenever the last evaluation was."""
        self._evaluated = None

    def drop_group(self, digest: bytes) -> dict[bytes, SignedVerdict]:
        """Forget a held group with its memos (vrl.node.forgetting); returns its verdicts, forgotten
        too. Its digest stays in :meth:`groups_of_version` until :meth:`keep_groups`."""
        self.groups.pop(digest)
        verdicts = self.verdicts.pop(digest, {})
        for verdict in verdicts.values():
            self._audit_draws.pop(verdict.signature, None)
        self._draws.pop(digest, None)
        self.abandoned_checks.pop(digest, None)
        self.rounds.late_failures.discard(digest)
        self.scans.forget(digest)
        return verdicts

    def keep_groups(self, version: int, kept: Iterable[bytes]) -> None:
        """Of a version whose groups are being forgotten, the digests still held."""
        self._by_version.pop(version, None)
        if kept := list(kept):
            self._by_version[version] = kept

    def drop_slots_below(self, floor: int) -> None:
        """Forget the slots of versions below ``floor`` whose group is no longer held."""
        for slot in [s for s in self._slots if s[1] < floor and self._slots[s] not in self.groups]:
            del self._slots[slot]

    # -- the Ledger the step judge reads (vrl.node.steps) ------------------------------------
    def group_version(self, digest: bytes) -> int | None:
        group = self.groups.get(digest)
        return self.forgotten.get(digest) if group is None else group.version

    def trainer_fail(self, digest: bytes, trainer: bytes) -> int | None:
        own = self.verdicts.get(digest, {}).get(trainer)
        if own is None:
            return self.forgotten_fails.get(digest) if trainer == self.config.trainer else None
        return own.round if own.outcome == Outcome.HARD_FAIL else None

    def batch_of(self, version: int) -> Batch | None:
        """The batch of the step that made ``version``: listed in its announcement, or from the
        batch file it names once fetched (vrl.node.steps); None while unknown."""
        a = self.policies.get(version)
        return None if a is None else self.steps.batch_of(a)

    def eligible_verifiers(self) -> int:
        latest = max(self.rounds.manifests, default=None)
        return self.rounds.manifests[latest].weights if latest is not None else 0

    def trust(self, node: bytes) -> float:
        return self.standing(node).trust

    def pretrusted(self, node: bytes) -> bool:
        return node in self.reputation.pretrusted

    # -- the one entry point ----------------------------------------------------------------
    def handle(self, event: Event, *, replaying: bool = False) -> list[Action]:
        actions: list[Action] = []
        match event:
            case Tick(now):
                self.now = max(self.now, now)
            case Abandoned(action):
                self._in_flight.discard(key := _flight_key(action))
                if key[:1] == ("check",):
                    self.abandoned_checks[key[1]] += 1
                    self._touch(key[1])
                actions += self.steps.handle(event, self)
            case PolicyAnnounced(a):
                # Every announcement that validated is kept, followed or not: a trainer's two
                # announcements of one version are the audit's evidence (specs/audit.md).
                actions.append(PersistPolicy(a))
                self._announced(a)
            case PolicyLoaded(version):
                self.loaded.add(version)
                self._in_flight.discard(("fetch", version))
            case GroupReceived(group, now):
                # Every group that validated is kept, taken or not (a second group in a taken
                # slot, one after its round closed): what a node was sent is what an audit and a
                # peer's backfill read, and a check or a training step of it survives a restart.
                actions.append(PersistGroup(group, now))
                actions += self.accept_group(group, now)
            case VerdictReceived(verdict):
                actions += self._received_verdict(verdict)
            case ManifestReceived(manifest, now, lists):
                if self.rounds.add(manifest, now):
                    if lists is not None and self.rounds.hold_lists(lists.content):
                        # The trainer's own, replayed from its store: every group of it is listed.
                        self.rounds.learn_lists(self.rounds.lists[manifest.round])
                        note_withheld(self, manifest)
                    actions.append(PersistManifest(manifest))
                    for verdict in self.waiting.take_round(manifest.round):
                        actions += self._received_verdict(verdict)
            case EntriesReceived(fetch, answer):
                self._in_flight.discard(_flight_key(fetch))
                try:
                    learnt = self.rounds.learn(fetch, answer)
                except CommitteeError:
                    learnt = []  # asked again at a later tick (the daemon blames the peer that sent it)
                for digest in learnt:
                    self._touch(digest)
            case Generated(version, groups):
                self._in_flight.discard(("generate", version))
                self.generated.add(version)
                actions += self.design.publish_groups(self, groups)
            case Checked(group, failed_reasons, digest, race_tokens, races_lost):
                self._in_flight.discard(("check", group))
                self.abandoned_checks.pop(group, None)
                self._touch(group)
                actions += self._checked(group, failed_reasons, digest, race_tokens, races_lost)
            case Refused(Checked(group, failed_reasons, digest, race_tokens, races_lost)):
                self.refused.add(group)
                actions += self._checked(group, failed_reasons, digest, race_tokens, races_lost)
            case Planted(submission, _, version):
                self._in_flight.discard(("plant", version))
                self.planted[submission.digest] = version
                self.planted_rounds.add(version)
                actions.append(Publish(TOPIC_GROUPS, submission.to_bytes()))
            case StepStateMissing():
                # Only the step judge's verdict, if its time has come: the replay is asked for
                # again at the next Tick. A fetch that fails at once (the trainer withholds the
                # file, no peer has it) must not be retried in a loop until step_wait ends.
                return [] if replaying else self.steps.handle(event, self)
            case StepVerdictReceived() | StepReplayed() | BatchFetched():
                actions += self.steps.handle(event, self)
            case Trained(announcement, used):
                self._in_flight.discard(("train", announcement.version - 1))
                self._announced(announcement)
                self.loaded.add(announcement.version)  # the trainer made these weights itself
                for digest in used:
                    if digest in self.groups:
                        self.groups[digest].trained = True
                        self._touch(digest)
                actions.append(Publish(TOPIC_POLICIES, announcement.to_bytes()))
                actions += reveal_plants(self, announcement.version - 1)
        actions += self._quarantines(replaying)
        actions += self.steps.convictions(self)
        if replaying:
            return []
        return actions + self.pending()

    def accept_group(self, group: Group, now: float) -> list[Action]:
        """Hold a received (or, in the committee design, own) group: the first of its slot."""
        self._in_flight.discard(("group", digest := group.digest))
        if self.design.left_out(self, digest, group.version) or group.version < self.group_floor:
            return []  # after its round's manifest (specs/committee.md §1), or forgotten: never checked or trained
        if digest in self.groups or self._slots.setdefault((group.subject, group.version, group.index),
                                                           digest) != digest:
            return []
        tokens = sum(len(r.completion_tokens) for r in group.rollouts) if group.rollouts else None
        self.groups[digest] = HeldGroup(group.subject, group.version, now, digest=digest, tokens=tokens)
        self._by_version[group.version].append(digest)
        self._touch(digest)
        if group.subject == self.me:
            self.generated.add(group.version)
        return self._release_pending(digest)

    def _announced(self, a: PolicyAnnouncement) -> None:
        if a.trainer == self.config.trainer and a.version not in self.policies and self.follows(a.version):
            self.policies[a.version] = a
            self.round_started.setdefault(a.version, self.now)

    # -- what is still to do ----------------------------------------------------------------
    def pending(self) -> list[Action]:
        """Actions the state calls for that are not already under way."""
        actions: list[Action] = []
        version = self.version
        if version is None:
            return actions
        self.forget(version)
        # The step judge's part (a verifier's), asked once: the steps it will replay, whose
        # weights are needed below, and its own actions, which keep their place further down.
        replays, step_actions = self.steps.pending(self, version) if self.has("verifier") else ([], [])
        for v in self._versions_needed(version, replays):
            if v not in self.loaded:
                actions += self.once(FetchPolicy(self.policies[v]))
        if self.has("worker") and version in self.loaded and version not in self.generated:
            actions += self.once(Generate(version))
        actions += self.design.pending(self, version)  # its checks, and what they need first
        if self.has("verifier"):
            actions += step_actions
        if self.has("trainer"):
            if (self.config.plant_every and version % self.config.plant_every == 0
                    and version not in self.planted_rounds and version in self.loaded):
                actions += self.once(Plant(version))
            actions += maybe_train(self, version)
        return actions

    def forget(self, version: int) -> None:
        """Forget what a node at round ``version`` no longer holds (vrl.node.forgetting)."""
        forgetting.forget(self, version)

    def _touch(self, digest: bytes) -> None:
        """A group's state moved: the passes that read it look at it again (scans.Scans, and
        the step judge's rules over the batches that list it)."""
        self.scans.touch(digest)
        self.steps.touch(digest)

    def once(self, action: Action) -> list[Action]:
        key = _flight_key(action)
        if key in self._in_flight:
            return []
        self._in_flight.add(key)
        if key[0] == "check":
            self._touch(key[1])
        return [action]

    def _versions_needed(self, version: int, replays: list[PolicyAnnouncement]) -> list[int]:
        """Versions whose weights this node must hold: the current one, for checking every
        version a fresh group may still use, and each step to replay with its parent."""
        needed = {version}
        if self.has("verifier") or self.has("trainer"):
            needed |= {v for v, digests in self._by_version.items() if digests and self.fresh(v)}
        needed |= {v for a in replays for v in (a.version - 1, a.version)}
        return sorted(v for v in needed if v in self.policies)

    def fresh(self, version: int) -> bool:
        current = self.version
        return current is not None and 0 <= current - version <= self.config.max_staleness

    def room_for(self, verdict: SignedVerdict) -> bool:
        """Whether a verdict may be accepted: the cap on strangers' verdicts per group (vrl.node.waiting)."""
        return room_for(verdict, self.verdicts.get(verdict.group, {}), self.trust)

    def slot_taken(self, subject: bytes, version: int, index: int, digest: bytes) -> bool:
        """Whether another group already holds this slot (specs/network.md §3.1)."""
        return self._slots.get((subject, version, index), digest) != digest

    def may_hold(self, version: int) -> bool:
        """Whether a group of this policy version is worth accepting: still usable, or of the
        next version, whose announcement may be a moment behind the group. Anything else could
        never be trained on, and would only fill the disk and everyone's backfill pages."""
        current = self.version
        return current is not None and current - self.config.max_staleness <= version <= current + 1

    def takes_group(self, version: int, digest: bytes) -> bool:
        """Whether a group of ``version`` is one to receive (specs/network.md §3.1): of a version
        it may hold, or listed in the batch of a step this node may still judge, which reaches
        further back (vrl.node.steps.StepJudge.lists)."""
        return self.may_hold(version) or self.steps.lists(digest)

    def takes_new_groups(self, version: int) -> bool:
        """Whether a group of ``version`` this node has not seen would still be taken: a version
        it may hold and, in the committee design, a round whose manifest is not here yet (a
        group the manifest leaves out is never checked or trained, specs/committee.md §1)."""
        return self.may_hold(version) and not self.design.closed(self, version)

    def fresh_groups(self) -> list[bytes]:
        """Digests of the groups still usable, in arrival order: the only ones any rule acts on."""
        # Groups are only added but when the floor moves (forgetting); freshness moves with the version.
        key = (self.version, len(self.groups), self.group_floor)
        if self._fresh_cache[0] != key:
            fresh = [d for v, digests in self._by_version.items() if self.fresh(v) for d in digests]
            self._fresh_cache = (key, sorted(fresh, key=lambda d: self.groups[d].arrived))
        return list(self._fresh_cache[1])

    # -- verifying --------------------------------------------------------------------------
    def start_check(self, digest: bytes, version: int, draw: Draw, pi: bytes) -> list[Action]:
        actions = self.once(Check(digest, version))
        if actions:
            self._draws[digest] = (draw, pi)
        return actions

    def weighs(self, verdict: SignedVerdict) -> bool:
        """Whether a verdict's word counts: its verifier's weight reaches COUNTING_WEIGHT, or, in
        the committee design, it holds a seat its claim proved (specs/committee.md §3.1, §8)."""
        return verdict.draw in SEATS or self.counts(verdict.verifier)

    def counts(self, verifier: bytes) -> bool:
        """Whether a verifier's word counts: its report weight reaches COUNTING_WEIGHT."""
        return self.standing(verifier).trust >= COUNTING_WEIGHT

    def audits(self, verdict: SignedVerdict) -> bool:
        """Whether the trainer re-checks a pass from a verifier it does not trust outright: a
        draw of its own ticket over the verdict, so the verifier cannot know which."""
        if verdict.outcome != Outcome.PASS or verdict.verifier in self.reputation.pretrusted:
            return False
        # Drawn over the verdict's id, remembered by its signature: a valid signature names one
        # verdict's bytes, and hashing them again for every pass was a fifth of the trainer's time.
        if verdict.signature not in self._audit_draws:
            rate = self.config.lazy_audit_rate / self.design.audit_divisor(self.config)
            self._audit_draws[verdict.signature] = ticket_selected(audit_ticket(self.key, verdict.id), rate)
        return self._audit_draws[verdict.signature]

    def race_test(self, subject: bytes) -> RaceTest:
        """This node's sequential test of ``subject``, over the groups of it this node drew."""
        return self.race_tests.get(subject) or RaceTest(self.race_loss_rate)

    def suspect(self, subject: bytes) -> bool:
        """Whether a race_losses fail on a group of ``subject`` still fresh stands: suspicion
        ends with the freshness window of the last group it was raised on (max_staleness)."""
        return subject in self.suspects and self.fresh(self.suspects[subject])

    def _checked(self, digest: bytes, reasons: tuple[str, ...], recomputed: bytes, race_tokens: int,
                 races_lost: int) -> list[Action]:
        """Publish a check's verdict, with the check's race evidence. A suspect's group is
        checked at rate 1, so its verdict is a draw too. When the evidence of a draw takes the
        producer's sequential test to rejection, the verdict fails hard as ``race_losses``."""
        group = self.groups.get(digest)
        if group is None:
            return []
        rate = 1.0 if self.suspect(group.subject) else self.standing(group.subject).check_rate
        draw, pi = self._draws.pop(digest, (Draw.NONE, b""))
        if (self.design.own_draw(self, digest, draw, rate)
                and self.race_test(group.subject).add(race_tokens, races_lost).rejected):
            reasons = (*reasons, RACE_LOSSES)
        return self.publish_verdict(digest, outcome_of(reasons), reasons, recomputed, rate=rate,
                                     race_tokens=race_tokens, races_lost=races_lost, draw=draw, pi=pi)

    def publish_verdict(self, digest: bytes, outcome: Outcome, reasons: tuple[str, ...], recomputed: bytes,
                         rate: float | None = None, race_tokens: int = 0, races_lost: int = 0,
                         draw: Draw = Draw.NONE, pi: bytes = b"") -> list[Action]:
        group, mine = self.groups.get(digest), self.verdicts[digest].get(self.me)
        if group is None or (mine is not None and not supersedes(outcome, mine)):
            return []
        claim = self.design.claim(self, digest, draw, pi)
        if claim is None:
            return []
        verdict = SignedVerdict(
            verifier=self.me, subject=group.subject, group=digest, round=self.version or 0,
            policy_version=group.version,
            rate=self.standing(group.subject).check_rate if rate is None else rate, outcome=outcome,
            reasons=tuple(sorted(set(reasons))), digest=recomputed, platform=self.platform,
            planted=digest in self.planted, race_tokens=race_tokens, races_lost=races_lost,
            **claim).signed(self.key)
        self._verdict(verdict)
        return self.design.route(self, verdict)

    # -- verdicts of others: the subject is derived from the group, never taken from the message
    def verdict_refusal(self, verdict: SignedVerdict) -> Refusal | None:
        """Why this network's design refuses a verdict's claim (specs/committee.md §4), or None;
        MANIFEST_MISSING while the committee design lacks its round's manifest."""
        return self.design.refusal(self, verdict)

    def _received_verdict(self, verdict: SignedVerdict) -> list[Action]:
        refusal = self.verdict_refusal(verdict)
        if refusal is not None and refusal != Refusal.MANIFEST_MISSING:
            return []
        if verdict.group in self.groups and refusal is None:
            return [Persist(verdict)] if self._verdict(verdict) else []
        self.waiting.add(verdict, self.may_hold, lambda verifier: self.trust(verifier) == 0)
        return []

    def _release_pending(self, digest: bytes) -> list[Action]:
        return [Persist(verdict) for verdict in self.waiting.take(digest) if self._verdict(verdict)]

    def matches_group(self, verdict: SignedVerdict) -> bool | None:
        """Whether a verdict's subject and version are those of the group it names (the signer
        of the group's records and their policy version), and it replayed no more races than
        the group has tokens. None while the group is unknown."""
        group = self.groups.get(verdict.group)
        if group is None:
            return None
        return ((verdict.subject, verdict.policy_version) == (group.subject, group.version)
                and (group.tokens is None or verdict.race_tokens <= group.tokens))

    def _verdict(self, verdict: SignedVerdict) -> bool:
        """Count a verdict on a known group; False if it is a repeat or contradicts the group.

        The report's subject and round come from the group (its records' signer and policy
        version), not from the verdict: a signed claim that an honest node produced a bad
        group is worth nothing unless that node's signature is on the group."""
        group, earlier = self.groups[verdict.group], self.verdicts[verdict.group].get(verdict.verifier)
        if (earlier is not None and not supersedes(verdict.outcome, earlier)) or not self.matches_group(verdict):
            return False
        self.verdicts[verdict.group][verdict.verifier] = verdict
        self._touch(verdict.group)
        self.design.counted(self, verdict, group)
        report = report_of(verdict, group.subject, group.version)
        if report is not None:
            self.reputation.add(forgetting.compact(self, report, group))
            # Only a check its own ticket drew feeds this node's test: a re-check prompted by
            # someone's report is a group that someone chose, perhaps for its lost races, and
            # Ville's bound holds only for evidence no one selected (specs/verification.md §7).
            if verdict.verifier == self.me and verdict.race_tokens and drawn(verdict):
                self.race_tests[group.subject] = self.race_test(group.subject).add(verdict.race_tokens,
                                                                                   verdict.races_lost)
            if report.node_level and (verdict.verifier == self.me or self.counts(verdict.verifier)):
                self.suspects[group.subject] = max(group.version, self.suspects.get(group.subject, group.version))
        return True

    def _evaluation_due(self, replaying: bool) -> bool:
        """Whether to evaluate reputation (and quarantines) now: the first time, when the round moved,
        and otherwise at most every REPUTATION_EVERY_SECONDS, and only if a report came since. Events
        absorbed in a batch (``replaying``) evaluate nothing: the batch's next live event does, once.
        Evidence is reports and withheld records alike (a manifest's records lower a score as a
        failure report does, specs/committee.md §7.1)."""
        last = self._evaluated
        if replaying or (last is not None and last[0] == (self.version or 0) and (
                self.reputation.held() == last[2] or self.now - last[1] < REPUTATION_EVERY_SECONDS)):
            return False
        self._evaluated = (self.version or 0, self.now, self.reputation.held())
        return True

    def _quarantines(self, replaying: bool = False) -> list[Action]:
        if not self._evaluation_due(replaying):
            return []
        actions: list[Action] = []
        for node, standing in self.reputation.standings(self.version or 0).items():
            if standing.quarantined and node not in self.quarantined:
                self.quarantined.add(node)
                purged = tuple(sorted(d for d, g in self.groups.items() if g.subject == node and not g.trained))
                actions.append(Quarantine(node, purged))
        return actions

    # -- training ---------------------------------------------------------------------------
    def decided(self, digest: bytes) -> bool | None:
        """Whether a group may enter a batch: True, False, or None while verdicts are due."""
        group = self.groups[digest]
        if group.trained or digest in self.planted or digest in self.refused or group.subject in self.quarantined:
            return False
        if not (listed := self.design.listed(self, digest, group.version)):
            return None if listed is None else False
        verdicts = self.verdicts[digest].values()
        mine = self.verdicts[digest].get(self.me)
        if any(v.outcome in (Outcome.HARD_FAIL, Outcome.SOFT_FAIL) for v in verdicts):
            # A failure stands until this node's own re-check clears it.
            if mine is None or not mine.checked:
                return None
            return mine.outcome == Outcome.PASS
        if ("check", digest) in self._in_flight:
            return None
        if any(v.outcome == Outcome.PASS and self.weighs(v) for v in verdicts):
            return True  # a pass from a checker that counts; a stranger's pass decides nothing
        return self.design.unreached(self, group)
