"""Requests at the documented limit (2048 inputs) are answered through every public format.

A 2048 x 384 float32 reply is 3 MiB, three times NATS's default ``max_payload``: the worker must
move it through the object store, never drop it. Each answer is checked row by row against the
in-process vectors of its texts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import nats
import numpy as np
import pytest
from nats.js.api import DiscardPolicy

from serving import nats_layout
from testbed.declared_tasks import declare_suite
from testbed.faults.counting import PROTOCOLS, Call, CountingClient, Protocol
from testbed.faults.reference import Reference
from testbed.faults.scenarios import serve
from testbed.fleet import LocalFleet, register_served_task, unique_task
from testbed.tiny_model import build_tiny_head, build_tiny_model

LIMIT = 2048
# Generous: on a shared 2-core machine one 2048-text batch can take tens of seconds.
DEADLINE_MS = 180_000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with LocalFleet(tmp_path_factory.mktemp("limits"), workers=1) as stack:
        yield stack


def limit_texts(n: int = LIMIT) -> list[str]:
    return [f"anfrage {i} zum mietvertrag und der frist {i % 13}" for i in range(n)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_2048_inputs_of_384_dims_are_answered(
    fleet: LocalFleet, wide_model_path: Path, protocol: Protocol
) -> None:
    reference = Reference(wide_model_path)
    texts = limit_texts()
    reference.prepare(texts)
    task = serve(fleet, wide_model_path)

    async def run() -> None:
        async with CountingClient(fleet.gateway_url, task, reference, retry_budget_s=240) as client:
            record = await client.call(Call(texts, protocol=protocol, timeout_ms=DEADLINE_MS))
        assert record.outcome == "answered", (record, fleet.logs())

    asyncio.run(run())


def test_the_openai_package_gets_2048_vectors_in_one_call(
    fleet: LocalFleet, wide_model_path: Path
) -> None:
    """What the issue saw fail: the stock client (no retries) sends more than 682 texts."""
    import openai

    reference = Reference(wide_model_path)
    texts = limit_texts()
    reference.prepare(texts)
    task = serve(fleet, wide_model_path)
    client = openai.OpenAI(
        base_url=f"{fleet.gateway_url}/v1", api_key="unused", max_retries=0, timeout=240
    )
    response = client.embeddings.create(model=task, input=texts)
    got = np.asarray([d.embedding for d in sorted(response.data, key=lambda d: d.index)])
    assert reference.matches(texts, got.astype(np.float32))


def test_2048_inputs_of_1024_dims_are_answered(fleet: LocalFleet, wider_model_path: Path) -> None:
    """8 MiB of float32 per reply (11 MiB as OpenAI's base64): the same path, twice as wide."""
    reference = Reference(wider_model_path)
    texts = limit_texts()
    reference.prepare(texts, "passage")
    task = serve(fleet, wider_model_path)

    async def run() -> None:
        async with CountingClient(fleet.gateway_url, task, reference, retry_budget_s=240) as client:
            calls = [
                Call(texts, kind="passage", protocol=p, timeout_ms=DEADLINE_MS)
                for p in ("msgpack", "openai")
            ]
            tally = await client.run_all(calls, concurrency=2)
        assert tally.answered == 2, (tally.summary(), tally.records)

    asyncio.run(run())


async def _limit_payloads(url: str, max_bytes: int | None) -> None:
    """Make the payloads bucket refuse objects above ``max_bytes`` (None: lift the limit)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(f"OBJ_{nats_layout.PAYLOADS_BUCKET}")
        config = info.config
        config.max_bytes = max_bytes if max_bytes is not None else -1
        config.discard = DiscardPolicy.NEW if max_bytes is not None else DiscardPolicy.OLD
        await js.update_stream(config)
    finally:
        await nc.close()


async def _dead_letters(url: str, task: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(
            nats_layout.DLQ_STREAM, subjects_filter=nats_layout.dlq_subject(task)
        )
        return int((info.state.subjects or {}).get(nats_layout.dlq_subject(task), 0))
    finally:
        await nc.close()


def test_a_reply_that_cannot_be_sent_is_an_error_and_a_dead_letter(
    fleet: LocalFleet, wide_model_path: Path
) -> None:
    """Above max_payload with the object store refusing the embeddings: the caller hears
    REPLY_UNDELIVERABLE at once (no deadline wait) and the request is in the DLQ for replay."""
    task = serve(fleet, wide_model_path)
    assert fleet.nats is not None
    asyncio.run(_limit_payloads(fleet.nats.url, 256 * 1024))
    try:
        texts = limit_texts(700)  # 700 x 384 float32 = 1.03 MiB: just above max_payload
        body = msgpack.packb({"inputs": texts}, use_bin_type=True)
        response = httpx.post(
            f"{fleet.gateway_url}/v1/tasks/{task}",
            content=body,
            headers={"Content-Type": "application/msgpack", "X-Taskfleet-Timeout-Ms": "180000"},
            timeout=200,
        )
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "REPLY_UNDELIVERABLE" and error["retryable"] is False
        assert asyncio.run(_dead_letters(fleet.nats.url, task)) == 1
        text = fleet.sidecar_metrics()
        assert f'taskfleet_sidecar_reply_failures_total{{task="{task}"}} 1' in text
        dead = f'taskfleet_sidecar_dead_letters_total{{task="{task}",code="REPLY_UNDELIVERABLE"}} 1'
        assert dead in text
    finally:
        asyncio.run(_limit_payloads(fleet.nats.url, None))


def test_a_classification_reply_above_max_payload_comes_through_the_object_store(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """2048 texts x 160 labels of float32 probabilities is 1.25 MiB: a classify reply takes the
    embeddings' path (object-store reference), and every probability equals the in-process
    classifier's. (A rerank reply holds one float32 per document, at most 8 KiB.)"""
    from evals.classifiers import ModelClassifier
    from serving.runtime.model_folder import ModelSpec

    base = build_tiny_model(tmp_path / "base", seed=31)
    labels = tuple(f"label-{i:03d}" for i in range(160))
    head = build_tiny_head(base, tmp_path / "head", labels=labels, seed=32, lora=False)
    task = unique_task("wide-classify")
    declare_suite(fleet.reg, f"{task}-suite", kind="classification")
    placement = register_served_task(
        fleet.reg, task, base, pinned=True, adapter_dir=head, suite=f"{task}-suite"
    )
    fleet.serving(task, placement.epoch)
    texts = limit_texts()
    response = httpx.post(
        f"{fleet.gateway_url}/v1/tasks/{task}",
        content=msgpack.packb({"inputs": texts}, use_bin_type=True),
        headers={"Content-Type": "application/msgpack", "X-Taskfleet-Timeout-Ms": "180000"},
        timeout=200,
    )
    assert response.status_code == 200, (response.text, fleet.logs())
    answer = msgpack.unpackb(response.content)
    assert answer["labels"] == list(labels) and answer["count"] == len(texts)
    got = np.frombuffer(answer["probabilities"], dtype="<f4").reshape(len(texts), len(labels))
    expected = ModelClassifier(ModelSpec(base, head)).classifier().predict_proba(texts)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    offloads = f'taskfleet_sidecar_reply_offloads_total{{task="{task}"}} 1'
    assert offloads in fleet.sidecar_metrics()


def test_a_rerank_request_of_2048_long_documents_is_answered_and_2049_refused(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    """2048 documents of ~600 characters are 1.2 MiB of request, above NATS's max_payload: the
    gateway must move the inputs through the object store, and every score equals the
    in-process cross-encoder's. One document more is a 400 on the native route and on the
    Cohere-shape route, and nothing is queued for it."""
    from evals.rerankers import CrossEncoderReranker
    from serving.client import Client, TaskfleetError
    from serving.runtime.model_folder import ModelSpec

    base = build_tiny_model(tmp_path / "base", seed=41)
    head = build_tiny_head(base, tmp_path / "ce", kind="score", seed=42)
    task = unique_task("wide-rerank")
    declare_suite(fleet.reg, f"{task}-suite", kind="rerank")
    placement = register_served_task(
        fleet.reg, task, base, pinned=True, adapter_dir=head, suite=f"{task}-suite"
    )
    fleet.serving(task, placement.epoch)
    query = "wie lange gilt die kündigungsfrist für eine mietwohnung"
    documents = [
        f"§ {i} BGB absatz {i % 7}: " + " ".join(f"wort{(i * 31 + j) % 997}" for j in range(70))
        for i in range(LIMIT)
    ]
    assert sum(len(d) for d in documents) > 1_100_000
    offloaded_before = _gateway_counter(fleet, "taskfleet_gateway_offloaded_payloads_total")
    with Client(fleet.gateway_url, max_retries=3) as client:
        scores = client.rerank(task, query, documents, timeout_ms=DEADLINE_MS)
        expected = CrossEncoderReranker(ModelSpec(base, head)).scorer().score([(query, documents)])
        assert len(scores.scores) == LIMIT
        np.testing.assert_allclose(scores.scores, expected[0], atol=1e-5)
        with pytest.raises(TaskfleetError) as refused:
            client.rerank(task, query, [*documents, "eins zu viel"])
        assert refused.value.status == 400 and "2048" in str(refused.value)
    cohere_shape = httpx.post(
        f"{fleet.gateway_url}/v1/rerank",
        json={"model": task, "query": query, "documents": [*documents, "eins zu viel"]},
        timeout=60,
    )
    assert cohere_shape.status_code == 400 and "2048" in cohere_shape.text
    offloaded = _gateway_counter(fleet, "taskfleet_gateway_offloaded_payloads_total")
    assert offloaded == offloaded_before + 1


def _gateway_counter(fleet: LocalFleet, name: str) -> float:
    for line in httpx.get(f"{fleet.gateway_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
