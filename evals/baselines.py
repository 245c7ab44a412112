"""Fit the lexical baselines into servable artifacts (the format:
serving/runtime/baseline_artifact.py).

- ``fit_tfidf_lr``: scikit-learn's TF-IDF (word 1-2 grams, sublinear tf) and class-balanced
  logistic regression on a classification split; the vocabulary, idf and coefficients are
  exported, and scikit-learn is never needed again to predict;
- ``fit_bm25``: the term statistics (document frequencies, document count, mean length) of a
  corpus, with the German stopword list the retrieval baseline uses.

Both write a folder that the eval harness and the runtime server load through the same code,
``serving.runtime.baseline_artifact.load_baseline``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evals.classification_data import ClassificationSplit
from evals.errors import CandidateError
from evals.suites import SuiteSpec

TFIDF_MAX_NGRAM = 2
BM25_K1 = 1.5
BM25_B = 0.75


@functools.cache
def german_stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_GERMAN

    return frozenset(STOPWORDS_GERMAN)


def fit_tfidf_lr(
    train: ClassificationSplit,
    target: Path,
    *,
    c: float = 1.0,
    seed: int = 0,
    fitted_on: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit on ``train`` and write the artifact folder ``target``; returns its manifest."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from serving.runtime.baseline_artifact import write_tfidf_lr

    if len(set(train.labels)) < 2:
        raise CandidateError("tfidf-lr needs at least two labels in the training split")
    started = time.perf_counter()
    vectorizer = TfidfVectorizer(ngram_range=(1, TFIDF_MAX_NGRAM), sublinear_tf=True)
    features = vectorizer.fit_transform(train.texts)
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000, random_state=seed)
    model.fit(features, train.labels)
    terms: list[str] = [""] * len(vectorizer.vocabulary_)
    for term, column in vectorizer.vocabulary_.items():
        terms[column] = term
    classes = [str(label) for label in model.classes_]
    weights = np.asarray(model.coef_, dtype=np.float64)
    bias = np.asarray(model.intercept_, dtype=np.float64)
    if len(classes) == 2:
        # Binary: scikit-learn keeps one row z for the second class; softmax([0, z]) is its
        # sigmoid, so two rows serve both cases with one formula.
        weights = np.vstack([np.zeros_like(weights[0]), weights[0]])
        bias = np.asarray([0.0, bias[0]])
    # Rows in the order the suite declares its labels (those seen in training).
    order = [classes.index(label) for label in train.label_names if label in classes]
    lineage = {
        **dict(fitted_on or {}),
        "items": len(train.ids),
        "features": len(terms),
        "c": c,
        "seed": seed,
        "fit_seconds": round(time.perf_counter() - started, 3),
    }
    return write_tfidf_lr(
        target,
        labels=[classes[i] for i in order],
        terms=terms,
        idf=np.asarray(vectorizer.idf_, dtype=np.float64),
        weights=weights[order],
        bias=bias[order],
        max_ngram=TFIDF_MAX_NGRAM,
        fitted_on=lineage,
    )


def fit_bm25(
    corpus: Sequence[str],
    target: Path,
    *,
    k1: float = BM25_K1,
    b: float = BM25_B,
    fitted_on: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The term statistics of ``corpus`` written as a bm25 artifact folder ``target``."""
    from serving.runtime.baseline_artifact import write_bm25
    from serving.runtime.lexical import bm25_statistics

    stopwords = german_stopwords()
    try:
        vocabulary, frequency, mean_length = bm25_statistics(corpus, stopwords)
    except ValueError as exc:
        raise CandidateError(str(exc)) from None
    terms: list[str] = [""] * len(vocabulary)
    for term, row in vocabulary.items():
        terms[row] = term
    return write_bm25(
        target,
        terms=terms,
        document_frequency=frequency,
        documents=len(corpus),
        mean_length=mean_length,
        k1=k1,
        b=b,
        stopwords=sorted(stopwords),
        fitted_on={**dict(fitted_on or {}), "documents": len(corpus)},
    )


def fit_on_suite(
    kind: str, suite: SuiteSpec, target: Path, *, data_root: Path | None = None
) -> dict[str, Any]:
    """Fit ``kind`` on a registered suite version (its data checked against the registered
    fingerprint): tfidf-lr on the training split, bm25 on the whole corpus of a rerank suite."""
    from evals.beir import read_corpus

    fingerprint = suite.checked_fingerprint(data_root)
    lineage = {"suite": suite.name, "suite_version": suite.version, "fingerprint": fingerprint}
    if kind == "tfidf-lr" and suite.kind == "classification":
        if suite.train_split is None:
            raise CandidateError(
                f"tfidf-lr is fitted on a training split, and suite {suite.name!r} declares "
                "none (register it with --train-split)"
            )
        train = suite.load(suite.train_split, data_root)
        assert isinstance(train, ClassificationSplit)
        return fit_tfidf_lr(train, target, fitted_on={**lineage, "split": suite.train_split})
    if kind == "bm25" and suite.kind == "rerank":
        corpus = read_corpus(suite.data_dir(data_root) / "corpus.jsonl")
        return fit_bm25(list(corpus.values()), target, fitted_on={**lineage, "split": "corpus"})
    raise CandidateError(f"a {kind} baseline is not fitted on a {suite.kind} suite")
