"""Prometheus metrics of one gateway (its own registry, so several gateways in one process,
as in tests, never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Requests for names that are not tasks are counted under this label, so a scan of random
# paths cannot grow the label set without bound.
UNKNOWN_TASK_LABEL = "_unknown"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "taskfleet_gateway_requests",
            "Embedding requests answered, by task and HTTP status.",
            ["task", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "taskfleet_gateway_request_seconds",
            "Time from request received to response ready, by task.",
            ["task"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "taskfleet_gateway_in_flight",
            "Requests published to the queue and waiting for their reply.",
            registry=self.registry,
        )
        self.duplicate_replies = Counter(
            "taskfleet_gateway_duplicate_replies",
            "Replies dropped because their request was already answered or abandoned.",
            registry=self.registry,
        )
        self.bad_replies = Counter(
            "taskfleet_gateway_bad_replies",
            "Messages on the reply subject that were not a v1 reply.",
            registry=self.registry,
        )
        self.offloaded_payloads = Counter(
            "taskfleet_gateway_offloaded_payloads",
            "Requests whose inputs went to the payloads object store.",
            registry=self.registry,
        )

    def observe(self, task: str, status: int, seconds: float) -> None:
        self.requests.labels(task=task, status=str(status)).inc()
        self.latency.labels(task=task).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
