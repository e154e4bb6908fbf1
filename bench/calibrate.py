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

Only the CPU is here; a device lent through ``device`` adds rows whose producer is another
device kind (the table's format has them: ``cpu/bfloat16/sdpa/cuda``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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


def honest(model_name: str, dtype: str, split: str, rollouts: int, new_tokens: int,
           kernels: tuple[str, ...] = ("sdpa", "eager")) -> list[vrl.Rollout]:
    """Honest rollouts of one half, made under every producer variation in turn whose
    attention kernel is one of ``kernels``."""
    rollouts *= SHORT_MODEL_ROLLOUTS.get(model_name, 1)
    tasks, _ = open_task_set("arithmetic")
    key = vrl.NodeKey.from_seed(hashlib.sha256(f"calibrate/{split}".encode()).digest())
    made = []
    producers = [p for p in PRODUCERS if p[0] in kernels]
    for attention, batch, threads in producers:
        torch.set_num_threads(threads)
        model = vrl.load_model(model_name, dtype=dtype, attention=attention)
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


def calibrate(args) -> dict:
    results = {}
    for dtype in args.dtypes:
        def make(kernels: tuple[str, ...], dtype: str = dtype) -> dict:  # called within this iteration
            halves = {}
            for model_name in args.models:
                for split in ("calibration", "validation"):
                    started = time.monotonic()
                    halves[model_name, split] = honest(model_name, dtype, split, args.rollouts, args.new_tokens,
                                                       kernels)
                    console.log(f"{model_name} {dtype} {split} ({'/'.join(kernels)}): "
                                f"{len(halves[model_name, split])} honest rollouts in "
                                f"{time.monotonic() - started:.0f} s")
            return halves

        shared = None if args.pin_kernel else make(("sdpa", "eager"))
        for attention in args.attention:
            halves = make((attention,)) if args.pin_kernel else shared
            name = profile_name("cpu", dtype, attention, SAME)
            measured: dict[str, list[dict]] = defaultdict(list)
            verifiers = {m: vrl.load_model(m, dtype=dtype, attention=attention) for m in args.models}
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
                "device": "cpu", "dtype": dtype, "attention": attention, "producer": SAME,
                "tolerances": limits, "race_loss_rate": q0, "race_exact": exact,
                "calibration": {"run": "bench/results/calibrate.json", "models": list(args.models),
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
    return results


def show(results: dict) -> None:
    table = Table(title="honest calibration per profile (CPU; producer: same device kind)")
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
    args = parser.parse_args()
    if args.pin_kernel and args.write_table:
        parser.error("--pin-kernel measures; the table's profiles allow any producer kernel (no --write-table)")
    results = calibrate(args)
    show(results)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("calibrate-pinned.json" if args.pin_kernel else "calibrate.json")
    out.write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "profiles": results}, indent=1,
                              default=str) + "\n")
    console.print(f"wrote {out}")
    if args.write_table:
        write_table(results)


if __name__ == "__main__":
    main()
