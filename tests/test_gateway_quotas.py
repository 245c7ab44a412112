"""Per-key quotas (token bucket, 429 + Retry-After, counted per key) and what operators see on
/metrics: the error code of every answer, and the queue as JetStream holds it."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from serving.client import Client
from serving.gateway import GatewaySettings
from serving.gateway.quotas import Quotas
from tests.gateway_fixture import Stack, nats_and_gateway

MSGPACK = {"Content-Type": "application/msgpack"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    clock = FakeClock()
    quotas = Quotas(clock)
    assert [quotas.take("k", 2.0, 3) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = quotas.take("k", 2.0, 3)
    assert wait == pytest.approx(0.5)
    clock.now += 0.5
    assert quotas.take("k", 2.0, 3) == 0.0
    assert quotas.take("k", 2.0, 3) > 0
    # Other keys have their own bucket; a quiet key refills up to its burst, not beyond.
    assert quotas.take("other", 2.0, 3) == 0.0
    clock.now += 60
    assert [quotas.take("k", 2.0, 3) for _ in range(4)][-1] > 0
    # A changed quota takes effect at once and keeps what is left within the new size.
    clock.now += 60
    assert quotas.take("k", 0.5, None) == 0.0
    assert quotas.take("k", 0.5, None) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=True, workers_refresh_s=0, retry_after_s=1)
    with nats_and_gateway(tmp_path_factory, settings) as built:
        yield built


def _post(stack: Stack, task: str, token: str, **headers: str) -> httpx.Response:
    body = msgpack.packb({"inputs": ["x"]})
    return httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=body,
        headers={**MSGPACK, "Authorization": f"Bearer {token}", **headers},
    )


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample (labels in any order); 0 when absent."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


def test_key_over_its_quota_gets_429_with_retry_after(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task)
    _, token = stack.registry.create_api_key(
        "metered", roles=["caller"], rate_limit_per_s=0.5, rate_burst=2
    )
    _, free = stack.registry.create_api_key("unmetered", roles=["caller"])
    stack.sync()
    try:
        assert [_post(stack, task, token).status_code for _ in range(2)] == [200, 200]
        refused = _post(stack, task, token)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "RATE_LIMITED" and error["retryable"] is True
        assert 1 <= int(refused.headers["Retry-After"]) <= 2
        # Nothing reached the queue for the refused call; other keys are not slowed down.
        assert len(peer.seen_payloads) == 2
        others = [_post(stack, task, free) for _ in range(5)]
        assert [r.status_code for r in others] == [200] * 5, [r.text for r in others]

        text = httpx.get(f"{stack.url}/metrics").text
        assert _metric(text, "taskfleet_gateway_rate_limited_total", key="metered") == 1.0
        assert (
            _metric(text, "taskfleet_gateway_requests_total", code="RATE_LIMITED", status="429")
            == 1.0
        )
        # The client library waits Retry-After and gets through.
        began = time.monotonic()
        with Client(stack.url, api_key=token, max_retries=5) as client:
            assert client.embed(task, "später").shape == (1, 4)
        assert time.monotonic() - began >= 0.5

        # The quota is the registry's: removing it lifts the limit once published.
        stack.registry.set_api_key_quota("metered", rate_limit_per_s=None)
        stack.sync()
        lifted = [_post(stack, task, token) for _ in range(4)]
        assert [r.status_code for r in lifted] == [200] * 4, [r.text for r in lifted]
    finally:
        stack.loop.run(peer.stop())


def test_metrics_tell_codes_apart_and_show_the_queue(stack: Stack) -> None:
    _, token = stack.registry.create_api_key("ops", roles=["caller"])
    stack.sync()
    unplaced = stack.task(placed=False)
    no_worker = stack.task()
    queued = stack.task(worker=True)  # a heartbeat names it, but nobody pulls
    assert _post(stack, unplaced, token).status_code == 503
    assert _post(stack, no_worker, token).status_code == 503
    late = _post(stack, queued, token, **{"X-Taskfleet-Timeout-Ms": "300"})
    assert late.status_code == 504
    assert late.json()["error"]["retryable"] is False  # no worker died: just nobody pulled

    text = httpx.get(f"{stack.url}/metrics").text
    requests = "taskfleet_gateway_requests_total"
    assert _metric(text, requests, task=unplaced, code="NOT_PLACED", status="503") == 1.0
    assert _metric(text, requests, task=no_worker, code="NO_WORKER", status="503") == 1.0
    assert _metric(text, requests, task=queued, code="DEADLINE_EXCEEDED", status="504") == 1.0
    # The abandoned request still waits in the queue, undelivered; one live worker serves it.
    assert _metric(text, "taskfleet_queue_pending", task=queued) == 1.0
    assert _metric(text, "taskfleet_queue_ack_pending", task=queued) == 0.0
    assert _metric(text, "taskfleet_fleet_live_workers", task=queued) == 1.0
    assert "taskfleet_queue_up 1.0" in text
    assert not math.isnan(_metric(text, "taskfleet_queue_pending", task=queued))
