"""How a real sidecar forms batches: a lone request is not held for the batch wait, batches
are counted in the model's own tokens (its tokenizer.json, read by the sidecar), and requests
that arrive together get in-process vectors, each answered once."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serving.client import Client
from testbed.faults.scenarios import serve
from testbed.fleet import LocalFleet
from tests.test_fleet_metrics import value

#: Far above the time a tiny model needs for one text, even on a loaded machine.
BATCH_WAIT_MS = 4000
TEXTS = [
    "Der Mieter muss die Kündigung schriftlich erklären.",
    "haus",
    " ".join(["der vermieter haftet für den schaden am haus"] * 30),  # above max_seq_length 64
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    args = [
        "--heartbeat-ms", "300",
        "--nak-delay-ms", "200",
        "--ack-wait-ms", "5000",
        "--max-batch-wait-ms", str(BATCH_WAIT_MS),
    ]  # fmt: skip
    with LocalFleet(tmp_path_factory.mktemp("batching"), workers=1, sidecar_args=args) as stack:
        yield stack


@pytest.fixture(scope="module")
def served(fleet: LocalFleet, tiny_model_path: Path) -> str:
    task = serve(fleet, tiny_model_path, prefix="batching")
    with Client(fleet.gateway_url, timeout_s=60) as client:
        client.embed(task, "warm up")
    return task


def test_a_lone_request_is_not_held_for_the_batch_wait(fleet: LocalFleet, served: str) -> None:
    with Client(fleet.gateway_url, timeout_s=60) as client:
        for text in TEXTS:
            started = time.monotonic()
            client.embed(served, text)
            elapsed_ms = (time.monotonic() - started) * 1000
            assert elapsed_ms < BATCH_WAIT_MS / 2, (
                f"a lone request took {elapsed_ms:.0f} ms with a {BATCH_WAIT_MS} ms batch wait"
            )


def test_batches_count_the_models_tokens(
    fleet: LocalFleet, served: str, tiny_model_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_path), device="cpu", local_files_only=True)
    features = model.preprocess(TEXTS)  # what the runtime computes: specials, truncation
    real = int(features["attention_mask"].sum())
    assert real < sum(len(t) // 4 for t in TEXTS), "the long text is truncated, not estimated"
    before = value(fleet.sidecar_metrics(), "taskfleet_sidecar_batch_tokens_sum", task=served)
    with Client(fleet.gateway_url, timeout_s=60) as client:
        client.embed(served, TEXTS)
    after = value(fleet.sidecar_metrics(), "taskfleet_sidecar_batch_tokens_sum", task=served)
    assert after - before == real


def test_requests_that_arrive_together_get_in_process_vectors(
    fleet: LocalFleet, served: str, tiny_model_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_path), device="cpu", local_files_only=True)
    texts = [f"{TEXTS[i % 3]} {i}" for i in range(48)]
    expected = np.asarray(model.encode(texts), dtype=np.float32)
    name = "taskfleet_sidecar_batch_messages_sum"
    before = value(fleet.sidecar_metrics(), name, task=served)
    with (
        Client(fleet.gateway_url, timeout_s=60) as client,
        concurrent.futures.ThreadPoolExecutor(16) as pool,
    ):
        got = list(pool.map(lambda t: client.embed(served, t)[0], texts))
    np.testing.assert_allclose(np.stack(got), expected, atol=1e-5)
    assert value(fleet.sidecar_metrics(), name, task=served) - before == len(texts)
