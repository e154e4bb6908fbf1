"""Admission into a GRPO batch (specs/reputation.md §6): which decided groups a step trains
on, and each one's loss weight, drawn by the reputation scores :mod:`vrl.node.reputation`
computes. A pure function of the candidates, the ``[admission]`` table and the round's seed,
so an auditor holding the same verdicts draws the same batch."""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from vrl.config import bounded, check_fields

# Each candidate's admission key is a hash of the round's seed and its group (specs/reputation.md §6).
ADMIT_DOMAIN = b"vrl/admit/v1\x00"


@dataclass(frozen=True)
class AdmissionConfig:
    """How a GRPO batch is drawn (specs/reputation.md §6): a node's ``[admission]`` table."""

    # groups per GRPO step, as vrl train's groups_per_step (vrl.rl.config.TrainConfig). A step
    # holds its batch in memory; 2^16 groups is far past any batch measured here.
    batch_groups: int = field(default=16, metadata=bounded(1, 2**16))
    # no node supplies more than a quarter of a batch, so a full batch draws on at least four
    # nodes (specs/reputation.md §6)
    node_cap: float = field(default=0.25, metadata=bounded(0, 1, open_low=True))
    # at least half from trusted nodes: SAPO's 4/4 mix beat 2/6 (arXiv 2509.08721 §5.2)
    trusted_share: float = field(default=0.5, metadata=bounded(0, 1))
    # a score this high counts as trusted (scores are in [0, 1])
    trusted_score: float = field(default=0.5, metadata=bounded(0, 1))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, slots=True)
class Candidate:
    group: bytes  # group digest
    node: bytes
    score: float
    verified: bool = False  # a pre-trusted node checked this very group and it passed

    def trusted(self, config: AdmissionConfig) -> bool:
        """Trusted rollouts: from a trusted node, or checked by a trusted node. Without the
        second, a new network where nobody has a record yet could never fill its trusted share."""
        return self.verified or self.score >= config.trusted_score


def admit(candidates: Iterable[Candidate], config: AdmissionConfig, seed: bytes) -> list[tuple[Candidate, float]]:
    """Choose a batch and each group's loss weight.

    * Groups are drawn without replacement with probability proportional to their node's
      score (Efraimidis & Spirakis 2006: key ``u ** (1/score)``, ``u`` from a hash of the
      seed and group), so admission grows with reputation and a score of 0 is never drawn.
    * A node fills at most ``ceil(node_cap * batch_groups)`` slots.
    * Untrusted groups fill at most ``(1 - trusted_share)`` of the batch; when trusted groups
      run short the batch shrinks rather than dilutes. A group is trusted when its node's
      score reaches ``trusted_score`` or a pre-trusted node checked and passed it.
    * Weights are ``score / mean(score)`` over the batch: mean 1, so the learning rate and the
      token-mean denominator are unchanged (specs/reputation.md §6); a weight is never negative.
    """
    def key(c: Candidate) -> float:
        u = (int.from_bytes(hashlib.sha256(ADMIT_DOMAIN + seed + c.group).digest()[:8], "big") + 1) / (2**64 + 1)
        drawn: float = u ** (1.0 / c.score)  # float ** float is typed Any (a complex for a base < 0); u > 0
        return drawn

    ranked = sorted((c for c in candidates if c.score > 0), key=lambda c: (-key(c), c.group))
    per_node_cap = math.ceil(config.node_cap * config.batch_groups)
    untrusted_cap = math.floor((1 - config.trusted_share) * config.batch_groups)
    taken: dict[bytes, int] = defaultdict(int)
    batch: list[Candidate] = []
    for c in ranked:
        if len(batch) == config.batch_groups:
            break
        if taken[c.node] >= per_node_cap or (not c.trusted(config) and sum(
                not x.trusted(config) for x in batch) >= untrusted_cap):
            continue
        taken[c.node] += 1
        batch.append(c)
    if config.trusted_share > 0:
        # When trusted groups ran short, drop the last-drawn untrusted ones until
        # untrusted <= trusted * (1 - share) / share: the batch shrinks rather than dilutes.
        n_trusted = sum(c.trusted(config) for c in batch)
        allowed = math.floor(n_trusted * (1 - config.trusted_share) / config.trusted_share + 1e-9)
        kept, seen = [], 0
        for c in batch:
            if not c.trusted(config):
                seen += 1
                if seen > allowed:
                    continue
            kept.append(c)
        batch = kept
    if not batch:
        return []
    mean = sum(c.score for c in batch) / len(batch)
    return [(c, c.score / mean) for c in batch]
