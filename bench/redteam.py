"""Every attack the project knows, against the calibrated verifier: what each one gets through.

    python bench/redteam.py                              # tiny and base, float32 (a few minutes)
    python bench/redteam.py --dtypes float32 bfloat16 float16   # about 10x as long: few rollouts
                                                         # fail there, so most nodes spend their budget
    python bench/redteam.py --models tiny --nodes 4      # a quick look
    python bench/redteam.py --dtypes bfloat16 --pinned-kernel   # the kernel-pinned rows instead

For every model, dtype, attack and strength, several independent cheating nodes (their own
keys, so their own tasks and seeds) produce groups as that attack does; each group is verified
whole, with the task set, round and sampling pinned, against the dtype's calibrated profile
(vrl.rollouts.profiles). Reported:

* per rollout, over the first ``sample`` groups of every node (SETTINGS): how many were
  rejected, and at which stage and reason;
* how many rollouts *changed* what training sees (a completion token, or the reward) against
  the honest rollout with the same seeds, and how many of those were accepted: a cheat that
  changed nothing harmed no one, and is counted as harmless;
* per node, the completion tokens a verifier reads, taking the node's rollouts in order, until
  it knows: the first rollout rejected outright, or the node's sequential test on lost races
  (vrl.rollouts.sequential.RaceTest at the profile's q0) rejecting
  (vrl.harness.adversary.tokens_to_detection). A node the budget never caught is "never", counted as
  such in the median and 95th percentile, not left out;
* the honest false-positive rate of each profile, from the calibration's validation half
  (bench/results/calibrate.json), and an honest node run through the same per-node detection.

With ``--pinned-kernel`` the verifier takes the profile's kernel-pinned row, measured by
``bench/calibrate.py --pin-kernel`` (bench/results/calibrate-pinned.json): what a network that
pins the producer's attention kernel to the verifier's would allow (specs/verification.md §6).
The red team's producers run the verifier's own model, so its kernel too.

Writes bench/results/redteam.json and bench/results/redteam.md (redteam-pinned.* with
``--pinned-kernel``). It prints counts and ratios: the machine is shared, so its timings would
say nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vrl  # noqa: E402
from vrl.harness.adversary import SPOOF_STRENGTHS, degraded, spoofing_decoder, tokens_to_detection  # noqa: E402
from vrl.node.work import tampered  # noqa: E402
from vrl.rollouts.config import GenerationConfig  # noqa: E402
from vrl.rollouts.generate import ARITHMETIC_MAX_NEW_TOKENS, iter_generate  # noqa: E402
from vrl.rollouts.profiles import profile_of, read_profiles  # noqa: E402
from vrl.rollouts.record import Rollout  # noqa: E402
from vrl.rollouts.verify import Expectations  # noqa: E402
from vrl.tasks import open_task_set  # noqa: E402

console = Console(width=160)
RESULTS = Path(__file__).resolve().parent / "results"
CALIBRATION = RESULTS / "calibrate.json"
PINNED = RESULTS / "calibrate-pinned.json"  # bench/calibrate.py --pin-kernel
GROUP_SIZE = 4  # small groups: more groups, so more tasks, for the same rollouts
#: One torch thread: the machine is shared (2 cores), and with another job on it two threads
#: made generation and verification 25 to 40 times slower here than one (measured on the base
#: model beside a calibration run); on models this small a second thread buys little anyway.
THREADS = 1


@dataclass(frozen=True)
class Setting:
    """How one model is exercised. ``sample`` groups per node make the per-rollout counts;
    ``budget`` groups per node bound the per-node detection; ``chunk`` groups are made and
    verified at a time, and a node's run stops at the first chunk that detects it (once its
    sample is complete)."""

    task: str
    new_tokens: int
    sample: int
    budget: int
    chunk: int


SETTINGS = {
    # Random weights: flat logits, so completions run to the length limit (32 tokens keep a
    # rollout's cost near a trained model's 8) and near-ties, where a spoof flips a token, are
    # common: 4 x 4 rollouts per node already show every attack, 2,048 tokens bound detection.
    "tiny": Setting("arithmetic:digits=1", 32, sample=4, budget=16, chunk=4),
    # The trained model with the node's own task and length limit: peaked logits, about 3.5
    # tokens a rollout, and a spoof changes 0.2 to 15% of rollouts (bench/results/redteam.md),
    # so it needs 4x the sample and 16x the groups (about 3,600 tokens of budget) to show it.
    # Chunks of 16 groups: at 4 a rollout cost twice as much to make and verify (batches too small).
    "base": Setting(GenerationConfig().task, ARITHMETIC_MAX_NEW_TOKENS, sample=16, budget=256, chunk=16),
}


@dataclass(frozen=True)
class Attack:
    """One cheat at one strength: ``make(key, group indices, the honest groups)`` returns the
    groups as the cheat submits them (the honest ones, with the same seeds, are for the cheats
    that start from honest work)."""

    name: str
    strength: str
    make: Callable[[vrl.NodeKey, list[int], list[list[Rollout]]], list[list[Rollout]]]


def attacks(model: vrl.Model, tasks, options: dict) -> list[Attack]:
    """Every attack class the project knows (vrl/harness/adversary.py, tests/test_attacks.py)."""

    def generated_by(cheap: vrl.Model):
        # Sampled and committed by a cheaper or different model; the claimed model's hash signed.
        def make(key, indices, _honest):
            return [[r.signed(key, model_hash=model.model_hash) for r in g]
                    for g in iter_generate(cheap, tasks, key, groups=indices, **options)]
        return make

    def spoofed(kind: str, strength: float):
        decoder = spoofing_decoder(model, kind, strength)  # the altered model is built once

        def make(key, indices, _honest):
            return list(iter_generate(model, tasks, key, groups=indices, decoder=decoder, **options))
        return make

    made = [Attack("honest", "", lambda key, indices, honest: honest)]
    made += [Attack(f"generated by {kind}", "", generated_by(degraded(model, kind)))
             for kind in ("other-model", "int4", "int8", "perturb-1pct")]
    # As the node adversaries do them (vrl.harness.adversary.CheatingWork): the first sample of each
    # group gets one token edited and re-committed by an honest prefill; every sample claims reward 1.
    made.append(Attack("tampered tokens", "", lambda key, indices, honest: [
        [tampered(g[0], model, key), *g[1:]] for g in honest]))
    made.append(Attack("fabricated reward", "", lambda key, indices, honest: [
        [r.signed(key, reward=1.0) for r in g] for g in honest]))
    made += [Attack(f"spoof {kind}", f"{strength:g}", spoofed(kind, strength))
             for kind, strengths in SPOOF_STRENGTHS.items() for strength in strengths]
    return made


def changed(cheat: Rollout, honest: Rollout) -> bool:
    """Whether what training sees differs from the honest rollout with the same seeds."""
    return cheat.completion_tokens != honest.completion_tokens or cheat.reward != honest.reward


@dataclass
class Tally:
    """The per-rollout counts of one attack, over every node's sample."""

    rollouts: int = 0
    rejected: int = 0
    reasons: Counter = field(default_factory=Counter)  # "stage/reason" -> rejected rollouts
    changed: int = 0
    changed_accepted: int = 0
    races: int = 0  # seeded races replayed (rollouts that reached stage 5)
    races_lost: int = 0  # of which the claimed token lost: the sequential test's evidence

    def add(self, cheat: Rollout, honest: Rollout, verdict: vrl.Verdict) -> None:
        self.rollouts += 1
        races, lost = verdict.race_evidence
        self.races += races
        self.races_lost += lost
        if not verdict.accepted:
            self.rejected += 1
            self.reasons[f"{verdict.stage.name.lower()}/{verdict.reason.value}"] += 1
        if changed(cheat, honest):
            self.changed += 1
            self.changed_accepted += verdict.accepted


def quantile(values: list[float], q: float) -> float:
    """The q-quantile as an order statistic (inverted CDF): defined with ``inf`` among the
    values, which interpolation is not."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def shown(tokens: float) -> str:
    return "never" if math.isinf(tokens) else f"{tokens:.0f}"


class Bench:
    """One model and dtype under attack: its settings, the nodes' keys, their honest groups."""

    def __init__(self, name: str, dtype: str, nodes: int, pinned: bool = False) -> None:
        self.model = vrl.load_model(name, dtype=dtype)
        self.setting = SETTINGS[name]
        self.tasks, _ = open_task_set(self.setting.task)
        sampling = vrl.sampling_for(self.model, max_new_tokens=self.setting.new_tokens)
        round_seed = hashlib.sha256(f"redteam/{name}".encode()).digest()
        self.options = {"round_seed": round_seed, "sampling": sampling, "group_size": GROUP_SIZE,
                        "batch_size": self.setting.chunk * GROUP_SIZE}
        # What a network's verifier pins: the task set, the round and the protocol's sampling.
        self.expect = Expectations(tasks=self.tasks, round_seed=round_seed, sampling=sampling)
        self.profile = profile_of(self.model)
        if pinned:
            pinned_rows = read_profiles(PINNED, table_format=None)
            if self.profile.name not in pinned_rows:
                raise SystemExit(f"{PINNED} has no kernel-pinned row for {self.profile.name}: "
                                 f"run python bench/calibrate.py --pin-kernel --dtypes {dtype}")
            self.profile = pinned_rows[self.profile.name]
        self.keys = [vrl.NodeKey.from_seed(hashlib.sha256(f"redteam/node/{n}".encode()).digest())
                     for n in range(nodes)]
        self._honest: dict[tuple[int, int], list[list[Rollout]]] = {}

    def honest(self, node: int, groups: list[int]) -> list[list[Rollout]]:
        """The honest node's groups, made once and shared by every attack."""
        if (node, groups[0]) not in self._honest:
            self._honest[node, groups[0]] = list(iter_generate(self.model, self.tasks, self.keys[node], groups=groups,
                                                               **self.options))
        return self._honest[node, groups[0]]

    def run_node(self, attack: Attack, node: int, tally: Tally) -> float:
        """One cheating node, chunk by chunk, until it is detected (its sample complete) or its
        budget is spent; its sample's rollouts go into ``tally``. Returns the completion tokens
        to detection, ``inf`` for never."""
        setting, key = self.setting, self.keys[node]
        submitted: list[Rollout] = []
        verdicts: list[vrl.Verdict] = []
        for start in range(0, setting.budget, setting.chunk):
            groups = list(range(start, start + setting.chunk))
            honest = self.honest(node, groups)
            rollouts = [r for g in attack.make(key, groups, honest) for r in g]
            checked = vrl.verify(rollouts, self.model, expect=self.expect, batch_size=len(rollouts),
                                 tolerances=self.profile.tolerances)
            if start < setting.sample:
                for cheat, truth, verdict in zip(rollouts, (r for g in honest for r in g), checked, strict=True):
                    tally.add(cheat, truth, verdict)
            submitted += rollouts
            verdicts += checked
            detected = tokens_to_detection(submitted, verdicts, self.profile.race_loss_rate)
            if detected is not None and start + setting.chunk >= setting.sample:
                return detected
        return math.inf if detected is None else detected


def run_model(name: str, dtype: str, nodes: int, progress: Progress, pinned: bool = False) -> dict:
    bench = Bench(name, dtype, nodes, pinned)
    rows = []
    listed = attacks(bench.model, bench.tasks, bench.options)
    task = progress.add_task(f"{name} {dtype}", total=len(listed) * nodes)
    for attack in listed:
        tally, detection = Tally(), []
        for node in range(nodes):
            detection.append(bench.run_node(attack, node, tally))
            progress.advance(task)
        median, p95 = quantile(detection, 0.5), quantile(detection, 0.95)
        rows.append({
            "model": name, "dtype": dtype, "attack": attack.name, "strength": attack.strength,
            "rollouts": tally.rollouts, "rejected": tally.rejected, "reasons": dict(tally.reasons.most_common()),
            "changed": tally.changed, "changed_accepted": tally.changed_accepted,
            "races": tally.races, "races_lost": tally.races_lost,
            "nodes": nodes, "nodes_detected": sum(not math.isinf(t) for t in detection),
            # JSON has no infinity: a node never detected is null, and so is a quantile that is.
            "tokens_to_detection": [None if math.isinf(t) else t for t in detection],
            "median": None if math.isinf(median) else median, "p95": None if math.isinf(p95) else p95,
        })
    return {"model": name, "dtype": dtype, "profile": bench.profile.name + (" (kernel pinned)" if pinned else ""),
            "race_margin": bench.profile.tolerances.race_margin, "q0": bench.profile.race_loss_rate,
            "setting": asdict(bench.setting), "rows": rows}


def honest_false_positives(calibration: Path = CALIBRATION) -> dict:
    """Each profile's validation half, as the calibration measured it."""
    if not calibration.exists():
        return {}
    profiles = json.loads(calibration.read_text())["profiles"]
    return {name: row["validation"] for name, row in profiles.items()}


def stages(reasons: dict) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in reasons.items()) or "-"


def detection_cell(row: dict) -> str:
    median = shown(math.inf if row["median"] is None else row["median"])
    p95 = shown(math.inf if row["p95"] is None else row["p95"])
    return f"{median} / {p95} ({row['nodes_detected']}/{row['nodes']})"


COLUMNS = ("attack", "strength", "rejected", "stage/reason", "changed", "changed & accepted", "races lost",
           "tokens to detection: median / p95 (nodes caught)")


def cells(row: dict) -> list[str]:
    return [row["attack"], row["strength"] or "-", f"{row['rejected']}/{row['rollouts']}", stages(row["reasons"]),
            f"{row['changed']}/{row['rollouts']}", str(row["changed_accepted"]),
            f"{row['races_lost']}/{row['races']}", detection_cell(row)]


def setup(run: dict) -> str:
    s = run["setting"]
    return (f"profile {run['profile']} (race margin {run['race_margin']:.3g}, q0 {run['q0']:.3g}); at most "
            f"{s['new_tokens']} new tokens, groups of {GROUP_SIZE}; per-rollout counts over {s['sample']} groups "
            f"of each of {run['rows'][0]['nodes']} nodes, a detection budget of {s['budget']} groups a node")


def markdown(runs: list[dict], false_positives: dict, command: str) -> str:
    lines = ["# Red team: every known attack against the calibrated verifier", "",
             f"Written by `{command}`; bench/redteam.py says how. *Changed*: the rollout differs from the",
             "honest one with the same seeds in a completion token or the reward (a cheat that changed",
             "neither changed nothing training sees). *Races lost*: seeded races the claimed token lost",
             "(margin > 0) of those replayed, the sequential test's evidence; an honest token loses at a",
             "rate of at most q0. *Tokens to detection*: completion tokens a verifier reads, taking one",
             "node's rollouts in order, until the first rollout rejected outright or the node's sequential",
             "race test rejecting; *never*: not within the budget.", ""]
    for run in runs:
        lines += [f"## {run['model']} {run['dtype']}", "", setup(run) + ".", "",
                  "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(cells(row)) + " |" for row in run["rows"]]
        lines.append("")
    lines += ["## Honest false positives per profile (the calibration's validation half)", "",
              "| profile | verdicts | rejected | 95% upper bound | races lost / replayed |", "|---|---|---|---|---|"]
    for name, v in false_positives.items():
        lines.append(f"| {name} | {v['verdicts']} | {v['rejected']} | {v['rejected_upper_95']:.2g} | "
                     f"{v['races_lost']} / {v['tokens']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"])
    # Eight nodes: the 95th percentile of eight is their worst, so "never" there means one node
    # in eight went uncaught within its budget.
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--pinned-kernel", action="store_true",
                        help="verify against the kernel-pinned rows (bench/results/calibrate-pinned.json)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    command = "python bench/redteam.py " + " ".join(sys.argv[1:])
    runs = []
    with Progress(console=console, transient=True) as progress:
        for dtype in args.dtypes:
            for name in args.models:
                runs.append(run_model(name, dtype, args.nodes, progress, args.pinned_kernel))
    false_positives = honest_false_positives(PINNED if args.pinned_kernel else CALIBRATION)
    for run in runs:
        table = Table(title=f"{run['model']} {run['dtype']}: {setup(run)}", title_justify="left")
        for column in COLUMNS:
            table.add_column(column, justify="left" if column in ("attack", "stage/reason") else "right")
        for row in run["rows"]:
            table.add_row(*cells(row))
        console.print(table)
    table = Table(title="honest false positives per profile (calibration's validation half)", title_justify="left")
    for column in ("profile", "verdicts", "rejected", "95% upper bound", "races lost / replayed"):
        table.add_column(column, justify="right")
    for name, v in false_positives.items():
        table.add_row(name, str(v["verdicts"]), str(v["rejected"]), f"{v['rejected_upper_95']:.2g}",
                      f"{v['races_lost']} / {v['tokens']}")
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("redteam-pinned" if args.pinned_kernel else "redteam")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "args": vars(args), "runs": runs,
                                                    "honest_false_positives": false_positives}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(runs, false_positives, command))
    console.print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
