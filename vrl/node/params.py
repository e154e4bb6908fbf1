"""The protocol's tunables: a node's ``[protocol]`` table (:class:`ProtocolParams`), and the
roles a node may take. :class:`vrl.node.protocol.ProtocolConfig` adds to them who the node is
to the network; :mod:`vrl.node.config` reads them from node.toml."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from vrl.config import U63, bounded, check_fields
from vrl.node.committee import COMMITTEE_SIZE, MAX_COMMITTEE_SIZE

ROLES = ("worker", "verifier", "trainer")


class Verification(StrEnum):
    """Which groups a verifier checks: the verification design (vrl.node.designs), set alike on
    every node of a network. A node.toml names it by its value."""

    TICKETS = "tickets"  # audit tickets: every verifier draws for every group (specs/network.md §4)
    COMMITTEE = "committee"  # VRF committees over the trainer's round manifests (specs/committee.md)


@dataclass(frozen=True)
class ProtocolParams:
    """The protocol's tunables (specs/network.md §9): a node's ``[protocol]`` table. Nodes of
    one network set groups_per_round and max_staleness alike; the rest is a node's own."""

    # A worker's groups per policy version: 4 groups of 8 are a round of 32 rollouts, one
    # generation pass (vrl.node.config: [work] generation_batch). An index is a u32 (specs/record.md §1).
    groups_per_round: int = field(default=4, metadata=bounded(1, 2**32))
    # Seconds a group waits for verdicts before it may be admitted unchecked: honest fails
    # arrive well within 4 s (check latency p90 1.98-2.50 s on the devnets: specs/security.md,
    # bench/results/devnet-poisoning.json). 0 admits on reputation alone at once; a day is
    # longer than any round should wait, and keeps every deadline the node computes finite.
    verdict_wait: float = field(default=4.0, metadata=bounded(0, 86400))
    # Seconds after which the trainer steps with what it has: about 7 of the devnet's rounds
    # (README: 12 versions in 98 s).
    round_timeout: float = field(default=60.0, metadata=bounded(0, 86400, open_low=True))
    # The trainer steps on any decided group rather than stall (specs/network.md §5.2).
    min_batch_groups: int = field(default=1, metadata=bounded(1, 2**16))
    # Versions a group may lag the trainer and still be checked and trained (vrl.rl.grpo.is_fresh):
    # a group of version r counts while the trainer announces r + 1 and r + 2, two rounds of
    # slack for gossip and backfill. A node keeps max_staleness + 1 copies of the policy in
    # memory (vrl.node.daemon: Work.install), so this bounds its memory: 17 copies of the
    # 156M-parameter small preset are about 10 GiB. Why GRPO has no such key: vrl/node/config.py.
    max_staleness: int = field(default=2, metadata=bounded(0, 16))
    # Share of other verifiers' passes the trainer re-checks itself (specs/network.md §5.3).
    lazy_audit_rate: float = field(default=0.25, metadata=bounded(0, 1))
    # The trainer plants one known-bad group every N rounds (0: never); rounds are policy versions.
    plant_every: int = field(default=0, metadata=bounded(0, U63))
    # The trainer publishes no version after this one (0: no limit).
    last_version: int = field(default=0, metadata=bounded(0, U63))
    # Share of training steps each verifier replays (specs/training.md §5), drawn by its own
    # step ticket. A replay costs about one training step (0.1-0.3 s each
    # on the base model, replaying a devnet's steps offline: vrl.audit.replay); with three
    # verifiers at 0.25 a single bad step escapes all of them with probability 0.75^3 = 0.42,
    # a trainer that cheats on k steps with 0.42^k. A fraud report that counts makes every
    # verifier replay the step, whatever its draw.
    step_audit_rate: float = field(default=0.25, metadata=bounded(0, 1))
    # Seconds an announced step's groups and state files may take to reach a verifier before
    # their absence is itself fraud (specs/training.md §5): the trainer serves all of them, and
    # backfill asks every 5 s (vrl.node.daemon.BACKFILL_EVERY_SECONDS): 30 s is six passes.
    step_wait: float = field(default=30.0, metadata=bounded(0, 86400, open_low=True))

    # Which groups a verifier checks. Committees, because their cost is flat in N: a verifier
    # checks ~committee_size x groups_per_round groups a round (44 at k = 11; 32.0, 43.4 and 44.2
    # measured at N = 10, 100 and 1,000, bench/results/simulate-scale.json; specs/committee.md §6),
    # where with tickets each verifier draws for every group, ~0.1 x groups_per_round x N checks
    # a round (40 at N = 100, 400 at N = 1,000). Tickets remain: the swarm's consumer checks
    # (vrl.node.designs) build on them.
    verification: Verification = field(default=Verification.COMMITTEE)
    # k, the expected committee size (specs/committee.md §5): the smallest k with
    # exp(-k (1 - 0.45)) <= 1e-3. The trainer signs it into each round manifest.
    committee_size: int = field(default=COMMITTEE_SIZE, metadata=bounded(1, MAX_COMMITTEE_SIZE))
    # Seconds after announcing version r by which the trainer closes round r's submission window
    # and signs its manifest, if not every expected group came sooner (specs/committee.md §3.4):
    # a third of round_timeout, leaving two thirds for the committees' checks.
    submission_window: float = field(default=20.0, metadata=bounded(0, 86400))
    # Seconds past submission_window the trainer keeps the window open while the round's groups
    # still arrive (one came within verdict_wait), so that a worker slow to get a version's weights
    # is not counted as withholding. At N = 1,000 the weights reached the last workers 16 s after
    # the announcement, and 106 honest workers' groups came 0-4 s after a window of 20 s: every one
    # of them refused (bench/simulate.py, lazy 10% run). Half the window: the trainer waits at
    # most 30 s, so half of round_timeout is left for the committees' checks.
    submission_grace: float = field(default=10.0, metadata=bounded(0, 86400))
    # B: the trainer's loss confirmations a committee member may have open or unconfirmed over
    # the rounds kept before its claims of lost races ask for no more (vrl.node.claims; specs/committee.md
    # §8). 8 is the lost races the pooled test needs to quarantine a spoofer losing 10 q0 of its
    # races on the float32 CPU profile (ln E(2,500, 8) = 9.37 >= ln(1/alpha) = 9.21,
    # vrl.rollouts.sequential; specs/verification.md §7.1), so one member's pending claims can
    # carry a whole quarantine's confirmations at once. An honest member on another platform
    # states a drift loss the trainer does not find on at most n q0 of a group (n race tokens):
    # over its ~44 seats a round (specs/committee.md §6), 0.43 expected at the devnet's 32
    # tokens a group, 1.7 at 128; its charges live about two rounds (the budget spans the rounds
    # kept), so 8 leaves it room (Poisson tails ~1e-5, 2e-2). A liar costs at most 8 checks per
    # two rounds, not its ~44 seats a round (bench/results/simulate-liar-budget.json). 0: no
    # budget (every claim asks; measurement).
    loss_claim_budget: int = field(default=8, metadata=bounded(0, 2**16))

    def __post_init__(self) -> None:
        check_fields(self, ProtocolParams)  # a subclass's further fields are its own to check
