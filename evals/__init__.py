"""The eval harness: declared suites, mteb-computed retrieval metrics kept per query, paired
bootstrap CIs, dense (base + LoRA) and BM25 candidates, an embedding cache, reports.

The core (``suites``, ``beir``, ``metrics``, ``bootstrap``, ``retrievers``, ``cache``,
``harness``, ``report``) knows nothing of the registry; ``runner`` is the one module that reads
and writes it, and ``tracking`` the one that talks to MLflow.
"""

from evals.errors import (
    CandidateError,
    EvalError,
    EvalInterrupted,
    SplitLeakError,
    SuiteDataError,
    UnknownSuite,
)
from evals.suites import BUILTIN_SUITES, SuiteSpec, beir_suite, get_suite

__all__ = [
    "BUILTIN_SUITES",
    "CandidateError",
    "EvalError",
    "EvalInterrupted",
    "SplitLeakError",
    "SuiteDataError",
    "SuiteSpec",
    "UnknownSuite",
    "beir_suite",
    "get_suite",
]
