"""Per-key request-rate quotas: one token bucket per API key, in this gateway process.

A key with ``rate_limit_per_s`` r and ``rate_burst`` b may send b requests at once and r per
second on average; a request over it gets 429 with ``Retry-After`` (the wait until a token is
back). The buckets live in the gateway's memory: N gateways behind a balancer allow N x r.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    rate: float
    capacity: float
    tokens: float
    updated: float


class Quotas:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str, rate_per_s: float, burst: int | None = None) -> float:
        """Take one token for ``key``: 0.0 when the request may go, else the seconds until a
        token is back (nothing is taken then)."""
        capacity = float(burst if burst is not None else max(1, math.ceil(rate_per_s)))
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = _Bucket(rate_per_s, capacity, capacity, now)
                self._buckets[key] = bucket
            elif (bucket.rate, bucket.capacity) != (rate_per_s, capacity):
                # The key's quota was changed: keep what is left, within the new size.
                bucket.rate, bucket.capacity = rate_per_s, capacity
                bucket.tokens = min(bucket.tokens, capacity)
            bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * rate_per_s)
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / rate_per_s
