"""What serving a candidate costs, measured while the eval runs it: comparable across kinds.

Every eval run reports, beside throughput and latency:

- ``cpu_ms_per_item``: CPU milliseconds per item (a text embedded or classified, a (query,
  document) pair scored) of the work the serving runtime would do: this process's CPU (all its
  threads: the in-process torch runtime, a baseline's numpy) plus that of a runtime process the
  candidate drives (the sidecar of ``--runtime candle|http``). An endpoint model's own engine is
  not ours to measure: its CPU here is the worker's share only; its price is given by the user.
- ``peak_memory_mb``: how far resident memory rose while the candidate loaded and ran (this
  process, reset with ``/proc/self/clear_refs`` before; plus the runtime process's peak).

``price_per_million`` (registry/costs.py) turns them into one figure the promotion rule can
compare: CPU-hours per million items at a CPU-hour price, plus an endpoint's own price per
million items when its model was registered with one.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _status_kb(pid: int | str, field: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of another live process (0 when it is gone or /proc is absent)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return 0.0


def process_peak_bytes(pid: int) -> int:
    return _status_kb(pid, "VmHWM") * 1024


def _reset_own_peak() -> None:
    # "5" resets the peak resident set size (VmHWM) of this process (Linux >= 4.0).
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


@dataclass
class Usage:
    cpu_seconds: float = 0.0
    peak_bytes: int = 0

    def figures(self, items: int) -> dict[str, float]:
        if items <= 0:
            return {}
        return {
            "cpu_ms_per_item": self.cpu_seconds * 1000.0 / items,
            "peak_memory_mb": self.peak_bytes / 2**20,
        }


@contextlib.contextmanager
def metered(runtime_pid: int | None = None) -> Iterator[Usage]:
    """Measures the block: this process's CPU and peak RSS rise, plus ``runtime_pid``'s CPU
    and peak (a runtime started inside the block can be added with :func:`add_runtime`)."""
    usage = Usage()
    _reset_own_peak()
    rss_before = _status_kb("self", "VmRSS") * 1024
    cpu_before = time.process_time()
    runtime_cpu_before = process_cpu_seconds(runtime_pid) if runtime_pid else 0.0
    try:
        yield usage
    finally:
        usage.cpu_seconds += time.process_time() - cpu_before
        peak = _status_kb("self", "VmHWM") * 1024
        usage.peak_bytes += max(0, peak - rss_before)
        if runtime_pid:
            add_runtime(usage, runtime_pid, runtime_cpu_before)


def add_runtime(usage: Usage, pid: int, cpu_before: float = 0.0) -> None:
    """Counts a runtime process's CPU (since ``cpu_before``) and peak RSS into ``usage``."""
    usage.cpu_seconds += max(0.0, process_cpu_seconds(pid) - cpu_before)
    usage.peak_bytes += process_peak_bytes(pid)
