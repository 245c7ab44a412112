"""The one place the eval harness touches the registry: resolve a candidate, run, record.

An eval run is recorded only after it has completed: the harness computes everything in
memory, then MLflow gets the run, then the registry gets one ``EvalRunCreate`` in one
transaction. Ctrl-C before that point leaves nothing half-written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evals.cache import EmbeddingCache
from evals.classifiers import (
    BaselineClassifier,
    MajorityClass,
    ModelClassifier,
    TfidfLogisticRegression,
)
from evals.errors import CandidateError, EvalError, EvalInterrupted
from evals.harness import Candidate, EvalResult, evaluate
from evals.provenance import code_version
from evals.report import run_markdown
from evals.rerankers import (
    BaselineReranker,
    BM25Reranker,
    CrossEncoderReranker,
    RandomReranker,
    dense_for_rerank,
)
from evals.retrievers import BM25Retriever, DenseRetriever, ProgressFn, no_progress
from evals.suites import RERANK, SuiteSpec, spec_from_record
from evals.tracking import log_eval_run, per_class_metric
from registry.bootstrap import Interval, paired_run_difference
from registry.kinds import CANDIDATE_KINDS

if TYPE_CHECKING:
    from registry.entities import Candidate as CandidateRecord
    from registry.entities import EvalRun
    from registry.store import EvalStore
    from serving.runtime.remote import RuntimeTarget


@dataclass(frozen=True)
class EvalPaths:
    """Where the shell says things live (from taskfleet settings / CLI flags)."""

    cache_dir: Path
    mlflow_uri: str | None = None  # None: do not log to MLflow
    data_root: Path | None = None  # None: ../shared/data next to the repository
    # The suite's data was moved: read it from here (it must be the registered version).
    suite_location: Path | None = None


@dataclass(frozen=True)
class ResolvedCandidate:
    candidate: Candidate
    model_fingerprint: str | None
    adapter_fingerprint: str | None
    trained_on: list[tuple[str | None, str]]
    runtime: str | None = None  # the runtime that encodes (None: no model)

    def close(self) -> None:
        close = getattr(self.candidate, "close", None)
        if close is not None:
            close()


def task_suite(reg: EvalStore, task: str, paths: EvalPaths) -> SuiteSpec:
    """The newest registered version of the task's suite, as the harness reads it."""
    return spec_from_record(reg.get_suite(reg.get_task(task).suite), paths.suite_location)


def resolve_candidate(
    reg: EvalStore,
    candidate: CandidateRecord,
    suite: SuiteSpec,
    cache: EmbeddingCache,
    runtime: RuntimeTarget | None = None,
) -> ResolvedCandidate:
    """Build what a registered candidate stands for on a suite of its task's kind, with its
    fingerprints and the splits it (or its adapter lineage) was trained on, encoding through
    ``runtime`` (default: torch, in-process)."""
    from registry import RegistryError
    from registry.runtimes import check_servable
    from serving.runtime.model_folder import ModelSpec

    allowed = CANDIDATE_KINDS.get(suite.kind, ())
    if candidate.kind not in allowed:
        raise CandidateError(
            f"candidate {candidate.name!r} is a {candidate.kind} candidate; a {suite.kind} suite "
            f"scores {', '.join(allowed)}"
        )
    fitted_on_train: list[tuple[str | None, str]] = (
        [(suite.name, suite.train_split)] if suite.train_split else []
    )
    baselines: dict[str, tuple[Candidate, list[tuple[str | None, str]]]] = {
        "bm25": (BM25Reranker() if suite.kind == RERANK else BM25Retriever(), []),
        "random": (RandomReranker(), []),
        "tfidf-lr": (TfidfLogisticRegression(), fitted_on_train),
        "majority": (MajorityClass(), fitted_on_train),
    }
    if candidate.kind in baselines:
        if runtime is not None and runtime.kind != "torch":
            raise CandidateError(
                f"a {candidate.kind} candidate runs in the Python runtime (torch) only, not "
                f"{runtime.kind}"
            )
        if candidate.base_model is not None:
            return _fitted_baseline(reg, candidate, suite)
        baseline, fitted_on = baselines[candidate.kind]
        return ResolvedCandidate(baseline, None, None, fitted_on)
    if candidate.base_model is None:
        raise CandidateError(f"candidate {candidate.name!r} names no base model")
    base = reg.get_model(candidate.base_model)
    adapter_path: Path | None = None
    adapter_fp: str | None = None
    trained_on: list[tuple[str | None, str]] = []
    if candidate.adapter is not None:
        adapter = reg.get_adapter(candidate.adapter)
        if adapter.base_model != base.name:
            raise CandidateError(
                f"adapter {adapter.name!r} was trained on {adapter.base_model!r}, "
                f"but candidate {candidate.name!r} uses base {base.name!r}"
            )
        adapter_path = reg.adapter_path(adapter.name)
        adapter_fp = adapter.sha256
        trained_on = [(a.training.suite, a.training.train_split) for a in reg.lineage(adapter.name)]
    elif candidate.kind != "embedding" and base.format != "endpoint":
        raise CandidateError(
            f"candidate {candidate.name!r}: scoring a {candidate.kind} without a taskfleet "
            "adapter (a Hugging Face cross-encoder or classifier base) is not supported yet"
        )
    kind = runtime.kind if runtime else "torch"
    try:
        check_servable(
            kind,
            model=base.name,
            model_runtimes=base.runtime_kinds,
            adapter=candidate.adapter,
            task_kind=reg.get_task(candidate.task).kind,
            variant=base.variant,
            model_format=base.format,
            endpoint_kind=(base.endpoint or {}).get("kind"),
        )
    except RegistryError as exc:
        raise CandidateError(str(exc)) from None
    spec = ModelSpec(
        base_path=reg.model_path(base.name),
        adapter_path=adapter_path,
        query_prefix=base.query_prefix,
        passage_prefix=base.passage_prefix,
    )
    built: Candidate
    if candidate.kind == "cross-encoder":
        built = CrossEncoderReranker(spec, runtime=runtime)
    elif candidate.kind == "classifier":
        built = ModelClassifier(spec)
    elif suite.kind == RERANK:
        built = dense_for_rerank(spec, base.sha256, adapter_fp, cache, runtime)
    else:
        built = DenseRetriever(
            spec,
            model_fingerprint=base.sha256,
            adapter_fingerprint=adapter_fp,
            cache=cache,
            runtime=runtime,
        )
    return ResolvedCandidate(built, base.sha256, adapter_fp, trained_on, kind)


def _fitted_baseline(
    reg: EvalStore, candidate: CandidateRecord, suite: SuiteSpec
) -> ResolvedCandidate:
    """A tfidf-lr or bm25 candidate on its own fitted artifact: scored by the code the Python
    runtime serves it with; the split it was fitted on (its manifest says) is never scored."""
    from serving.runtime.baseline_artifact import BaselineError, read_manifest

    assert candidate.base_model is not None
    base = reg.get_model(candidate.base_model)
    if base.format != candidate.kind:
        raise CandidateError(f"model {base.name!r} is not a fitted {candidate.kind} artifact")
    folder = reg.model_path(base.name)
    try:
        fitted_on = read_manifest(folder).get("fitted_on", {})
    except BaselineError as exc:
        raise CandidateError(str(exc)) from None
    split = fitted_on.get("split")
    trained_on = [(fitted_on.get("suite"), split)] if split and split != "corpus" else []
    built: Candidate = (
        BaselineClassifier(folder) if candidate.kind == "tfidf-lr" else BaselineReranker(folder)
    )
    return ResolvedCandidate(built, base.sha256, None, trained_on, "torch")


def run_eval(
    reg: EvalStore,
    task: str,
    candidate_name: str,
    paths: EvalPaths,
    *,
    split: str | None = None,
    sample: int | None = None,
    progress: ProgressFn = no_progress,
    runtime: RuntimeTarget | None = None,
) -> EvalRun:
    """Evaluate a registered candidate on its task's suite (through ``runtime``, default the
    in-process torch one), record the run, then ask for the task's auto-promotion."""
    from registry.entities import EvalRunCreate
    from serving.runtime.heads import HeadError
    from serving.runtime.model_folder import ModelLoadError

    suite = task_suite(reg, task, paths)
    split = split or suite.test_split
    candidate = reg.get_candidate(task, candidate_name)
    cache = EmbeddingCache.in_dir(paths.cache_dir)
    resolved: ResolvedCandidate | None = None
    try:
        resolved = resolve_candidate(reg, candidate, suite, cache, runtime)
        result = evaluate(
            suite,
            split,
            resolved.candidate,
            data_root=paths.data_root,
            sample=sample,
            trained_on=resolved.trained_on,
            progress=progress,
        )
    except KeyboardInterrupt:
        raise EvalInterrupted("interrupted; no eval run was recorded") from None
    except (ModelLoadError, HeadError) as exc:
        raise CandidateError(str(exc)) from None
    finally:
        if resolved is not None:
            resolved.close()
        cache.close()

    version = code_version()
    mlflow_run_id = None
    if paths.mlflow_uri:
        mlflow_run_id = _log_to_mlflow(paths.mlflow_uri, task, candidate, result, resolved, version)
    create = EvalRunCreate(
        task=task,
        candidate=candidate.name,
        suite_name=result.suite_name,
        suite_version=result.suite_version,
        suite_fingerprint=result.suite_fingerprint,
        split=result.split,
        main_metric=result.main_metric,
        metrics=result.metrics,
        ci=result.ci,
        cost=result.cost,
        per_query=result.per_query,
        model_fingerprint=resolved.model_fingerprint,
        adapter_fingerprint=resolved.adapter_fingerprint,
        sample_size=result.sample_size,
        warnings=result.warnings,
        code_version=version,
        mlflow_run_id=mlflow_run_id,
        wall_seconds=result.wall_seconds,
        runtime=resolved.runtime,
        details=result.details,
    )
    recorded = reg.record_eval_run(create)
    # The step a task opts into (``auto_promote``): a run that clears the rule promotes now.
    reg.maybe_auto_promote(task, candidate.name)
    return recorded


def _log_to_mlflow(
    uri: str,
    task: str,
    candidate: CandidateRecord,
    result: EvalResult,
    resolved: ResolvedCandidate,
    version: str,
) -> str:
    params = {
        "task": task,
        "candidate": candidate.name,
        "kind": candidate.kind,
        "base_model": candidate.base_model or "",
        "adapter": candidate.adapter or "",
        "suite": f"{result.suite_name}@{result.suite_version}",
        "suite_fingerprint": result.suite_fingerprint,
        "split": result.split,
        "sample_size": result.sample_size or "all",
        "model_fingerprint": resolved.model_fingerprint or "",
        "adapter_fingerprint": resolved.adapter_fingerprint or "",
        "code_version": version,
        "runtime": resolved.runtime or "",
    }
    metrics = dict(result.metrics)
    for name, (low, high) in result.ci.items():
        metrics[f"{name}_ci_low"] = low
        metrics[f"{name}_ci_high"] = high
    metrics.update({f"cost_{k}": v for k, v in result.cost.items()})
    if result.details is not None:
        per_class = result.details.get("per_class_f1", {})
        metrics.update({per_class_metric(label): value for label, value in per_class.items()})
    metrics["wall_seconds"] = result.wall_seconds

    try:
        return log_eval_run(
            uri,
            task=task,
            run_name=candidate.name,
            params=params,
            metrics=metrics,
            report_markdown=run_markdown(task, candidate.name, result),
        )
    except KeyboardInterrupt:
        raise EvalInterrupted("interrupted; no eval run was recorded") from None
    except Exception as exc:  # MLflow raises many types; the run must not be half-recorded
        raise EvalError(f"could not log the run to MLflow at {uri}: {exc}") from None


def leaderboard(reg: EvalStore, task: str) -> dict[str, EvalRun]:
    """Per candidate, the run that ranks it on the newest version of the task's suite (the
    registry's rule: its test split only, never another version or folder)."""
    return reg.leaderboard(task)


@dataclass(frozen=True)
class Comparison:
    a: EvalRun
    b: EvalRun
    difference: Interval  # mean(a - b) of the main metric over shared queries
    shared_queries: int


def compare(reg: EvalStore, task: str, a: str, b: str) -> Comparison:
    """Paired bootstrap of the main-metric difference between two candidates' latest runs."""
    board = leaderboard(reg, task)
    for name in (a, b):
        reg.get_candidate(task, name)  # NotFound for an unknown candidate
        if name not in board:
            raise EvalError(f"candidate {name!r} has no eval run on task {task!r} yet")
    run_a, run_b = board[a], board[b]
    if (run_a.suite_fingerprint, run_a.split) != (run_b.suite_fingerprint, run_b.split):
        raise EvalError(
            f"runs are not comparable: {a} on {run_a.split}@{run_a.suite_fingerprint[:12]}, "
            f"{b} on {run_b.split}@{run_b.suite_fingerprint[:12]}"
        )
    try:
        interval, shared = paired_run_difference(run_a, run_b)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    return Comparison(run_a, run_b, interval, shared)


# The documented demo sample: the first DEMO_SAMPLE judged eval queries (queries.jsonl order)
# against the full corpus, so `make demo` shows real numbers in about a minute on two cores.
DEMO_SAMPLE = 100


def evaluate_sample(
    reg: EvalStore,
    task: str,
    candidates: list[str],
    paths: EvalPaths,
    *,
    sample: int = DEMO_SAMPLE,
    progress: ProgressFn = no_progress,
) -> dict[str, EvalRun]:
    """Evaluate several candidates on the same documented sample; each run is recorded."""
    return {
        name: run_eval(reg, task, name, paths, sample=sample, progress=progress)
        for name in candidates
    }
