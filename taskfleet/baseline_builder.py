"""The shell's baseline builder: the registry fits a servable tfidf-lr or bm25 candidate
through it (``BaselineBuilder`` in registry/store.py) and so reads no suite data; the CLI, the
control plane's REST route and the benchmarks pass it in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from registry.entities import Suite
from registry.errors import InvalidInput


def fit_baseline(
    kind: str, suite: Suite, target: Path, *, data_root: Path | None = None
) -> Mapping[str, Any]:
    """evals/baselines.py's fit on the registered suite version; a refusal (no training split,
    data that moved or changed) is the registry's InvalidInput (one line, 400 on REST)."""
    from evals.baselines import fit_on_suite
    from evals.errors import EvalError
    from evals.suites import spec_from_record

    try:
        return fit_on_suite(kind, spec_from_record(suite), target, data_root=data_root)
    except EvalError as exc:
        raise InvalidInput(str(exc)) from None
