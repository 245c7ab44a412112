"""Eval core without a registry: suites, BEIR loading and its bad input, metrics, bootstrap."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evals.beir import load_split
from evals.errors import SplitLeakError, SuiteDataError, UnknownSuite
from evals.harness import check_split_allowed, evaluate
from evals.ranking_metrics import per_query_scores
from evals.retrievers import BM25Retriever, tokenize_german
from evals.suites import DEFAULT_DATA_ROOT, beir_suite, builtin_spec
from registry.bootstrap import bootstrap_ci, paired_difference_ci
from tests.beir_fixture import build_beir


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    return build_beir(tmp_path / "beir")


# ---- an independent, straightforward implementation of the three metrics --------------------
def _ranked(scores: dict[str, float]) -> list[str]:
    # trec_eval order: score descending, ties by document id descending
    return [d for d, _ in sorted(scores.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)]


def naive_ndcg(ranked: list[str], relevant: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:k]) if d in relevant)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), k)))
    return dcg / ideal


def naive_mrr(ranked: list[str], relevant: set[str], k: int) -> float:
    return next((1.0 / (i + 1) for i, d in enumerate(ranked[:k]) if d in relevant), 0.0)


def naive_recall(ranked: list[str], relevant: set[str], k: int) -> float:
    return len(relevant & set(ranked[:k])) / len(relevant)


def test_metrics_equal_a_naive_implementation(beir: Path) -> None:
    suite = beir_suite("fixture", beir)
    result = evaluate(suite, "test", BM25Retriever())
    data = load_split(beir, "test")
    # Rerun retrieval to get the ranked lists the harness scored.
    ranked = BM25Retriever().retrieve(data, 100).results
    expected = {"ndcg_at_10": [], "mrr_at_10": [], "recall_at_100": []}  # type: dict[str, list[float]]
    for qid, docs in data.qrels.items():
        order, rel = _ranked(ranked[qid]), set(docs)
        expected["ndcg_at_10"].append(naive_ndcg(order, rel, 10))
        expected["mrr_at_10"].append(naive_mrr(order, rel, 10))
        expected["recall_at_100"].append(naive_recall(order, rel, 100))
    for metric, values in expected.items():
        assert result.metrics[metric] == pytest.approx(float(np.mean(values)), abs=1e-9)
    assert result.per_query == pytest.approx(
        dict(zip(data.qrels, expected["ndcg_at_10"], strict=True)), abs=1e-9
    )
    assert 0.2 < result.metrics["ndcg_at_10"] < 1.0  # lexical overlap is built into the fixture


def test_metrics_on_hand_made_rankings() -> None:
    qrels = {"q1": {"a": 1, "b": 1}, "q2": {"c": 1}, "q3": {"d": 1}}
    results = {
        "q1": {"x": 0.9, "a": 0.8, "y": 0.7, "b": 0.1},
        "q2": {f"n{i}": 1.0 - i / 100 for i in range(12)} | {"c": 0.0},
        # q3 has no results at all: it must count as zero, not disappear
    }
    scores = per_query_scores(results, qrels, ["ndcg_at_10", "mrr_at_10", "recall_at_100"])
    assert scores["mrr_at_10"] == {"q1": 0.5, "q2": 0.0, "q3": 0.0}
    assert scores["recall_at_100"] == {"q1": 1.0, "q2": 1.0, "q3": 0.0}
    ideal = 1 + 1 / math.log2(3)
    assert scores["ndcg_at_10"]["q1"] == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(5)) / ideal
    )
    assert scores["ndcg_at_10"]["q2"] == 0.0


def test_bootstrap_ci_contains_estimate_and_narrows() -> None:
    rng = np.random.default_rng(3)
    scores = rng.uniform(0, 1, size=2000)
    small = bootstrap_ci(scores[:50], seed=1)
    large = bootstrap_ci(scores, seed=1)
    assert small.contains(small.estimate) and large.contains(large.estimate)
    assert large.width < small.width / 3  # ~ 1/sqrt(n): 40x the queries, ~6x narrower
    assert bootstrap_ci(scores[:50], seed=1) == small  # seeded: reproducible


def test_paired_difference_uses_shared_queries_and_cancels_difficulty() -> None:
    rng = np.random.default_rng(5)
    difficulty = rng.uniform(0, 1, size=300)
    a = {f"q{i}": float(v) for i, v in enumerate(difficulty)}
    b = {f"q{i}": float(v) - 0.02 for i, v in enumerate(difficulty)} | {"extra": 1.0}
    interval, shared = paired_difference_ci(a, b)
    assert shared == 300
    assert interval.estimate == pytest.approx(0.02)
    assert interval.low > 0.0  # a constant gap is detected despite noisy per-query scores
    unpaired = bootstrap_ci(list(a.values()))
    assert interval.width < unpaired.width / 10
    with pytest.raises(ValueError, match="share no query"):
        paired_difference_ci({"x": 1.0}, {"y": 1.0})


def test_fingerprint_changes_when_a_data_file_changes(beir: Path) -> None:
    suite = beir_suite("fixture", beir, train_split="dev")
    before = suite.fingerprint()
    assert before == suite.fingerprint()
    qrels = beir / "qrels" / "dev.tsv"
    qrels.write_text(qrels.read_text() + "dev-0000\t§ miete-0\t1\n")
    assert suite.fingerprint() != before


def test_builtin_suites_are_declared_data() -> None:
    suite = builtin_spec("german-legal-retrieval")
    assert (suite.test_split, suite.train_split) == ("eval", "dev")
    assert suite.main_metric == "ndcg_at_10"
    assert suite.data_dir() == DEFAULT_DATA_ROOT / "gerlayqa" / "beir"
    rerank, area = builtin_spec("german-legal-rerank"), builtin_spec("german-legal-area")
    assert (rerank.kind, rerank.metrics) == ("rerank", ("ndcg_at_10", "mrr_at_10", "map_at_1000"))
    assert (area.kind, area.main_metric) == ("classification", "macro_f1")
    with pytest.raises(UnknownSuite, match="not a built-in suite"):
        builtin_spec("nope")
    missing = suite.with_location(Path("/nonexistent/folder"))
    with pytest.raises(SuiteDataError, match="does not exist"):
        missing.fingerprint()


def test_missing_file_is_named(beir: Path) -> None:
    (beir / "queries.jsonl").unlink()
    with pytest.raises(SuiteDataError, match=r"missing file\(s\) in .*queries.jsonl"):
        beir_suite("fixture", beir).fingerprint()
    with pytest.raises(SuiteDataError, match="missing file"):
        load_split(beir, "test")


def test_malformed_jsonl_names_the_line(beir: Path) -> None:
    corpus = beir / "corpus.jsonl"
    lines = corpus.read_text().splitlines()
    lines[4] = '{"_id": "broken", "text": '
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(SuiteDataError, match=r"corpus.jsonl:5: malformed JSON"):
        load_split(beir, "test")
    lines[4] = json.dumps({"id": "no-underscore-id", "text": "x"})
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(SuiteDataError, match=r"corpus.jsonl:5: expected an object"):
        load_split(beir, "test")


def test_unknown_documents_are_counted_skipped_and_warned(beir: Path) -> None:
    clean = evaluate(beir_suite("fixture", beir), "test", BM25Retriever())
    qrels = beir / "qrels" / "test.tsv"
    text = qrels.read_text()
    # dangling pairs on judged queries, an unknown query, a query whose only pair dangles
    qrels.write_text(text + "test-0000\t§ 9999\t1\ntest-0001\t§ 8888\t1\nghost-q\t§ 1\t1\n")
    extra = json.dumps({"_id": "lonely", "text": "frage"})
    (beir / "queries.jsonl").write_text((beir / "queries.jsonl").read_text() + extra + "\n")
    qrels.write_text(qrels.read_text() + "lonely\t§ 7777\t1\n")
    result = evaluate(beir_suite("fixture", beir), "test", BM25Retriever())
    assert any("4 qrels pair(s)" in w for w in result.warnings)  # ghost-q's too
    assert any("1 query id(s)" in w and "not in queries.jsonl" in w for w in result.warnings)
    assert any("1 query(ies)" in w and "no relevant document" in w for w in result.warnings)
    # skipping, not scoring as misses: the score is unchanged
    assert result.metrics == pytest.approx(clean.metrics)
    assert result.num_queries == clean.num_queries


def test_empty_split_is_an_error(beir: Path) -> None:
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(SuiteDataError, match="'test' is empty"):
        load_split(beir, "test")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\ntest-0000\tnope\t1\n")
    with pytest.raises(SuiteDataError, match="no query with a relevant document"):
        load_split(beir, "test")


def test_sample_takes_the_first_queries_with_the_full_corpus(beir: Path) -> None:
    data = load_split(beir, "test")
    sample = data.sample(5)
    assert list(sample.queries) == list(data.queries)[:5]
    assert sample.corpus == data.corpus
    result = evaluate(beir_suite("fixture", beir), "test", BM25Retriever(), sample=5)
    assert result.sample_size == 5 and len(result.per_query) == 5


def test_split_leak_is_refused() -> None:
    suite = builtin_spec("german-legal-retrieval")
    check_split_allowed(suite, "eval", [("german-legal-retrieval", "dev")])
    check_split_allowed(suite, "dev", [])  # a base model may be scored on dev
    with pytest.raises(SplitLeakError, match="trained on it"):
        check_split_allowed(suite, "eval", [("german-legal-retrieval", "dev"), (None, "eval")])
    with pytest.raises(SplitLeakError):
        check_split_allowed(suite, "dev", [("german-legal-retrieval", "dev")])
    check_split_allowed(suite, "eval", [("another-suite", "eval")])
    with pytest.raises(SuiteDataError, match="no split 'test'"):
        check_split_allowed(suite, "test")


def test_german_tokenisation() -> None:
    tokens = tokenize_german("Ich kündige den Mietvertrag (§ 573b BGB) wegen der Straße!")
    assert tokens == ["kündige", "mietvertrag", "573b", "bgb", "wegen", "straße"]
