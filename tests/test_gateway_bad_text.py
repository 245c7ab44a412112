"""Bad text in any input decoder is a 400, never a 500: lone surrogates in JSON (which
``json.loads`` accepts but UTF-8 cannot carry) and invalid UTF-8 in msgpack strings. Nothing
reaches the queue."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgpack
import pytest

from serving.gateway import GatewaySettings
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import Stack, nats_and_gateway, stream_messages

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=False, default_timeout_s=5, workers_refresh_s=0)
    with nats_and_gateway(tmp_path_factory, settings) as built:
        yield built


def _assert_bad_request(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST" and error["retryable"] is False


@pytest.mark.parametrize(
    "raw",
    [
        b'{"inputs": ["a\\ud800b"]}',
        b'{"inputs": "\\udfff"}',
        b'{"inputs": ["ok", "x\\udc80"], "kind": "passage"}',
        b'{"inputs": ["ok"], "kind": "\\ud800"}',
    ],
)
def test_lone_surrogate_in_json_task_body_is_400(stack: Stack, raw: bytes) -> None:
    task = stack.task(worker=True)
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}", content=raw, headers=JSON, timeout=HTTP_TIMEOUT_S
    )
    _assert_bad_request(response)
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_lone_surrogate_in_openai_body_is_400(stack: Stack) -> None:
    task = stack.task(worker=True)
    raw = b'{"model": "%s", "input": ["fine", "bad \\ud83d"]}' % task.encode()
    response = httpx.post(
        f"{stack.url}/v1/embeddings", content=raw, headers=JSON, timeout=HTTP_TIMEOUT_S
    )
    _assert_bad_request(response)
    raw = b'{"model": "%s\\ud800", "input": "x"}' % task.encode()
    response = httpx.post(
        f"{stack.url}/v1/embeddings", content=raw, headers=JSON, timeout=HTTP_TIMEOUT_S
    )
    assert response.status_code in (400, 404), response.text
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_invalid_utf8_in_msgpack_string_is_400(stack: Stack) -> None:
    task = stack.task(worker=True)
    # A msgpack str (fixstr, 3 bytes) holding bytes that are not UTF-8.
    body = b"\x81\xa6inputs\x91\xa3a\xffb"
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=body,
        headers={"Content-Type": "application/msgpack"},
        timeout=HTTP_TIMEOUT_S,
    )
    _assert_bad_request(response)
    # A surrogate smuggled into msgpack as "UTF-8" (CESU-style) is invalid UTF-8 too.
    body = msgpack.packb({"inputs": ["a"]}).replace(b"\xa1a", b"\xa3\xed\xa0\x80")
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=body,
        headers={"Content-Type": "application/msgpack"},
        timeout=HTTP_TIMEOUT_S,
    )
    _assert_bad_request(response)
