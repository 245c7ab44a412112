"""One way for tests to record a finished eval run with per-query scores around a level."""

from __future__ import annotations

from registry import Registry
from registry.entities import EvalRunCreate

QUERIES = [f"q{i}" for i in range(60)]


def record_run(
    reg: Registry,
    task: str,
    candidate: str,
    level: float,
    *,
    noise: float = 0.0,
    items_per_s: float = 100.0,
    runtime: str | None = None,
    cpu_ms: float | None = None,
) -> int:
    """Per-query nDCG@10 alternates level -/+ noise, so the paired bootstrap has spread.

    The run is on the newest registered version of the task's suite, test split. It is
    recorded as the eval runner records: then the task's auto-promotion step runs."""
    per_query = {q: level + (noise if i % 2 else -noise) for i, q in enumerate(QUERIES)}
    mean = sum(per_query.values()) / len(per_query)
    suite = reg.get_suite(reg.get_task(task).suite)
    run = reg.record_eval_run(
        EvalRunCreate(
            task=task,
            candidate=candidate,
            suite_name=suite.name,
            suite_version=str(suite.version),
            suite_fingerprint=suite.fingerprint,
            split=suite.test_split,
            main_metric="ndcg_at_10",
            metrics={"ndcg_at_10": mean, "recall_at_100": min(1.0, mean + 0.3)},
            ci={"ndcg_at_10": (mean - 0.02, mean + 0.02)},
            cost={"items_per_s": items_per_s}
            | ({} if cpu_ms is None else {"cpu_ms_per_item": cpu_ms, "peak_memory_mb": 100.0}),
            per_query=per_query,
            runtime=runtime,
        )
    )
    reg.maybe_auto_promote(task, candidate)
    return run.id
