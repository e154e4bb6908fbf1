"""Calibrate the verification profiles on honest drift, and write the tolerance table.

    python bench/calibrate.py                     # every CPU profile; prints, writes bench/results/calibrate.json
    python bench/calibrate.py --write-table       # ... and specs/tolerances.json, which the verifier loads
    python bench/calibrate.py --rollouts 48       # a quick look (far fewer than the 5,000 verdicts a table needs)

A profile is (verifier device, dtype, verifier attention, producer device): see
vrl/rollouts/profiles.py. For each dtype and each model (``tiny``: random weights, flat
logits, 64-token completions; ``base``: trained, peaked, completions of a few tokens, the
short-rollout case), honest rollouts are generated under benign producer variation (sdpa or
eager attention, generation batches of 4 or 16 with padding, 1 or 2 threads), in two disjoint
halves with their own round seeds:

* the **calibration** half is verified with nothing rejected, and every statistic of every
  verdict is kept, under each verifier variation (prefill batch 1, padded 4 or 8; 1 or 2
  threads). A rate (a committed value missed, a race lost) is the Clopper-Pearson upper
  bound (confidence RATE_CONFIDENCE) of the worst model and variation; a count's bound is
  its binomial tail at RECORD_ALPHA; every other tolerance is HEADROOM times the worst
  honest value. The race-loss rate is the sequential test's q0;
* the **validation** half is then verified for real, with those tolerances, under the same
  variations: its rejections are the honest false-positive rate the table is held to
  (<= 0.1% of at least 5,000 verdicts per profile, issue 16).

A producer on another device kind (a GPU) makes the rows ``cpu/DTYPE/ATTENTION/cuda``: the
halves are generated there and verified here, in two steps (``bench/gpu.sh`` runs the first):

    python bench/calibrate.py --device cuda --dtypes bfloat16 --produce DIR    # on the GPU: both halves -> DIR
    python bench/calibrate.py --dtypes bfloat16 --producer-rollouts DIR --producer-device cuda \
        --out bench/results/calibrate-cuda.json --add-to-table                  # here: the CPU verifies them

``--add-to-table`` adds (or replaces) only the profiles this run measured and leaves every
other row of the table as it was, byte for byte; ``--write-table`` writes the run's profiles
alone. ``--check-models`` verifies a few more models' validation halves (the 0.5B shape, too
slow on this CPU for 5,000 verdicts) with the tolerances the others set: measured, not tabled.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from scipy.stats import beta, binom

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import vrl  # noqa: E402
from proofs import commitment  # noqa: E402
from vrl.rollouts.generate import sampling_for  # noqa: E402
from vrl.rollouts.profiles import (  # noqa: E402
    MEASURE_ONLY,
    RECORD_ALPHA,
    SAME,
    TABLE_FILE,
    TABLE_FORMAT,
    Tolerances,
    profile_name,
)
from vrl.rollouts.sequential import alternatives, threshold  # noqa: E402
from vrl.tasks import open_task_set  # noqa: E402

console = Console(width=150)
RESULTS = Path(__file__).resolve().parent / "results"
#: The table's source of truth; the package ships a copy (vrl.rollouts.profiles.TABLE_FILE).
SPEC_TABLE = Path(__file__).resolve().parents[1] / "specs" / "tolerances.json"

#: Each tolerance is twice the worst honest value of the calibration half: the validation
#: half, verified with it, measures what that leaves (specs/verification.md §5).
HEADROOM = 2.0
#: The honest race-loss rate q0 is an upper confidence bound, so that the sequential test's
#: Ville bound holds with the calibration's own sampling error accounted for.
RATE_CONFIDENCE = 0.999
#: The honest per-token loss rate is never taken below this: q0 = 0 would make one lost race
#: infinite evidence, and a profile calibrated on few tokens must not become that strict.
MIN_RATE = 1e-6
#: The mean mantissa error is never held below a quarter of a bf16 ulp: float32 replays
#: agree exactly almost always, and twice a worst of 0 would reject the one value in a
#: record that crosses a rounding boundary. Below it the committed rows are the claimed
#: model's to within one value in four off by one ulp; the races judge the tokens.
MANTISSA_FLOOR = 0.25
#: What an honest prover varies (attention, generation batch, threads) ...
PRODUCERS = (("sdpa", 16, 2), ("sdpa", 4, 1), ("eager", 16, 1), ("eager", 4, 2))
#: ... and what the verifier varies (prefill batch, threads), with its attention in the profile.
VERIFIERS = ((1, 1), (4, 2), (8, 1))
STATS = ("commitment_misses", "commitment_comparisons", "commitment_miss_rate", "commitment_mantissa_error",
         "commitment_rows_fully_missed", "commitment_closing_misses", "race_margin_max", "race_tokens", "races_lost",
         "logprob_error_max")


#: The trained model's completions are a few tokens long: it gets this many times the
#: rollouts, so that its token count bounds its loss rate as tightly as the other's.
SHORT_MODEL_ROLLOUTS = {"base": 8}


#: Loaded models by (name, dtype, device): a 0.5B preset's seeded init takes about a minute of
#: CPU, and the producer variations would pay it for each. The attention kernel is set on the
#: shared network at each use, as load_model sets it on a preset (transformers reads it at
#: every forward).
_loaded: dict[tuple[str, str, str], vrl.Model] = {}


def model_for(name: str, dtype: str, attention: str, device: str = "cpu") -> vrl.Model:
    key = (name, dtype, device)
    if key not in _loaded:
        _loaded[key] = vrl.load_model(name, dtype=dtype, attention=attention, device=device)
    model = _loaded[key]
    model.network.config._attn_implementation = attention
    return model


def honest(model_name: str, dtype: str, split: str, rollouts: int, new_tokens: int,
           kernels: tuple[str, ...] = ("sdpa", "eager"), device: str = "cpu") -> list[vrl.Rollout]:
    """Honest rollouts of one half, made under every producer variation in turn whose
    attention kernel is one of ``kernels``."""
    rollouts *= SHORT_MODEL_ROLLOUTS.get(model_name, 1)
    tasks, _ = open_task_set("arithmetic")
    key = vrl.NodeKey.from_seed(hashlib.sha256(f"calibrate/{split}".encode()).digest())
    made = []
    producers = [p for p in PRODUCERS if p[0] in kernels]
    for attention, batch, threads in producers:
        torch.set_num_threads(threads)
        model = model_for(model_name, dtype, attention, device)
        seed = hashlib.sha256(f"calibrate/{split}/{model_name}/{dtype}/{attention}/{batch}".encode()).digest()
        made += [r for group in vrl.iter_generate(model, tasks, key, round_seed=seed,
                                                  groups=max(1, rollouts // 4 // len(producers)),
                                                  sampling=sampling_for(model, max_new_tokens=new_tokens),
                                                  batch_size=batch)
                 for r in group]
    torch.set_num_threads(2)
    return made


def verdicts(records, model, tolerances) -> list[vrl.Verdict]:
    out = []
    for batch, threads in VERIFIERS:
        torch.set_num_threads(threads)
        out += vrl.verify(records, model, batch_size=batch, tolerances=tolerances)
    torch.set_num_threads(2)
    return out


def upper_rate(lost: int, tokens: int) -> float:
    """Clopper-Pearson upper bound of a binomial rate at RATE_CONFIDENCE."""
    if tokens == 0:
        return 0.5
    return float(beta.ppf(RATE_CONFIDENCE, lost + 1, tokens - lost)) if lost < tokens else 1.0


def _parts(rows_by_model: dict[str, list[dict]]):
    """(label, rows) per model and verifier variation: the variations re-verify the same
    records, which are one sample of the honest distribution, not three."""
    for m, rs in rows_by_model.items():
        for v, (batch, threads) in enumerate(VERIFIERS):
            part = rs[v * len(rs) // len(VERIFIERS):(v + 1) * len(rs) // len(VERIFIERS)]
            yield f"{m} batch {batch} threads {threads}", part


def _rate(rows_by_model: dict[str, list[dict]], events: str, trials) -> tuple[float, dict[str, float]]:
    """The largest Clopper-Pearson upper bound of ``events`` per trial over the parts: the
    flatter a model's logits or the more its variation drifts, the higher its rate."""
    rates = {label: upper_rate(int(sum(r[events] for r in part)), int(sum(trials(r) for r in part)))
             for label, part in _parts(rows_by_model)}
    return max(MIN_RATE, *rates.values()), rates


def derive(rows_by_model: dict[str, list[dict]]) -> tuple[dict, dict, float, bool]:
    """(tolerances, the worst honest values, q0, race_exact) from the calibration half."""
    rows = [r for rs in rows_by_model.values() for r in rs]
    worst = {s: max(r[s] for r in rows) for s in STATS}
    miss_rate, miss_rates = _rate(rows_by_model, "commitment_misses", lambda r: r["commitment_comparisons"])
    closing_rate, _ = _rate(rows_by_model, "commitment_closing_misses", lambda r: commitment.CLOSING_VALUES)
    row_rate, _ = _rate(rows_by_model, "commitment_rows_fully_missed", lambda r: r["race_tokens"])
    longest = int(worst["race_tokens"])
    drift = max(worst["race_margin_max"], worst["logprob_error_max"])
    tolerances = {
        # A count's bound is its binomial tail at RECORD_ALPHA (profiles.Tolerances), and never
        # below HEADROOM times the worst count seen.
        "commitment_miss_rate": miss_rate,
        "commitment_mantissa_error": max(MANTISSA_FLOOR, HEADROOM * worst["commitment_mantissa_error"]),
        "commitment_rows_fully_missed": max(binom_bound(longest, row_rate),
                                            math.ceil(HEADROOM * worst["commitment_rows_fully_missed"])),
        "commitment_closing_misses": max(binom_bound(commitment.CLOSING_VALUES, closing_rate),
                                         math.ceil(HEADROOM * worst["commitment_closing_misses"])),
        # A token can lose its race honestly only by what drift moves two scores: the worst
        # honest margin, or the drift the logprobs show where no race was lost at all.
        "race_margin": HEADROOM * drift,
        "logprob_error": HEADROOM * worst["logprob_error_max"],
    }
    q0, rates = _rate(rows_by_model, "races_lost", lambda r: r["race_tokens"])
    upper_by_part = {"miss_rate_upper_by_part": miss_rates, "race_loss_upper_by_part": rates}
    return tolerances, worst | upper_by_part, q0, drift == 0.0


def binom_bound(n: int, p: float) -> int:
    return int(binom.isf(RECORD_ALPHA, n, p))


#: The honest-flag check: this many honest producers, each making HORIZON rollouts drawn
#: from the validation half's evidence, run through the sequential test.
STREAMS, HORIZON = 2000, 10_000


def honest_flags(evidence: list[tuple[int, int]], q0: float) -> dict:
    """How often the sequential test flags an honest producer over HORIZON rollouts: each of
    STREAMS producers draws its rollouts' (tokens, lost) with replacement from the validation
    half, and the test's ln E is followed rollout by rollout. Ville bounds the true rate by
    ALPHA for any producer whose loss rate is at most q0; this measures the margin: the
    streams flagged, and the largest ln E any stream reached against ln(1/ALPHA)."""
    rng = np.random.default_rng(16)
    table = np.array(evidence, dtype=np.int64)
    grid = np.array(alternatives(q0))
    flagged, top = 0, -math.inf
    for _ in range(STREAMS // 100):  # 100 streams at a time: 100 x 10,000 x J floats
        draws = table[rng.integers(0, len(table), size=(100, HORIZON))]
        n, k = np.cumsum(draws[..., 0], axis=1), np.cumsum(draws[..., 1], axis=1)
        terms = (k[..., None] * np.log(grid / q0) + (n - k)[..., None] * (np.log1p(-grid) - np.log1p(-q0)))
        log_e = np.logaddexp.reduce(terms, axis=-1) - math.log(len(grid))
        flagged += int((log_e.max(axis=1) >= threshold()).sum())
        top = max(top, float(log_e.max()))
    return {"streams": STREAMS, "horizon_rollouts": HORIZON, "flagged": flagged, "max_log_e": top,
            "threshold": threshold(), "tokens_per_rollout": float(table[:, 0].mean())}


def scores(verdict: vrl.Verdict) -> dict:
    return {s: float(verdict.scores.get(s, 0.0)) for s in STATS}


def halves_file(directory: Path, model_name: str, dtype: str, split: str) -> Path:
    """Where ``--produce`` writes one half and ``--producer-rollouts`` reads it."""
    return Path(directory) / f"{model_name}-{dtype}-{split}.vrl"


def produce(args) -> dict:
    """Only the producer's side: both halves of every model and dtype, generated on
    ``--device`` under every producer variation, written to ``--produce``; nothing verified."""
    out = Path(args.produce)
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    for dtype in args.dtypes:
        for model_name in [*args.models, *args.check_models]:
            rollouts = args.check_rollouts if model_name in args.check_models else args.rollouts
            for split in ("calibration", "validation"):
                started = time.monotonic()
                records = honest(model_name, dtype, split, rollouts, args.new_tokens, device=args.device)
                path = halves_file(out, model_name, dtype, split)
                vrl.write_rollouts(path, records)
                made[path.name] = {"rollouts": len(records), "seconds": time.monotonic() - started,
                                   "tokens": sum(len(r.completion_tokens) for r in records),
                                   "model_hash": records[0].model_hash.hex() if records else None}
                console.log(f"{path}: {len(records)} honest rollouts in {time.monotonic() - started:.0f} s")
    return made


def load_halves(args, model_name: str, dtype: str) -> dict:
    halves = {}
    for split in ("calibration", "validation"):
        halves[model_name, split] = list(vrl.read_rollouts(halves_file(args.producer_rollouts, model_name, dtype,
                                                                       split)))
    return halves


def check(records, model, tolerances, limit: int = 0) -> dict:
    """A checked model's validation half, verified with a profile's tolerances: its rejections,
    and the worst of every statistic. With ``limit``, only that many whole groups, spread evenly over
    the half (so over its producer variations), under the last verifier variation alone: the
    0.5B shape's prefill takes seconds a token on this CPU."""
    if limit:  # whole groups (verify() refuses a group with records missing), spread over the half
        groups: dict[tuple[bytes, int], list] = defaultdict(list)
        for r in records:
            groups[r.round_seed, r.group_index].append(r)
        chosen = list(groups.values())
        chosen = [chosen[i * len(chosen) // limit] for i in range(min(limit, len(chosen)))]
        records = [r for g in chosen for r in g]
        batch, threads = VERIFIERS[-1]
        torch.set_num_threads(threads)
        judged = vrl.verify(records, model, batch_size=batch, tolerances=tolerances)
        torch.set_num_threads(2)
    else:
        judged = verdicts(records, model, tolerances)
    rows = [scores(v) for v in judged]
    reasons: dict[str, int] = defaultdict(int)
    for v in judged:
        if not v.accepted:
            reasons[v.reason.value] += 1
    return {"verdicts": len(judged), "rejected": sum(reasons.values()), "reasons": dict(reasons),
            "tokens": int(sum(v.race_evidence[0] for v in judged)),
            "races_lost": int(sum(v.race_evidence[1] for v in judged)),
            "worst": {s: max((r[s] for r in rows), default=0.0) for s in STATS}}


#: Per profile, the --check-models results (calibrate() fills it; main() writes it).
checks: dict[str, dict[str, dict]] = defaultdict(dict)


def calibrate(args) -> dict:
    results = {}
    device = torch.device(args.device).type
    producer = args.producer_device if args.producer_rollouts else SAME
    for dtype in args.dtypes:
        def make(kernels: tuple[str, ...], dtype: str = dtype) -> dict:  # called within this iteration
            halves = {}
            for model_name in args.models:
                if args.producer_rollouts:  # made elsewhere (--produce), under every producer variation
                    halves |= load_halves(args, model_name, dtype)
                    continue
                for split in ("calibration", "validation"):
                    started = time.monotonic()
                    halves[model_name, split] = honest(model_name, dtype, split, args.rollouts, args.new_tokens,
                                                       kernels, args.device)
                    console.log(f"{model_name} {dtype} {split} ({'/'.join(kernels)}): "
                                f"{len(halves[model_name, split])} honest rollouts in "
                                f"{time.monotonic() - started:.0f} s")
            return halves

        shared = None if args.pin_kernel else make(("sdpa", "eager"))
        for attention in args.attention:
            halves = make((attention,)) if args.pin_kernel else shared
            name = profile_name(device, dtype, attention, producer)
            measured: dict[str, list[dict]] = defaultdict(list)
            verifiers = {m: vrl.load_model(m, dtype=dtype, attention=attention, device=args.device)
                         for m in args.models}
            for model_name, model in verifiers.items():
                judged = verdicts(halves[model_name, "calibration"], model, MEASURE_ONLY)
                measured[model_name] = [scores(v) for v in judged]
            limits, worst, q0, exact = derive(measured)
            tolerances = Tolerances(**limits)
            checked, rejected, reasons, tokens, lost = 0, 0, defaultdict(int), 0, 0
            evidence: dict[str, list[tuple[int, int]]] = defaultdict(list)
            for model_name, model in verifiers.items():
                for v in verdicts(halves[model_name, "validation"], model, tolerances):
                    checked += 1
                    tokens, lost = tokens + v.race_evidence[0], lost + v.race_evidence[1]
                    evidence[model_name].append(v.race_evidence)
                    if not v.accepted:
                        rejected += 1
                        reasons[v.reason.value] += 1
            results[name] = {
                "device": device, "dtype": dtype, "attention": attention,
                "producer": SAME if producer == device else producer,
                "tolerances": limits, "race_loss_rate": q0, "race_exact": exact,
                "calibration": {"run": f"bench/results/{args.out.name}", "models": list(args.models),
                                "verdicts": sum(len(r) for r in measured.values()),
                                "tokens": int(sum(r["race_tokens"] for rs in measured.values() for r in rs)),
                                "races_lost": int(sum(r["races_lost"] for rs in measured.values() for r in rs)),
                                "worst": worst, "headroom": HEADROOM},
                "validation": {"verdicts": checked, "rejected": rejected, "reasons": dict(reasons),
                               "rejected_upper_95": float(beta.ppf(0.95, rejected + 1, checked - rejected)),
                               "tokens": tokens, "races_lost": lost},
                "honest_flag": {m: honest_flags(e, q0) for m, e in evidence.items()},
            }
            console.log(f"{name}: {checked} validation verdicts, {rejected} rejected {dict(reasons)}; q0 {q0:.3g}")
            del verifiers
            for model_name in args.check_models:  # measured with this profile's tolerances, not tabled
                started = time.monotonic()
                model = model_for(model_name, dtype, attention, args.device)
                records = (load_halves(args, model_name, dtype)[model_name, "validation"] if args.producer_rollouts
                           else honest(model_name, dtype, "validation", args.check_rollouts, args.new_tokens,
                                       device=args.device))
                checks[name][model_name] = check(records, model, tolerances, args.check_limit)
                console.log(f"{name} check {model_name}: {checks[name][model_name]} "
                            f"({time.monotonic() - started:.0f} s)")
                del model
    return results


def show(results: dict) -> None:
    table = Table(title="honest calibration per profile (device/dtype/attention/producer)")
    for column in ("profile", "verdicts (cal/val)", "rejected (val)", "miss p/closing", "mantissa", "race margin",
                   "logprob", "q0 (lost/tokens)"):
        table.add_column(column, justify="right")
    for name, row in results.items():
        t, cal, val = row["tolerances"], row["calibration"], row["validation"]
        table.add_row(name, f"{cal['verdicts']}/{val['verdicts']}",
                      f"{val['rejected']} ({val['rejected'] / max(val['verdicts'], 1):.2%})",
                      f"{t['commitment_miss_rate']:.2g}/{t['commitment_closing_misses']}",
                      f"{t['commitment_mantissa_error']:.3g}",
                      f"{t['race_margin']:.3g}", f"{t['logprob_error']:.3g}",
                      f"{row['race_loss_rate']:.2g} ({cal['races_lost']}/{cal['tokens']})")
    console.print(table)


def add_to_table(results: dict) -> None:
    """The table with this run's profiles added (or replaced): every other row is written back
    as it was read, so its bytes do not change (json round-trips every value)."""
    document = json.loads(SPEC_TABLE.read_text())
    if document.get("format") != TABLE_FORMAT:
        raise SystemExit(f"{SPEC_TABLE}: not a {TABLE_FORMAT} table")
    # The spec's rows keep their order (the table's JSON is sorted by name): new ones go last.
    rows = SPEC.read_text().partition(SPEC_MARKER)[2].partition("\n## ")[0]
    shown = re.findall(r"^\| `([^`]+)` \|", rows, flags=re.MULTILINE)
    order = [n for n in shown if n in document["profiles"]] + sorted(set(document["profiles"]) - set(shown))
    write_table({**{n: document["profiles"][n] for n in order}, **results})


def write_table(results: dict) -> None:
    document = {
        "format": TABLE_FORMAT,
        "written_by": "python bench/calibrate.py --write-table",
        "method": "specs/verification.md §5: HEADROOM x the worst honest value of the calibration half; "
                  "q0 the Clopper-Pearson upper bound; the validation half's rejections are the measured "
                  "honest false-positive rate",
        "headroom": HEADROOM, "rate_confidence": RATE_CONFIDENCE,
        "profiles": results,
    }
    text = json.dumps(document, indent=1, sort_keys=True) + "\n"
    for path in (SPEC_TABLE, TABLE_FILE):  # the source of truth, and the copy the package ships
        path.write_text(text)
        console.print(f"wrote {path}")
    write_spec_rows(results)


#: Where specs/verification.md §5.3 shows the rows; tests/test_specs.py holds them to the table.
SPEC = SPEC_TABLE.parent / "verification.md"
SPEC_MARKER = "<!-- profile table: generated from specs/tolerances.json by bench/calibrate.py --write-table -->"
SPEC_COLUMNS = ("commitment_miss_rate", "commitment_mantissa_error", "commitment_rows_fully_missed",
                "commitment_closing_misses", "race_margin", "logprob_error")


def write_spec_rows(results: dict) -> None:
    """The table's rows, 3 significant digits, under SPEC_MARKER up to the next heading."""
    columns = " | ".join(f"`{c}`" for c in SPEC_COLUMNS)
    lines = ["| Profile | " + columns + " | `race_loss_rate` | validation: rejected |",
             "|---" * (len(SPEC_COLUMNS) + 3) + "|"]
    for name, row in results.items():
        t, val = row["tolerances"], row["validation"]
        lines.append(f"| `{name}` | " + " | ".join(f"{t[c]:.3g}" for c in SPEC_COLUMNS)
                     + f" | {row['race_loss_rate']:.3g} | {val['rejected']} of {val['verdicts']} |")
    text = SPEC.read_text()
    head, _, rest = text.partition(SPEC_MARKER + "\n")
    tail = rest[rest.index("\n## "):]
    SPEC.write_text(head + SPEC_MARKER + "\n\n" + "\n".join(lines) + "\n" + tail)
    console.print(f"wrote the rows of {SPEC} §5.3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "base"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    parser.add_argument("--attention", nargs="+", default=["sdpa", "eager"])
    # 896 rollouts a half of tiny, 8 times as many of base (SHORT_MODEL_ROLLOUTS), under 3 verifier
    # variations: 24,192 verdicts a half and profile, over the 5,000 the goal is measured on.
    parser.add_argument("--rollouts", type=int, default=896)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--write-table", action="store_true")
    # The producer decodes with the verifier's own attention kernel: what a network that pins
    # the kernel could use (specs/verification.md §6). Measured only: its file is
    # calibrate-pinned.json, and the table's profiles stay those of any producer kernel.
    parser.add_argument("--pin-kernel", action="store_true")
    parser.add_argument("--device", default="cpu", help="where the producer and the verifier run (cpu, cuda)")
    parser.add_argument("--produce", type=Path, help="only generate both halves on --device, into this folder")
    parser.add_argument("--producer-rollouts", type=Path,
                        help="verify the halves --produce wrote here instead of generating them")
    parser.add_argument("--producer-device", default="cuda", help="the device kind that made --producer-rollouts")
    parser.add_argument("--check-models", nargs="*", default=[],
                        help="models whose validation half is only verified with the profile's tolerances")
    parser.add_argument("--check-rollouts", type=int, default=16, help="rollouts a half of each --check-models")
    parser.add_argument("--check-limit", type=int, default=0,
                        help="verify only this many of each checked model's groups, at one verifier variation")
    parser.add_argument("--add-from", type=Path, nargs="*", default=[],
                        help="only add the profiles of these results files (this script's --out) to the table")
    parser.add_argument("--add-to-table", action="store_true",
                        help="add this run's profiles to the table, leaving its other rows as they are")
    parser.add_argument("--out", type=Path, help="the results file (default: bench/results/calibrate.json)")
    args = parser.parse_args()
    if args.pin_kernel and (args.write_table or args.add_to_table):
        parser.error("--pin-kernel measures; the table's profiles allow any producer kernel (no --write-table)")
    if args.produce and args.producer_rollouts:
        parser.error("--produce makes the halves that --producer-rollouts reads: one or the other")
    if args.add_from:
        add_to_table({k: v for path in args.add_from for k, v in json.loads(path.read_text())["profiles"].items()})
        return
    if args.produce:
        made = produce(args)
        (args.produce / "produced.json").write_text(json.dumps(made, indent=1) + "\n")
        return
    args.out = args.out or RESULTS / ("calibrate-pinned.json" if args.pin_kernel else "calibrate.json")
    results = calibrate(args)
    show(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"args": {k: v for k, v in vars(args).items()}, "profiles": results}
    if checks:
        report["checks"] = checks
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    console.print(f"wrote {args.out}")
    if args.write_table:
        write_table(results)
    elif args.add_to_table:
        add_to_table(results)


if __name__ == "__main__":
    main()
