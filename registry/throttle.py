"""Login throttling: failed API-key attempts counted per client.

Keys hold 192 random bits, so guessing one is hopeless; the throttle stops a client from
hammering the control plane with wrong keys all the same (200 in 0.4 s before). Once a client
reaches its limit of failures inside the window, every attempt from it answers 429
`RATE_LIMITED` with `Retry-After` until the oldest failure leaves the window; a throttled
attempt is not even checked, so it teaches nothing. In memory, per process.

Only the client is counted, never the key: a key's prefix is public (it is in every token the
key's users send, in logs and listings), and counting failures per prefix let anyone who knew
one lock that key out for every user by sending 20 wrong secrets a minute. The client is the
peer address, or what a configured proxy forwards (`--forwarded-allow-ips`); an IPv6 client
counts by its /64 network, since one host usually holds a whole /64.
"""

from __future__ import annotations

import ipaddress
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
    window_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _failures: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, client: str) -> None:
        """Raise `RateLimited` if the client is throttled now."""
        with self._lock:
            wait = self._wait(client_bucket(client), self.clock())
        if wait > 0:
            raise RateLimited(
                f"too many failed API-key attempts; try again in {math.ceil(wait)} s",
                retry_after_s=math.ceil(wait),
            )

    def failed(self, client: str) -> None:
        with self._lock:
            now = self.clock()
            # Only the newest `max_per_client` failures decide when the client may try again.
            times = self._failures.setdefault(
                client_bucket(client), deque(maxlen=self.max_per_client)
            )
            times.append(now)
            if len(self._failures) > 10_000:  # a flood of distinct clients: forget the idle ones
                self._prune(now)

    def _wait(self, bucket: str, now: float) -> float:
        times = self._failures.get(bucket)
        if not times:
            return 0.0
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) < self.max_per_client:
            return 0.0
        return times[-self.max_per_client] + self.window_s - now

    def _prune(self, now: float) -> None:
        for name in [n for n, t in self._failures.items() if not t or t[-1] <= now - self.window_s]:
            del self._failures[name]


def client_bucket(client: str) -> str:
    """What one client's failures are counted under: its IPv4 address, its IPv6 /64."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client  # not an address (a test client's name, "unknown")
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
