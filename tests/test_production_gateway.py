"""Sampling and feedback at the gateway, over real HTTP, a real nats-server and a real registry
(the worker side is the protocol peer of tests/gateway_fixture.py; the sidecar's side is
tests/test_e2e_production.py): what a sampled request leaves in streams SAMPLES and SHADOW,
that ``--sample 0`` leaves nothing, that feedback is taken once and only within the retention,
and each refusal in the one error shape."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from serving import nats_layout
from serving import protocol as p
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings
from serving.sample_records import decode_feedback, decode_sample
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import Stack, beat, gateway_stack
from tests.nats_fixture import running_nats
from tests.test_registry import make_model_dir


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with running_nats(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def stack(nats_server: EmbeddedNats, tmp_path: Path) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=True, default_timeout_s=10, workers_refresh_s=0)
    with gateway_stack(nats_server.url, tmp_path, settings) as built:
        yield built


async def _stream(url: str, stream: str, subjects: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """Every message of ``stream`` on ``subjects`` (subject, data, headers)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream, subjects_filter=subjects)
        found = []
        for subject in sorted(info.state.subjects or {}):
            message = await js.get_last_msg(stream, subject)
            found.append((subject, message.data or b"", dict(message.headers or {})))
        return found
    finally:
        await nc.close()


def _shadow(stack: Stack, task: str) -> None:
    """A second candidate of the task as its shadow, held by a (test) worker."""
    reg = stack.registry
    reg.add_model(f"s-{task}", path=make_model_dir(stack.tmp / f"s-{task}", b"shadow"))
    reg.add_candidate(task, name="s", base=f"s-{task}")
    reg.start_shadow(task, "s", sample_rate=1.0)

    async def hold() -> None:
        nc = await nats.connect(stack.nats_url)
        try:
            layout = await nats_layout.ensure_layout(nc.jetstream())
            await beat(layout, f"shadow-{task}", nats_layout.shadow_key(task))
        finally:
            await nc.close()

    stack.loop.run(hold())


def test_a_sampled_request_is_kept_copied_to_the_shadow_and_takes_feedback_once(
    stack: Stack,
) -> None:
    task = stack.task(worker=True)
    peer = stack.responder(task)
    reg = stack.registry
    _shadow(stack, task)
    reg.set_production_settings(task, retention_days=1 / 24)
    mine = reg.create_api_key("app", roles=["caller"], tasks=[task])[1]
    theirs = reg.create_api_key("elsewhere", roles=["caller"], tasks=["other"])[1]
    stack.sync()
    auth = {"Authorization": f"Bearer {mine}"}
    try:
        ids = []
        for n in range(4):
            r = httpx.post(
                f"{stack.url}/v1/tasks/{task}",
                json={"inputs": [f"frage {n}", "zweite frage"]},
                headers={**auth, "Accept": "application/json"},
                timeout=HTTP_TIMEOUT_S,
            )
            assert r.status_code == 200 and r.headers["X-Taskfleet-Sampled"] == "1", r.text
            ids.append(r.headers["X-Request-Id"])
        passage = httpx.post(
            f"{stack.url}/v1/tasks/{task}",
            json={"inputs": ["ein absatz"], "kind": "passage"},
            headers=auth,
            timeout=HTTP_TIMEOUT_S,
        ).headers["X-Request-Id"]

        kept = stack.loop.run(_stream(stack.nats_url, "SAMPLES", f"samples.{task}.>"))
        assert len(kept) == 5
        for subject, data, headers in kept:
            record = decode_sample(data)
            assert subject == f"samples.{task}.{record.request_id}.champion"
            assert headers["Nats-TTL"] == "3600s"  # the task's retention
            assert (record.candidate, record.shadow, record.key) == (f"m-{task}", "s", "app")
            reply = record.answer()
            assert isinstance(reply, p.ReplyOk) and reply.count == len(record.inputs().inputs)
        copies = stack.loop.run(_stream(stack.nats_url, "SHADOW", f"shadow.{task}"))
        assert len(copies) == 1  # one subject: its newest copy, the passage request's
        _, data, headers = copies[0]
        assert headers["Tf-Reply"] == f"samples.{task}.{passage}.shadow"
        assert "Tf-Min-Epoch" not in headers
        deadline_in = int(headers["Tf-Deadline"]) - time.time() * 1000
        assert 0 < deadline_in <= 2000  # a copy that cannot run soon is shed, not queued
        assert p.decode_task_payload(p.unpack(data)).task == task

        def feedback(body: dict[str, object], key: str = mine) -> httpx.Response:
            return httpx.post(
                f"{stack.url}/v1/feedback",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=HTTP_TIMEOUT_S,
            )

        first = feedback({"request_id": ids[0], "relevant_ids": ["d1", "d2"], "index": 1})
        assert first.status_code == 202, first.text
        assert first.json() == {
            "status": "accepted", "request_id": ids[0], "task": task, "index": 1
        }  # fmt: skip
        refusals = [
            ({"request_id": ids[0], "relevant_ids": ["d3"], "index": 1}, mine, 409),
            ({"request_id": ids[1], "relevant_ids": ["d1"], "index": 2}, mine, 400),
            ({"request_id": ids[1], "label": "x"}, mine, 400),
            ({"request_id": ids[1], "relevant": [0]}, mine, 400),
            ({"request_id": passage, "relevant_ids": ["d1"]}, mine, 400),
            ({"request_id": ids[1], "relevant_ids": ["d1"]}, theirs, 403),
            ({"request_id": "0" * 32, "relevant_ids": ["d1"]}, mine, 404),
            ({"request_id": "a.b", "relevant_ids": ["d1"]}, mine, 400),
            ({"request_id": ids[1], "relevant_ids": ["d1"], "label": "x"}, mine, 400),
            ({"request_id": ids[1], "relevant_ids": ["d1"], "colour": "red"}, mine, 400),
        ]
        for body, key, status in refusals:
            r = feedback(body, key)
            assert r.status_code == status, (body, r.text)
            assert set(r.json()["error"]) == {"code", "message", "retryable"}
        assert feedback({"request_id": ids[1], "relevant_ids": ["d1"]}).status_code == 202
        recorded = stack.loop.run(_stream(stack.nats_url, "FEEDBACK", f"feedback.{task}.>"))
        assert sorted(s for s, _, _ in recorded) == sorted(
            [f"feedback.{task}.{ids[0]}.1", f"feedback.{task}.{ids[1]}.0"]
        )
        said = decode_feedback(recorded[0][1] if ids[0] in recorded[0][0] else recorded[1][1])
        assert (said.relevant_ids, said.index, said.key) == (["d1", "d2"], 1, "app")
    finally:
        stack.loop.run(peer.stop())


def test_sample_zero_keeps_nothing_and_feedback_ends_with_the_retention(stack: Stack) -> None:
    task = stack.task(worker=True)
    peer = stack.responder(task)
    reg = stack.registry
    key = reg.create_api_key("app", roles=["caller"], tasks=[task])[1]
    auth = {"Authorization": f"Bearer {key}"}
    stack.sync()
    try:
        for n in range(5):  # no sample rate set: the default, 0
            r = httpx.post(
                f"{stack.url}/v1/tasks/{task}",
                json={"inputs": [f"q{n}"]},
                headers=auth,
                timeout=HTTP_TIMEOUT_S,
            )
            assert r.status_code == 200 and "X-Taskfleet-Sampled" not in r.headers
        assert stack.loop.run(_stream(stack.nats_url, "SAMPLES", f"samples.{task}.>")) == []

        reg.set_production_settings(task, sample_rate=1.0, retention_days=2 / 86400)  # 2 s
        stack.sync()
        r = httpx.post(
            f"{stack.url}/v1/tasks/{task}",
            json={"inputs": ["spät"]},
            headers=auth,
            timeout=HTTP_TIMEOUT_S,
        )
        request_id = r.headers["X-Request-Id"]
        assert r.headers["X-Taskfleet-Sampled"] == "1"
        time.sleep(3.5)  # the stream deletes the sampled inputs with their TTL
        assert stack.loop.run(_stream(stack.nats_url, "SAMPLES", f"samples.{task}.>")) == []
        late = httpx.post(
            f"{stack.url}/v1/feedback",
            json={"request_id": request_id, "relevant_ids": ["d1"]},
            headers=auth,
            timeout=HTTP_TIMEOUT_S,
        )
        assert (late.status_code, late.json()["error"]["code"]) == (404, "UNKNOWN_REQUEST")
    finally:
        stack.loop.run(peer.stop())


def test_the_feedback_stream_keeps_the_first_message_per_input() -> None:
    """The rule the gateway's 409 relies on, on the stream as the layout creates it."""

    async def run(url: str) -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await nats_layout.ensure_layout(js)
            subject = nats_layout.feedback_subject("t", "r1", 0)
            await js.publish(subject, b"first")
            with pytest.raises(nats.js.errors.APIError) as refused:
                await js.publish(subject, b"second")
            assert refused.value.err_code == 10077
            assert (await js.get_last_msg(nats_layout.FEEDBACK_STREAM, subject)).data == b"first"
        finally:
            await nc.close()

    with EmbeddedNats() as server:
        asyncio.run(run(server.url))
