"""Kinds of suites, tasks and candidates, and the names of records: rules every role may read,
with no database.

A task has the kind of its suite. What can compete on a task of each kind is fixed here;
model-free baselines have no base or adapter and can never be placed.
"""

from __future__ import annotations

import re

from contract import TASK_NAME
from registry.errors import InvalidInput

SUITE_KINDS = ("retrieval", "rerank", "classification")
TASK_KINDS = SUITE_KINDS  # a task has the kind of its suite
# What can compete on a task of each kind. Model-free baselines have no base or adapter.
CANDIDATE_KINDS: dict[str, tuple[str, ...]] = {
    "retrieval": ("embedding", "bm25"),
    "rerank": ("cross-encoder", "embedding", "bm25", "random"),
    "classification": ("classifier", "tfidf-lr", "majority"),
}
BASELINE_KINDS = ("bm25", "random", "tfidf-lr", "majority")

# ---- names ---------------------------------------------------------------------------------
# Registry names: lowercase, a letter or digit first, at most 128 characters (the columns).
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
# Candidates are often "<base>+<adapter>", so they may also contain '+'.
CANDIDATE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,127}$")
# A task name is a NATS subject token (tasks.<task>) and a consumer name, so no '.'; the rule is
# the one the fleet checks too (contract/shared.toml [task_name]).
TASK_NAME_RE = TASK_NAME.pattern
_PATTERNS = {
    "candidate": (CANDIDATE_NAME_RE, "'.', '_', '+' or '-'"),
    "task": (TASK_NAME_RE, " or ".join(f"'{c}'" for c in TASK_NAME.also)),
}


def check_name(kind: str, name: str) -> str:
    """``name`` if it is a valid name for a ``kind`` record (task, candidate, model, adapter,
    suite, api key), else ``InvalidInput`` saying what is allowed."""
    pattern, allowed = _PATTERNS.get(kind, (NAME_RE, "'.', '_' or '-'"))
    if not pattern.fullmatch(name):
        raise InvalidInput(
            f"invalid {kind} name {name!r}: use lowercase letters, digits, {allowed} "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return name
