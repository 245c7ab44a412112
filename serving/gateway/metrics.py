"""Prometheus metrics of one gateway (its own registry, so several gateways in one process,
as in tests, never share counters).

Besides its own requests the gateway reports the queue as JetStream sees it, read at scrape
time: messages waiting per task consumer (not yet delivered), delivered but unacknowledged,
redelivered, dead letters per task, and live workers per task. Worker-side figures (batches,
runtime latency, loads, evictions) come from each sidecar's own ``/metrics``.

The figures name every task and API key, so ``/metrics`` is for the scraper only
(``httpapi.scrape.check_scraper``, the control plane's rule too): with a metrics token it needs
that bearer token; without one it is open only when the gateway runs without auth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Requests for names that are not tasks are counted under this label, so a scan of random
# paths cannot grow the label set without bound.
UNKNOWN_TASK_LABEL = "_unknown"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# The code label of a request that was answered.
OK_CODE = "OK"


@dataclass(frozen=True)
class ConsumerStats:
    """One task consumer as JetStream reports it."""

    task: str
    pending: int  # in the stream, not delivered to any worker yet
    ack_pending: int  # delivered to a worker, not acknowledged yet
    redelivered: int  # delivered more than once and not acknowledged yet
    waiting_pulls: int  # pull requests of workers waiting for messages


@dataclass(frozen=True)
class QueueSnapshot:
    consumers: list[ConsumerStats] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)  # task -> messages in DLQ
    live_workers: dict[str, int] = field(default_factory=dict)  # task -> workers with a loop


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "taskfleet_gateway_requests",
            "Embedding requests answered, by task, HTTP status and error code (OK if none).",
            ["task", "status", "code"],
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

        self.offloaded_replies = Counter(
            "taskfleet_gateway_offloaded_replies",
            "Replies whose embeddings came through the payloads object store (above max_payload).",
            registry=self.registry,
        )
        self.crash_deadlines = Counter(
            "taskfleet_gateway_crash_deadlines",
            "Deadlines that passed while a worker serving the task died or restarted "
            "(answered 504 retryable).",
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "taskfleet_gateway_rate_limited",
            "Requests refused with 429 because the API key was over its quota, by key and "
            "quota (requests or tokens).",
            ["key", "quota"],
            registry=self.registry,
        )
        self.estimated_tokens = Counter(
            "taskfleet_gateway_estimated_tokens",
            "Estimated model tokens of the requests queued (characters / 4 per text, at most "
            "the model's max_seq_length), by API key (_none without auth).",
            ["key"],
            registry=self.registry,
        )
        self.queue_pending = Gauge(
            "taskfleet_queue_pending",
            "Messages of the task in stream TASKS not delivered to any worker yet.",
            ["task"],
            registry=self.registry,
        )
        self.queue_ack_pending = Gauge(
            "taskfleet_queue_ack_pending",
            "Messages of the task delivered to a worker and not acknowledged yet.",
            ["task"],
            registry=self.registry,
        )
        self.queue_redelivered = Gauge(
            "taskfleet_queue_redelivered",
            "Unacknowledged messages of the task that were delivered more than once.",
            ["task"],
            registry=self.registry,
        )
        self.queue_waiting_pulls = Gauge(
            "taskfleet_queue_waiting_pulls",
            "Pull requests of workers waiting for messages of the task.",
            ["task"],
            registry=self.registry,
        )
        self.dead_letters = Gauge(
            "taskfleet_queue_dead_letters",
            "Messages of the task in stream DLQ.",
            ["task"],
            registry=self.registry,
        )
        self.live_workers = Gauge(
            "taskfleet_fleet_live_workers",
            "Workers whose heartbeat lists a loop for the task.",
            ["task"],
            registry=self.registry,
        )
        self.queue_up = Gauge(
            "taskfleet_queue_up",
            "1 when the queue figures of this scrape could be read from NATS, else 0.",
            registry=self.registry,
        )

    def observe(self, task: str, status: int, code: str, seconds: float) -> None:
        self.requests.labels(task=task, status=str(status), code=code).inc()
        self.latency.labels(task=task).observe(seconds)

    def set_queue(self, snapshot: QueueSnapshot | None) -> None:
        """Replace the queue gauges with ``snapshot`` (None: NATS could not be read)."""
        gauges = (
            self.queue_pending,
            self.queue_ack_pending,
            self.queue_redelivered,
            self.queue_waiting_pulls,
            self.dead_letters,
            self.live_workers,
        )
        for gauge in gauges:
            gauge.clear()
        self.queue_up.set(0 if snapshot is None else 1)
        if snapshot is None:
            return
        for c in snapshot.consumers:
            self.queue_pending.labels(task=c.task).set(c.pending)
            self.queue_ack_pending.labels(task=c.task).set(c.ack_pending)
            self.queue_redelivered.labels(task=c.task).set(c.redelivered)
            self.queue_waiting_pulls.labels(task=c.task).set(c.waiting_pulls)
        for task, count in snapshot.dead_letters.items():
            self.dead_letters.labels(task=task).set(count)
        for task, count in snapshot.live_workers.items():
            self.live_workers.labels(task=task).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
