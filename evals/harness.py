"""The registry-free core of an eval run: load a split, retrieve, score per query, bootstrap.

``evaluate`` returns an ``EvalResult`` and writes nothing anywhere; recording it (registry,
MLflow) is the runner's job, and happens only after this returns, so an interrupted run leaves
no trace but content-keyed cache entries.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evals.beir import RetrievalSplit, load_split
from evals.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_ci
from evals.errors import SplitLeakError, SuiteDataError
from evals.metrics import max_depth, mean_scores, per_query_scores
from evals.retrievers import ProgressFn, RetrievalOutput, no_progress
from evals.suites import SuiteSpec


class Retriever(Protocol):
    def retrieve(
        self, data: RetrievalSplit, k: int, progress: ProgressFn = ...
    ) -> RetrievalOutput: ...


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
    per_query: dict[str, float]  # main metric, per query id (what paired comparisons use)
    per_query_all: dict[str, dict[str, float]]  # every metric, per query id
    sample_size: int | None
    num_queries: int
    warnings: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

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
                f"refusing to score split {split!r} of {suite.name!r}: the candidate's adapter "
                "lineage was trained on it"
            )


def load_suite_split(
    suite: SuiteSpec, split: str, *, data_root: Path | None = None, sample: int | None = None
) -> tuple[RetrievalSplit, str]:
    """The (optionally sampled) split and the suite's content fingerprint."""
    fingerprint = suite.fingerprint(data_root)
    data = load_split(suite.data_dir(data_root), split)
    return data.sample(sample), fingerprint


def evaluate(
    suite: SuiteSpec,
    split: str,
    retriever: Retriever,
    *,
    data_root: Path | None = None,
    sample: int | None = None,
    trained_on: Iterable[tuple[str | None, str]] = (),
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    progress: ProgressFn = no_progress,
) -> EvalResult:
    started = time.perf_counter()
    check_split_allowed(suite, split, trained_on)
    data, fingerprint = load_suite_split(suite, split, data_root=data_root, sample=sample)
    return score(
        suite,
        data,
        retriever,
        fingerprint=fingerprint,
        sample=sample,
        resamples=resamples,
        seed=seed,
        progress=progress,
        started=started,
    )


def score(
    suite: SuiteSpec,
    data: RetrievalSplit,
    retriever: Retriever,
    *,
    fingerprint: str,
    sample: int | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    progress: ProgressFn = no_progress,
    started: float | None = None,
) -> EvalResult:
    """Retrieve and score an already-loaded split."""
    started = time.perf_counter() if started is None else started
    output = retriever.retrieve(data, max_depth(suite.metrics), progress)
    per_query = per_query_scores(output.results, data.qrels, suite.metrics)
    metrics = mean_scores(per_query)
    ci: dict[str, tuple[float, float]] = {}
    for name, values in per_query.items():
        interval = bootstrap_ci(list(values.values()), resamples=resamples, seed=seed)
        ci[name] = (interval.low, interval.high)
    return EvalResult(
        suite_name=suite.name,
        suite_version=suite.version,
        suite_fingerprint=fingerprint,
        split=data.split,
        main_metric=suite.main_metric,
        metrics=metrics,
        ci=ci,
        cost=output.cost,
        per_query=per_query[suite.main_metric],
        per_query_all=per_query,
        sample_size=len(data.queries) if sample is not None else None,
        num_queries=len(data.queries),
        warnings=list(data.warnings) + list(output.warnings),
        wall_seconds=time.perf_counter() - started,
    )
