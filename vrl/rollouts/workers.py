"""The process-wide thread pool for work that releases the GIL while it runs: Ed25519
verification (OpenSSL, through ``cryptography``).

Threads only help such work. Measured on this 2-core machine: checking 128 rollout signatures
takes 13.5 ms instead of 20 ms. Ed25519 signing gains too little to be worth a thread (11.2 to
9.9 ms), and Python-level work gains nothing. (Model hashing needs no pool: BLAKE3 spreads a
tensor over the cores itself, ``vrl.rollouts.model.weights_hash``.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


#: One worker per core: the work is CPU-bound.
WORKERS = os.cpu_count() or 1


@cache
def pool() -> ThreadPoolExecutor:
    """The shared pool, created on first use."""
    return ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="vrl-worker")


def map_in_slices(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[function(x) for x in items]``, with one contiguous slice of ``items`` per worker, so
    the cost of handing work to a thread is paid once per slice, not once per item."""
    if len(items) < 2 * WORKERS:
        return [function(item) for item in items]
    size = -(-len(items) // WORKERS)
    slices = [items[start : start + size] for start in range(0, len(items), size)]
    return [result for part in pool().map(lambda part: [function(item) for item in part], slices) for result in part]
