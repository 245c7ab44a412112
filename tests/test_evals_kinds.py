"""Rerank and classification suites without a registry: readers and their bad input (file:line),
metrics against independent computations, the paired macro-F1 bootstrap, the candidates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evals.cache import EmbeddingCache
from evals.classification_data import load_split as load_labelled
from evals.classifiers import MajorityClass, ModelClassifier, TfidfLogisticRegression
from evals.errors import CandidateError, SuiteDataError
from evals.harness import evaluate
from evals.rerank_data import load_split as load_rerank
from evals.rerankers import BM25Reranker, CrossEncoderReranker, RandomReranker, dense_for_rerank
from evals.retrievers import BM25Retriever
from evals.suites import SuiteSpec, declare
from registry.bootstrap import macro_f1_ci, macro_f1_resamples, paired_macro_f1_ci
from serving.runtime.model_folder import ModelSpec
from testbed.tiny_model import build_tiny_head
from tests.kinds_fixture import build_classification, build_rerank


@pytest.fixture
def rerank_dir(tmp_path: Path) -> Path:
    return build_rerank(tmp_path / "rerank")


@pytest.fixture
def labelled_dir(tmp_path: Path) -> Path:
    return build_classification(tmp_path / "area")


def spec(kind: str, folder: Path, train: str | None = "train") -> SuiteSpec:
    return SuiteSpec(name="s", kind=kind, location=folder, test_split="test", train_split=train)


# ---- rerank ---------------------------------------------------------------------------------
def test_rerank_metrics_equal_a_naive_implementation(rerank_dir: Path) -> None:
    data = load_rerank(rerank_dir, "test")
    result = evaluate(spec("rerank", rerank_dir), "test", BM25Reranker())
    ranked = BM25Reranker().rerank(data).results
    ndcg, mrr, ap = [], [], []
    for qid, relevant in data.qrels.items():
        order = [
            d for d, _ in sorted(ranked[qid].items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        ]
        hits = [i for i, d in enumerate(order) if d in relevant]
        dcg = sum(1 / math.log2(i + 2) for i in hits if i < 10)
        ideal = sum(1 / math.log2(i + 2) for i in range(min(len(relevant), 10)))
        ndcg.append(dcg / ideal)
        mrr.append(1 / (hits[0] + 1) if hits and hits[0] < 10 else 0.0)
        ap.append(sum((n + 1) / (i + 1) for n, i in enumerate(hits)) / len(relevant))
    assert result.metrics["ndcg_at_10"] == pytest.approx(np.mean(ndcg), abs=1e-9)
    assert result.metrics["mrr_at_10"] == pytest.approx(np.mean(mrr), abs=1e-9)
    assert result.metrics["map_at_1000"] == pytest.approx(np.mean(ap), abs=1e-9)
    # every candidate list is scored, and only its own documents
    assert all(set(ranked[q]) == set(data.candidates[q]) for q in data.candidates)


def test_random_order_is_seeded_and_a_floor(rerank_dir: Path) -> None:
    suite = spec("rerank", rerank_dir)
    a = evaluate(suite, "test", RandomReranker(seed=0))
    assert a.metrics == evaluate(suite, "test", RandomReranker(seed=0)).metrics
    assert a.metrics != evaluate(suite, "test", RandomReranker(seed=1)).metrics
    assert 0.0 < a.metrics["ndcg_at_10"] < 1.0


def test_bi_and_cross_encoders_score_the_candidate_lists(
    rerank_dir: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    suite = spec("rerank", rerank_dir)
    cache = EmbeddingCache.in_dir(tmp_path / "cache")
    bi = dense_for_rerank(ModelSpec(base_path=tiny_model_path), "tiny", None, cache)
    result = evaluate(suite, "test", bi)
    assert result.cost["items_per_s"] > 0 and 0 < result.metrics["ndcg_at_10"] <= 1
    head = build_tiny_head(tiny_model_path, tmp_path / "ce", kind="score")
    cross = evaluate(suite, "test", CrossEncoderReranker(ModelSpec(tiny_model_path, head)))
    assert cross.metrics != result.metrics
    with pytest.raises(CandidateError, match="cannot be scored on rerank suite"):
        evaluate(suite, "test", BM25Retriever())  # a retrieval candidate


def test_rerank_reader_names_file_and_line(rerank_dir: Path) -> None:
    path = rerank_dir / "top_ranked" / "test.jsonl"
    lines = path.read_text().splitlines()
    original = list(lines)

    def broken(line: str, index: int = 2) -> None:
        changed = list(original)
        changed[index] = line
        path.write_text("\n".join(changed) + "\n")

    first = json.loads(original[0])
    cases = [
        ('{"query-id": "x", ', r"test.jsonl:3: malformed JSON"),
        (
            json.dumps({"query-id": first["query-id"], "corpus-ids": ["§ miete-0"]}),
            r"test.jsonl:3: duplicate query id .* \(first on line 1\)",
        ),
        (
            json.dumps({"query-id": "test-0002", "corpus-ids": ["§ 9999"]}),
            r"test.jsonl:3: candidate '§ 9999' is not in corpus.jsonl",
        ),
        (
            json.dumps({"query-id": "nobody", "corpus-ids": ["§ miete-0"]}),
            r"test.jsonl:3: query id 'nobody' is not in queries.jsonl",
        ),
        (
            json.dumps({"query-id": "test-0002", "corpus-ids": []}),
            r"test.jsonl:3: query 'test-0002' has no candidates",
        ),
    ]
    for line, message in cases:
        broken(line)
        with pytest.raises(SuiteDataError, match=message):
            load_rerank(rerank_dir, "test")
    path.write_text("")
    with pytest.raises(SuiteDataError, match="split 'test' is empty"):
        load_rerank(rerank_dir, "test")
    path.unlink()
    with pytest.raises(SuiteDataError, match=r"missing file: .*top_ranked/test.jsonl"):
        load_rerank(rerank_dir, "test")


# ---- classification -------------------------------------------------------------------------
def test_classification_metrics_are_scikit_learns(labelled_dir: Path) -> None:
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    data = load_labelled(labelled_dir, "test")
    result = evaluate(spec("classification", labelled_dir), "test", TfidfLogisticRegression())
    details = result.details
    assert details is not None
    pred = [details["pred"][i] for i in data.ids]
    assert result.metrics["macro_f1"] == pytest.approx(f1_score(data.labels, pred, average="macro"))
    assert result.metrics["accuracy"] == pytest.approx(accuracy_score(data.labels, pred))
    assert (
        details["confusion_matrix"]
        == confusion_matrix(data.labels, pred, labels=list(data.label_names)).tolist()
    )
    assert set(details["per_class_f1"]) == set(data.label_names)
    low, high = result.ci["macro_f1"]
    assert low <= result.metrics["macro_f1"] <= high
    assert result.per_query == {
        i: float(details["gold"][i] == details["pred"][i]) for i in data.ids
    }
    majority = evaluate(spec("classification", labelled_dir), "test", MajorityClass())
    assert majority.metrics["macro_f1"] < result.metrics["macro_f1"]
    no_train = spec("classification", labelled_dir, train=None)
    with pytest.raises(CandidateError, match="declares none"):
        evaluate(no_train, "test", MajorityClass())


def test_macro_f1_bootstrap_recomputes_scikit_learn_per_resample() -> None:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 4, size=300)
    pred = np.where(rng.random(300) < 0.6, gold, rng.integers(0, 4, size=300))
    idx = rng.integers(0, 300, size=(20, 300))
    ours = macro_f1_resamples(gold, pred, 4, idx)
    theirs = [f1_score(gold[row], pred[row], average="macro", zero_division=0) for row in idx]
    np.testing.assert_allclose(ours, theirs, atol=1e-12)

    labels = ["a", "b", "c", "d"]
    g = {f"i{n}": labels[v] for n, v in enumerate(gold)}
    p = {f"i{n}": labels[v] for n, v in enumerate(pred)}
    worse = {k: (v if n % 4 else "a") for n, (k, v) in enumerate(p.items())}
    interval = macro_f1_ci(g, p)
    assert interval.low < interval.estimate < interval.high
    diff, shared = paired_macro_f1_ci(g, p, worse)
    assert shared == 300 and diff.low > 0  # the better predictions win on paired resamples
    same, _ = paired_macro_f1_ci(g, p, p)
    assert same.low == same.high == 0.0


def test_model_classifier_and_label_checks(
    labelled_dir: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    head = build_tiny_head(tiny_model_path, tmp_path / "cls", kind="classify")
    suite = spec("classification", labelled_dir)
    result = evaluate(suite, "test", ModelClassifier(ModelSpec(tiny_model_path, head)))
    assert result.num_queries == 30 and result.cost["items_per_s"] > 0
    other = build_tiny_head(tiny_model_path, tmp_path / "other", labels=("a", "b"), lora=False)
    with pytest.raises(CandidateError, match="are not the suite's"):
        evaluate(suite, "test", ModelClassifier(ModelSpec(tiny_model_path, other)))


def test_classification_reader_names_file_and_line(labelled_dir: Path) -> None:
    path = labelled_dir / "test.jsonl"
    original = path.read_text().splitlines()
    first = json.loads(original[0])
    cases = [
        ('{"id": "x", "text": ', r"test.jsonl:2: malformed JSON"),
        (json.dumps({**first}), rf"test.jsonl:2: duplicate id '{first['id']}' \(first on line 1\)"),
        (
            json.dumps({"id": "n", "text": "x", "label": "steuer"}),
            r"test.jsonl:2: unknown label 'steuer'; labels.json declares miete, kauf, erbe",
        ),
        (
            json.dumps({"id": "n", "text": " ", "label": "kauf"}),
            r"test.jsonl:2: 'text' of 'n' is empty",
        ),
        (
            json.dumps({"id": 7, "text": "x", "label": "kauf"}),
            r"test.jsonl:2: 'id' must be a string",
        ),
    ]
    for line, message in cases:
        path.write_text("\n".join([original[0], line, *original[2:]]) + "\n")
        with pytest.raises(SuiteDataError, match=message):
            load_labelled(labelled_dir, "test")
    path.write_text("\n")
    with pytest.raises(SuiteDataError, match="split 'test' is empty"):
        load_labelled(labelled_dir, "test")
    (labelled_dir / "labels.json").write_text('[{"label": "a"}, {"label": "a"}]')
    with pytest.raises(SuiteDataError, match=r"labels.json: entry 2 repeats label 'a'"):
        load_labelled(labelled_dir, "train")


def test_declare_reads_everything_and_fingerprints(labelled_dir: Path, rerank_dir: Path) -> None:
    create, counts = declare("area", "classification", labelled_dir)
    assert (create.test_split, create.train_split, create.main_metric) == (
        "test",
        "train",
        "macro_f1",
    )
    assert counts == {"test": {"items": 30, "labels": 3}, "train": {"items": 45, "labels": 3}}
    again, _ = declare("area", "classification", labelled_dir)
    assert again.fingerprint == create.fingerprint
    other_metric, _ = declare("area", "classification", labelled_dir, main_metric="accuracy")
    assert other_metric.fingerprint != create.fingerprint  # the declaration is part of it
    with pytest.raises(
        SuiteDataError, match="has no classification split 'dev' \\(splits found: test, train\\)"
    ):
        declare("area", "classification", labelled_dir, test_split="dev")
    with pytest.raises(SuiteDataError, match="not a classification metric"):
        declare("area", "classification", labelled_dir, main_metric="ndcg_at_10")
    rerank, counts = declare("rr", "rerank", rerank_dir)
    assert rerank.metrics == ["ndcg_at_10", "mrr_at_10", "map_at_1000"]
    assert counts["test"]["queries"] == 16


def test_an_mteb_task_offline_names_what_is_missing(tmp_path: Path) -> None:
    from evals.mteb_suites import declare_mteb

    with pytest.raises(SuiteDataError) as refused:
        declare_mteb("banking", "Banking77Classification", tmp_path / "banking")
    message = str(refused.value)
    assert "mteb task 'Banking77Classification' (classification) needs the dataset" in message
    assert "'mteb/banking77' at revision 0fd18e25b25c072e09e0d92ab615fda904d66300" in message
    assert "local Hugging Face cache" in message and "HF_HUB_OFFLINE=1" in message
    assert "\n" not in message
    with pytest.raises(SuiteDataError, match="mteb knows no task named 'NoSuchTask'"):
        declare_mteb("x", "NoSuchTask", tmp_path / "x")
    with pytest.raises(SuiteDataError, match="is a Clustering task"):
        declare_mteb("x", "TwentyNewsgroupsClustering", tmp_path / "x")
