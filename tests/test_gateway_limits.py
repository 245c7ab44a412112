"""What one caller may ask of a task is bounded at the gateway, before anything is queued.

Over real HTTP (uvicorn), a real nats-server and a real SQLite registry whose task settings
reach the gateway through KV ``directory``: per-text limits in characters (413, per task, the
rerank query and documents apart), a minimum epoch ahead of every placement (refused after a
short wait, never queued), absurd header values (400, never 500), chunked bodies over the limit
(413) and error messages that stay short whatever was sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import msgpack
import pytest

from httpapi.errors import MAX_MESSAGE_CHARS
from registry.limits import DEFAULT_MAX_TEXT_CHARS
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings
from testbed.declared_tasks import add_task, declare_suite
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import Stack, gateway_stack, stream_messages
from tests.nats_fixture import running_nats

MSGPACK = {"Content-Type": "application/msgpack"}
MAX_BODY = 2 * 1024 * 1024
EPOCH_WAIT_S = 3.0


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(scope="module")
def stack(nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(
        require_auth=False,
        max_body_bytes=MAX_BODY,
        default_timeout_s=10,
        workers_refresh_s=0,
        min_epoch_wait_s=EPOCH_WAIT_S,
    )
    with gateway_stack(nats_server.url, tmp_path_factory.mktemp("gateway"), settings) as built:
        yield built


def post(stack: Stack, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(f"{stack.url}{path}", json=body, headers=headers, timeout=30)


def error_of(response: httpx.Response) -> dict[str, object]:
    body: dict[str, dict[str, object]] = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "retryable"}
    return body["error"]


def too_large(response: httpx.Response) -> str:
    assert response.status_code == 413, response.text
    error = error_of(response)
    assert error["code"] == "PAYLOAD_TOO_LARGE" and error["retryable"] is False
    return str(error["message"])


# ----------------------------------------------------------------------- per-text limits


def test_a_text_above_the_default_limit_is_413_and_never_queued(stack: Stack) -> None:
    """The finding: one 30 MB text inside the body limit took a worker down. Now any text above
    the task's limit is refused by the gateway, on every endpoint, naming it and the limit."""
    task = stack.task(worker=True)
    long = "x" * (DEFAULT_MAX_TEXT_CHARS + 1)
    ok = "y" * DEFAULT_MAX_TEXT_CHARS
    for path, body in (
        (f"/v1/tasks/{task}", {"inputs": ["kurz", long]}),
        ("/v1/embeddings", {"model": task, "input": ["kurz", long]}),
    ):
        message = too_large(post(stack, path, body))
        assert f"[1]' has {DEFAULT_MAX_TEXT_CHARS + 1} characters" in message, message
        assert f"at most {DEFAULT_MAX_TEXT_CHARS}" in message and "max_text_chars" in message
    msgpacked = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=msgpack.packb({"inputs": long}),
        headers=MSGPACK,
        timeout=HTTP_TIMEOUT_S,
    )
    assert "'inputs[0]'" in too_large(msgpacked)
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0
    # A text at the limit is taken (and queued: the announced worker never pulls it).
    at_limit = post(
        stack, f"/v1/tasks/{task}", {"inputs": [ok]}, **{"X-Taskfleet-Timeout-Ms": "200"}
    )
    assert at_limit.status_code == 504, at_limit.text
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 1


def test_limits_are_the_tasks_own_and_change_with_the_registry(stack: Stack) -> None:
    declare_suite(stack.registry, "limit-pairs", kind="rerank")
    declare_suite(stack.registry, "limit-areas", kind="classification")
    rank = add_task(
        stack.registry,
        "limit-rank",
        suite="limit-pairs",
        max_query_chars=10,
        max_document_chars=20,
    ).name
    area = add_task(stack.registry, "limit-area", suite="limit-areas", max_text_chars=5).name
    stack.sync()
    query, document = "q" * 11, "d" * 21
    # The rerank query and each document against their own limit, both stock paths alike.
    for path, extra in ((f"/v1/tasks/{rank}", {}), ("/v1/rerank", {"model": rank})):
        message = too_large(post(stack, path, {**extra, "query": query, "documents": ["d"]}))
        assert "'query' has 11 characters" in message and "max_query_chars" in message
        message = too_large(
            post(stack, path, {**extra, "query": "q", "documents": ["d" * 20, document]})
        )
        assert "'documents[1]' has 21 characters" in message and "max_document_chars" in message
    message = too_large(post(stack, "/v1/classify", {"model": area, "input": ["12345", "123456"]}))
    assert "'input[1]' has 6 characters" in message and "at most 5" in message
    # Within them the request goes on (the tasks are not placed: 503, after the limits).
    within = post(stack, f"/v1/tasks/{rank}", {"query": "q" * 10, "documents": ["d" * 20]})
    assert (within.status_code, error_of(within)["code"]) == (503, "NOT_PLACED")

    # A change reaches the gateway through the directory, never through the database.
    changed = stack.registry.set_task_limits(area, max_text_chars=6)
    assert (changed.max_text_chars, changed.max_query_chars) == (6, 8_192)
    stack.sync()
    taken = post(stack, f"/v1/tasks/{area}", {"inputs": ["123456"]})
    assert (taken.status_code, error_of(taken)["code"]) == (503, "NOT_PLACED")


# ----------------------------------------------------------------------- the epoch fence


def test_a_min_epoch_ahead_of_the_placement_is_refused_at_the_gateway(stack: Stack) -> None:
    """The finding: `X-Taskfleet-Min-Epoch: 999999` made every other caller of the task fail
    for ~50 s, its message held by a worker. Now the gateway refuses it after a short wait for
    the placement to arrive, and nothing reaches the queue."""
    task = stack.task(worker=True)
    began = time.monotonic()
    refused = post(
        stack, f"/v1/tasks/{task}", {"inputs": ["x"]}, **{"X-Taskfleet-Min-Epoch": "999999"}
    )
    took = time.monotonic() - began
    assert refused.status_code == 503, refused.text
    error = error_of(refused)
    assert error["code"] == "NOT_READY" and error["retryable"] is True
    assert "999999" in str(error["message"]) and "epoch 1" in str(error["message"])
    assert int(refused.headers["Retry-After"]) >= 1
    assert EPOCH_WAIT_S <= took < EPOCH_WAIT_S + 5, took
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_a_min_epoch_waits_for_a_converging_placement(stack: Stack) -> None:
    """A caller that saw epoch 2 through another gateway waits here while this one's watch
    catches up with the promotion, then is served (stamped with epoch 2)."""
    task = stack.task()
    peer = stack.responder(task, epoch=2)
    try:
        answer: list[httpx.Response] = []
        caller = threading.Thread(
            target=lambda: answer.append(
                post(
                    stack, f"/v1/tasks/{task}", {"inputs": ["x"]}, **{"X-Taskfleet-Min-Epoch": "2"}
                )
            )
        )
        caller.start()
        time.sleep(EPOCH_WAIT_S / 6)
        stack.registry.update_placement(task, replicas=2)  # the next epoch: 2
        stack.sync()
        caller.join(timeout=30)
        assert answer and answer[0].status_code == 200, answer and answer[0].text
        assert [h.get("Tf-Min-Epoch") for h in peer.seen_headers] == ["2"]
        # No key without auth: the header that workers share batches by is absent.
        assert "Tf-Key" not in peer.seen_headers[0]
    finally:
        stack.loop.run(peer.stop())


# ----------------------------------------------------------------------- edges


ABSURD_HEADERS = [
    ("X-Taskfleet-Timeout-Ms", "9" * 401),  # a 500 before: int -> float overflow
    ("X-Taskfleet-Timeout-Ms", "-5"),
    ("X-Taskfleet-Timeout-Ms", "0"),
    ("X-Taskfleet-Timeout-Ms", "1_000"),
    ("X-Taskfleet-Timeout-Ms", "+5"),
    ("X-Taskfleet-Timeout-Ms", "2147483648"),
    ("X-Taskfleet-Priority", "9" * 401),
    ("X-Taskfleet-Priority", "high"),
    ("X-Taskfleet-Priority", "-" + "9" * 30),
    ("X-Taskfleet-Min-Epoch", "-1"),
    ("X-Taskfleet-Min-Epoch", "9" * 401),
    ("X-Taskfleet-Min-Epoch", "1e3"),
]


@pytest.mark.parametrize(("header", "value"), ABSURD_HEADERS)
def test_absurd_header_values_are_400(stack: Stack, header: str, value: str) -> None:
    task = stack.task(worker=True)
    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}",
        content=msgpack.packb({"inputs": ["x"]}),
        headers={**MSGPACK, header: value},
        timeout=HTTP_TIMEOUT_S,
    )
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "BAD_REQUEST" and header in str(error["message"])
    assert len(str(error["message"])) < 300
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_sane_header_values_pass(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task)
    try:
        headers = {
            "X-Taskfleet-Timeout-Ms": "900000",  # above the 300 s cap: capped, not refused
            "X-Taskfleet-Priority": "-3",
            "X-Taskfleet-Min-Epoch": "0",
        }
        response = post(stack, f"/v1/tasks/{task}", {"inputs": ["x"]}, **headers)
        assert response.status_code == 200, response.text
        sent = peer.seen_headers[-1]
        assert sent["Tf-Priority"] == "-3"
        deadline_in_s = int(sent["Tf-Deadline"]) / 1000 - time.time()
        assert 250 < deadline_in_s <= 300
    finally:
        stack.loop.run(peer.stop())


def test_a_chunked_body_over_the_limit_is_413(stack: Stack) -> None:
    task = stack.task(worker=True)

    def chunks() -> Iterator[bytes]:
        piece = b"x" * 65536
        for _ in range(MAX_BODY // len(piece) + 4):
            yield piece

    response = httpx.post(
        f"{stack.url}/v1/tasks/{task}", content=chunks(), headers=MSGPACK, timeout=30
    )
    assert "content-length" not in {k.lower() for k in response.request.headers}
    message = too_large(response)
    assert str(MAX_BODY) in message
    assert stack.loop.run(stream_messages(stack.nats_url, task)) == 0


def test_error_messages_stay_short_whatever_was_sent(stack: Stack) -> None:
    task = stack.task(worker=True)
    many_fields = {"inputs": ["x"], **{f"field-{i:06d}" * 4: 1 for i in range(20_000)}}
    long_model = "m" * 1_000_000
    cases = [
        post(stack, f"/v1/tasks/{task}", many_fields),  # the unknown-field error echoed 2.6 MB
        post(stack, "/v1/embeddings", {"model": long_model, "input": "x"}),  # 404 names it
        post(stack, f"/v1/tasks/{task}", {"inputs": ["x"], "kind": "k" * 100_000}),
        post(
            stack, "/v1/embeddings", {"model": task, "input": "x", "encoding_format": "e" * 10**5}
        ),
    ]
    for response in cases:
        assert response.status_code in (400, 404), response.text[:300]
        assert len(str(error_of(response)["message"])) <= MAX_MESSAGE_CHARS + 40
        assert len(response.content) < 2 * MAX_MESSAGE_CHARS
    assert "and 19995 more" in str(error_of(cases[0])["message"])
