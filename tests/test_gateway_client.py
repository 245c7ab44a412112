"""serving.client (sync and async) and API-key checks, against a served gateway on real NATS."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from serving.client import (
    AsyncClient,
    AuthError,
    BadRequest,
    Client,
    Unavailable,
    UnknownTask,
)
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings
from tests.gateway_fixture import Responder, Stack, expected_embedding, gateway_stack
from tests.nats_fixture import running_nats

RETRY_AFTER_S = 1


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture(scope="module")
def open_stack(
    nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=False, retry_after_s=RETRY_AFTER_S, workers_refresh_s=0)
    with gateway_stack(nats_server.url, tmp_path_factory.mktemp("open"), settings) as built:
        yield built


@pytest.fixture(scope="module")
def auth_stack(
    nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=True, workers_refresh_s=0)
    with gateway_stack(nats_server.url, tmp_path_factory.mktemp("auth"), settings) as built:
        yield built


def expected(texts: list[str], kind: str = "query") -> np.ndarray:
    return np.array([expected_embedding(t, kind) for t in texts], dtype=np.float32)


def test_sync_client_returns_vectors_and_what_served_them(open_stack: Stack) -> None:
    task = open_stack.task()
    peer = open_stack.responder(task, model_key="m1", epoch=4)
    try:
        with Client(open_stack.url) as client:
            texts = ["ein Satz", "noch ein längerer Satz"]
            vectors = client.embed(task, texts, kind="passage")
            assert vectors.dtype == np.float32
            np.testing.assert_array_equal(vectors, expected(texts, "passage"))
            info = client.embed_with_info(task, "one")
            assert (info.model_key, info.epoch) == ("m1", 4)
            assert info.request_id == peer.seen_headers[-1]["Tf-Request-Id"]
    finally:
        open_stack.loop.run(peer.stop())


def test_async_client_shares_the_behaviour(open_stack: Stack) -> None:
    task = open_stack.task()
    peer = open_stack.responder(task)

    async def call() -> np.ndarray:
        async with AsyncClient(open_stack.url) as client:
            return await client.embed(task, ["a", "b c"])

    try:
        np.testing.assert_array_equal(asyncio.run(call()), expected(["a", "b c"]))
    finally:
        open_stack.loop.run(peer.stop())


def test_client_raises_precise_errors(open_stack: Stack) -> None:
    with Client(open_stack.url, max_retries=0) as client:
        with pytest.raises(UnknownTask) as unknown:
            client.embed("no-such-task", ["x"])
        assert unknown.value.status == 404
        with pytest.raises(BadRequest):
            client.embed(open_stack.task(worker=True), [])
        with pytest.raises(Unavailable) as unavailable:
            client.embed(open_stack.task(placed=False), ["x"])
        assert unavailable.value.code == "NOT_PLACED"
        assert unavailable.value.retry_after_s == RETRY_AFTER_S


def test_client_retries_503_after_retry_after(open_stack: Stack) -> None:
    task = open_stack.task()  # placed, but no worker yet
    peers: list[Responder] = []

    def worker_arrives() -> None:
        time.sleep(0.5)
        peers.append(open_stack.responder(task))

    arrival = threading.Thread(target=worker_arrives)
    started = time.monotonic()
    arrival.start()
    try:
        with Client(open_stack.url, max_retries=5) as client:
            vectors = client.embed(task, ["late"])
        np.testing.assert_array_equal(vectors, expected(["late"]))
        # The first answer was a 503; the client waited Retry-After before asking again.
        assert time.monotonic() - started >= RETRY_AFTER_S
    finally:
        arrival.join()
        for peer in peers:
            open_stack.loop.run(peer.stop())


def test_api_keys_are_checked(auth_stack: Stack) -> None:
    task = auth_stack.task()
    other = auth_stack.task()
    registry = auth_stack.registry
    _, caller = registry.create_api_key("app", roles=["caller"], tasks=[task])
    _, viewer = registry.create_api_key("looker", roles=["viewer"])
    _, elsewhere = registry.create_api_key("other-app", roles=["caller"], tasks=[other])
    auth_stack.sync()
    peer = auth_stack.responder(task)
    try:
        for key, status in [(None, 401), ("tfk_nope_nope", 401), (viewer, 403), (elsewhere, 403)]:
            with Client(auth_stack.url, api_key=key, max_retries=0) as client:
                with pytest.raises(AuthError) as refused:
                    client.embed(task, ["x"])
                assert refused.value.status == status, key
        with Client(auth_stack.url, api_key=caller) as client:
            np.testing.assert_array_equal(client.embed(task, ["x"]), expected(["x"]))
        registry.revoke_api_key("app")
        auth_stack.sync()
        with Client(auth_stack.url, api_key=caller) as client, pytest.raises(AuthError):
            client.embed(task, ["x"])
    finally:
        auth_stack.loop.run(peer.stop())


def test_openai_client_sends_its_api_key(auth_stack: Stack) -> None:
    from openai import AuthenticationError, OpenAI

    task = auth_stack.task()
    _, token = auth_stack.registry.create_api_key("openai-app", roles=["caller"])
    auth_stack.sync()
    peer = auth_stack.responder(task)
    try:
        client = OpenAI(base_url=f"{auth_stack.url}/v1", api_key=token, max_retries=0)
        result = client.embeddings.create(model=task, input="hallo welt")
        assert result.data[0].embedding == expected_embedding("hallo welt", "query")
        wrong = OpenAI(base_url=f"{auth_stack.url}/v1", api_key="tfk_x_y", max_retries=0)
        with pytest.raises(AuthenticationError):
            wrong.embeddings.create(model=task, input="x")
    finally:
        auth_stack.loop.run(peer.stop())


def test_call_command_prints_shape_norms_and_what_served(open_stack: Stack) -> None:
    import typer
    from typer.testing import CliRunner

    from taskfleet.cli_gateway import call

    app = typer.Typer()
    app.command()(call)
    task = open_stack.task()
    peer = open_stack.responder(task, model_key="base+lora", epoch=7)
    try:
        args = [task, "--text", "one two", "--text", "three", "--url", open_stack.url]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "2 x 4 float32" in result.output
        assert "base+lora" in result.output and "epoch 7" in result.output
        norm = float(np.linalg.norm(expected_embedding("three", "query")))
        assert f"{norm:.4f}" in result.output
        unknown = CliRunner().invoke(app, ["no-such-task", "-t", "x", "--url", open_stack.url])
        assert unknown.exit_code == 1
        assert "404 NOT_FOUND" in unknown.output and "Traceback" not in unknown.output
    finally:
        open_stack.loop.run(peer.stop())
