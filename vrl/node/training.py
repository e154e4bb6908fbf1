"""The trainer's duties (:class:`Training`: a step per admitted batch, each announced as the
next version, bound to what made it) and a verifier's replay of the trainer's steps
(:class:`StepReplay`, specs/training.md §4-5).

Each duty is an async generator of the protocol events it ends in: the daemon feeds each to
the protocol as it comes, and the duty goes on once the protocol has acted on it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import TypedDict

import structlog

from proofs.zk import ZkError
from vrl.node import deltas
from vrl.node import protocol as P
from vrl.node.blobs import MAX_OPTIMIZER_BYTES, Blobs, BlobWriteError
from vrl.node.groups import GroupCache
from vrl.node.messages import BatchFile, Group, PolicyAnnouncement
from vrl.node.metrics import NodeMetrics
from vrl.node.proving import Proving
from vrl.node.storage import replay_needs
from vrl.node.store import Store
from vrl.node.work import CheckResult, ModelThread, PolicyTrainer, Screen, TrainedStep, Work
from vrl.rl.step import MAX_STEP_CONFIG_BYTES, PolicyForward
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.model import platform_tag
from vrl.zk.rewards import max_proofs_bytes


class Shortcut(TypedDict, total=False):
    """The announcement's optional files: a weights delta from its parent's weights file, and a
    committee network's batch file (each by hash and size)."""

    delta: bytes
    delta_size: int
    delta_parent: bytes
    batch_file: bytes
    batch_size: int


def whole(groups: list[Group | None]) -> list[Group]:
    """``groups``, every one there; a LookupError where one is not (no longer decodes)."""
    present = [g for g in groups if g is not None]
    if len(present) < len(groups):
        raise LookupError(f"{len(groups) - len(present)} of the batch's groups are not in the store")
    return present


class Training:
    """The trainer role of a node: ``trainer`` stepped on the batches ``protocol`` admits.
    ``keep`` is how many policy versions the node's work holds (max_staleness + 1)."""

    def __init__(self, trainer: PolicyTrainer, key: NodeKey, work: Work, protocol: P.NodeProtocol, store: Store,
                 groups: GroupCache, blobs: Blobs, proving: Proving, model_thread: ModelThread,
                 metrics: NodeMetrics, log: structlog.BoundLogger, keep: int) -> None:
        self.trainer, self.key, self.work, self.protocol, self.store = trainer, key, work, protocol, store
        self.groups, self.blobs, self.proving, self.model_thread = groups, blobs, proving, model_thread
        self.metrics, self.log, self.keep = metrics, log, keep

    async def train(self, version: int, batch: tuple[tuple[bytes, float], ...]) -> AsyncIterator[P.Event]:
        bodies = [self.groups.body(digest) for digest, _ in batch]  # stored: None only if one no longer decodes
        try:
            groups = whole(bodies)
            rewards, proofs = (await self.proving.prove_rewards(groups) if self.proving.answer_key is not None
                               else (None, (b"", 0)))
            step, refused = await self.model_thread.run("train", self.trainer.step, groups, [w for _, w in batch],
                                                        self.screen(groups), rewards, proofs)
        except Exception as error:  # whatever the step failed on: the round must not stall on it
            self.log.error("training step failed; the round will ask again", version=version, error=repr(error))
            yield P.Abandoned(P.Train(version, batch))
            return
        for digest, result in refused.items():
            self.metrics.checks.labels(P.outcome_of(result.reasons)).inc()
            for reason in result.reasons:
                self.metrics.rejected.labels(reason).inc()
            self.log.warning("refused to train a group its own pass failed", group=digest.hex()[:12],
                             reasons=sorted(set(result.reasons)))
            yield P.Refused(P.Checked(digest, result.reasons, result.digest, result.race_tokens, result.races_lost))
        if step is None:  # every group refused: the round goes on, and the protocol asks again
            yield P.Abandoned(P.Train(version, batch))
            return
        # The parent is looked up here, on the event loop, where the protocol's state changes.
        parent = self.protocol.policies.get(self.trainer.version - 1)
        delta = await self.model_thread.run("delta", self.delta_of, parent, step.blob)
        try:
            trained = self.announce(step, delta)
        except BlobWriteError as error:
            # A full disk (specs/storage.md §5). The step is in its checkpoint already
            # (PolicyTrainer.step wrote it before returning), so nothing is lost: the next start
            # announces it (bootstrap). Training on would make a version whose parent was never
            # announced, so this trainer trains no more until the node restarts with room.
            self.log.error("cannot store the new version's files: training stops; restart the node once the disk "
                           "has room, and it announces this version from its checkpoint", version=self.trainer.version,
                           error=str(error))
            return
        yield trained
        for group in groups:
            self.metrics.groups_trained.labels(group.subject.hex()[:8]).inc()

    def screen(self, groups: list[Group]) -> Screen:
        """What checks the batch before the step (PolicyTrainer.screened): every group from the
        step's own pass or a prefill of its version, except an older version's group this node
        has checked itself already (its verdict stands) or whose weights it no longer holds."""
        me = self.key.node_id
        mine = {g.digest for g in groups if (v := self.protocol.verdicts.get(g.digest, {}).get(me)) is not None
                and v.checked}
        held = set(self.work.models)

        def screen(group: Group, version: int, forward: PolicyForward | None) -> CheckResult | None:
            if forward is None and (group.digest in mine or version not in held):
                return None
            result = self.work.check(group, version, forward)
            if result.reasons and forward is not None:
                # The training pass batches all groups and runs with gradients, which no
                # calibration measured: a failure there is confirmed by the verifier's own
                # prefill before a group is refused (a refusal is a fraud report). Rare: cheap.
                result = self.work.check(group, version)
            return result
        return screen

    def delta_of(self, parent: PolicyAnnouncement | None, blob: bytes) -> tuple[bytes, bytes] | None:
        """(a weights delta, its parent file's hash) that rebuilds ``blob`` from the weights file
        of ``parent`` (the previous version's announcement; specs/network.md §6.1), if this node
        holds that file and the delta is the smaller; else None (the announcement names the full
        file only)."""
        if parent is None:
            return None
        path = self.blobs.directory / parent.blob.hex()
        if not path.exists():
            return None
        try:
            delta = deltas.encode(path.read_bytes(), blob)
        except (deltas.DeltaError, OSError) as error:  # another architecture, an unreadable file: no delta,
            # and the version is announced with its full file all the same (the delta is an optimization)
            self.log.info("no weights delta for this version", parent=parent.version, reason=str(error))
            return None
        return (delta, parent.blob) if len(delta) < len(blob) else None

    def announce(self, step: TrainedStep, delta: tuple[bytes, bytes] | None = None) -> P.Trained:
        """The trainer's current weights as the next version, bound to the step that made them
        (specs/training.md §3), with ``delta`` (:meth:`delta_of`) when there is one; every file
        it names is stored and served first (the full file too: late joiners need it)."""
        version = self.trainer.version
        parent = self.protocol.policies.get(version - 1)
        shortcut: Shortcut = {} if delta is None else {
            "delta": self.blobs.keep(delta[0]), "delta_size": len(delta[0]), "delta_parent": delta[1]}
        if self.protocol.design.manifests and step.batch:
            # A committee network's batch goes in a file that only its step's replayers fetch
            # (specs/network.md §3.3.1): listed inline, every node would receive 40 bytes a group.
            file = BatchFile(self.key.node_id, version, step.batch).to_bytes()
            shortcut |= {"batch_file": self.blobs.keep(file), "batch_size": len(file)}
        announcement = PolicyAnnouncement(
            self.key.node_id, version, step.model.model_hash, self.blobs.keep(step.blob), len(step.blob),
            parent=parent.model_hash if parent is not None else b"",
            batch=() if "batch_file" in shortcut else step.batch,
            config=self.blobs.keep(self.trainer.config_file), optimizer_before=step.optimizer_before,
            optimizer=self.blobs.keep(step.optimizer), optimizer_size=len(step.optimizer),
            platform=platform_tag(step.model), proofs=step.proofs[0], proofs_size=step.proofs[1],
            **shortcut).signed(self.key)
        self.work.install(version, self.trainer.frozen_copy(step.model), self.keep)
        metrics = {k: v for k, v in step.metrics.items() if isinstance(v, (int, float))}
        if "held_out_accuracy" in metrics:
            self.metrics.held_out_accuracy.set(metrics["held_out_accuracy"])
            self.metrics.expected_accuracy.set(metrics["held_out_expected_accuracy"])
        self.metrics.policy_version.set(version)
        self.store.put_policy(announcement, time.time())
        used = tuple(d for d, _ in step.batch)
        self.store.put_trained(version, used, json.dumps(metrics, sort_keys=True))
        # [train] report_to: the same numbers, stored first, at step = the version they made.
        self.trainer.trainer.trackers.log({"step": version, **metrics})
        self.log.info("policy published", version=version, groups=len(step.batch), **{
            k: round(v, 4) for k, v in metrics.items()
            if k in ("held_out_accuracy", "held_out_expected_accuracy", "rewards_mean", "loss")})
        return P.Trained(announcement, used)

    async def bootstrap(self) -> AsyncIterator[P.Event]:
        """The trainer announces its current weights unless the store already has them:
        version 0 at the first start, or the checkpoint a crash left unannounced."""
        if self.trainer.version in self.protocol.policies:
            announcement = self.protocol.policies[self.trainer.version]
            model = await self.model_thread.run("load", self.trainer.policy)
            self.work.install(announcement.version, self.trainer.frozen_copy(model), self.keep)
            yield P.PolicyLoaded(announcement.version)
            return
        step = await self.model_thread.run("serialize", self.trainer.current)
        metrics = await self.model_thread.run("evaluate", self.trainer.trainer.evaluate, step.model)
        yield self.announce(dataclasses.replace(step, metrics=metrics))

    def close(self) -> None:
        self.trainer.trainer.trackers.close()


class StepReplay:
    """A verifier's replay of the trainer's steps: the step that made an announcement run
    again on the files it names, and compared (``private``: a network of private tasks, whose
    steps train on the rewards their proofs file shows)."""

    def __init__(self, protocol: P.NodeProtocol, work: Work, groups: GroupCache, blobs: Blobs, proving: Proving,
                 model_thread: ModelThread, metrics: NodeMetrics, log: structlog.BoundLogger, private: bool) -> None:
        self.protocol, self.work, self.groups, self.blobs, self.proving = protocol, work, groups, blobs, proving
        self.model_thread, self.metrics, self.log, self.private = model_thread, metrics, log, private

    async def replay(self, announcement: PolicyAnnouncement) -> AsyncIterator[P.Event]:
        """Replay the step that made ``announcement`` (drawn by this node's step ticket, or
        reported as fraud by another) and report what it found."""
        version = announcement.version
        parent = self.protocol.policies.get(version - 1)
        batch = self.protocol.batch_of(version)
        groups = [g for digest, _ in batch or () if (g := self.groups.body(digest)) is not None]
        if (parent is None or batch is None or len(groups) < len(batch) or version not in self.work.models
                or version - 1 not in self.work.models):
            yield P.Abandoned(P.ReplayStep(announcement))
            return
        # What the replay reads stays on disk while it is fetched, whatever versions arrive meanwhile.
        try:
            with self.blobs.pinned(replay_needs(announcement, parent)):
                config = await self.blobs.get(announcement.config, MAX_STEP_CONFIG_BYTES,
                                              f"step config of version {version}")
                before = await self.blobs.get(announcement.optimizer_before,
                                              min(parent.optimizer_size, MAX_OPTIMIZER_BYTES),
                                              f"optimizer state of version {version - 1}")
                after = await self.blobs.get(announcement.optimizer,
                                             min(announcement.optimizer_size, MAX_OPTIMIZER_BYTES),
                                             f"optimizer state of version {version}")
                records = sum(len(g.rollouts) for g in groups)
                proofs = (await self.blobs.get(announcement.proofs,
                                               min(announcement.proofs_size, max_proofs_bytes(records)),
                                               f"reward proofs of version {version}")
                          if self.private and announcement.proofs else b"")
        except Exception as error:  # whatever the fetch failed on; the protocol decides when it is fraud
            self.log.warning("step state unavailable", version=version, error=repr(error))
            yield P.StepStateMissing(version)
            return
        try:
            rewards, unproven = (await self.model_thread.run("check proofs", self.proving.step_rewards, groups, proofs)
                                 if self.private else (None, ()))
        except ZkError as error:
            # ezkl failing here (a circuit this machine cannot build or hold): this node's own
            # problem, so no verdict; not retried, since it would fail the same way every tick.
            self.log.error("reward proofs cannot be checked here; the step is left unjudged", version=version,
                           error=str(error))
            return
        replay = functools.partial(self.work.replay, batch=batch)
        faults, replayed, drift = await self.model_thread.run("replay", replay, announcement, config, before, after,
                                                              groups, rewards)
        faults = (*faults, *unproven)
        self.metrics.step_drift.set(drift)
        yield P.StepReplayed(version, faults, replayed, drift)
