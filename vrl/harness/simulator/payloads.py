"""Real messages with synthetic content: signed rollout records of a realistic size, the groups
they form, the trainer's announcements, and the outcome of a check, which the simulator stubs.

Generation is not modelled beyond its time: a worker's records carry synthetic token ids,
logprobs and commitment bytes of the sizes a real record has (prompt and completion tokens as
the config says, 6.33 commitment bytes a token), and are signed with the worker's real Ed25519
key by the real record code (vrl.rollouts.record.Rollout.signed), grouped by
vrl.node.messages.Group.of. Every byte count the simulator reports is the length of such a
real encoding. What a check of a group finds is the ground truth the simulator keeps: the
cheat that made the group (spec.BAD_REASONS) or, for an honest group, a pass (or a soft fail
at the calibrated honest rate)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass
from typing import TypedDict

from proofs.sampling_params import SamplingParams
from vrl.node.committee import Draw
from vrl.node.events import Checked
from vrl.node.messages import Group, Outcome, PolicyAnnouncement, SignedVerdict, audit_ticket
from vrl.rollouts.keys import NodeKey
from vrl.rollouts.record import Rollout, round_seed
from vrl.tasks import RewardSpec

from .spec import BAD_REASONS, LAZY, PLATFORM, SPOOF_LOSS_FACTOR, SPOOFS, SimConfig

_DIGEST = b"vrl/sim/recomputed\x00"
_RECORDS = b"vrl/sim/records\x00"
_MODEL = b"vrl/sim/model\x00"
_OPTIMIZER = b"vrl/sim/optimizer\x00"
STEP_CONFIG_DOMAIN = b"vrl/sim/step-config\x00"
STEP_CONFIG = hashlib.sha256(STEP_CONFIG_DOMAIN).digest()


def honest_digest(group: bytes) -> bytes:
    """What every verifier that really prefills the group recomputes (one platform: one digest)."""
    return hashlib.sha256(_DIGEST + group).digest()


def model_hash(version: int) -> bytes:
    return hashlib.sha256(_MODEL + version.to_bytes(8, "big")).digest()


def optimizer_hash(version: int) -> bytes:
    return hashlib.sha256(_OPTIMIZER + version.to_bytes(8, "big")).digest()


class Records:
    """Builds a node's signed groups of a round, with synthetic content of the configured size.

    Each group draws its content from a stream of its own, seeded by the run's seed, its maker's
    key, its version and its index (a node makes each version's groups once,
    vrl.node.protocol's ``generated``): the same group whichever process makes it and in
    whatever order, so a :class:`Maker` may make them ahead on another core."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.sampling = SamplingParams(1.0, 0, 1.0, max(config.max_new_tokens, math.ceil(config.completion_tokens)),
                                       (0,))
        self.reward_spec = RewardSpec()  # one for every record: building one checks its terms

    def _rng(self, node_id: bytes, version: int, index: int) -> random.Random:
        return random.Random(hashlib.sha256(_RECORDS + b"%d/%d/%d/" % (self.config.seed, version, index)
                                            + node_id).digest())

    @staticmethod
    def _whole(mean: float, rng: random.Random) -> int:
        """A count whose mean is ``mean``: its floor, plus one at the fraction's rate (a whole
        ``mean`` draws nothing)."""
        whole = math.floor(mean)
        return whole + (rng.random() < mean - whole) if mean != whole else whole

    def group(self, key: NodeKey, version: int, index: int, reward: float | None = None) -> Group:
        c, rng = self.config, self._rng(key.node_id, version, index)
        seed = round_seed(model_hash(version), version)
        task = f"sim-{version}-{index}".ljust(c.task_id_chars, "-")
        prompt = tuple(rng.randrange(1, 50_000) for _ in range(self._whole(c.prompt_tokens, rng)))
        rollouts = []
        for sample in range(c.group_size):
            tokens = self._whole(c.completion_tokens, rng)
            commitment = c.commitment_bytes or math.ceil(c.commitment_bytes_per_token * tokens)
            rollouts.append(Rollout(
                node_id=key.node_id, model_hash=model_hash(version), policy_version=version, round_seed=seed,
                group_index=index, task_id=task, sample_index=sample, group_size=c.group_size,
                prompt="What is 12 + 34? ", reference="46", prompt_tokens=prompt,
                completion_tokens=tuple(rng.randrange(1, 50_000) for _ in range(tokens)),
                finish_reason="length", sampling=self.sampling,
                behaviour_logprobs=tuple(-rng.random() for _ in range(tokens)),
                reward=float(rng.random() < 0.5) if reward is None else reward, reward_spec=self.reward_spec,
                commitment=rng.randbytes(commitment)).signed(key))
        return Group.of(rollouts)

    def groups(self, key: NodeKey, version: int, count: int, reward: float | None = None) -> tuple[Group, ...]:
        """A node's groups of a round, indices 0 to ``count`` - 1."""
        return tuple(self.group(key, version, index, reward) for index in range(count))

    def resigned(self, group: Group, key: NodeKey, index: int) -> Group:
        """The replay cheat: another node's records re-signed as one's own (vrl.harness.adversary)."""
        return Group.of([r.signed(key, group_index=index) for r in group.rollouts])

    @property
    def tokens(self) -> int:
        """Completion tokens of one group: what a check's and a generation's cost is charged on."""
        return round(self.config.group_size * self.config.completion_tokens)


def blob_of(version: int) -> bytes:
    return hashlib.sha256(b"blob" + model_hash(version)).digest()


class _Delta(TypedDict, total=False):
    """An announcement's weights delta (specs/network.md §6.1): none, or all three."""

    delta: bytes
    delta_size: int
    delta_parent: bytes


class _BatchFile(TypedDict, total=False):
    """An announcement's batch file (specs/network.md §3.3.1): none, or both."""

    batch_file: bytes
    batch_size: int


def announcement(trainer: NodeKey, version: int, batch: tuple[tuple[bytes, float], ...], weights_bytes: int,
                 optimizer_bytes: int = 0, delta_bytes: int = 0, batch_file: bytes = b"") -> PolicyAnnouncement:
    """The trainer's announcement of ``version``, bound to its step as an honest trainer's is
    (specs/training.md §3): parent, optimizer before and after (``optimizer_bytes``, 0: twice the
    weights, Adam's two moments), one step config for the run; from version 1 a weights delta of
    ``delta_bytes`` against the parent's file (specs/network.md §6.1) if that is nonzero. With
    ``batch_file`` (the :func:`batch_file` of the batch: a committee network's trainer,
    vrl.node.training) the announcement names it instead of listing the batch."""
    delta: _Delta = ({"delta": hashlib.sha256(b"delta" + model_hash(version)).digest(), "delta_size": delta_bytes,
                      "delta_parent": blob_of(version - 1)} if version and 0 < delta_bytes < weights_bytes else {})
    named: _BatchFile = ({"batch_file": hashlib.sha256(batch_file).digest(), "batch_size": len(batch_file)}
                         if batch_file else {})
    return PolicyAnnouncement(
        trainer.node_id, version, model_hash(version), blob_of(version),
        weights_bytes, parent=model_hash(version - 1) if version else b"", batch=() if named else batch,
        config=STEP_CONFIG, **named,
        optimizer_before=optimizer_hash(version - 1) if version else b"", optimizer=optimizer_hash(version),
        optimizer_size=optimizer_bytes or 2 * weights_bytes, platform=PLATFORM, **delta).signed(trainer)


@dataclass(frozen=True)
class Truth:
    """What the simulator knows of a group: who made it and how (``cheat``: an adversary kind,
    "planted", or "" for an honest group)."""

    maker: int  # node index; -1 for a sybil's or a planted canary's key
    cheat: str

    @property
    def bad(self) -> bool:
        return self.cheat in BAD_REASONS


def check_result(truth: Truth | None, digest: bytes, verifier_kind: str, subject_kind: str, tokens: int, q0: float,
                 honest_reject: float, rng: random.Random, verifier: bytes) -> tuple[Checked, float]:
    """What a Check of ``digest`` by a verifier of ``verifier_kind`` reports, and the share of
    the honest verification time it took (0 for a lazy verifier, which runs nothing)."""
    cheat = truth.cheat if truth is not None else ""
    if verifier_kind in LAZY:
        # vrl.harness.adversary.CheatingWork.check: approves unseen, digest made up, every race won.
        return Checked(digest, (), hashlib.sha256(b"lazy" + verifier + digest).digest(), tokens, 0), 0.0
    if verifier_kind == "collude" and subject_kind == "collude":
        # Passes a fellow colluder's group with the digest an honest prefill gives (it ran one).
        return Checked(digest, (), honest_digest(digest), tokens, 0), 1.0
    if cheat in BAD_REASONS:
        return Checked(digest, BAD_REASONS[cheat], honest_digest(digest), tokens, 0), 1.0
    if verifier_kind == "accuse":
        # It ran the prefill (its digest is the honest one) and fails the group all the same.
        return Checked(digest, ("reward_mismatch",), honest_digest(digest), tokens, 0), 1.0
    lost = 0
    if cheat in SPOOFS:
        # Which races a group's tokens lose is a function of the group and the platform, the
        # same for every verifier of it (specs/verification.md §7): drawn from the digest.
        rate, races = min(0.5, SPOOF_LOSS_FACTOR * q0), random.Random(digest)
        lost = sum(races.random() < rate for _ in range(tokens))
    reasons = ("logprob_mismatch",) if honest_reject and rng.random() < honest_reject else ()
    return Checked(digest, reasons, honest_digest(digest), tokens, lost), 1.0


#: The platform a liar's verdicts state: the simulated one at two threads, which is not bit-exact
#: (specs/reputation.md §4 rule 2), so the trainer compares no race counts with it and a refuted
#: claim is a soft fail, not a hard fail that quarantines the liar at its first one: the liar the
#: budget on loss confirmations must bound round after round (specs/committee.md §8).
LIAR_PLATFORM = PLATFORM.replace("threads-1", "threads-2")


def liar_claim(data: bytes, key: NodeKey) -> bytes:
    """A liar's verdict as it sends it (adversary ``liar``): a committee pass, made by an honest
    check, re-signed stating every race it replayed lost, on :data:`LIAR_PLATFORM`. Its own
    sequential test saw the honest counts, so its verdict stays a pass (a race_losses fail would
    be a failure, re-checked by the trainer and the recheck committee whatever the budget:
    specs/security.md). Any other verdict goes as it is."""
    verdict = SignedVerdict.from_bytes(data)
    if verdict.draw != Draw.COMMITTEE or verdict.outcome != Outcome.PASS or not verdict.race_tokens:
        return data
    return dataclasses.replace(verdict, races_lost=verdict.race_tokens, platform=LIAR_PLATFORM,
                               signature=b"").signed(key).to_bytes()


def sybil_verdict(key: NodeKey, group: Group, version: int, committee: bool = False) -> SignedVerdict:
    """A fresh key's hard fail of an honest group: a stranger's smear (specs/reputation.md §7).
    In the committee design it claims a committee seat with a proof that is 80 bytes of noise:
    a receiver refuses it on its weights path, which no fresh key has (specs/committee.md §4
    step 2), before the proof or the signature would be checked."""
    draw = {"draw": "committee", "pi": hashlib.sha512(b"sybil" + key.node_id + group.digest).digest()[:80]
            + bytes(16), "ticket": b"", "weight": 1} if committee else {"ticket": audit_ticket(key, group.digest)}
    return SignedVerdict(verifier=key.node_id, subject=group.subject, group=group.digest, round=version,
                         policy_version=group.version, rate=1.0, outcome=Outcome.HARD_FAIL,
                         reasons=("reward_mismatch",), digest=hashlib.sha256(key.node_id + group.digest).digest(),
                         platform=PLATFORM, **draw).signed(key)
