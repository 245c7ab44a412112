"""Kinds of suites, tasks and candidates: the rules every role may read, with no database.

A task has the kind of its suite. What can compete on a task of each kind is fixed here;
model-free baselines have no base or adapter and can never be placed.
"""

from __future__ import annotations

SUITE_KINDS = ("retrieval", "rerank", "classification")
TASK_KINDS = SUITE_KINDS  # a task has the kind of its suite
# What can compete on a task of each kind. Model-free baselines have no base or adapter.
CANDIDATE_KINDS: dict[str, tuple[str, ...]] = {
    "retrieval": ("embedding", "bm25"),
    "rerank": ("cross-encoder", "embedding", "bm25", "random"),
    "classification": ("classifier", "tfidf-lr", "majority"),
}
BASELINE_KINDS = ("bm25", "random", "tfidf-lr", "majority")
