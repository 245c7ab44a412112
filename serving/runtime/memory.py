"""Giving freed memory back to the system: glibc keeps what a large batch freed unless told.

Two glibc calls, process-wide, through ctypes (no-ops where the C library is not glibc):

- a fixed mmap threshold (``release_freed_tensors``): glibc raises its threshold to the size of
  each large block freed, up to 32 MiB, so after the first large batch every activation tensor
  comes from the heap, whose freed space is rarely returned. Fixed at 1 MiB, blocks from that
  size up get their own mapping and go back to the system when freed;
- ``malloc_trim(0)`` (``trim``): returns the free pages of every heap and arena, the smaller
  blocks (token lists, Python objects, tokenizer buffers) a batch left behind.

The trainer (finetune/trainer.py) sets the threshold for large steps. The runtime server only
trims, once a batch's reply is out and nothing waits (serving/runtime/server.py): a fixed
threshold there cost ~20% of batch throughput (every activation tensor a fresh mapping,
faulted in again). Neither changes a value, only where memory lives.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

#: glibc's mallopt parameter M_MMAP_THRESHOLD (malloc.h).
_M_MMAP_THRESHOLD = -3
#: Allocations from this size up get their own mapping, given back to the system when freed.
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def _libc() -> Any | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - only glibc has these two
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_tensors() -> bool:
    """Make glibc give large freed blocks back to the system at once (process-wide).

    In training without it a step kept ~2.5 GB that no tensor used (9.7 GB peak RSS where
    5.5 GB were live). Returns False where the C library is not glibc."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def trim() -> bool:
    """Return the free pages of glibc's heaps to the system; True when some were returned."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


def rss_bytes(pid: int | None = None) -> int:
    """Resident memory of a process (this one by default), from /proc; 0 where unreadable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
