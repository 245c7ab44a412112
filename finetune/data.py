"""Training pairs from a suite's training split: one (query, positive passage) pair per qrel.

The split is read with the eval harness's BEIR loader (one reader in the project, so training
and evaluation see identical texts). Only a split the suite declares for training may be used;
a split it tests on is refused, so no adapter is ever scored on questions it was trained on.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from evals.beir import load_split
from evals.errors import EvalError
from evals.suites import SuiteSpec
from finetune.errors import TrainingDataError

# Below this many pairs a contrastive run learns nothing worth registering.
MIN_TRAINING_PAIRS = 4


@dataclass(frozen=True)
class TrainingPairs:
    suite: str
    split: str
    queries: dict[str, str]
    corpus: dict[str, str]
    pairs: list[tuple[str, str]]
    # All relevant passages per query: other positives of the same query are never negatives.
    positives: dict[str, frozenset[str]]
    fingerprint: str
    warnings: list[str] = field(default_factory=list)


def training_split(suite: SuiteSpec, split: str | None) -> str:
    """The split to train on: the suite's declared one by default; never a test split."""
    if split is None:
        if not suite.train_splits:
            raise TrainingDataError(f"suite {suite.name!r} declares no training split")
        return suite.train_splits[0]
    if split in suite.test_splits:
        raise TrainingDataError(
            f"split {split!r} is a test split of suite {suite.name!r}; training on it would "
            f"leak the test set (training splits: {', '.join(suite.train_splits) or 'none'})"
        )
    if split not in suite.train_splits:
        raise TrainingDataError(
            f"suite {suite.name!r} has no training split {split!r} "
            f"(training splits: {', '.join(suite.train_splits) or 'none'})"
        )
    return split


def load_training_pairs(
    suite: SuiteSpec,
    split: str | None = None,
    *,
    data_root: Path | None = None,
    max_pairs: int | None = None,
    seed: int = 0,
) -> TrainingPairs:
    split = training_split(suite, split)
    try:
        data = load_split(suite.data_dir(data_root), split)
    except EvalError as exc:
        raise TrainingDataError(f"suite {suite.name!r}, split {split!r}: {exc}") from exc
    pairs = [(q, d) for q, docs in data.qrels.items() for d in sorted(docs)]
    if max_pairs is not None and max_pairs < len(pairs):
        pairs = sorted(random.Random(seed).sample(pairs, max_pairs))
    if len(pairs) < MIN_TRAINING_PAIRS:
        raise TrainingDataError(
            f"split {split!r} of suite {suite.name!r} has {len(pairs)} usable training pairs; "
            f"at least {MIN_TRAINING_PAIRS} are needed"
        )
    used = {q for q, _ in pairs}
    queries = {q: data.queries[q] for q in sorted(used)}
    return TrainingPairs(
        suite=suite.name,
        split=split,
        queries=queries,
        corpus=data.corpus,
        pairs=pairs,
        positives={q: frozenset(data.qrels[q]) for q in queries},
        fingerprint=fingerprint(queries, data.corpus, pairs),
        warnings=list(data.warnings),
    )


def fingerprint(
    queries: dict[str, str], corpus: dict[str, str], pairs: list[tuple[str, str]]
) -> str:
    """sha256 over exactly what training saw: the pairs, their query texts and the corpus."""
    digest = hashlib.sha256()
    for query_id, doc_id in sorted(pairs):
        digest.update(f"pair\t{query_id}\t{doc_id}\n".encode())
    for query_id in sorted(queries):
        digest.update(f"query\t{query_id}\t{queries[query_id]}\n".encode())
    for doc_id in sorted(corpus):
        digest.update(f"doc\t{doc_id}\t{corpus[doc_id]}\n".encode())
    return digest.hexdigest()
