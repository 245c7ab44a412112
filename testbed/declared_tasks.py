"""Registry-level suites for tests that need a task but no suite data: the registry stores a
declaration and its fingerprint and never reads the data itself."""

from __future__ import annotations

import hashlib
from typing import Any

from registry import NotFound, Registry
from registry.entities import Suite, SuiteCreate, Task

METRICS = {
    "retrieval": ["ndcg_at_10", "mrr_at_10", "recall_at_100"],
    "rerank": ["ndcg_at_10", "mrr_at_10", "map_at_1000"],
    "classification": ["macro_f1", "accuracy"],
}


def fake_fingerprint(name: str, version: int = 1) -> str:
    return hashlib.sha256(f"{name}@{version}".encode()).hexdigest()


def declare_suite(
    reg: Registry,
    name: str,
    *,
    kind: str = "retrieval",
    fingerprint: str | None = None,
    test_split: str = "eval",
    train_split: str | None = "dev",
    description: str = "",
    location: str | None = None,
    live_split: str | None = None,
) -> Suite:
    """Register (a version of) a suite; an existing fingerprint returns that version."""
    suite, _ = reg.add_suite(
        SuiteCreate(
            name=name,
            kind=kind,
            location=location or f"/nonexistent/{name}",
            test_split=test_split,
            train_split=train_split,
            main_metric=METRICS[kind][0],
            metrics=METRICS[kind],
            fingerprint=fingerprint or fake_fingerprint(name),
            description=description,
            live_split=live_split,
        )
    )
    return suite


def add_task(reg: Registry, name: str, *, suite: str | None = None, **kwargs: Any) -> Task:
    """A task on a registered suite (declared here when it does not exist yet)."""
    suite = suite or name
    try:
        reg.get_suite(suite)
    except NotFound:
        declare_suite(reg, suite, kind=kwargs.get("kind") or "retrieval")
    return reg.add_task(name, suite=suite, **kwargs)
