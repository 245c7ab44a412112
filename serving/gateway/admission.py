"""What a key may spend: its request and token quotas, charged before anything is queued.

Two buckets per key and gateway process (``serving/gateway/quotas.py``): requests, charged as
soon as the key is known (before the body is read: an over-quota caller costs nothing more), and
estimated model tokens, charged once the body is parsed, the texts are within the task's limits
and the task can be served (a refused request costs the key nothing). A request's estimate is
``request.tokens(max_seq_length)`` of ``serving/gateway/bodies*.py``: a quarter of the
characters per text, a rerank pair holding query and document, each text or pair at most the
placement's ``max_seq_length`` (what the model reads of it).

Over a quota: 429 ``RATE_LIMITED`` with ``Retry-After``. A request that costs more tokens than
the key's token burst could never pass: 413 ``PAYLOAD_TOO_LARGE``, naming the cost and the burst.
"""

from __future__ import annotations

import math

from serving.directory import KeyRecord
from serving.gateway.dispatch import TaskBody
from serving.gateway.errors import PayloadTooLarge, RateLimited
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.quotas import Quotas, bucket_size
from serving.protocol import PlacementValue

# The key label of requests that carry no key (auth off).
NO_KEY_LABEL = "_none"


class Admission:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.requests = Quotas()
        self.tokens = Quotas()

    def charge_request(self, key: KeyRecord) -> None:
        """One request from the key's request bucket; 429 when it is empty."""
        if key.rate_limit_per_s is None:
            return
        wait_s = self.requests.take(key.name, key.rate_limit_per_s, key.rate_burst)
        if wait_s > 0:
            self.metrics.rate_limited.labels(key=key.name, quota="requests").inc()
            raise RateLimited(
                f"API key {key.name!r} is over its quota of {key.rate_limit_per_s:g} requests/s",
                retry_after_s=max(1, math.ceil(wait_s)),
            )

    def charge_tokens(
        self, key: KeyRecord | None, request: TaskBody, placement: PlacementValue
    ) -> int:
        """The request's estimated tokens, taken from the key's token bucket; 429 when the
        bucket holds too few now, 413 when it never could."""
        cost = request.tokens(placement.max_seq_length)
        if key is not None and key.token_rate_per_s is not None:
            rate = key.token_rate_per_s
            wait_s = self.tokens.take(key.name, rate, key.token_burst, cost)
            if wait_s == math.inf:
                raise PayloadTooLarge(
                    f"this request costs an estimated {cost} tokens (a quarter of the "
                    f"characters per text, at most {placement.max_seq_length or 'no cap'} per "
                    f"text); API key {key.name!r} may spend at most "
                    f"{bucket_size(rate, key.token_burst)} at once (its token burst): send "
                    "fewer or shorter texts per request"
                )
            if wait_s > 0:
                self.metrics.rate_limited.labels(key=key.name, quota="tokens").inc()
                raise RateLimited(
                    f"API key {key.name!r} is over its quota of {rate:g} estimated tokens/s "
                    f"(this request: {cost})",
                    retry_after_s=max(1, math.ceil(wait_s)),
                )
        self.metrics.estimated_tokens.labels(key=key.name if key else NO_KEY_LABEL).inc(cost)
        return cost
