"""Precision profiles and the calibrated tolerance table (specs/verification.md §5).

Which drift is honest depends on where the numbers were computed. A *profile* names that:
the verifier's device kind, the compute dtype (part of the model's identity, so the verifier
knows it), the verifier's attention implementation, and the producer's device kind as seen
from the verifier (``same``, or the other kind's name). ``bench/calibrate.py`` measures the
honest distribution of every statistic in each profile it can run and writes the table,
``specs/tolerances.json``, and its copy shipped in this package (``tolerances.json`` beside
this module, package data: a wheel install has no ``specs/``). The verifier loads the shipped
copy and nowhere else, so every threshold cites the calibration run that set it;
``tests/test_specs.py`` keeps the two copies equal.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from vrl.errors import VrlError

if TYPE_CHECKING:
    from vrl.rollouts.model import Model

#: The table, written by ``bench/calibrate.py --write-table`` (specs/verification.md §5) to
#: specs/ and here. Read as package data: an installed wheel has it where this module is.
TABLE_FILE = Path(str(resources.files(__package__).joinpath("tolerances.json")))
TABLE_FORMAT = "vrl/tolerances/v1"
#: What the producer's device is called when it is the verifier's own kind.
SAME = "same"


class ProfileError(VrlError):
    """The tolerance table is missing, unreadable or not in TABLE_FORMAT."""


#: The per-record test size of the count statistics: an honest record's misses exceed their
#: bound with probability at most this under the binomial model. A hard rejection is confirmed
#: by any re-check on the same platform (the prefill is deterministic), so it convicts: over a
#: 10,000-rollout horizon this spends 1e-5, a tenth of the per-node budget of 1e-4 (issue 16).
RECORD_ALPHA = 1e-9


@dataclass(frozen=True, slots=True)
class Tolerances:
    """Per-rollout acceptance thresholds (specs/verification.md §5): a record is rejected when
    a score is strictly greater than its tolerance. Misses are a count over ``comparisons``
    values, each missed by an honest prefill with probability at most ``commitment_miss_rate``:
    their bound is the binomial tail's, so a three-token completion (nine comparisons) may
    have a stray miss that a rate alone would call 11%."""

    commitment_miss_rate: float  # honest P(a committed value's sign or exponent disagrees), upper bound
    commitment_mantissa_error: float  # mean mantissa error (bf16 ulps) of the agreeing values
    commitment_rows_fully_missed: int  # body rows with every value disagreeing
    commitment_closing_misses: int  # of the closing row's 32 values
    race_margin: float  # margin (scaled logits) by which a claimed token may lose its seeded race
    logprob_error: float  # largest |claimed - recomputed| behaviour logprob, nats

    def allowed_misses(self, comparisons: int) -> float:
        """The most misses an honest record of ``comparisons`` values shows but with
        probability RECORD_ALPHA: the binomial's inverse survival function."""
        if self.commitment_miss_rate >= 1.0:
            return float(comparisons)
        return float(_binomial_isf(comparisons, self.commitment_miss_rate))

    @classmethod
    def for_dtype(cls, dtype_name: str) -> Tolerances:
        """The tolerances of a CPU verifier with sdpa attention checking a CPU producer."""
        return profile(f"cpu/{dtype_name}/sdpa/{SAME}").tolerances


@lru_cache(maxsize=4096)
def _binomial_isf(n: int, p: float) -> int:
    from scipy.stats import binom  # scipy costs 0.3 s to import: only a verifier pays it

    return int(binom.isf(RECORD_ALPHA, n, p)) if n and p > 0 else 0


#: Tolerances nothing exceeds: verify() then measures every statistic of every record and
#: rejects only what no tolerance governs (the calibration's and the red team's benches).
MEASURE_ONLY = Tolerances(commitment_miss_rate=1.0, commitment_mantissa_error=1e9,
                          commitment_rows_fully_missed=10**9, commitment_closing_misses=10**9, race_margin=1e9,
                          logprob_error=1e9)


@dataclass(frozen=True, slots=True)
class Profile:
    """One row of the table: the tolerances, the honest per-token race-loss rate the
    sequential test assumes (:mod:`vrl.rollouts.sequential`), and where they came from."""

    name: str  # "device/dtype/attention/producer"
    tolerances: Tolerances
    race_loss_rate: float  # q0: upper confidence bound of an honest token's P(lost race)
    race_exact: bool  # calibrated with no honest drift at all: any lost race is proof
    calibration: str  # the run that set it (bench/results/...)


#: A device kind as torch names one (cpu, cuda, mps, xpu, ...), or SAME.
_DEVICE_KIND = re.compile(r"[a-z][a-z0-9_]{0,15}")


def profile_name(device: str, dtype: str, attention: str, producer: str = SAME) -> str:
    """``device/dtype/attention/producer``; a producer that is not a device kind's name is a
    ProfileError (a user's flag reaches here: ``vrl verify --producer-device``)."""
    if not isinstance(producer, str) or not _DEVICE_KIND.fullmatch(producer):
        raise ProfileError(f"the producer's device must be a device kind such as cpu or cuda, or {SAME!r}; "
                           f"got {str(producer)[:40]!r}")
    return f"{device}/{dtype}/{attention}/{SAME if producer == device else producer}"


@cache
def table() -> dict[str, Profile]:
    """Every calibrated profile, by name, read once from TABLE_FILE."""
    return read_profiles(TABLE_FILE)


def read_profiles(path: Path, *, table_format: str | None = TABLE_FORMAT) -> dict[str, Profile]:
    """The profiles of a file with TABLE_FORMAT's ``profiles`` mapping: the table, or (with
    ``table_format=None``) a calibration's own results, whose rows are alike (bench/)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ProfileError(f"{path}: cannot read the tolerance table ({error}); "
                           "bench/calibrate.py --write-table writes it") from None
    if (not isinstance(data, dict) or not isinstance(data.get("profiles"), dict)
            or (table_format is not None and data.get("format") != table_format)):
        raise ProfileError(f"{path}: not a {table_format or 'calibration'} table")
    profiles = {}
    names = [f.name for f in fields(Tolerances)]
    for name, row in data["profiles"].items():
        try:
            limits = row["tolerances"]
            given: dict[str, Any] = {key: type_(limits[key]) for key, type_ in
                                     ((n, int if n in ("commitment_rows_fully_missed",
                                                       "commitment_closing_misses") else float) for n in names)}
            tolerances = Tolerances(**given)
            q0 = float(row["race_loss_rate"])
            values = [float(getattr(tolerances, n)) for n in names]
            if not (0 < q0 < 0.5 and all(math.isfinite(v) and v >= 0 for v in values)
                    and tolerances.commitment_miss_rate <= 1):
                raise ValueError("a rate or tolerance out of range")
            profiles[name] = Profile(name, tolerances, q0, bool(row["race_exact"]), str(row["calibration"]["run"]))
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ProfileError(f"{path}: profile {name!r}: {error!r}") from None
    return profiles


def profile(name: str) -> Profile:
    """The profile called ``name``; an uncalibrated one falls back (with a warning, once) to
    the loosest calibrated profile of the same dtype (specs/verification.md §5.2), or of any
    dtype when none of its dtype is calibrated."""
    profiles = table()
    if name in profiles:
        return profiles[name]
    return _fallback(name)


@cache
def _fallback(name: str) -> Profile:
    dtype = name.split("/")[1] if name.count("/") == 3 else ""
    candidates = [p for p in table().values() if p.name.split("/")[1] == dtype] or list(table().values())
    loosest = max(candidates, key=lambda p: (p.tolerances.race_margin, p.tolerances.logprob_error, p.race_loss_rate))
    structlog.get_logger("vrl.verify").warning(
        "uncalibrated profile", profile=name, using=loosest.name,
        hint="run bench/calibrate.py on this device pair to calibrate it (specs/verification.md §5)")
    return Profile(name, loosest.tolerances, loosest.race_loss_rate, False, f"fallback to {loosest.name}")


def profile_of(model: Model, producer: str = SAME) -> Profile:
    """The profile of verifying with ``model`` (its device, dtype and attention) a producer
    on device kind ``producer`` (``same`` by default)."""
    from vrl.rollouts.model import network_device  # the model module imports torch and transformers

    device = network_device(model.network).type
    attention = getattr(model.network.config, "_attn_implementation", None) or "sdpa"
    return profile(profile_name(device, model.dtype_name, attention, producer))


def profile_of_platform(tag: str, producer: str = SAME) -> Profile:
    """The profile of a verifier known only by the platform tag its verdicts carry
    (vrl.rollouts.model.platform_tag: ``torch-V/KERNELS/DTYPE/ATTENTION/threads-N``)."""
    parts = tag.split("/")
    if len(parts) < 5:
        return profile(f"unknown/unknown/unknown/{producer}")
    device = "cuda" if parts[1].startswith("cuda-") else "cpu"
    return profile(profile_name(device, parts[-3], parts[-2], producer))
