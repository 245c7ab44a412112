"""End to end: a task called by name through the real gateway, JetStream, sidecar and runtime
returns the vectors in-process sentence-transformers computes; so does the stock OpenAI client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serving.client import Client
from taskfleet.variant_builder import build_variant
from testbed.declared_tasks import add_task
from testbed.fleet import LocalFleet, register_served_task, unique_task

TEXTS = [
    "Der Mieter muss die Kündigung schriftlich erklären.",
    "Wer haftet für den Schaden am Haus?",
    "the tenant gives notice",
    "§ 573 BGB regelt die ordentliche Kündigung des Vermieters.",
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    stack = LocalFleet(tmp_path_factory.mktemp("fleet"), workers=1).start()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def placed(fleet: LocalFleet, tiny_model_path: Path) -> str:
    task = unique_task("e2e")
    placement = register_served_task(fleet.reg, task, tiny_model_path, pinned=True)
    try:
        fleet.serving(task, placement.epoch)
    except AssertionError:
        pytest.fail(f"no worker serves the task:\n{fleet.logs()}")
    return task


def _in_process(model_path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)


def test_call_by_task_name_returns_in_process_vectors(
    fleet: LocalFleet, placed: str, tiny_model_path: Path
) -> None:
    expected = _in_process(tiny_model_path, TEXTS)
    with Client(fleet.gateway_url) as client:
        result = client.embed_with_info(placed, TEXTS, kind="passage")
    assert result.vectors.shape == expected.shape
    np.testing.assert_allclose(result.vectors, expected, atol=1e-5)
    # The reply names what served it: the placed model at the placed epoch.
    assert result.epoch == 1
    assert result.model_key.startswith(f"m-{placed}-")
    # One text alone gives the same vector as inside the batch (no padding leaks in).
    with Client(fleet.gateway_url) as client:
        single = client.embed(placed, TEXTS[1], kind="passage")
    np.testing.assert_allclose(single[0], expected[1], atol=1e-5)


def test_openai_client_gets_the_same_vectors(
    fleet: LocalFleet, placed: str, tiny_model_path: Path
) -> None:
    import openai

    expected = _in_process(tiny_model_path, TEXTS)
    client = openai.OpenAI(base_url=f"{fleet.gateway_url}/v1", api_key="unused", max_retries=3)
    response = client.embeddings.create(model=placed, input=TEXTS)
    got = np.asarray([d.embedding for d in sorted(response.data, key=lambda d: d.index)])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert response.model == placed
    # The stock client asks for base64 by default when numpy is present; float works too.
    response = client.embeddings.create(model=placed, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(response.data[0].embedding, expected[0], atol=1e-5)

    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=unique_task("missing"), input="x")


def test_placement_status_reaches_the_registry(fleet: LocalFleet, placed: str) -> None:
    """Desired vs reported epoch, and the loaded model, readable from the database alone."""
    status = {s.task: s for s in fleet.reg.placement_status()}[placed]
    assert status.published_at is not None and status.converged
    workers = {w.worker_id: w for w in fleet.reg.list_workers()}
    (worker,) = (workers[s.worker_id] for s in fleet.sidecars)
    assert worker.reachable and worker.epochs[placed] == 1
    assert any(key.startswith(f"m-{placed}-") for key in worker.loaded)
    assert 0 < worker.memory_used <= worker.memory_budget == fleet.memory_budget_bytes


def test_onnx_variants_serve_their_in_process_vectors(
    fleet: LocalFleet, tiny_model_path: Path
) -> None:
    """`candidate add --variant onnx|onnx-int8` promoted: the Python runtime runs ONNX Runtime
    behind the same socket protocol, and the gateway returns the variant's in-process vectors
    (for fp32 the source's; for int8 each text's own, whatever it was batched with)."""
    from serving.runtime.onnx_variant import OnnxModel

    reg = fleet.reg
    try:
        reg.get_model("tiny-src")
    except Exception:
        reg.add_model("tiny-src", path=tiny_model_path)
    source = _in_process(tiny_model_path, TEXTS)
    for variant in ("onnx", "onnx-int8"):
        task = unique_task(variant.replace("-", ""))
        add_task(reg, task, suite="test-suite")
        candidate = reg.add_variant_candidate(
            task, base="tiny-src", variant=variant, build=build_variant
        )
        placed = reg.promote(task, candidate.name, override=True, reason="test: no eval run")
        try:
            fleet.serving(task, placed.epoch)
        except AssertionError:
            pytest.fail(f"no worker serves the {variant} variant:\n{fleet.logs()}")
        model = OnnxModel(reg.model_path(candidate.name))
        expected = np.stack([model.encode([text])[0] for text in TEXTS])
        with Client(fleet.gateway_url) as client:
            result = client.embed_with_info(task, TEXTS, kind="passage")
            single = client.embed(task, TEXTS[1], kind="passage")
        # fp32 padding moves a vector by rounding only; int8 runs each text alone.
        atol = 1e-5 if variant == "onnx" else 1e-6
        np.testing.assert_allclose(result.vectors, expected, atol=atol)
        np.testing.assert_allclose(single[0], expected[1], atol=atol)
        if variant == "onnx":
            np.testing.assert_allclose(result.vectors, source, atol=1e-5)
        assert result.model_key.startswith(f"tiny-src-{variant}")
