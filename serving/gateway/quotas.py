"""Per-key quotas: token buckets per API key, in this gateway process.

A key may carry two quotas, each a bucket with a rate r per second and a size b: requests
(``rate_limit_per_s``/``rate_burst``, every request costs 1) and estimated model tokens
(``token_rate_per_s``/``token_burst``, a request costs its texts' estimate,
``serving/gateway/bodies.py``). A request takes its cost from the bucket or, when the bucket
holds less, is refused with 429 and ``Retry-After`` (the wait until it would hold enough); a
request that costs more than the bucket's size could never pass, and is refused with 413
instead. Left unset, a bucket holds one second of its rate. The buckets live in the gateway's
memory: N gateways behind a balancer allow N x r.

This is the gateway's half of fair sharing: a key's average share of the fleet is its token
rate. Within that, the workers share their batches between the keys that wait (header
``Tf-Key``), so one key's burst does not delay another's requests behind it.
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
    """One bucket per key (requests, or estimated tokens: one ``Quotas`` for each)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str, rate_per_s: float, burst: int | None = None, cost: int = 1) -> float:
        """Take ``cost`` from ``key``'s bucket: 0.0 when the request may go, else the seconds
        until the bucket holds enough (nothing is taken then), ``math.inf`` when ``cost`` is
        above the bucket's size (it never will)."""
        capacity = float(bucket_size(rate_per_s, burst))
        if cost > capacity:
            return math.inf
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
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return 0.0
            return (cost - bucket.tokens) / rate_per_s


def bucket_size(rate_per_s: float, burst: int | None) -> int:
    """The size of a quota's bucket: its burst, else one second of its rate."""
    return burst if burst is not None else max(1, math.ceil(rate_per_s))
