"""Per-key quotas (token buckets of requests and of estimated tokens, 429 + Retry-After, 413 for
a request no bucket could hold, counted per key), the key's name on every queue message
(``Tf-Key``), and what operators see on /metrics (behind its scrape token): the error code of
every answer, and the queue as JetStream holds it."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from serving.client import Client
from serving.gateway import GatewaySettings, create_gateway
from serving.gateway.quotas import Quotas
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import (
    Stack,
    consumer_exists,
    nats_and_gateway,
    serve_app,
    stream_messages,
)

MSGPACK = {"Content-Type": "application/msgpack"}
SCRAPE_TOKEN = "scrape-secret"


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
    settings = GatewaySettings(
        require_auth=True, workers_refresh_s=0, retry_after_s=1, metrics_token=SCRAPE_TOKEN
    )
    with nats_and_gateway(tmp_path_factory, settings) as built:
        yield built


def _post(stack: Stack, task: str, token: str, **headers: str) -> httpx.Response:
    body = msgpack.packb({"inputs": ["x"]})
    return httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=body,
        headers={**MSGPACK, "Authorization": f"Bearer {token}", **headers},
        timeout=HTTP_TIMEOUT_S,
    )


def _scrape(stack: Stack) -> str:
    response = httpx.get(
        f"{stack.url}/metrics",
        headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"},
        timeout=HTTP_TIMEOUT_S,
    )
    assert response.status_code == 200, response.text
    return response.text


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

        text = _scrape(stack)
        assert _metric(text, "taskfleet_gateway_rate_limited_total", key="metered") == 1.0
        assert (
            _metric(text, "taskfleet_gateway_requests_total", code="RATE_LIMITED", status="429")
            == 1.0
        )
        # The client library waits Retry-After and gets through. A key of its own, whose one
        # token takes 5 s to come back: the client's call meets an empty bucket however long
        # the machine took since the call before it (the key above refills within 2 s).
        _, slow = stack.registry.create_api_key(
            "slow", roles=["caller"], rate_limit_per_s=0.2, rate_burst=1
        )
        stack.sync()
        assert _post(stack, task, slow).status_code == 200
        began = time.monotonic()
        with Client(stack.url, api_key=slow, max_retries=5) as client:
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

    text = _scrape(stack)
    requests = "taskfleet_gateway_requests_total"
    assert _metric(text, requests, task=unplaced, code="NOT_PLACED", status="503") == 1.0
    assert _metric(text, requests, task=no_worker, code="NO_WORKER", status="503") == 1.0
    assert _metric(text, requests, task=queued, code="DEADLINE_EXCEEDED", status="504") == 1.0
    # The abandoned request still waits in the queue, undelivered; one live worker serves it.
    # No worker created the task's consumer, and the gateway does not: it waits in the stream.
    assert not stack.loop.run(consumer_exists(stack.nats_url, queued))
    assert stack.loop.run(stream_messages(stack.nats_url, queued)) == 1
    assert _metric(text, "taskfleet_queue_pending", task=queued) == 1.0
    assert _metric(text, "taskfleet_queue_ack_pending", task=queued) == 0.0
    assert _metric(text, "taskfleet_fleet_live_workers", task=queued) == 1.0
    assert "taskfleet_queue_up 1.0" in text
    assert not math.isnan(_metric(text, "taskfleet_queue_pending", task=queued))


def test_token_bucket_charges_each_request_its_cost() -> None:
    clock = FakeClock()
    quotas = Quotas(clock)
    assert quotas.take("k", 100.0, 300, cost=200) == 0.0
    assert quotas.take("k", 100.0, 300, cost=200) == pytest.approx(1.0)  # 100 left, 100 short
    clock.now += 1.0
    assert quotas.take("k", 100.0, 300, cost=200) == 0.0
    # A request above the bucket's size could never pass, however long it waits.
    assert quotas.take("k", 100.0, 300, cost=301) == math.inf
    assert quotas.take("k", 100.0, None, cost=101) == math.inf  # the size is a second of rate


def test_a_keys_token_quota_is_charged_by_estimated_tokens(stack: Stack) -> None:
    """100 estimated tokens/s, 500 at once: a request costs a quarter of its characters per
    text; one costing more than 500 is refused with 413, one over what is left with 429."""
    task = stack.task()
    peer = stack.responder(task)
    _, token = stack.registry.create_api_key(
        "tokened", roles=["caller"], token_rate_per_s=100, token_burst=500
    )
    _, other = stack.registry.create_api_key("bystander", roles=["caller"])
    stack.sync()

    def post(texts: list[str], key: str) -> httpx.Response:
        return httpx.post(
            f"{stack.url}/v1/tasks/{task}",
            content=msgpack.packb({"inputs": texts}),
            headers={**MSGPACK, "Authorization": f"Bearer {key}"},
            timeout=HTTP_TIMEOUT_S,
        )

    try:
        # 600 estimated tokens (3 x 800 characters / 4): above the burst, so never.
        never = post(["x" * 800] * 3, token)
        assert never.status_code == 413, never.text
        error = never.json()["error"]
        assert error["code"] == "PAYLOAD_TOO_LARGE" and error["retryable"] is False
        assert "600 tokens" in error["message"] and "500" in error["message"]
        # 400 tokens pass, the next 400 find ~100 left: 429 with the wait for 300 more.
        assert post(["y" * 800, "z" * 800], token).status_code == 200
        over = post(["y" * 800, "z" * 800], token)
        assert over.status_code == 429, over.text
        assert over.json()["error"]["code"] == "RATE_LIMITED"
        assert 2 <= int(over.headers["Retry-After"]) <= 4
        # Small requests of the same key still fit what is left; other keys are not charged.
        assert post(["kurz"], token).status_code == 200
        assert [post(["y" * 800] * 4, other).status_code for _ in range(3)] == [200] * 3
        assert len(peer.seen_payloads) == 5  # the refused requests never reached the queue

        text = _scrape(stack)
        limited = "taskfleet_gateway_rate_limited_total"
        assert _metric(text, limited, key="tokened", quota="tokens") == 1.0
        assert _metric(text, "taskfleet_gateway_estimated_tokens_total", key="tokened") == 401
        assert _metric(text, "taskfleet_gateway_estimated_tokens_total", key="bystander") == 2400
    finally:
        stack.loop.run(peer.stop())


def test_every_queue_message_names_the_callers_key(stack: Stack) -> None:
    """``Tf-Key``: what workers share their batches by; the key's name, never its token."""
    task = stack.task()
    peer = stack.responder(task)
    _, first = stack.registry.create_api_key("first-app", roles=["caller"])
    _, second = stack.registry.create_api_key("second-app", roles=["admin"])
    stack.sync()
    try:
        assert _post(stack, task, first).status_code == 200
        assert _post(stack, task, second).status_code == 200
        assert [h.get("Tf-Key") for h in peer.seen_headers] == ["first-app", "second-app"]
    finally:
        stack.loop.run(peer.stop())


def test_metrics_need_the_scrape_token(stack: Stack) -> None:
    """The figures name every task and key: /metrics answers the scraper only."""
    _, key = stack.registry.create_api_key("curious", roles=["admin"])
    stack.sync()
    url = f"{stack.url}/metrics"
    for headers in ({}, {"Authorization": f"Bearer {key}"}, {"Authorization": "Bearer wrong"}):
        refused = httpx.get(url, headers=headers, timeout=HTTP_TIMEOUT_S)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
        assert "taskfleet_" not in refused.text
    assert "taskfleet_gateway_requests_total" in _scrape(stack)
    # With auth on and no token configured, /metrics is off and says how to turn it on.
    with serve_app(create_gateway(stack.nats_url, GatewaySettings(require_auth=True))) as bare:
        off = httpx.get(
            f"{bare}/metrics", headers={"Authorization": f"Bearer {key}"}, timeout=HTTP_TIMEOUT_S
        )
        assert off.status_code == 403, off.text
        assert "--metrics-token" in off.json()["error"]["message"]
