"""Training steps replayed offline (specs/training.md §4): :func:`replay_step` re-executes the
GRPO step that made one policy version from the files its announcement names, and says
whether the announced weights and optimizer state are what that step makes.

The files come from wherever the caller has them (a devnet's ``blobs/`` directories, a
node's store for the groups): :func:`replay_step` takes two lookups, by SHA-256 and by group
digest, and never fetches, writes or trusts anything it cannot hash. When the announcement's
platform differs from this machine's only in torch's thread count, the replay runs at the
trainer's count, so that bit-exactness is what it checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from vrl.node.messages import BatchFile, Group, MessageError, PolicyAnnouncement, StepFault
from vrl.node.steps import step_rule_faults
from vrl.node.storage import step_drawn
from vrl.node.weights import WeightsError, from_blob
from vrl.node.work import judge_step
from vrl.rollouts.model import Model, platform_tag

# A private task set's step (specs/zk.md §11): from its groups and its reward proofs file,
# the rewards it must have trained on, and why it is at fault (None: it is not).
StepRewards = Callable[[list[Group], bytes], tuple[list[list[float]], str | None]]
# Reasons a proof fails that say the auditor does not hold the SRS it was made against (a node
# holds the network's one, so there they are the trainer's fault; an auditor may just lack it).
_SRS_NOT_HELD = frozenset({"zk_wrong_srs", "zk_dev_srs"})

_THREADS = re.compile(r"/threads-(\d+)$")


@dataclass(frozen=True)
class StepCheck:
    """One step judged offline: its faults (StepFault codes, empty when it is what was
    announced), what was missing to judge it, and the replay's numbers."""

    version: int
    faults: tuple[str, ...]
    missing: tuple[str, ...]  # files or groups not found: the step could not be replayed
    same_platform: bool  # bit-exact was required
    exact: bool
    drift: float  # ||claimed - replay|| / ||replay - parent|| (specs/training.md §4)
    optimizer_drift: float
    seconds: float  # the replay's own time

    @property
    def replayed(self) -> bool:
        return not self.missing

    @property
    def ok(self) -> bool:
        return self.replayed and not self.faults

    def sentence(self) -> str:
        if self.missing:
            return f"version {self.version} could not be replayed: missing {', '.join(self.missing[:3])}"
        if not self.faults:
            how = "bit for bit" if self.exact else f"within tolerance (drift {self.drift:.2e})"
            return f"version {self.version} is what its step makes, {how}"
        return (f"version {self.version} is not what its step makes: {', '.join(self.faults)} "
                f"(drift {self.drift:.3g}{', same platform: bit-exact was required' if self.same_platform else ''})")


@contextlib.contextmanager
def threads_of(platform: str, model: Model) -> Iterator[None]:
    """Run at the thread count a platform tag names when that is all that differs from this
    machine's: a replay or re-verification on the same platform must then be bit-exact."""
    wanted, before = _THREADS.search(platform), torch.get_num_threads()
    if wanted and _THREADS.sub("", platform) == _THREADS.sub("", platform_tag(model)):
        torch.set_num_threads(int(wanted[1]))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def replay_step(announcement: PolicyAnnouncement, parent: PolicyAnnouncement, *,
                blob: Callable[[bytes], bytes | None], group: Callable[[bytes], Group | None], base: Model,
                max_staleness: int = 2, trainer_fails: Mapping[bytes, int] | None = None,
                rewards: StepRewards | None = None) -> StepCheck:
    """Re-execute the step that made ``announcement`` (version ``v``) from ``parent`` (version
    ``v - 1``): the chain rules of specs/training.md §5 first, then the replay. ``blob`` looks a
    file up by its SHA-256 (None if absent; what it returns is hashed again here), ``group`` a
    batch group by digest; ``base`` is the network's base model (the architecture, tokenizer
    and only reference policy). ``trainer_fails`` maps a group's digest to the round of the
    trainer's own signed hard fail on it, for the ``rejected_group`` rule: a step can replay
    bit for bit and still train a group its trainer had rejected. ``rewards``, for a private
    task set, gives what the step must have trained on from its reward proofs file, and why it
    is at fault (``Models.step_rewards``: specs/zk.md §11)."""
    if announcement.version != parent.version + 1:
        raise ValueError(f"version {parent.version} is not the parent of version {announcement.version}")
    missing: list[str] = []

    def file(digest: bytes, what: str) -> bytes | None:
        data = blob(digest)
        if data is None or hashlib.sha256(data).digest() != digest:
            missing.append(f"{what} {digest.hex()[:16]}")
            return None
        return data

    batch = announcement.inline
    if batch is None:  # the batch is in the file the announcement names (specs/network.md §3.3.1)
        data = file(announcement.batch_file, f"batch file of version {announcement.version}")
        if data is None:
            return StepCheck(announcement.version, (), tuple(missing), False, False, 0.0, 0.0, 0.0)
        try:
            batch = BatchFile.of(announcement, data)
        except MessageError:
            return StepCheck(announcement.version, (StepFault.BAD_BATCH,), (), False, False, 0.0, 0.0, 0.0)
    digests = [d for d, _ in batch]
    groups = [group(d) for d in digests]
    missing += [f"group {d.hex()[:16]}" for d, g in zip(digests, groups) if g is None]
    versions = {g.digest: g.version for g in groups if g is not None}
    rules = step_rule_faults(announcement, parent, batch, versions, dict(trainer_fails or {}), max_staleness)
    if rules:
        return StepCheck(announcement.version, rules, (), False, False, 0.0, 0.0, 0.0)
    weights = [file(a.blob, f"weights of version {a.version}") for a in (parent, announcement)]
    config = file(announcement.config, "step config")
    before = file(announcement.optimizer_before, f"optimizer state of version {parent.version}")
    after = file(announcement.optimizer, f"optimizer state of version {announcement.version}")
    proofs = file(announcement.proofs, "reward proofs") if rewards is not None and announcement.proofs else b""
    present = [g for g in groups if g is not None]
    # Whatever is None was named in missing: the other tests only say so to the type checker.
    if (missing or config is None or before is None or after is None or proofs is None
            or weights[0] is None or weights[1] is None or len(present) < len(groups)):
        return StepCheck(announcement.version, (), tuple(missing), False, False, 0.0, 0.0, 0.0)
    groups_held, weights_held = present, [weights[0], weights[1]]
    try:
        parent_model, claimed = (
            from_blob(base, w, blob_hash=a.blob, model_hash=a.model_hash, name=f"policy@{a.version}")
            for w, a in zip(weights_held, (parent, announcement)))
    except WeightsError:  # the weights file is not the announced model: no step made it
        return StepCheck(announcement.version, (StepFault.WEIGHTS_MISMATCH,), (), False, False, float("inf"), 0.0, 0.0)
    started = time.perf_counter()
    trained, unproven = rewards(groups_held, proofs) if rewards is not None else (None, None)
    if unproven in _SRS_NOT_HELD:  # the auditor lacks the network's SRS: its own gap, not the trainer's fault
        return StepCheck(announcement.version, (), (f"the SRS its reward proofs were made against ({unproven}; "
                                                    "give it with --srs, or --allow-dev-srs)",), False, False, 0.0,
                         0.0, 0.0)
    with threads_of(announcement.platform, parent_model):
        judged = judge_step(announcement, parent_model, claimed, config, before, after, groups_held, base, trained,
                            batch=batch)
    seconds = time.perf_counter() - started
    result = judged.replay
    faults = (*judged.faults, *(() if unproven is None else (StepFault.REWARD_UNPROVEN,)))
    return StepCheck(announcement.version, faults, (), judged.same_platform,
                     result is not None and result.exact, judged.drift,
                     result.optimizer_drift if result is not None else 0.0, seconds)


def sampled(announcement: PolicyAnnouncement, share: float) -> bool:
    """Whether an audit replaying a ``share`` of the steps replays this one: the draw an
    archive of that share keeps (vrl.node.storage.step_drawn, specs/storage.md §3), so an
    audit at a share up to an archive's finds every step it draws there."""
    return step_drawn(announcement, share)


def replay_steps(announcements: Iterable[PolicyAnnouncement], *, blob: Callable[[bytes], bytes | None],
                 group: Callable[[bytes], Group | None], base: Model, share: float = 1.0,
                 max_staleness: int = 2, trainer_fails: Mapping[bytes, int] | None = None,
                 rewards: StepRewards | None = None) -> Iterator[StepCheck]:
    """Replay a ``share`` of the steps of one trainer's announcements (any order; each
    version's parent must be among them), oldest first."""
    by_version = {a.version: a for a in announcements}  # announcements are ~250 bytes plus their batch
    for version in sorted(by_version):
        parent = by_version.get(version - 1)
        if version > 0 and parent is not None and sampled(by_version[version], share):
            yield replay_step(by_version[version], parent, blob=blob, group=group, base=base,
                              max_staleness=max_staleness, trainer_fails=trainer_fails, rewards=rewards)
