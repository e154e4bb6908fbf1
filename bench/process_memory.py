"""This process's memory as the benchmarks measure it (Linux /proc): resident now, the peak
since the start or since :func:`reset_peak`, and what the machine has available. A benchmark
run as ``python bench/NAME.py`` has this folder first on sys.path: ``from process_memory
import ...``."""

from __future__ import annotations

import resource
from pathlib import Path


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    """Resident now (VmRSS)."""
    return _status("VmRSS")


def peak_bytes() -> int:
    """The resident peak (VmHWM) since the start or the last :func:`reset_peak`; getrusage's
    lifetime peak where /proc does not say."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_peak() -> None:
    """Start the peak over from now (Linux: writing 5 to clear_refs resets VmHWM), so that a
    set-up's own peak is not the measurement's."""
    Path("/proc/self/clear_refs").write_text("5")


def available_bytes() -> int:
    """The machine's memory available to a new process (/proc/meminfo's MemAvailable)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0
