"""The gateway over real HTTP (uvicorn), a real nats-server and a real SQLite registry.

Success paths are answered by the test-only protocol peer in tests/gateway_fixture.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import msgpack
import numpy as np
import pytest

from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings
from serving.protocol import ErrorInfo, PayloadRef
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import DIMS, Stack, expected_embedding, gateway_stack, stream_messages
from tests.nats_fixture import running_nats

MAX_BODY = 4 * 1024 * 1024
MSGPACK = {"Content-Type": "application/msgpack"}


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(scope="module")
def stack(nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(
        require_auth=False, max_body_bytes=MAX_BODY, default_timeout_s=10, workers_refresh_s=0
    )
    with gateway_stack(nats_server.url, tmp_path_factory.mktemp("gateway"), settings) as built:
        yield built


def post_msgpack(url: str, task: str, body: object, **headers: str) -> httpx.Response:
    data = msgpack.packb(body, use_bin_type=True)
    return httpx.post(
        f"{url}/v1/tasks/{task}",
        content=data,
        headers={**MSGPACK, **headers},
        timeout=HTTP_TIMEOUT_S,
    )


def error_of(response: httpx.Response) -> dict[str, object]:
    body: dict[str, dict[str, object]] = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "retryable"}
    return body["error"]


# ----------------------------------------------------------------------------- refusals


def test_unknown_task_is_404(stack: Stack) -> None:
    response = post_msgpack(stack.url, "no-such-task", {"inputs": ["x"]})
    assert response.status_code == 404
    assert error_of(response)["code"] == "NOT_FOUND"


def test_unknown_route_uses_the_error_shape(stack: Stack) -> None:
    response = httpx.get(f"{stack.url}/v1/nothing", timeout=HTTP_TIMEOUT_S)
    assert response.status_code == 404
    assert error_of(response)["code"] == "NOT_FOUND"


def test_unplaced_task_is_503_with_retry_after(stack: Stack) -> None:
    task = stack.task(placed=False)
    response = post_msgpack(stack.url, task, {"inputs": ["x"]})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    error = error_of(response)
    assert error["code"] == "NOT_PLACED" and error["retryable"] is True
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_placed_task_without_a_live_worker_is_503(stack: Stack) -> None:
    task = stack.task()
    other = stack.task(worker=True)  # a live worker, but for another task only
    response = post_msgpack(stack.url, task, {"inputs": ["x"]})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert error_of(response)["code"] == "NO_WORKER"
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0
    assert other != task


BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("broken msgpack", b"\xc1\xc1\xc1", "application/msgpack"),
    ("truncated msgpack", msgpack.packb({"inputs": ["abc"]})[:-2], "application/msgpack"),
    ("broken json", b'{"inputs": [', "application/json"),
    ("empty body", b"", "application/json"),
    ("not a map", json.dumps(["a"]).encode(), "application/json"),
    ("inputs missing", json.dumps({"kind": "query"}).encode(), "application/json"),
    ("inputs a number", json.dumps({"inputs": 3}).encode(), "application/json"),
    ("inputs empty", json.dumps({"inputs": []}).encode(), "application/json"),
    ("empty string", json.dumps({"inputs": ["a", ""]}).encode(), "application/json"),
    ("non-string item", msgpack.packb({"inputs": ["a", 1]}), "application/msgpack"),
    ("bad kind", json.dumps({"inputs": ["a"], "kind": "doc"}).encode(), "application/json"),
    ("unknown field", json.dumps({"inputs": ["a"], "text": "b"}).encode(), "application/json"),
]


@pytest.mark.parametrize(
    ("case", "body", "content_type"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
def test_malformed_requests_are_400_and_never_queued(
    stack: Stack, case: str, body: bytes, content_type: str
) -> None:
    task = stack.task(worker=True)
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=body,
        headers={"Content-Type": content_type},
        timeout=HTTP_TIMEOUT_S,
    )
    assert response.status_code == 400, case
    assert error_of(response)["code"] == "BAD_REQUEST"
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_unsupported_media_type_is_415(stack: Stack) -> None:
    task = stack.task(worker=True)
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=b"hello",
        headers={"Content-Type": "text/plain"},
        timeout=HTTP_TIMEOUT_S,
    )
    assert response.status_code == 415
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_oversize_body_is_413_and_never_queued(stack: Stack) -> None:
    task = stack.task(worker=True)
    response = post_msgpack(stack.url, task, {"inputs": ["x" * (MAX_BODY + 10)]})
    assert response.status_code == 413
    assert error_of(response)["code"] == "PAYLOAD_TOO_LARGE"
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_deadline_passing_is_504(stack: Stack) -> None:
    task = stack.task(worker=True)  # a worker is announced, but nobody pulls
    started = time.monotonic()
    response = post_msgpack(stack.url, task, {"inputs": ["x"]}, **{"X-Taskfleet-Timeout-Ms": "300"})
    assert response.status_code == 504
    assert error_of(response)["code"] == "DEADLINE_EXCEEDED"
    assert 0.3 <= time.monotonic() - started < 5
    # The request did reach the queue: a worker that picks it up late sees the deadline passed.
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 1


def test_bad_timeout_header_is_400(stack: Stack) -> None:
    task = stack.task(worker=True)
    response = post_msgpack(
        stack.url, task, {"inputs": ["x"]}, **{"X-Taskfleet-Timeout-Ms": "soon"}
    )
    assert response.status_code == 400


# ----------------------------------------------------------------------------- success


def test_msgpack_request_gets_msgpack_float32_embeddings(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task, model_key="base-abc+lora-1", epoch=3)
    try:
        texts = ["the first text", "zwei Wörter"]
        before_ms = int(time.time() * 1000)
        response = post_msgpack(
            stack.url, task, {"inputs": texts, "kind": "passage"}, **{"X-Taskfleet-Priority": "5"}
        )
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/msgpack")
        body = msgpack.unpackb(response.content)
        assert (body["count"], body["dims"]) == (2, DIMS)
        assert (body["model_key"], body["epoch"]) == ("base-abc+lora-1", 3)
        vectors = np.frombuffer(body["embeddings"], dtype="<f4").reshape(2, DIMS)
        assert vectors.tolist() == [expected_embedding(t, "passage") for t in texts]
        assert response.headers["X-Taskfleet-Epoch"] == "3"
        assert response.headers["X-Taskfleet-Model"] == "base-abc+lora-1"

        headers = peer.seen_headers[-1]
        request_id = headers["Tf-Request-Id"]
        assert headers["Nats-Msg-Id"] == request_id == response.headers["X-Request-Id"]
        assert headers["Tf-Reply"] == f"_tf.reply.{stack.gateway_id}.{request_id}"
        assert int(headers["Tf-Deadline"]) >= before_ms + 9_000
        assert headers["Tf-Priority"] == "5"
        assert peer.seen_payloads[-1].inputs == texts
        assert peer.seen_payloads[-1].task == task
    finally:
        stack.loop.run(peer.stop())


def test_json_request_gets_json_and_a_single_string_is_one_input(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task)
    try:
        response = httpx.post(
            f"{stack.url}/v1/tasks/{task}", json={"inputs": "one query"}, timeout=HTTP_TIMEOUT_S
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["embeddings"] == [expected_embedding("one query", "query")]
        assert (body["count"], body["dims"], body["epoch"]) == (1, DIMS, 1)
        # Accept overrides the request's format.
        response = post_msgpack(stack.url, task, {"inputs": ["a b"]}, Accept="application/json")
        assert response.json()["embeddings"] == [expected_embedding("a b", "query")]
    finally:
        stack.loop.run(peer.stop())


def test_worker_errors_keep_their_code(stack: Stack) -> None:
    task = stack.task()
    failing = ErrorInfo(code="INFER_FAILED", message="CUDA exploded", retryable=False)
    peer = stack.responder(task, error=failing)
    try:
        response = post_msgpack(stack.url, task, {"inputs": ["x"]})
        assert response.status_code == 502
        assert error_of(response) == {
            "code": "INFER_FAILED",
            "message": "CUDA exploded",
            "retryable": False,
        }
        peer.error = ErrorInfo(code="OUT_OF_MEMORY", message="full", retryable=True)
        response = post_msgpack(stack.url, task, {"inputs": ["x"]})
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) > 0
    finally:
        stack.loop.run(peer.stop())


def duplicate_count(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=HTTP_TIMEOUT_S).text.splitlines():
        if line.startswith("taskfleet_gateway_duplicate_replies_total"):
            return float(line.split()[-1])
    raise AssertionError("duplicate replies counter missing from /metrics")


def test_duplicate_replies_are_dropped(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task, duplicate=True)
    try:
        before = duplicate_count(stack.url)
        for text in ["first", "second text"]:
            response = httpx.post(
                f"{stack.url}/v1/tasks/{task}", json={"inputs": [text]}, timeout=HTTP_TIMEOUT_S
            )
            assert response.json()["embeddings"] == [expected_embedding(text, "query")]
        deadline = time.monotonic() + 5
        while duplicate_count(stack.url) < before + 2:
            assert time.monotonic() < deadline, "the second copies of the replies never arrived"
            time.sleep(0.05)
    finally:
        stack.loop.run(peer.stop())


def test_large_inputs_travel_through_the_object_store(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task)
    try:
        # ~1.5 MB in all, each text within the default per-text limit (32,768 characters)
        texts = [f"{i} " + "lorem ipsum " * 2_500 for i in range(50)]
        response = post_msgpack(stack.url, task, {"inputs": texts})
        assert response.status_code == 200, response.text
        vectors = np.frombuffer(msgpack.unpackb(response.content)["embeddings"], dtype="<f4")
        assert vectors.reshape(50, DIMS).tolist() == [expected_embedding(t, "query") for t in texts]
        inputs = peer.seen_payloads[-1].inputs
        assert isinstance(inputs, PayloadRef)
        assert inputs.ref == response.headers["X-Request-Id"]
        assert not stack.loop.run(_object_exists(stack.nats_url, inputs.ref))
    finally:
        stack.loop.run(peer.stop())


async def _object_exists(nats_url: str, key: str) -> bool:
    import nats
    from nats.js.errors import NotFoundError

    from serving.nats_layout import PAYLOADS_BUCKET

    nc = await nats.connect(nats_url)
    try:
        store = await nc.jetstream().object_store(PAYLOADS_BUCKET)
        try:
            await store.get_info(key)
        except NotFoundError:
            return False
        return True
    finally:
        await nc.close()


def test_openai_client_against_the_gateway(stack: Stack) -> None:
    from openai import OpenAI

    task = stack.task()
    peer = stack.responder(task)
    try:
        client = OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0)
        texts = ["alpha beta", "gamma"]
        result = client.embeddings.create(model=task, input=texts)  # base64 by default
        assert [d.embedding for d in result.data] == [expected_embedding(t, "query") for t in texts]
        assert result.model == task and result.usage.total_tokens > 0
        floats = client.embeddings.create(model=task, input="gamma", encoding_format="float")
        assert floats.data[0].embedding == expected_embedding("gamma", "query")
        response = httpx.post(
            f"{stack.url}/v1/embeddings", json={"model": task, "input": []}, timeout=HTTP_TIMEOUT_S
        )
        assert response.status_code == 400
        response = httpx.post(
            f"{stack.url}/v1/embeddings",
            json={"model": "nope", "input": "x"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert response.status_code == 404
    finally:
        stack.loop.run(peer.stop())


def test_health_readiness_and_metrics(stack: Stack) -> None:
    assert httpx.get(f"{stack.url}/healthz", timeout=HTTP_TIMEOUT_S).status_code == 200
    assert httpx.get(f"{stack.url}/readyz", timeout=HTTP_TIMEOUT_S).json()["nats"] is True
    task = stack.task(placed=False)
    post_msgpack(stack.url, task, {"inputs": ["x"]})
    text = httpx.get(f"{stack.url}/metrics", timeout=HTTP_TIMEOUT_S).text
    line = f'taskfleet_gateway_requests_total{{code="NOT_PLACED",status="503",task="{task}"}} 1.0'
    assert line in text
    assert "taskfleet_gateway_request_seconds_bucket" in text
    assert "taskfleet_gateway_in_flight 0.0" in text
