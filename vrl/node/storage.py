"""A node's storage tier (specs/storage.md): which blobs it keeps, and the crash-safe prune of
the rest.

Blobs are the files announcements name by SHA-256 (weights, optimizer states, step configs,
reward proofs: :mod:`vrl.node.blobs`). Every version's announcement stays in the store for
good; its blobs need not. The ``default`` tier keeps the blobs of the last ``max_staleness +
1`` versions, which is all the protocol can still use: a group older than that is no longer
checked or trained (vrl.rl.grpo.is_fresh), and a verifier replays step ``r`` only while it
holds versions ``r - 1`` and ``r`` (:class:`vrl.node.training.StepReplay`, the same window of
:meth:`vrl.node.work.Work.install`). The ``archive`` tier keeps every version's blobs, or,
with ``archive_sample`` below 1, those of the steps the audit's own draw picks at that share
(:func:`step_drawn`), and serves them to auditors and late joiners.

The prune (:class:`Pruner`) is a journal in the node's SQLite store: the blobs about to go are
recorded as an intent in one transaction, then unlinked, then the directory is fsynced, then
the intent is marked done. A crash at any point leaves either an intent, which the next start
finishes (:meth:`Pruner.reconcile`), or nothing. A full disk fails the intent's transaction
before any file is touched. Only blobs that some announcement outside the window names, no
announcement inside it names, and no duty in flight has pinned (:meth:`vrl.node.blobs.Blobs.pinned`)
are ever candidates: a file no announcement names yet (a trainer's step about to be announced)
is never one.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from vrl.config import ConfigError, bounded, check_fields, checked, one_of
from vrl.node.messages import PolicyAnnouncement
from vrl.node.store import Store
from vrl.rollouts.files import fsync

TIERS = ("default", "archive")

# Which steps an audit replays when it samples, and which steps an archive of a share keeps: a
# hash of the announcement, not a choice, so two audits of one run replay the same steps and an
# audit at a share at or below an archive's finds every step it draws there (specs/training.md
# §4, specs/storage.md §3).
STEP_SAMPLE_DOMAIN = b"vrl/audit-step-sample/v1\x00"


def step_drawn(announcement: PolicyAnnouncement, share: float) -> bool:
    """Whether the step that made ``announcement`` is among a ``share`` of the steps: the
    first 8 bytes of its hash, as a fraction of 2^64, fall below ``share`` (so a step drawn at
    one share is drawn at every larger one)."""
    digest = hashlib.sha256(STEP_SAMPLE_DOMAIN + announcement.id).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


@dataclass(frozen=True)
class StorageConfig:
    """What a node keeps on disk (specs/storage.md): a node's ``[storage]`` table."""

    # default: the blobs of the last max_staleness + 1 versions; archive: every step's blobs
    # (or a drawn share's), served to auditors and late joiners. Who must run one: specs/storage.md §4.
    tier: str = field(default="default", metadata=checked(one_of(TIERS)))
    # archive only: the share of steps whose blobs are kept, drawn as an audit draws them
    # (step_drawn), so an audit at a sample up to this share finds every step it replays. 1: all.
    archive_sample: float = field(default=1.0, metadata=bounded(0, 1))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.tier != "archive" and self.archive_sample != 1.0:
            raise ConfigError('applies to tier = "archive" only (the default tier keeps the last max_staleness + 1 '
                              "versions, whatever the share)", ("archive_sample",), type(self).__name__)


def named(announcement: PolicyAnnouncement) -> set[bytes]:
    """The blobs an announcement names that its version itself made or uses: weights, its delta, step
    config, optimizer state after the step, reward proofs, batch file (not ``optimizer_before``,
    its parent's state)."""
    return {d for d in (announcement.blob, announcement.delta, announcement.config, announcement.optimizer,
                        announcement.proofs, announcement.batch_file) if d}


def replay_needs(announcement: PolicyAnnouncement, parent: PolicyAnnouncement | None) -> set[bytes]:
    """Every blob a replay of the step that made ``announcement`` reads (specs/training.md §4):
    its own, the parent's weights and the optimizer state before the step."""
    before = {announcement.optimizer_before} if announcement.optimizer_before else set()
    return named(announcement) | before | ({parent.blob} if parent is not None else set())


def retained(policies: Mapping[int, PolicyAnnouncement], latest: int, keep: int, config: StorageConfig) -> set[bytes]:
    """The blobs a node of ``config``'s tier keeps while ``latest`` is the newest version:
    those of versions ``latest - keep + 1 .. latest`` (``keep`` is max_staleness + 1), with the
    state before each step whose parent is in that window too; an archive adds every drawn step's."""
    oldest = latest - keep + 1
    keep_set: set[bytes] = set()
    for version in range(max(oldest, 0), latest + 1):
        announcement = policies.get(version)
        if announcement is None:
            continue
        keep_set |= named(announcement)
        if version > oldest and announcement.optimizer_before:
            keep_set.add(announcement.optimizer_before)
    if config.tier == "archive":
        for version, announcement in policies.items():
            if version > 0 and step_drawn(announcement, config.archive_sample):
                keep_set |= replay_needs(announcement, policies.get(version - 1))
    return keep_set


def prunable(policies: Mapping[int, PolicyAnnouncement], latest: int, keep: int,
             config: StorageConfig) -> dict[bytes, int]:
    """Blobs that versions older than the window name and nothing kept names, each with the
    newest version naming it. An archive of every step prunes nothing."""
    if config.tier == "archive" and config.archive_sample >= 1.0:
        return {}
    kept = retained(policies, latest, keep, config)
    out: dict[bytes, int] = {}
    for version, announcement in policies.items():
        if version <= latest - keep:
            for digest in replay_needs(announcement, None) - kept:
                out[digest] = max(version, out.get(digest, version))
    return out


@dataclass(frozen=True)
class Pruned:
    """What one prune did: blobs removed, and bytes freed."""

    removed: tuple[bytes, ...] = ()
    freed: int = 0
    skipped_pinned: int = 0


class Pruner:
    """The prune of one node's blob directory ``directory`` under ``config``'s tier, journaled
    in ``store``; ``pins`` (digest -> count, :attr:`vrl.node.blobs.Blobs.pins`) are what duties in
    flight hold; ``keep`` is max_staleness + 1."""

    def __init__(self, config: StorageConfig, store: Store, directory: Path, pins: Mapping[bytes, int], keep: int,
                 log: structlog.BoundLogger | None = None) -> None:
        self.config, self.store, self.directory, self.pins, self.keep = config, store, Path(directory), pins, keep
        self.log = log or structlog.get_logger("vrl.node.storage")
        self._pruned_at: int | None = None

    def after(self, policies: Mapping[int, PolicyAnnouncement], latest: int | None) -> Pruned:
        """Prune once per new latest version (what the daemon calls after each event)."""
        if latest is None or latest == self._pruned_at:
            return Pruned()
        result = self.prune(policies, latest)
        self._pruned_at = latest
        return result

    def prune(self, policies: Mapping[int, PolicyAnnouncement], latest: int) -> Pruned:
        """Remove what the tier does not keep; a failure to journal (a full disk) removes nothing
        and is logged: the next version tries again."""
        result = Pruned()
        try:
            for step in self.steps(policies, latest):
                result = step
        except (sqlite3.Error, OSError) as error:
            # A full disk: the journal's transaction fails before any file goes (SQLITE_FULL), or
            # the folder's fsync fails after some did (ENOSPC), leaving an intent that the next
            # prune, or the next start (reconcile), finishes. Either way no kept blob is touched.
            self.log.warning("prune stopped; nothing needed was removed, the next version retries",
                             folder=str(self.directory), store=str(self.store.path),
                             error=str(error) or repr(error))
        return result

    def steps(self, policies: Mapping[int, PolicyAnnouncement], latest: int) -> Iterator[Pruned]:
        """The prune, one durable step per item (a test stops it after any of them, as a crash
        would): the intent recorded, each blob unlinked, the directory synced, the intent done."""
        candidates = prunable(policies, latest, self.keep, self.config)
        victims = {d: v for d, v in candidates.items() if (self.directory / d.hex()).exists() and not self.pins.get(d)}
        pinned = sum(1 for d in candidates if self.pins.get(d))
        if not victims:
            yield Pruned(skipped_pinned=pinned)
            return
        self.store.begin_prune(sorted(victims.items()), time.time())
        yield Pruned(skipped_pinned=pinned)
        removed, freed = [], 0
        for digest in sorted(victims):
            freed += self._unlink(digest)
            removed.append(digest)
            yield Pruned(tuple(removed), freed, pinned)
        fsync(self.directory)
        self.store.end_prune(removed)
        self.log.info("pruned blobs", tier=self.config.tier, latest=latest, removed=len(removed), freed=freed)
        yield Pruned(tuple(removed), freed, pinned)

    def reconcile(self, policies: Mapping[int, PolicyAnnouncement], latest: int | None) -> Pruned:
        """At start: finish a prune a crash interrupted. An intent whose blob the tier now
        keeps (a node restarted with ``tier = "archive"``) is cancelled, and the file stays."""
        intents = self.store.prune_intents()
        if not intents:
            return Pruned()
        kept = retained(policies, latest, self.keep, self.config) if latest is not None else set()
        if self.config.tier == "archive" and self.config.archive_sample >= 1.0:
            kept |= set(intents)
        cancel = [d for d in intents if d in kept]
        finish = [d for d in intents if d not in kept]
        freed = sum(self._unlink(d) for d in finish)
        fsync(self.directory)
        self.store.cancel_prune(cancel)
        self.store.end_prune(finish)
        self.log.warning("finished an interrupted prune", removed=len(finish), kept=len(cancel))
        return Pruned(tuple(finish), freed)

    def _unlink(self, digest: bytes) -> int:
        path = self.directory / digest.hex()
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return 0
        return size


def blob_bytes(directory: Path) -> int:
    """The bytes of the blob files in ``directory`` (what the tier bounds)."""
    return sum(p.stat().st_size for p in Path(directory).iterdir() if len(p.name) == 64 and p.is_file())
