"""Activation commitments: top-k hidden-state values per row, Newton-interpolated over a prime
field (specs/commitment.md).

The idea is TOPLOC's (Ong et al., ICML 2025): keep only the largest-magnitude values of the
final hidden states (the LM head's input) and store them as the coefficients of the polynomial
through the points ``(index, value bits)``, so the indices cost nothing; a verifier that
recomputes the hidden states by one prefill takes its *own* top indices and evaluates the
polynomial there. Where its index was among the prover's, it gets the prover's exact value
back; elsewhere it gets noise.

What differs from TOPLOC, and why (specs/commitment.md §6; ``bench/calibrate.py`` judges the
same hidden states by TOPLOC's thresholds beside ours, and ``bench/cost.py`` measures the size):

* top-k is taken **per row**, not over a flattened 32-row chunk, so every row, hence every
  generated token, holds ``VALUES_PER_ROW`` values (TOPLOC can leave rows with none);
* one more row than tokens is committed (the row after the last token), so the last token
  changes a committed activation (TOPLOC never covers it);
* the **sign bit is compared** (TOPLOC masks it away, so negated hidden states pass);
* statistics are aggregated over the whole sequence and compared with thresholds calibrated
  on honest drift (``bench/calibrate.py``), instead of loose per-chunk bounds;
* 3 values per row at 16 bits over 32-row chunks, plus 32 values for the closing row, is
  ``69 + 6n + 2 ceil(n/32)`` bytes for n tokens: 6.33 B/token at 256 tokens, against
  TOPLOC's 8.06.

This module knows tensors and bytes only; binding to a model, prompt and tokens is the job of
the signed record that carries the commitment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from proofs.errors import MalformedCommitment

SCHEME_VERSION = 1
#: Rows per polynomial. 32 follows TOPLOC; with 3 values per row the polynomial has degree 95.
ROWS_PER_CHUNK = 32
#: Values kept per row. 3 keeps the size under TOPLOC's 8.06 B/token while every row is
#: covered; bench/calibrate.py shows the sequence statistics separate honest from tampered.
VALUES_PER_ROW = 3
#: Values kept for the closing row (the row after the last token), committed as a chunk of its
#: own: it is the only row a last-token edit changes, so it carries enough values for a
#: per-row test (32 values: an honest row misses about 1 in bf16, an edited row most of them).
CLOSING_VALUES = 32
#: The largest prime below 2^16: every finite bf16 bit pattern (< 0xFF80) is a field element.
FIELD_PRIME = 65521
HEADER_BYTES = 3
_SIGN_EXPONENT_SHIFT = 7
_MANTISSA_MASK = 0x7F
_MAGNITUDE_MASK = 0x7FFF


def bf16_bits(rows: torch.Tensor) -> np.ndarray:
    """Round to bfloat16 (round-to-nearest-even) and return the 16-bit patterns as int64."""
    bits = rows.detach().to(torch.bfloat16).contiguous().view(torch.int16).to(torch.int64)
    return (bits & 0xFFFF).cpu().numpy()


def top_indices(bits: np.ndarray, k: int) -> np.ndarray:
    """Per row, the ``k`` columns of largest magnitude, ties to the lower column; shape (rows, k).

    For finite bf16 values the magnitude order is the integer order of ``bits & 0x7FFF``, so
    the selection is exact and identical on every machine.
    """
    width = bits.shape[1]
    key = (bits & _MAGNITUDE_MASK) * width + (width - 1 - np.arange(width))
    if width <= 1 << 16:  # key < 2^31: int32 halves the memory traffic of the partition
        key = key.astype(np.int32)
    part = np.argpartition(-key, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(key, part, axis=1), axis=1)
    return np.take_along_axis(part, order, axis=1)


def _inverse_table() -> np.ndarray:
    """Inverses of every element of GF(FIELD_PRIME) by Fermat (0 maps to 0), computed once."""
    result = np.ones(FIELD_PRIME, dtype=np.int64)
    base = np.arange(FIELD_PRIME, dtype=np.int64)
    exponent = FIELD_PRIME - 2
    while exponent:
        if exponent & 1:
            result = result * base % FIELD_PRIME
        base = base * base % FIELD_PRIME
        exponent >>= 1
    result[0] = 0
    return result


_INVERSE = _inverse_table()


def _interpolate(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Monomial coefficients (constant first) of the polynomials through (x, y), row-wise.

    Newton's divided differences, then expansion of the Newton form; shapes (chunks, n).
    """
    n = x.shape[1]
    coef = y % FIELD_PRIME
    for level in range(1, n):
        numerator = (coef[:, level:] - coef[:, level - 1 : -1]) % FIELD_PRIME
        coef[:, level:] = numerator * _INVERSE[(x[:, level:] - x[:, : n - level]) % FIELD_PRIME] % FIELD_PRIME
    poly = np.zeros_like(coef)
    poly[:, 0] = coef[:, n - 1]
    for i in range(n - 2, -1, -1):
        # poly <- poly * (X - x_i) + coef_i
        shifted = np.zeros_like(poly)
        shifted[:, 1:] = poly[:, :-1]
        poly = (shifted - x[:, i : i + 1] * poly) % FIELD_PRIME
        poly[:, 0] = (poly[:, 0] + coef[:, i]) % FIELD_PRIME
    return poly


def _evaluate(poly: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Horner evaluation of each chunk's polynomial at that chunk's points; (chunks, q)."""
    acc = np.zeros_like(x)
    for i in range(poly.shape[1] - 1, -1, -1):
        acc = (acc * x + poly[:, i : i + 1]) % FIELD_PRIME
    return acc


def _injective_modulus(keys: np.ndarray) -> int:
    """The largest m <= FIELD_PRIME under which the keys stay distinct (TOPLOC's search)."""
    if keys.max() < FIELD_PRIME:
        # Distinct (row, column) points give distinct keys, and below the prime reduction
        # keeps them so: the search's first candidate wins (always, while 32 * width < p).
        return FIELD_PRIME
    for m in range(FIELD_PRIME, len(keys) - 1, -1):
        if len(np.unique(keys % m)) == len(keys):
            return m
    # Only reachable when 32 * hidden_size > FIELD_PRIME and every candidate collides, which
    # for 96 keys has probability far below 2^-100.
    raise ValueError(f"no modulus <= {FIELD_PRIME} keeps these {len(keys)} keys distinct")


def _chunks(n_rows: int) -> list[tuple[int, int, int]]:
    """(first row, end row, values per row): 32-row chunks of the body, then the closing row."""
    body = n_rows - 1
    spans = [(start, min(start + ROWS_PER_CHUNK, body), VALUES_PER_ROW) for start in range(0, body, ROWS_PER_CHUNK)]
    return [*spans, (body, n_rows, CLOSING_VALUES)]


def committed_size(n_rows: int) -> int:
    """Exact byte length of a commitment over ``n_rows`` rows."""
    return HEADER_BYTES + sum(2 + 2 * (end - start) * k for start, end, k in _chunks(n_rows))


def build(rows: torch.Tensor) -> bytes:
    """Commit to hidden-state rows, shape (n_rows, hidden)."""
    return build_many([rows])[0]


def _selections(row_sets: Sequence[torch.Tensor]) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per sequence and per chunk of :func:`_chunks`: the chunk's interpolation points
    (``row_in_chunk * width + column``, row-major, flat) and the selected values' bf16 bits,
    shaped (rows in the chunk, values per row).

    Top-k is per row, so the rows of every sequence are stacked and selected in two vectorized
    calls (all body rows, then all closing rows) instead of one call per chunk.
    """
    widths = {rows.shape[1] if rows.ndim == 2 else -1 for rows in row_sets}
    for rows in row_sets:
        if rows.ndim != 2 or rows.shape[0] < 2 or rows.shape[1] < CLOSING_VALUES:
            raise ValueError(f"rows must be 2-D with >= 2 rows and >= {CLOSING_VALUES} columns, "
                             f"got shape {tuple(rows.shape)}")
    if len(widths) > 1:
        raise ValueError(f"row sets of one call must share their width, got {sorted(widths)}")
    if not row_sets:
        return []
    (width,) = widths
    bits = bf16_bits(torch.cat(list(row_sets)))
    lengths = np.array([rows.shape[0] for rows in row_sets])
    closing = np.cumsum(lengths) - 1
    is_body = np.ones(len(bits), dtype=bool)
    is_body[closing] = False
    body_bits, closing_bits = bits[is_body], bits[closing]
    body_columns = top_indices(body_bits, VALUES_PER_ROW)
    body_values = np.take_along_axis(body_bits, body_columns, axis=1)
    # Each body row's index inside its sequence, then inside its chunk.
    body_starts = np.repeat(np.cumsum(lengths - 1) - (lengths - 1), lengths - 1)
    row_in_chunk = (np.arange(len(body_bits)) - body_starts) % ROWS_PER_CHUNK
    body_keys = row_in_chunk[:, None] * width + body_columns
    closing_columns = top_indices(closing_bits, CLOSING_VALUES)
    closing_values = np.take_along_axis(closing_bits, closing_columns, axis=1)
    selections, body_offset = [], 0
    for which, n_rows in enumerate(lengths.tolist()):
        chunks = [(body_keys[body_offset + start : body_offset + end].reshape(-1),
                   body_values[body_offset + start : body_offset + end])
                  for start, end, _ in _chunks(n_rows)[:-1]]
        chunks.append((closing_columns[which], closing_values[which : which + 1]))
        selections.append(chunks)
        body_offset += n_rows - 1
    return selections


def build_many(row_sets: Sequence[torch.Tensor]) -> list[bytes]:
    """Commit to several sequences at once: selection and interpolation are vectorized over
    every chunk of every sequence, which keeps commitment building a small share of generation."""
    pieces: list[list[bytes]] = []
    by_length: dict[int, list[tuple[int, int, int, np.ndarray, np.ndarray]]] = {}
    for which, chunks in enumerate(_selections(row_sets)):
        pieces.append([b""] * len(chunks))
        for index, (keys, values) in enumerate(chunks):
            modulus = _injective_modulus(keys)
            by_length.setdefault(len(keys), []).append((which, index, modulus, keys % modulus, values.reshape(-1)))
    for group in by_length.values():
        poly = _interpolate(np.stack([item[3] for item in group]), np.stack([item[4] for item in group]))
        for (which, index, modulus, _, _), coefficients in zip(group, poly):
            pieces[which][index] = np.concatenate([[modulus], coefficients]).astype(">u2").tobytes()
    header = bytes([SCHEME_VERSION, ROWS_PER_CHUNK, VALUES_PER_ROW])
    return [header + b"".join(chunks) for chunks in pieces]


@dataclass(frozen=True, slots=True)
class CommitmentCheck:
    """Sequence-level agreement between a commitment and recomputed hidden states.

    A comparison is a *miss* when sign or exponent differ (which is also what an index outside
    the prover's top set looks like: the polynomial returns noise there); otherwise its error
    is the mantissa difference in bf16 ulps.
    """

    rows: int
    comparisons: int  # over the body rows (the rows that chose the tokens)
    misses: int
    mantissa_error_mean: float
    rows_fully_missed: int
    closing_misses: int  # of CLOSING_VALUES comparisons on the row after the last token

    @property
    def miss_rate(self) -> float:
        return self.misses / self.comparisons if self.comparisons else 1.0


def parse(data: bytes, n_rows: int) -> list[tuple[int, np.ndarray]]:
    """Split commitment bytes into (modulus, coefficients) per chunk, checking the layout."""
    if len(data) < HEADER_BYTES:
        raise MalformedCommitment(f"{len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    version, rows_per_chunk, values_per_row = data[0], data[1], data[2]
    if (version, rows_per_chunk, values_per_row) != (SCHEME_VERSION, ROWS_PER_CHUNK, VALUES_PER_ROW):
        raise MalformedCommitment(
            f"unsupported scheme {version}/{rows_per_chunk}/{values_per_row}, "
            f"expected {SCHEME_VERSION}/{ROWS_PER_CHUNK}/{VALUES_PER_ROW}"
        )
    expected = committed_size(n_rows)
    if len(data) != expected:
        raise MalformedCommitment(f"{len(data)} bytes for {n_rows} rows, expected {expected}")
    chunks = []
    offset = HEADER_BYTES
    for start, end, k in _chunks(n_rows):
        count = 1 + (end - start) * k
        words = np.frombuffer(data, dtype=">u2", count=count, offset=offset).astype(np.int64)
        offset += 2 * count
        modulus, coefficients = int(words[0]), words[1:]
        if not len(coefficients) <= modulus <= FIELD_PRIME:
            raise MalformedCommitment(f"chunk at row {start}: modulus {modulus} out of range")
        if (coefficients >= FIELD_PRIME).any():
            raise MalformedCommitment(f"chunk at row {start}: coefficient outside the field")
        chunks.append((modulus, coefficients))
    return chunks


def check(data: bytes, rows: torch.Tensor) -> CommitmentCheck:
    """Compare a commitment with hidden-state rows recomputed by the verifier.

    Raises :class:`MalformedCommitment` when the bytes do not have the layout for ``rows``.
    """
    (result,) = check_many([data], [rows])
    if isinstance(result, MalformedCommitment):
        raise result
    return result


def check_many(
    commitments: Sequence[bytes], row_sets: Sequence[torch.Tensor]
) -> list[CommitmentCheck | MalformedCommitment]:
    """Compare many commitments with their recomputed rows, vectorized across all of them.

    A malformed commitment gets its :class:`MalformedCommitment` in its place, so one bad
    record never stops the others from being checked.
    """
    malformed: dict[int, MalformedCommitment] = {}
    parsed: dict[int, list[tuple[int, np.ndarray]]] = {}
    for which, (data, rows) in enumerate(zip(commitments, row_sets, strict=True)):
        try:
            parsed[which] = parse(data, rows.shape[0])
        except MalformedCommitment as error:
            malformed[which] = error
    selections = dict(zip(parsed, _selections([row_sets[which] for which in parsed])))
    # Every chunk's polynomial is evaluated at the verifier's own points; chunks with as many
    # coefficients are stacked and evaluated together.
    by_degree: dict[int, list[tuple[int, int, np.ndarray, np.ndarray]]] = {}
    for which, chunks in selections.items():
        for index, ((modulus, coefficients), (keys, _)) in enumerate(zip(parsed[which], chunks)):
            by_degree.setdefault(len(coefficients), []).append((which, index, coefficients, keys % modulus))
    claimed: dict[tuple[int, int], np.ndarray] = {}
    for group in by_degree.values():
        values = _evaluate(np.stack([item[2] for item in group]), np.stack([item[3] for item in group]))
        claimed.update(((which, index), row) for (which, index, _, _), row in zip(group, values))
    body: list[tuple[np.ndarray, np.ndarray]] = []
    closing: list[tuple[np.ndarray, np.ndarray]] = []
    for which, chunks in selections.items():
        for index, (_, mine) in enumerate(chunks):
            (closing if index == len(chunks) - 1 else body).append((claimed[which, index].reshape(mine.shape), mine))
    checked: dict[int, CommitmentCheck] = {}
    if selections:
        statistics = _agreements([row_sets[which].shape[0] for which in selections], body, closing)
        checked = dict(zip(selections, statistics, strict=True))
    # Each commitment either failed to parse or was parsed, selected and checked.
    return [malformed[which] if which in malformed else checked[which] for which in range(len(row_sets))]


def _agreements(n_rows: list[int], body: list[tuple[np.ndarray, np.ndarray]],
                closing: list[tuple[np.ndarray, np.ndarray]]) -> list[CommitmentCheck]:
    """Per-sequence statistics from (claimed, recomputed) bf16 bits: ``body`` holds every body
    chunk of every sequence in order (a sequence of n rows has n - 1 body rows), ``closing``
    one closing row per sequence. Computed on all rows at once, then summed per sequence."""
    claimed, mine = np.concatenate([c for c, _ in body]), np.concatenate([m for _, m in body])
    agree = (claimed >> _SIGN_EXPONENT_SHIFT) == (mine >> _SIGN_EXPONENT_SHIFT)
    error = np.where(agree, np.abs((claimed & _MANTISSA_MASK) - (mine & _MANTISSA_MASK)), 0)
    starts = np.cumsum([0, *(n - 1 for n in n_rows[:-1])])
    row_misses = (~agree).sum(axis=1)
    misses = np.add.reduceat(row_misses, starts)
    fully_missed = np.add.reduceat(row_misses == VALUES_PER_ROW, starts)
    error_sums = np.add.reduceat(error.sum(axis=1), starts)
    closing_claimed, closing_mine = np.concatenate([c for c, _ in closing]), np.concatenate([m for _, m in closing])
    closing_misses = ((closing_claimed >> _SIGN_EXPONENT_SHIFT) != (closing_mine >> _SIGN_EXPONENT_SHIFT)).sum(axis=1)
    results = []
    for i, n in enumerate(n_rows):
        comparisons = (n - 1) * VALUES_PER_ROW
        matched = comparisons - int(misses[i])
        results.append(CommitmentCheck(
            rows=n, comparisons=comparisons, misses=int(misses[i]),
            mantissa_error_mean=float(error_sums[i]) / matched if matched else float(_MANTISSA_MASK),
            rows_fully_missed=int(fully_missed[i]), closing_misses=int(closing_misses[i])))
    return results


def opens(data: bytes, n_rows: int, index: int, row: torch.Tensor) -> bool:
    """Whether body row ``index`` of a commitment over ``n_rows`` rows is exactly ``row``, as
    far as the commitment holds it: the polynomial, evaluated at the keys of ``row``'s own top
    columns, gives back ``row``'s bf16 bits, every one. For a row the prover revealed (a sampling
    proof's hidden state, specs/zk.md §8), which must be the row it committed, bit for bit.

    Raises :class:`MalformedCommitment` for bytes without the layout for ``n_rows`` rows, or an
    ``index`` that is not a body row.
    """
    if not 0 <= index < n_rows - 1:
        raise MalformedCommitment(f"row {index} is not a body row of a {n_rows}-row commitment")
    modulus, coefficients = parse(data, n_rows)[index // ROWS_PER_CHUNK]
    bits = bf16_bits(row.reshape(1, -1))
    columns = top_indices(bits, VALUES_PER_ROW)[0]
    keys = (index % ROWS_PER_CHUNK) * bits.shape[1] + columns
    claimed = _evaluate(coefficients[None, :], (keys % modulus)[None, :])[0]
    return bool((claimed == bits[0, columns]).all())
