"""What operators see: a real sidecar's /metrics after real traffic, and the Grafana dashboard
under deploy/ that must parse and query only metrics a real gateway or sidecar serves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.client import Client
from testbed.faults.scenarios import serve
from testbed.fleet import LocalFleet, wait_until

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "taskfleet.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_created")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with LocalFleet(tmp_path_factory.mktemp("metrics"), workers=1) as stack:
        yield stack


@pytest.fixture(scope="module")
def served(fleet: LocalFleet, tiny_model_path: Path) -> str:
    task = serve(fleet, tiny_model_path, prefix="metrics")
    with Client(fleet.gateway_url) as client:
        for i in range(5):
            client.embed(task, [f"satz {i}", "noch einer"])
    return task


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of a Prometheus text exposition."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, f"not a sample line: {line!r}"
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        found.setdefault(match.group(1), []).append((labels, float(match.group(3))))
    return found


def families(text: str) -> dict[str, str]:
    """Metric name -> type, from the # TYPE lines (present even before the first sample)."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))


def value(text: str, name: str, **labels: str) -> float:
    for found, number in samples(text).get(name, []):
        if all(found.get(k) == v for k, v in labels.items()):
            return number
    return 0.0


def test_sidecar_metrics_after_traffic(fleet: LocalFleet, served: str) -> None:
    text = fleet.sidecar_metrics()
    assert value(text, "taskfleet_sidecar_batches_total", task=served) >= 1
    assert value(text, "taskfleet_sidecar_replies_total", task=served, outcome="ok") == 5
    assert value(text, "taskfleet_sidecar_batch_tokens_count", task=served) >= 1
    assert value(text, "taskfleet_sidecar_batch_messages_sum", task=served) == 5
    assert value(text, "taskfleet_sidecar_runtime_seconds_count", op="infer") >= 1
    assert value(text, "taskfleet_sidecar_runtime_seconds_count", op="load") >= 1
    assert value(text, "taskfleet_sidecar_model_loads_total", outcome="ok") >= 1
    assert value(text, "taskfleet_sidecar_runtime_up") == 1
    assert value(text, "taskfleet_sidecar_held_messages", task=served) == 0
    assert value(text, "taskfleet_sidecar_serving_epoch", task=served) == 1
    assert (
        0
        < value(text, "taskfleet_sidecar_memory_used_bytes")
        <= value(text, "taskfleet_sidecar_memory_budget_bytes")
    )
    for name in ("redeliveries", "dead_letters", "reply_failures", "model_evictions"):
        assert f"# TYPE taskfleet_sidecar_{name}_total counter" in text


def test_gateway_metrics_show_the_task_consumer(fleet: LocalFleet, served: str) -> None:
    def scraped() -> str:
        text = fleet.gateway_metrics()
        return text if value(text, "taskfleet_fleet_live_workers", task=served) else ""

    text = wait_until(scraped)
    assert value(text, "taskfleet_gateway_requests_total", task=served, code="OK") == 5
    assert value(text, "taskfleet_queue_pending", task=served) == 0
    assert value(text, "taskfleet_queue_ack_pending", task=served) == 0
    assert value(text, "taskfleet_fleet_live_workers", task=served) == 1


def test_grafana_dashboard_queries_only_served_metrics(fleet: LocalFleet, served: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"] and dashboard["title"]
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert all(exprs), "every panel target has a query"
    served_types = {**families(fleet.gateway_metrics()), **families(fleet.sidecar_metrics())}
    known = set(served_types)
    for name, kind in served_types.items():
        if kind == "histogram":
            known |= {name + s for s in SUFFIXES}
    used = {m for expr in exprs for m in re.findall(r"\btaskfleet_[a-z0-9_]+", expr)}
    assert used, "the dashboard queries taskfleet metrics"
    missing = sorted(used - known)
    assert not missing, f"the dashboard queries metrics nobody serves: {missing}"
    # Every family an operator needs for the queue and the workers has a panel.
    for needed in (
        "taskfleet_queue_pending",
        "taskfleet_queue_ack_pending",
        "taskfleet_sidecar_batches_total",
        "taskfleet_sidecar_runtime_seconds_bucket",
        "taskfleet_sidecar_model_evictions_total",
        "taskfleet_sidecar_dead_letters_total",
        "taskfleet_sidecar_redeliveries_total",
        "taskfleet_gateway_requests_total",
    ):
        assert needed in used, needed
