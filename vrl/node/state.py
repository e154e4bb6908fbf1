"""A node's protocol state as its rules read it: small typed interfaces over
:class:`vrl.node.protocol.NodeProtocol`, which the rule modules take instead of the class
(:mod:`vrl.node.rounds`, :mod:`vrl.node.tickets`, :mod:`vrl.node.batches`,
:mod:`vrl.node.forgetting`), as :class:`vrl.node.steps.StepJudge` reads its ``Ledger``.

:class:`NodeView` is what a rule reads; :class:`NodeState` adds the few changes a rule makes
to the protocol's own tables, each a named method, so that the tables themselves stay the
protocol's (its underscore fields) and each change is one a reader can find. The sub-machines
(``rounds``, ``scans``, ``reputation``, ``waiting``, ``steps``) are objects with public
interfaces of their own, which a rule calls directly.

Here too are the two types the protocol and its rules share: its configuration
(:class:`ProtocolConfig`) and what it holds of a group (:class:`HeldGroup`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vrl.config import ConfigError
from vrl.node.admission import AdmissionConfig
from vrl.node.committee import Draw, Refusal
from vrl.node.events import Action
from vrl.node.messages import Group, Outcome, SignedVerdict
from vrl.node.params import ROLES, ProtocolParams, Verification
from vrl.node.reputation import Reputation, ReputationConfig, Standing
from vrl.node.scans import Scanned, Scans
from vrl.node.steps import StepJudge
from vrl.node.waiting import WaitingVerdicts
from vrl.rollouts.keys import NodeKey


@dataclass(frozen=True, kw_only=True)
class ProtocolConfig(ProtocolParams):
    """All a :class:`NodeProtocol` is configured with: the tunables, who this node is to the
    network, and the reputation and admission parameters."""

    roles: frozenset[str]
    trainer: bytes  # whose policy announcements this network follows
    pretrusted: frozenset[bytes] = frozenset()  # bootstrap trust anchors besides this node
    reputation: ReputationConfig = field(default_factory=ReputationConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = set(self.roles) - set(ROLES)
        if unknown or not self.roles:
            raise ConfigError(f"must be a non-empty subset of {ROLES}, got {sorted(self.roles)}", ("roles",),
                              type(self).__name__)


@dataclass
class HeldGroup:
    """What a node holds of a group it accepted (the records themselves are the store's)."""

    subject: bytes
    version: int
    arrived: float
    trained: bool = False
    digest: bytes = b""  # the one copy its reports share (forgetting.compact)
    # Its records' completion tokens, the most races a check replays (specs/verification.md §7);
    # None for a group replayed from the store, whose records are not decoded again.
    tokens: int | None = None
    recomputed: bytes = b""  # the first recomputed commitment digest a report on it gave, shared alike


class NodeView(Scanned, Protocol):
    """What the protocol's rules read of a node's state: what the incremental passes read
    (:class:`vrl.node.scans.Scanned`: the clock, the round, policies, groups, the fresh ones and
    their decisions) and the rest below. The containers are the protocol's: a rule reads them,
    and changes them only through :class:`NodeState`'s methods (or the sub-machines' own)."""

    @property
    def key(self) -> NodeKey: ...

    @property
    def me(self) -> bytes: ...

    @property
    def config(self) -> ProtocolConfig: ...

    @property
    def design(self) -> Design:
        """The verification design, chosen once from ``config.verification`` (vrl.node.designs)."""
        ...

    @property
    def groups(self) -> Mapping[bytes, HeldGroup]: ...

    @property
    def verdicts(self) -> Mapping[bytes, Mapping[bytes, SignedVerdict]]:
        """Group digest -> verifier -> its verdict."""
        ...

    @property
    def round_started(self) -> Mapping[int, float]: ...

    @property
    def abandoned_checks(self) -> Mapping[bytes, int]: ...

    @property
    def reputation(self) -> Reputation: ...

    @property
    def scans(self) -> Scans: ...

    @property
    def waiting(self) -> WaitingVerdicts: ...

    @property
    def steps(self) -> StepJudge: ...

    def has(self, role: str) -> bool: ...

    def standing(self, node: bytes) -> Standing: ...

    def counts(self, verifier: bytes) -> bool: ...

    def weighs(self, verdict: SignedVerdict) -> bool: ...

    def suspect(self, subject: bytes) -> bool: ...

    def audits(self, verdict: SignedVerdict) -> bool:
        """Whether the trainer re-checks this pass (its lazy-verifier audit draw)."""
        ...

    def groups_of_version(self, version: int) -> Sequence[bytes]:
        """The digests of the held groups of a policy version, in arrival order."""
        ...

    def versions_below(self, floor: int) -> list[int]:
        """The policy versions below ``floor`` of which groups are held, in order."""
        ...

    def checking(self, digest: bytes) -> bool:
        """Whether a check of the group is under way."""
        ...

    def training(self, version: int) -> bool:
        """Whether the step on ``version`` is under way."""
        ...

    def checks_under_way(self) -> int: ...


class NodeState(NodeView, Protocol):
    """A node's state with the changes its rules make: actions asked for once, checks begun,
    verdicts published, groups accepted and forgotten. ``group_floor``, ``forgotten``,
    ``forgotten_fails`` and the ``shared_`` tables are :mod:`vrl.node.forgetting`'s to write."""

    group_floor: int
    forgotten: dict[bytes, int]
    forgotten_fails: dict[bytes, int]
    shared_ids: dict[bytes, bytes]
    shared_platforms: dict[str, str]

    def once(self, action: Action) -> list[Action]:
        """``[action]`` unless the same action is already under way (then ``[]``); it is from now on."""
        ...

    def start_check(self, digest: bytes, version: int, draw: Draw, pi: bytes) -> list[Action]:
        """Ask once for a check of a group, its verdict to claim ``draw`` with VRF proof ``pi``."""
        ...

    def publish_verdict(self, digest: bytes, outcome: Outcome, reasons: tuple[str, ...], recomputed: bytes,
                        rate: float | None = None) -> list[Action]:
        """Sign this node's verdict on a group, count it, and say where it goes."""
        ...

    def accept_group(self, group: Group, now: float) -> list[Action]:
        """Hold a group, the first of its slot; the verdicts that waited for it are counted."""
        ...

    def request_evaluation(self) -> None:
        """Evaluate reputation at the next event, whenever the last evaluation was."""
        ...

    def drop_group(self, digest: bytes) -> dict[bytes, SignedVerdict]:
        """Forget a held group with the memos kept for it (its check's draw, its verdicts' audit
        draws, its abandoned checks, its passes' state); returns its verdicts, forgotten too.
        Its digest stays in :meth:`groups_of_version` until :meth:`keep_groups`."""
        ...

    def keep_groups(self, version: int, kept: Iterable[bytes]) -> None:
        """Of a version whose groups are being forgotten, the digests still held."""
        ...

    def drop_slots_below(self, floor: int) -> None:
        """Forget the slots of versions below ``floor`` whose group is no longer held."""
        ...


class Design(Protocol):
    """A verification design: who checks which group, what a verdict claims, and when a group
    is decided (vrl.node.designs: the ticket design and the committee design). The protocol
    asks its design wherever the two differ, and nowhere else."""

    name: Verification
    #: Whether the design closes each round with the trainer's signed manifest (specs/committee.md
    #: §3.4): groups go to the trainer and are fetched by digest, passes are not gossiped, and
    #: manifests are a topic of its own.
    manifests: bool

    def step_committee(self, config: ProtocolConfig) -> int:
        """The step judge's committee size (specs/training.md §5); 0 for a step ticket."""
        ...

    def audit_divisor(self, config: ProtocolConfig) -> int:
        """What the trainer's lazy-verifier audit rate is divided by, so that it audits each
        verifier about ``lazy_audit_rate x groups_per_round`` times a round."""
        ...

    def pending(self, node: NodeState, version: int) -> list[Action]:
        """The design's part of what is still to do at round ``version``: the checks asked for,
        and what else the design needs before them (manifests, listings)."""
        ...

    def publish_groups(self, node: NodeState, groups: Sequence[Group]) -> list[Action]:
        """Where this node's newly generated groups go."""
        ...

    def left_out(self, node: NodeView, digest: bytes, version: int) -> bool:
        """Whether a group is known never to be checked or trained (so is not taken)."""
        ...

    def closed(self, node: NodeView, version: int) -> bool:
        """Whether a round takes no more new groups."""
        ...

    def own_draw(self, node: NodeView, digest: bytes, draw: Draw, rate: float) -> bool:
        """Whether this node's own draw chose the check it just made, whose race evidence its
        sequential test may count (specs/verification.md §7)."""
        ...

    def claim(self, node: NodeView, digest: bytes, draw: Draw, pi: bytes) -> dict[str, Any] | None:
        """The draw fields of this node's verdict on a group (draw, pi, ticket and any proven
        place); None when it could claim nothing another node could check."""
        ...

    def route(self, node: NodeView, verdict: SignedVerdict) -> list[Action]:
        """Where this node's own verdict goes."""
        ...

    def refusal(self, node: NodeView, verdict: SignedVerdict) -> Refusal | None:
        """Why this design refuses a received verdict's claim, or None."""
        ...

    def counted(self, node: NodeView, verdict: SignedVerdict, group: HeldGroup) -> None:
        """A verdict on a held group was just counted."""
        ...

    def listed(self, node: NodeView, digest: bytes, version: int) -> bool | None:
        """Whether a group may be decided at all: True, False (never), None (not yet known)."""
        ...

    def unreached(self, node: NodeView, group: HeldGroup) -> bool | None:
        """The decision on a group no failure and no counting pass has reached: True to admit,
        None to wait."""
        ...

    def decisions(self, node: NodeView, fresh: list[bytes]) -> dict[bytes, bool | None]:
        """:meth:`NodeView.decided` of each fresh group."""
        ...

    def seated(self, verdict: SignedVerdict) -> bool:
        """Whether a verdict holds a seat its claim proved: the design's own check of a group
        (admission's trusted share, specs/reputation.md §6)."""
        ...
