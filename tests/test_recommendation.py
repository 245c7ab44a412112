"""The cost-aware choice as a pure function: the cheapest non-inferior candidate, never one
outside the margin, with the line that says why."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from registry import entities as e
from registry.costs import serving_cost
from registry.recommendation import Option, recommend

QUERIES = [f"q{i}" for i in range(400)]


def run(name: str, level: float, *, spread: float = 0.0, cpu_ms: float | None = 4.0) -> e.EvalRun:
    """Per-query nDCG@10 around ``level``; a candidate with ``spread`` differs from the others
    on each query by +/- spread, so its paired CI has that width."""
    per_query = {
        q: level + (spread if i % 2 else -spread) * ((i % 7) / 7) for i, q in enumerate(QUERIES)
    }
    mean = sum(per_query.values()) / len(per_query)
    return e.EvalRun(
        id=hash(name) % 1000,
        task="german-legal-retrieval",
        candidate=name,
        suite_name="german-legal-retrieval",
        suite_version="1",
        suite_fingerprint="f" * 64,
        split="eval",
        main_metric="ndcg_at_10",
        metrics={"ndcg_at_10": mean},
        ci={"ndcg_at_10": (mean - 0.01, mean + 0.01)},
        cost={} if cpu_ms is None else {"cpu_ms_per_item": cpu_ms, "peak_memory_mb": 90.0},
        per_query=per_query,
        model_fingerprint=None,
        adapter_fingerprint=None,
        sample_size=None,
        warnings=[],
        code_version="test",
        mlflow_run_id=None,
        wall_seconds=1.0,
        created_at=datetime.now(UTC),
        runtime="torch",
    )


def option(r: e.EvalRun, unservable: str | None = None) -> Option:
    return Option(r.candidate, r, serving_cost(r.cost), unservable)


def test_cheapest_picks_the_non_inferior_variant_and_says_why() -> None:
    minilm = option(run("minilm", 0.0357, cpu_ms=9.2))
    int8 = option(run("minilm-onnx-int8", 0.0350, spread=0.002, cpu_ms=4.0))
    chosen = recommend("german-legal-retrieval", [minilm, int8], prefer="cheapest", margin=0.002)
    assert chosen.candidate == "minilm-onnx-int8"
    assert chosen.reason.startswith("minilm-onnx-int8: ndcg_at_10 -0.0007 [")
    assert "vs minilm, margin 0.002; 2.3x cheaper" in chosen.reason
    best = recommend("german-legal-retrieval", [minilm, int8], prefer="best", margin=0.002)
    assert best.candidate == "minilm" and best.reason.startswith("best ndcg_at_10 0.0357")


def test_a_cheaper_candidate_outside_the_margin_is_never_recommended() -> None:
    minilm = option(run("minilm", 0.0357, cpu_ms=9.2))
    bm25 = option(run("bm25-cheap", 0.0300, spread=0.001, cpu_ms=0.1))
    chosen = recommend("t", [minilm, bm25], prefer="cheapest", margin=0.002)
    assert chosen.candidate == "minilm"
    assert "no non-inferior candidate is cheaper" in chosen.reason
    (line,) = chosen.considered
    assert line.startswith("bm25-cheap: ndcg_at_10 -0.0057 [") and line.endswith(
        "outside the margin"
    )


def test_what_cannot_serve_or_has_no_cost_is_said_and_skipped() -> None:
    minilm = option(run("minilm", 0.0357, cpu_ms=9.2))
    unpriced = option(run("old-run", 0.0356, spread=0.0005, cpu_ms=None))
    retrieval_bm25 = option(run("bm25", 0.05, cpu_ms=0.01), unservable="it makes no embedding")
    chosen = recommend("t", [minilm, unpriced, retrieval_bm25], prefer="cheapest", margin=0.002)
    assert chosen.candidate == "minilm"
    assert "bm25: cannot be served (it makes no embedding)" in chosen.considered
    assert any("its cost is not measured" in line for line in chosen.considered)
    nothing = recommend("t", [retrieval_bm25], prefer="cheapest", margin=0.002)
    assert nothing.candidate is None
    with pytest.raises(ValueError):
        recommend("t", [minilm], prefer="fastest", margin=0.0)


def test_an_endpoint_price_counts_beside_the_workers_cpu() -> None:
    local = serving_cost({"cpu_ms_per_item": 9.0})
    api = serving_cost({"cpu_ms_per_item": 0.2}, endpoint_price_per_million=0.02)
    assert local is not None and api is not None
    assert local.price_per_million == pytest.approx(0.1)  # 9 CPU-ms x 1M = 2.5 CPU-h x $0.04
    assert api.price_per_million == pytest.approx(0.02 + 0.2 / 9 * 0.1)
    assert serving_cost({"items_per_s": 3.0}) is None
