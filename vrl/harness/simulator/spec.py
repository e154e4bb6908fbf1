"""What a simulation is asked to run (:class:`SimConfig`), the adversary mix it plants
(:func:`parse_adversaries`), and the measured costs it charges (:class:`CostModel`).

Every number the simulator charges instead of doing the work comes from a results file of a
benchmark run on this machine, named where it is read; the few modelling choices that have no
measurement say so where they are made."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vrl.errors import VrlError
from vrl.node.config import ADVERSARIES, TRAINER_ADVERSARIES
from vrl.node.params import ProtocolParams, Verification
from vrl.rollouts.profiles import profile_of_platform

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"

#: What a backfill pass costs (SimConfig.backfill): the models of vrl.harness.simulator.stores.
BACKFILL_MODELS = ("gossip", "daemon", "gossip-cursor", "daemon-cursor", "gossip-round", "daemon-round",
                   "gossip-full", "daemon-full")
#: The simulator's own adversaries, beside every cheat the devnet has (vrl.node.config.ADVERSARIES):
SIM_ADVERSARIES = {
    "lazy": "a lazy verifier: passes what it is asked to check without running the model (= lazy-verifier)",
    "withhold": "a worker that submits only the half of its assigned groups whose rewards it likes",
    "sybil": "a flood of fresh keys: each round every sybil slot mints a key that submits bad groups and "
             "hard-fails honest groups",
    "collude": "workers that submit bad groups (fabricated rewards) and, as verifiers, pass each other's",
    "liar": "a verifier that checks honestly but, on every committee seat it passes, states every race lost "
            "(races_lost = race_tokens), so that the trainer checks the group (specs/committee.md §8)",
    "accuse": "a verifier that checks honestly, then reports every honest group it checks as failed (a reward "
              "mismatch it made up): a false accuser, whose every failure the fresh recheck committee and the "
              "trainer check again (specs/security.md, false accusation)",
}
#: Every adversary a spec may name: the devnet's cheats and the simulator's own.
ALL_ADVERSARIES = {**ADVERSARIES, **SIM_ADVERSARIES}
#: Adversaries whose groups are bad by content: an honest check fails them with these reason
#: codes (vrl.rollouts.verify.Reason), the ground truth the simulated check reports. What each
#: cheat breaks follows vrl.harness.adversary.CheatingWork: a reward claimed, a model swapped
#: (the commitment and the logprobs are the swapped model's), a token edited and re-committed
#: (only the sampling check sees it), another node's records re-signed (its seeds are not ours).
BAD_REASONS = {
    "fabricated-reward": ("reward_mismatch",),
    "quantized-model": ("commitment_mismatch", "logprob_mismatch"),
    "other-model": ("commitment_mismatch", "logprob_mismatch", "sampling_mismatch"),
    "tampered-tokens": ("sampling_mismatch",),
    "replay": ("sampling_mismatch", "task_not_assigned"),
    "collude": ("reward_mismatch",),
    "sybil": ("reward_mismatch",),
    "planted": ("sampling_mismatch",),  # the trainer's canary is a tampered token (vrl.node.work.Work.plant)
}
#: Decode spoofs pass every per-record check; what gives them away is how often their tokens
#: lose the seeded races (specs/verification.md §7).
SPOOFS = frozenset(k for k in ADVERSARIES if k.startswith("spoof-"))
#: A spoofer's per-token race-loss rate, as a multiple of the honest profile's q0. An assumption,
#: not a measurement: vrl.harness.adversary.NODE_SPOOF_STRENGTH picks strengths that change a
#: token in 1-7% of rollouts; at the base model's ~3 completion tokens a rollout (calibrate.json)
#: that is a per-token loss rate of a few times q0. 10x is the middle of that range.
SPOOF_LOSS_FACTOR = 10.0
#: Verifying adversaries: their Check actions are answered by the cheat, not by an honest check.
LAZY = frozenset({"lazy", "lazy-verifier"})


class SpecError(VrlError, ValueError):
    """An adversary spec or a simulation setting that cannot be run; says which and why."""


@dataclass(frozen=True)
class AdversarySpec:
    """``kind`` at ``share`` of the nodes (a share of N, rounded to whole nodes)."""

    kind: str
    share: float


def parse_adversaries(text: str) -> tuple[AdversarySpec, ...]:
    """``"collude:0.3,lazy:0.1"``: kinds with their share of nodes in (0, 1); a kind alone
    (``"replay"``) is one node. Trainer cheats (``trainer-*``) are the trainer's own, one at most.
    Raises :class:`SpecError` naming the part that is wrong."""
    specs: list[AdversarySpec] = []
    if not text.strip():
        return ()
    for part in text.split(","):
        part = part.strip()
        kind, _, share_text = part.partition(":")
        kind = kind.strip()
        if kind not in ALL_ADVERSARIES:
            raise SpecError(f"adversary {kind!r} (in {part!r}) is not one of: {', '.join(sorted(ALL_ADVERSARIES))}")
        if not share_text:
            share = 0.0  # one node
        else:
            try:
                share = float(share_text)
            except ValueError:
                raise SpecError(f"{part!r}: the share after ':' must be a number in (0, 1), "
                                f"got {share_text!r}") from None
            if not (math.isfinite(share) and 0 < share < 1):
                raise SpecError(f"{part!r}: the share must be in (0, 1), got {share_text}")
            if kind in TRAINER_ADVERSARIES:
                raise SpecError(f"{part!r}: a trainer cheat is the one trainer's; name it without a share")
        if any(s.kind == kind for s in specs):
            raise SpecError(f"adversary {kind!r} is named twice")
        specs.append(AdversarySpec(kind, share))
    if sum(1 for s in specs if s.kind in TRAINER_ADVERSARIES) > 1:
        raise SpecError("a network has one trainer, so at most one trainer cheat")
    return tuple(specs)


def assign(specs: tuple[AdversarySpec, ...], nodes: int) -> dict[int, str]:
    """Node index -> adversary kind. Node 0 is the trainer (and gets a trainer cheat); the other
    cheats take the last nodes, as the devnet's plan does (vrl.harness.devnet.plan). Sybil slots
    are not nodes of the N: they are counted apart (:func:`sybil_slots`)."""
    out: dict[int, str] = {}
    slot = nodes - 1
    for spec in specs:
        if spec.kind in TRAINER_ADVERSARIES:
            out[0] = spec.kind
            continue
        if spec.kind == "sybil":
            continue
        count = max(1, round(spec.share * nodes)) if spec.share else 1
        for _ in range(count):
            if slot < 1:
                raise SpecError(f"the adversaries ask for more than the {nodes - 1} non-trainer nodes there are")
            out[slot] = spec.kind
            slot -= 1
    return out


def sybil_slots(specs: tuple[AdversarySpec, ...], nodes: int) -> int:
    return next((max(1, round(s.share * nodes)) if s.share else 1 for s in specs if s.kind == "sybil"), 0)


@dataclass(frozen=True)
class CostModel:
    """Seconds the simulator charges for the work it does not do, per completion token.

    ``verify_ms_per_token`` and ``generate_ms_per_token`` are bench/cost.py's (a results file,
    e.g. bench/results/cost-small-float32.json: the median over its rows); the trainer's step
    and a verifier's replay of it cost ``step_seconds`` each."""

    verify_ms_per_token: float
    generate_ms_per_token: float
    step_seconds: float
    source: str

    @classmethod
    def from_results(cls, path: Path, step_seconds: float) -> CostModel:
        try:
            rows = json.loads(Path(path).read_text())["rows"]
            verify = statistics.median(float(r["verification_ms_per_token"]) for r in rows)
            generate = statistics.median(float(r["generation_ms_per_token"]) for r in rows)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SpecError(f"{path}: not a bench/cost.py results file ({error})") from None
        return cls(verify, generate, step_seconds, str(path))


#: Every simulated node runs the same software on the same kind of machine: one platform, so
#: verifiers' recomputed digests and race counts compare (specs/reputation.md §4). A tag as
#: vrl.rollouts.model.platform_tag writes it on the devnet's machines (its profile is the base
#: model's, cpu/float32/sdpa; its bytes are those of the devnet's verdicts).
PLATFORM = "torch-2.13.0+cpu/cpu-AVX512/float32/sdpa/threads-1"


def honest_race_loss() -> float:
    """The honest q0 of the simulated platform's profile (the protocol's race_loss_rate: an upper
    confidence bound), from the calibration table the package ships. Honest tokens are simulated
    as losing no race: the calibration saw 0 lost in its honest tokens
    (bench/results/calibrate.json, races_lost)."""
    return profile_of_platform(PLATFORM).race_loss_rate


@dataclass(frozen=True)
class SimConfig:
    """One simulation. Defaults are those of the devnet the calibration runs (bench/devnet.py
    costs: the base model on 2-digit additions, the protocol's default parameters)."""

    nodes: int = 10
    rounds: int = 5
    adversaries: tuple[AdversarySpec, ...] = ()
    seed: int = 0
    design: Verification = ProtocolParams.verification  # the verification design: the node's default
    # Rounds measured after the warm-up ones (start-up dials and version 0's weights are behind
    # them): the calibration's WARMUP_VERSIONS (bench/devnet.py costs).
    warmup: int = 1
    # Records: group_size samples per group (GenerationConfig's default, 8); the base model's
    # arithmetic rollouts on the devnet average 5.8 prompt and 3.5 completion tokens, with
    # max_new_tokens 8 (bench/results/devnet-costs.json, read from the trainer's store).
    group_size: int = 8
    # Means (a record draws a whole count around them): a devnet run's, read from its store.
    prompt_tokens: float = 6
    completion_tokens: float = 4
    max_new_tokens: int = 8
    # 6.33 commitment bytes per token (bench/results/cost-small-float32.json)
    commitment_bytes_per_token: float = 6.33
    # Or a record's commitment bytes, measured (0: by the rule above): the base model's ~3.4-token
    # rollouts carry ~95 bytes, a fixed part the 256-token rows of the cost file amortize away.
    commitment_bytes: int = 0
    task_id_chars: int = 0  # a task id's length (0: "sim-<version>-<index>"); the devnet's are ~26 chars
    # The base model's weights blob as the devnet announces it (bench/results/devnet-costs.json).
    weights_bytes: int = 13_654_264
    # Its step's optimizer state (0: twice the weights) and the weights delta against the parent's
    # file (0: none, the whole file each version). The devnet's base model: 26,266,288 and ~7.0 MB
    # (the trainer's announcements, bench/results/devnet-costs.json optimizer_bytes, delta_bytes).
    optimizer_bytes: int = 0
    delta_bytes: int = 0
    cost_file: Path = RESULTS / "cost-small-float32.json"
    # A step of the base model, and a replay of it, 0.1-0.3 s (vrl.node.params: step_audit_rate's note)
    step_seconds: float = 0.3
    # Network: one-way latency per hop and per-link bandwidth; loopback devnets see ~1 ms.
    latency_s: float = 0.001
    bandwidth_bps: float = 100e6 / 8
    loss: float = 0.0  # share of gossip deliveries a node misses, recovered by its next backfill pass
    partition: tuple[int, int, float] | None = None  # (from version, until version, share of nodes cut off)
    churn: float = 0.0  # share of non-trainer nodes that leave for one round at each new version
    joins: int = 0  # fresh honest nodes that join at each new version
    honest_reject: float = 0.0  # honest checks that soft-fail (calibrate.json: 0 of its honest streams flagged)
    # Processors all nodes share (the devnet's one machine: 2); 0: each node has its own.
    cores: int = 0
    # Processes that make workers' groups ahead beside the simulation (making.Maker), on other
    # cores of the machine that runs it; 0: made in the simulation's own. The same results.
    makers: int = 0
    topology: str = "devnet"  # devnet: each node dials the trainer and the node before it; random: D random peers
    # Seconds between a node's handling passes of its inbox (the daemon ticks every TICK_SECONDS)
    window_s: float = 0.25
    sybil_verdicts: int = 32  # groups each fresh sybil key hard-fails per round
    deadline_s: float = 3600.0  # simulated seconds after which the run stops, rounds done or not
    # What a backfill pass costs (stores.py): "gossip", what the network gossiped in the window
    # (specs/network.md §3.5); "daemon", each peer's own store as vrl.node.catchup pages it (the
    # calibration's): to the trainer everything, to any other peer in the committee design what
    # that design gossips. Both by cursor kept across rounds (specs/network.md §6: what the peer
    # stored since the last pass), less what the asker names as held (``have``). "-cursor": the
    # same without ``have``, and the daemon paging every peer its whole store, groups and passes
    # included (the daemon before both); "-round": that with the cursor kept only within a round
    # (the first pass of a round pages the window whole); "-full": every pass the whole window,
    # as before cursors.
    backfill: str = "gossip"
    # ProtocolParams and AdmissionConfig overrides (the latter over NODE_OVERRIDES'): fields and
    # their values, as node.toml's [protocol] and [admission] tables give them
    protocol: dict[str, Any] = field(default_factory=dict)
    admission: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise SpecError(f"nodes: a network needs a trainer and a worker, got {self.nodes}")
        if self.rounds < 1:
            raise SpecError(f"rounds: at least 1, got {self.rounds}")
        if self.design not in {v.value for v in Verification}:
            raise SpecError(f"design: one of {', '.join(Verification)}, got {self.design!r}")
        object.__setattr__(self, "design", Verification(self.design))  # given as its name (bench/simulate.py)
        if self.backfill not in BACKFILL_MODELS:
            raise SpecError(f"backfill: one of {', '.join(BACKFILL_MODELS)}, got {self.backfill!r}")
        if self.topology not in ("devnet", "random"):
            raise SpecError(f"topology: devnet or random, got {self.topology!r}")
        # More makers than cores only contend (one keeps ahead of N = 1,000 on 2 cores: 113 CPU s
        # against the simulation's 439, bench/results/simulate-1000-20-makers.json).
        if type(self.makers) is not int or not 0 <= self.makers <= (os.cpu_count() or 1):
            raise SpecError(f"makers: 0 to {os.cpu_count() or 1} processes (this machine's cores), got {self.makers!r}")
        for name in ("loss", "churn", "honest_reject"):
            if not 0 <= getattr(self, name) < 1:
                raise SpecError(f"{name}: a share in [0, 1), got {getattr(self, name)}")
