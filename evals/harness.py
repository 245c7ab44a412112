"""The registry-free core of an eval run: load a split, run the candidate, score, bootstrap.

``evaluate`` returns an ``EvalResult`` and writes nothing anywhere; recording it (registry,
MLflow) is the runner's job, and happens only after this returns, so an interrupted run leaves
no trace but content-keyed cache entries. Each suite kind has its candidate shape:

- retrieval: ``retrieve(split, k, progress)`` -> ranked results over the whole corpus;
- rerank: ``rerank(split, progress)`` -> scores over each query's candidate list;
- classification: ``classify(test, train, progress)`` -> a predicted label per item.

Ranking kinds are scored by mteb's metric code per query; classification by scikit-learn
(accuracy, macro-F1, per-class F1, confusion matrix), with per-item predictions kept so the
promotion rule can bootstrap the macro-F1 difference of two candidates on the same items.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evals.beir import RetrievalSplit
from evals.classification_data import ClassificationSplit
from evals.cost import Usage, add_runtime, metered
from evals.errors import CandidateError, SplitLeakError, SuiteDataError
from evals.ranking_metrics import max_depth, mean_scores, per_query_scores
from evals.readers import SuiteData
from evals.rerank_data import RerankSplit
from evals.retrievers import ProgressFn, RetrievalOutput, no_progress
from evals.suites import CLASSIFICATION, RERANK, RETRIEVAL, SuiteSpec
from registry.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_ci, macro_f1_ci


class Retriever(Protocol):
    def retrieve(
        self, data: RetrievalSplit, k: int, progress: ProgressFn = ...
    ) -> RetrievalOutput: ...


class Reranker(Protocol):
    def rerank(self, data: RerankSplit, progress: ProgressFn = ...) -> RetrievalOutput: ...


@dataclass
class ClassificationOutput:
    predictions: list[str]  # one label per test item, in item order
    cost: dict[str, float]
    warnings: list[str] = field(default_factory=list)


class LabelPredictor(Protocol):
    needs_training_split: bool

    def classify(
        self,
        data: ClassificationSplit,
        train: ClassificationSplit | None,
        progress: ProgressFn = ...,
    ) -> ClassificationOutput: ...


Candidate = Retriever | Reranker | LabelPredictor
_METHOD = {RETRIEVAL: "retrieve", RERANK: "rerank", CLASSIFICATION: "classify"}


@dataclass(frozen=True)
class EvalResult:
    suite_name: str
    suite_version: str
    suite_fingerprint: str
    split: str
    main_metric: str
    metrics: dict[str, float]
    ci: dict[str, tuple[float, float]]
    cost: dict[str, float]
    per_query: dict[str, float]  # main metric per query (classification: 1.0 if correct)
    per_query_all: dict[str, dict[str, float]]  # every per-query metric
    sample_size: int | None
    num_queries: int
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    details: dict[str, Any] | None = None

    @property
    def main_score(self) -> float:
        return self.metrics[self.main_metric]


def check_split_allowed(
    suite: SuiteSpec, split: str, trained_on: Iterable[tuple[str | None, str]] = ()
) -> None:
    """Refuse unknown splits, and any split the candidate (or its lineage) was trained on.

    ``trained_on`` holds (suite name or None, split) per adapter in the lineage; a record
    without a suite name is taken to mean this suite, since guessing otherwise could leak.
    """
    if split not in suite.splits:
        known = ", ".join(suite.splits)
        raise SuiteDataError(f"suite {suite.name!r} has no split {split!r} (splits: {known})")
    for trained_suite, trained_split in trained_on:
        if trained_split == split and trained_suite in (None, suite.name):
            raise SplitLeakError(
                f"refusing to score split {split!r} of {suite.name!r}: the candidate (or its "
                "adapter lineage) was trained on it"
            )


def check_candidate_fits(suite: SuiteSpec, candidate: object, name: str = "the candidate") -> None:
    """A candidate of one kind cannot be scored on a suite of another."""
    if not hasattr(candidate, _METHOD[suite.kind]):
        raise CandidateError(f"{name} cannot be scored on {suite.kind} suite {suite.name!r}")


def load_suite_split(
    suite: SuiteSpec, split: str, *, data_root: Path | None = None, sample: int | None = None
) -> tuple[SuiteData, str]:
    """The (optionally sampled) split and the suite's content fingerprint (checked against
    the registered one)."""
    fingerprint = suite.checked_fingerprint(data_root)
    data = suite.load(split, data_root)
    return data.sample(sample), fingerprint


def evaluate(
    suite: SuiteSpec,
    split: str,
    candidate: Candidate,
    *,
    data_root: Path | None = None,
    sample: int | None = None,
    trained_on: Iterable[tuple[str | None, str]] = (),
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    progress: ProgressFn = no_progress,
) -> EvalResult:
    started = time.perf_counter()
    check_candidate_fits(suite, candidate)
    check_split_allowed(suite, split, trained_on)
    data, fingerprint = load_suite_split(suite, split, data_root=data_root, sample=sample)
    train: ClassificationSplit | None = None
    if getattr(candidate, "needs_training_split", False):
        if suite.train_split is None:
            raise CandidateError(
                f"this candidate is fitted on a training split, and suite {suite.name!r} "
                "declares none (register it with --train-split)"
            )
        loaded = suite.load(suite.train_split, data_root)
        assert isinstance(loaded, ClassificationSplit)
        train = loaded
    return score(
        suite,
        data,
        candidate,
        fingerprint=fingerprint,
        train=train,
        sample=sample,
        resamples=resamples,
        seed=seed,
        progress=progress,
        started=started,
    )


def score(
    suite: SuiteSpec,
    data: SuiteData,
    candidate: Candidate,
    *,
    fingerprint: str,
    train: ClassificationSplit | None = None,
    sample: int | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    progress: ProgressFn = no_progress,
    started: float | None = None,
) -> EvalResult:
    """Run the candidate on an already-loaded split and score it."""
    started = time.perf_counter() if started is None else started
    check_candidate_fits(suite, candidate)
    head: dict[str, Any] = {
        "suite_name": suite.name,
        "suite_version": suite.version,
        "suite_fingerprint": fingerprint,
        "split": data.split,
        "main_metric": suite.main_metric,
    }
    if isinstance(data, ClassificationSplit):
        with metered() as usage:
            output = candidate.classify(data, train, progress)  # type: ignore[union-attr]
        _default_resources(output.cost, usage, candidate, len(data.ids))
        return _classification_result(head, suite, data, output, sample, resamples, seed, started)
    with metered() as usage:
        if isinstance(data, RerankSplit):
            ranked = candidate.rerank(data, progress)  # type: ignore[union-attr]
            items = data.pairs
        else:
            k = max_depth(suite.metrics)
            ranked = candidate.retrieve(data, k, progress)  # type: ignore[union-attr]
            items = len(data.queries)
    _default_resources(ranked.cost, usage, candidate, items)
    qrels, count = data.qrels, len(data.queries)
    per_query = per_query_scores(ranked.results, qrels, suite.metrics)
    ci: dict[str, tuple[float, float]] = {}
    for name, values in per_query.items():
        interval = bootstrap_ci(list(values.values()), resamples=resamples, seed=seed)
        ci[name] = (interval.low, interval.high)
    return EvalResult(
        **head,
        metrics=mean_scores(per_query),
        ci=ci,
        cost=ranked.cost,
        per_query=per_query[suite.main_metric],
        per_query_all=per_query,
        sample_size=count if sample is not None else None,
        num_queries=count,
        warnings=list(data.warnings) + list(ranked.warnings),
        wall_seconds=time.perf_counter() - started,
    )


def _default_resources(cost: dict[str, float], usage: Usage, candidate: object, items: int) -> None:
    """CPU per item and peak memory of the whole candidate call (and of a runtime process it
    drove), unless the candidate measured the serving part itself (a dense retriever counts
    its encoding only, a baseline its predictions, not a fit)."""
    if "cpu_ms_per_item" in cost:
        return
    pid = getattr(candidate, "runtime_pid", None)
    if pid:
        add_runtime(usage, pid)
    cost.update(usage.figures(items))


def classification_scores(
    data: ClassificationSplit, predictions: list[str]
) -> tuple[dict[str, float], dict[str, Any]]:
    """scikit-learn's accuracy and macro-F1, plus per-class F1 and the confusion matrix."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    if len(predictions) != len(data.ids):
        raise CandidateError(
            f"the candidate returned {len(predictions)} predictions for {len(data.ids)} items"
        )
    unknown = sorted(set(predictions) - set(data.label_names))
    if unknown:
        raise CandidateError(
            f"the candidate predicts label(s) the suite does not declare: {', '.join(unknown)}"
        )
    labels = list(data.label_names)
    per_class = f1_score(data.labels, predictions, labels=labels, average=None, zero_division=0)
    metrics = {
        "macro_f1": float(f1_score(data.labels, predictions, average="macro", zero_division=0)),
        "accuracy": float(accuracy_score(data.labels, predictions)),
    }
    details = {
        "labels": labels,
        "per_class_f1": {label: float(v) for label, v in zip(labels, per_class, strict=True)},
        "support": data.label_counts(),
        "confusion_matrix": confusion_matrix(data.labels, predictions, labels=labels).tolist(),
        "gold": dict(zip(data.ids, data.labels, strict=True)),
        "pred": dict(zip(data.ids, predictions, strict=True)),
    }
    return metrics, details


def _classification_result(
    head: dict[str, Any],
    suite: SuiteSpec,
    data: ClassificationSplit,
    output: ClassificationOutput,
    sample: int | None,
    resamples: int,
    seed: int,
    started: float,
) -> EvalResult:
    metrics, details = classification_scores(data, output.predictions)
    correct = {
        i: float(g == p) for i, g, p in zip(data.ids, data.labels, output.predictions, strict=True)
    }
    accuracy = bootstrap_ci(list(correct.values()), resamples=resamples, seed=seed)
    macro = macro_f1_ci(details["gold"], details["pred"], resamples=resamples, seed=seed)
    ci = {"accuracy": (accuracy.low, accuracy.high), "macro_f1": (macro.low, macro.high)}
    return EvalResult(
        **head,
        metrics={m: metrics[m] for m in suite.metrics},
        ci={m: ci[m] for m in suite.metrics},
        cost=output.cost,
        per_query=correct,
        per_query_all={"accuracy": correct},
        sample_size=len(data.ids) if sample is not None else None,
        num_queries=len(data.ids),
        warnings=list(data.warnings) + list(output.warnings),
        wall_seconds=time.perf_counter() - started,
        details=details,
    )
