"""Dense candidates on the small BEIR fixture: equal to mteb's full path, cached, adapters count."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals.beir import load_split
from evals.cache import EmbeddingCache
from evals.harness import evaluate
from evals.mteb_task import evaluate_with_mteb
from evals.retrievers import DenseRetriever
from evals.suites import beir_suite
from serving.runtime.model_folder import ModelLoadError, ModelSpec
from testbed.tiny_model import build_tiny_adapter, build_tiny_model
from tests.beir_fixture import build_beir


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    return build_beir(tmp_path / "beir")


def _dense(model: Path, cache: EmbeddingCache, adapter: Path | None = None) -> DenseRetriever:
    spec = ModelSpec(base_path=model, adapter_path=adapter)
    return DenseRetriever(
        spec,
        model_fingerprint="tiny-model",
        adapter_fingerprint=adapter.name if adapter else None,
        cache=cache,
    )


def test_scores_equal_mteb_full_retrieval_path(
    beir: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    suite = beir_suite("fixture", beir)
    ours = evaluate(suite, "test", _dense(tiny_model_path, EmbeddingCache.in_dir(tmp_path / "c")))
    theirs = evaluate_with_mteb(suite, load_split(beir, "test"), tiny_model_path)
    for metric in suite.metrics:
        # mteb rounds nDCG/recall averages to 5 decimals; MRR it leaves unrounded
        assert ours.metrics[metric] == pytest.approx(theirs[metric], abs=6e-6), metric
    assert ours.metrics["ndcg_at_10"] != pytest.approx(1.0)  # a random model is not perfect


def test_second_run_is_served_from_cache_and_adapter_reencodes(
    beir: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    suite = beir_suite("fixture", beir)
    cache = EmbeddingCache.in_dir(tmp_path / "cache")
    texts = len(load_split(beir, "test").corpus) + len(load_split(beir, "test").queries)

    first = evaluate(suite, "test", _dense(tiny_model_path, cache))
    assert first.cost["encoded_items"] == texts and first.cost["cached_items"] == 0
    assert first.cost["items_per_s"] > 0 and first.cost["latency_p95_ms"] > 0

    second = evaluate(suite, "test", _dense(tiny_model_path, cache))
    assert second.cost["encoded_items"] == 0 and second.cost["cached_items"] == texts
    assert second.cost["cost_from_cache"] == 1.0
    assert second.cost["items_per_s"] == pytest.approx(first.cost["items_per_s"])
    assert second.metrics == first.metrics

    adapter = build_tiny_adapter(tiny_model_path, tmp_path / "lora-a")
    with_adapter = evaluate(suite, "test", _dense(tiny_model_path, cache, adapter))
    assert with_adapter.cost["encoded_items"] == texts  # new adapter: its own namespace
    assert with_adapter.per_query != first.per_query  # and it really changes the vectors

    # A new query in the split: only that query is encoded.
    queries = beir / "queries.jsonl"
    queries.write_text(queries.read_text() + '{"_id": "new-q", "text": "mieter kaution"}\n')
    qrels = beir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "new-q\t§ miete-0\t1\n")
    again = evaluate(suite, "test", _dense(tiny_model_path, cache))
    assert again.cost["encoded_items"] == 1


def test_adapter_for_another_base_is_a_clear_error(
    beir: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    other_base = build_tiny_model(tmp_path / "wide", hidden=48, heads=2)
    adapter = build_tiny_adapter(other_base, tmp_path / "lora-wide")
    retriever = _dense(tiny_model_path, EmbeddingCache.in_dir(tmp_path / "c"), adapter)
    with pytest.raises(ModelLoadError, match="does not fit this base model"):
        evaluate(beir_suite("fixture", beir), "test", retriever)
