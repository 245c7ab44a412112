"""Login throttling: failed API-key attempts counted per client and per key prefix.

Keys hold 192 random bits, so guessing one is hopeless; the throttle stops a client from
hammering the control plane with wrong keys all the same (200 in 0.4 s before), and stops
anyone from trying many secrets against one key prefix from many addresses. Once either
counter reaches its limit inside the window, every attempt from that client or for that
prefix answers 429 `RATE_LIMITED` with `Retry-After` until the oldest failure leaves the
window; a throttled attempt is not even checked, so it teaches nothing. In memory, per process.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from httpapi.errors import ApiError, ErrorCode


class RateLimited(ApiError):
    code = ErrorCode.RATE_LIMITED


@dataclass
class LoginThrottle:
    max_per_client: int = 10
    max_per_prefix: int = 20
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, client: str, prefix: str | None) -> None:
        """Raise `RateLimited` if the client or the key prefix is throttled now."""
        with self._lock:
            now = self.clock()
            waits = [
                self._wait(f"client:{client}", self.max_per_client, now),
                self._wait(f"prefix:{prefix}", self.max_per_prefix, now) if prefix else 0.0,
            ]
        wait = max(waits)
        if wait > 0:
            raise RateLimited(
                f"too many failed API-key attempts; try again in {math.ceil(wait)} s",
                retry_after_s=math.ceil(wait),
            )

    def failed(self, client: str, prefix: str | None) -> None:
        with self._lock:
            now = self.clock()
            for name in (f"client:{client}", f"prefix:{prefix}" if prefix else None):
                if name is not None:
                    self._failures.setdefault(name, deque()).append(now)
            if len(self._failures) > 10_000:  # a flood of distinct names: forget the idle ones
                self._prune(now)

    def _wait(self, name: str, limit: int, now: float) -> float:
        times = self._failures.get(name)
        if not times:
            return 0.0
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) < limit:
            return 0.0
        return times[-limit] + self.window_s - now

    def _prune(self, now: float) -> None:
        for name in [n for n, t in self._failures.items() if not t or t[-1] <= now - self.window_s]:
            del self._failures[name]
