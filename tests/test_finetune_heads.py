"""Cross-encoder and classifier fine-tuning on a tiny BERT: they learn, they are repeatable, and
what training wrote is what the eval harness and the runtime compute (one model library)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evals.classifiers import ModelClassifier, TfidfLogisticRegression
from evals.harness import evaluate
from evals.rerankers import CrossEncoderReranker
from evals.suites import SuiteSpec
from finetune.config import LoraHyperparameters, preset
from finetune.data import load_labelled, load_rerank_groups
from finetune.errors import TrainingDataError
from finetune.head_training import class_weights
from finetune.job import fit_linear_head, train_head_adapter
from finetune.trainer import mean_loss
from registry.fingerprint import file_sha256, read_head_kind
from serving.runtime.model_folder import ModelSpec
from serving.runtime.pool import ClassifyWork, ModelPool, ScoreWork
from tests.kinds_fixture import build_classification, build_rerank

FAST = LoraHyperparameters(
    rank=4, alpha=8, dropout=0.0, batch_size=4, max_seq_length=48, learning_rate=5e-3, epochs=4
)


@pytest.fixture(scope="module")
def rerank_suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteSpec:
    folder = build_rerank(tmp_path_factory.mktemp("rr"), queries={"test": 10, "train": 24})
    return SuiteSpec("rr", "rerank", folder, test_split="test", train_split="train")


@pytest.fixture(scope="module")
def area_suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteSpec:
    folder = build_classification(tmp_path_factory.mktemp("area"))
    return SuiteSpec("area", "classification", folder, test_split="test", train_split="train")


def test_cross_encoder_learns_repeatably_and_serves_what_it_evaluates(
    rerank_suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_rerank_groups(rerank_suite)
    hp = FAST.with_overrides(group_size=4)
    first = train_head_adapter("score", tiny_model_path, data, hp, tmp_path / "a")
    second = train_head_adapter("score", tiny_model_path, data, hp, tmp_path / "b")
    assert first.result.steps == 24 == len(first.result.losses)  # 6 batches of 4 x 4 epochs
    assert mean_loss(first.result.losses, first=False) < mean_loss(first.result.losses, first=True)
    assert second.result.losses == first.result.losses
    for name in ("adapter_model.safetensors", "head.safetensors", "head.json"):
        assert file_sha256(first.path / name) == file_sha256(second.path / name)
    assert read_head_kind(first.path) == "score"

    spec = ModelSpec(base_path=tiny_model_path, adapter_path=first.path)
    reranker = CrossEncoderReranker(spec)
    split = rerank_suite.load("test")
    evaluated = reranker.rerank(split).results  # type: ignore[arg-type]
    pool = ModelPool(device="cpu", max_batch_tokens=None, max_batch_size=None)
    pool.load("ce", spec)
    for qid in list(split.queries)[:3]:  # type: ignore[union-attr]
        docs = split.candidates[qid]  # type: ignore[union-attr]
        texts = [split.corpus[d] for d in docs]  # type: ignore[union-attr]
        served = pool.score([ScoreWork("ce", split.queries[qid], texts)])[0]  # type: ignore[union-attr]
        np.testing.assert_allclose(served, [evaluated[qid][d] for d in docs], atol=1e-5)


def test_classifier_learns_and_serves_what_it_evaluates(
    area_suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_labelled(area_suite)
    hp = FAST.with_overrides(batch_size=8, epochs=6)
    trained = train_head_adapter("classify", tiny_model_path, data, hp, tmp_path / "cls")
    losses = trained.result.losses
    assert mean_loss(losses, first=False) < 0.8 * mean_loss(losses, first=True)
    spec = ModelSpec(base_path=tiny_model_path, adapter_path=trained.path)
    result = evaluate(area_suite, "test", ModelClassifier(spec))
    assert result.metrics["accuracy"] > 0.5  # three topics with distinct words; chance is 1/3
    pool = ModelPool(device="cpu", max_batch_tokens=None, max_batch_size=None)
    pool.load("cls", spec)
    test = area_suite.load("test")
    labels, probabilities = pool.classify([ClassifyWork("cls", test.texts[:5])])[0]  # type: ignore[union-attr]
    assert labels == ["miete", "kauf", "erbe"]
    predicted = [labels[i] for i in probabilities.argmax(axis=1)]
    assert result.details is not None
    assert predicted == [result.details["pred"][i] for i in test.ids[:5]]  # type: ignore[union-attr]


def test_linear_head_is_a_servable_classifier(
    area_suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_labelled(area_suite)
    path, fitted = fit_linear_head(tiny_model_path, data, tmp_path / "lr")
    assert sorted(p.name for p in path.iterdir()) == ["head.json", "head.safetensors"]
    assert fitted.trainable_parameters == 3 * (32 + 1)
    head = evaluate(area_suite, "test", ModelClassifier(ModelSpec(tiny_model_path, path)))
    tfidf = evaluate(area_suite, "test", TfidfLogisticRegression())
    assert head.metrics["macro_f1"] > 0.4 and tfidf.metrics["macro_f1"] > 0.6


def test_bad_training_data_and_presets(
    area_suite: SuiteSpec, rerank_suite: SuiteSpec, tmp_path: Path
) -> None:
    data = load_labelled(area_suite)
    weights = class_weights(data, FAST)
    assert weights == pytest.approx([1.0, 1.0, 1.0])  # the fixture is balanced
    with pytest.raises(TrainingDataError, match="test split"):
        load_labelled(area_suite, "test")
    with pytest.raises(TrainingDataError, match="not retrieval"):
        from finetune.data import load_training_pairs

        load_training_pairs(rerank_suite)
    assert preset("default", "rerank").group_size == 4
    assert preset("demo", "classification").max_steps == 30
