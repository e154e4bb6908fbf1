"""The vocabulary of :class:`vrl.node.protocol.NodeProtocol`: the events it is fed (what
happened: a message arrived, the clock moved, the daemon finished a job) and the actions it
answers with (what the daemon is to do). Plain immutable records, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass

from vrl.node.messages import (
    Batch,
    Group,
    ManifestLists,
    PolicyAnnouncement,
    RoundManifest,
    SignedVerdict,
    StepVerdict,
    Submission,
)
from vrl.node.requests import EntriesAnswer

# -- events (fed in) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class PolicyAnnounced:
    announcement: PolicyAnnouncement


@dataclass(frozen=True)
class PolicyLoaded:
    """The daemon fetched, hash-checked and loaded a version's weights."""
    version: int


@dataclass(frozen=True)
class GroupReceived:
    """A group whose records decoded, verify their signatures and form one whole group
    (:func:`vrl.node.messages.decode_group`), decoded once: its subject, version and slot
    come from its records."""
    group: Group
    now: float


@dataclass(frozen=True)
class VerdictReceived:
    verdict: SignedVerdict


@dataclass(frozen=True)
class ManifestReceived:
    """A round manifest arrived (the committee design, specs/committee.md §3.3); ``lists``, the
    lists behind it, only as the trainer replays its own from its store."""
    manifest: RoundManifest
    now: float
    lists: ManifestLists | None = None


@dataclass(frozen=True)
class EntriesReceived:
    """An ``entries`` answer (specs/committee.md §3.5) to this node's ``fetch``
    (:class:`FetchEntries`), decoded; the protocol checks it against the request and the round's
    header before it uses a leaf of it."""
    fetch: FetchEntries
    answer: EntriesAnswer


@dataclass(frozen=True)
class Generated:
    version: int
    groups: tuple[Group, ...]


@dataclass(frozen=True)
class Checked:
    group: bytes
    failed_reasons: tuple[str, ...]  # rejection codes, empty when every record passed
    digest: bytes
    race_tokens: int = 0  # the sequential test's evidence (vrl.node.work.CheckResult)
    races_lost: int = 0


@dataclass(frozen=True)
class Refused:
    """The trainer's GRPO forward pass checked this group, one of the batch it was about to
    train, and it failed (vrl.node.work.PolicyTrainer.screened: specs/network.md §5.4). It is
    never trained; the check is published as any check of this node's is."""
    check: Checked


@dataclass(frozen=True)
class Planted:
    submission: Submission
    subject: bytes
    version: int


@dataclass(frozen=True)
class Trained:
    announcement: PolicyAnnouncement
    groups: tuple[bytes, ...]  # the admitted groups the step used


@dataclass(frozen=True)
class StepVerdictReceived:
    verdict: StepVerdict


@dataclass(frozen=True)
class StepReplayed:
    """The daemon replayed the step that made ``version`` (:class:`ReplayStep`)."""
    version: int
    faults: tuple[str, ...]  # StepFault codes, empty when the replay agreed
    replayed: bytes  # the replay's model hash (empty if it could not run)
    drift: float


@dataclass(frozen=True)
class StepStateMissing:
    """The daemon could not get the config, optimizer or proofs files of the step that made
    ``version`` (:class:`ReplayStep`)."""
    version: int


@dataclass(frozen=True)
class BatchFetched:
    """The daemon fetched the batch file ``announcement`` names (:class:`FetchBatch`): its
    ``batch``, or None when the file is not a batch of that announcement (trainer fraud anyone
    can re-check, specs/training.md §5; the daemon logs why)."""
    announcement: PolicyAnnouncement
    batch: Batch | None


@dataclass(frozen=True)
class Abandoned:
    """The daemon could not carry out an action (e.g. no peer had the weights yet); the
    protocol will ask again when it is still due."""
    action: Action


Event = (Abandoned | Tick | PolicyAnnounced | PolicyLoaded | GroupReceived | VerdictReceived | Generated | Checked
         | Refused | Planted | Trained | StepVerdictReceived | StepReplayed | StepStateMissing | ManifestReceived
         | BatchFetched | EntriesReceived)


# -- actions (carried out by the daemon) ---------------------------------------------------------

@dataclass(frozen=True)
class Publish:
    """Gossip one of this node's own messages on ``topic``. The daemon stores it first, so
    that what a node says is acknowledged before anyone can have heard it (specs/network.md
    §6: a peer's backfill of this node's store finds everything it gossiped)."""
    topic: str
    data: bytes


@dataclass(frozen=True)
class Send:
    """Deliver one message to one node, not by gossip (the committee design's routing,
    specs/network.md §3.5): a worker's groups and a member's passes go to the trainer only.
    The sender stores its own copy as it stores what it publishes; the receiver validates and
    handles it as the same message arriving on ``topic``, and forwards it to no one."""

    peer: bytes  # the receiver's node id
    topic: str
    data: bytes


@dataclass(frozen=True)
class FetchGroup:
    """Fetch one group by its digest (specs/network.md §3.5): from the trainer, which holds
    every group its manifests list, or any peer that holds it. The daemon checks that the bytes
    hash to ``digest`` and feeds them as :class:`GroupReceived`, or :class:`Abandoned` if no
    peer had them."""

    digest: bytes
    version: int


@dataclass(frozen=True)
class FetchPolicy:
    announcement: PolicyAnnouncement


@dataclass(frozen=True)
class FetchBatch:
    """Fetch the batch file ``announcement`` names (specs/network.md §3.3.1), for judging its step."""
    announcement: PolicyAnnouncement


@dataclass(frozen=True)
class Generate:
    version: int


@dataclass(frozen=True)
class Check:
    group: bytes
    version: int


@dataclass(frozen=True)
class Plant:
    version: int


@dataclass(frozen=True)
class Train:
    version: int
    batch: tuple[tuple[bytes, float], ...]  # (group digest, loss weight)


@dataclass(frozen=True)
class Quarantine:
    node: bytes
    purged: tuple[bytes, ...]  # its groups dropped from the queue, never trained on


@dataclass(frozen=True)
class Persist:
    """Store this received verdict: it names a known group, agrees with it, and now counts.
    Verdicts still waiting for their group are not stored, so strangers cannot fill the disk."""
    verdict: SignedVerdict


@dataclass(frozen=True)
class PersistGroup:
    """Store this received group, under the signer and version of its records, before it is
    acted on: a check or a training step of it must find it after a restart."""
    group: Group
    received: float


@dataclass(frozen=True)
class PersistPolicy:
    """Store this received policy announcement: the versions a restarted node follows are
    replayed from the store (vrl.node.catchup.replay_store)."""
    announcement: PolicyAnnouncement


@dataclass(frozen=True)
class FetchEntries:
    """Ask for entries of one list of round ``round``'s paged manifest, by position or by key
    (specs/committee.md §3.5): the trainer first, then peers. The daemon feeds the answer as
    :class:`EntriesReceived`, or :class:`Abandoned` if no peer answered."""

    round: int
    list: str
    positions: tuple[int, ...] = ()
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class PersistManifest:
    """Store this received round manifest (the trainer's, the first of its round): a restarted
    node's committees are drawn from it again (specs/committee.md §3); the trainer stores the
    lists behind its own (``lists``), which it serves and an audit reads."""
    manifest: RoundManifest
    lists: ManifestLists | None = None


@dataclass(frozen=True)
class ReplayStep:
    """Run the step that made this announcement again and compare (specs/training.md §4)."""
    announcement: PolicyAnnouncement


@dataclass(frozen=True)
class PersistStep:
    """Store this received step verdict (it names a known announcement and now counts)."""
    verdict: StepVerdict


@dataclass(frozen=True)
class ConvictTrainer:
    """Trainer fraud is confirmed (specs/training.md §6): this node follows no version from
    ``version`` on; the daemon says so loudly in its logs and metrics."""
    trainer: bytes
    version: int
    reasons: tuple[str, ...]
    reporters: tuple[bytes, ...]


Action = (Publish | Send | FetchGroup | FetchPolicy | FetchBatch | Generate | Check | Plant | Train | Quarantine
          | Persist | PersistGroup | PersistPolicy | ReplayStep | PersistStep | ConvictTrainer | PersistManifest
          | FetchEntries)
