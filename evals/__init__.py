"""The eval harness: declared suites of three kinds (retrieval, rerank, classification), one
reader per kind, mteb-computed ranking metrics kept per query, scikit-learn classification
metrics, paired bootstrap CIs, lexical baselines and model candidates (through
serving/runtime), an embedding cache, reports.

The core (``suites``, ``beir``, ``metrics``, ``retrievers``, ``cache``, ``harness``,
``report``) knows nothing of the registry's database (the bootstrap maths it uses is
``registry/bootstrap.py``, shared with the promotion rule); ``runner`` is the one module that
reads and writes the registry, and ``tracking`` the one that talks to MLflow. ``provenance``
names the code that produced a record (eval runs and adapters).
"""

from evals.errors import (
    CandidateError,
    EvalError,
    EvalInterrupted,
    SplitLeakError,
    SuiteDataError,
    UnknownSuite,
)
from evals.suites import SuiteSpec, beir_suite, builtin_spec, declare

__all__ = [
    "CandidateError",
    "EvalError",
    "EvalInterrupted",
    "SplitLeakError",
    "SuiteDataError",
    "SuiteSpec",
    "UnknownSuite",
    "beir_suite",
    "builtin_spec",
    "declare",
]
