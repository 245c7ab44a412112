"""Training data from a suite's training split, read with the eval harness's reader of the
suite's kind (one reader per kind in the project, so training and evaluation see identical
texts): retrieval pairs (query, positive passage), rerank groups (a query's relevant and other
candidates), labelled texts. Only the split a suite declares for training may be used; a split
it tests on is refused, so no adapter is ever scored on what it was trained on.
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
        if suite.train_split is None:
            raise TrainingDataError(f"suite {suite.name!r} declares no training split")
        return suite.train_split
    if split == suite.test_split:
        raise TrainingDataError(
            f"split {split!r} is a test split of suite {suite.name!r}; training on it would "
            f"leak the test set (training split: {suite.train_split or 'none'})"
        )
    if split != suite.train_split:
        raise TrainingDataError(
            f"suite {suite.name!r} has no training split {split!r} "
            f"(training split: {suite.train_split or 'none'})"
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
    if suite.kind != "retrieval":
        raise TrainingDataError(f"suite {suite.name!r} is a {suite.kind} suite, not retrieval")
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


@dataclass(frozen=True)
class RerankGroups:
    """Training data of a cross-encoder: per query, the relevant and the other candidates of
    its list (a listwise group is one positive plus negatives drawn from that list)."""

    suite: str
    split: str
    queries: dict[str, str]
    corpus: dict[str, str]
    groups: list[tuple[str, list[str], list[str]]]  # (query id, positives, negatives)
    fingerprint: str
    warnings: list[str] = field(default_factory=list)


def load_rerank_groups(
    suite: SuiteSpec, split: str | None = None, *, data_root: Path | None = None
) -> RerankGroups:
    from evals.rerank_data import RerankSplit

    split = training_split(suite, split)
    data = _load(suite, split, data_root)
    assert isinstance(data, RerankSplit)
    groups = []
    for qid, candidates in data.candidates.items():
        positives = [d for d in candidates if d in data.qrels[qid]]
        negatives = [d for d in candidates if d not in data.qrels[qid]]
        if positives and negatives:
            groups.append((qid, positives, negatives))
    warnings = list(data.warnings)
    skipped = len(data.candidates) - len(groups)
    if skipped:
        warnings.append(f"{skipped} query(ies) lack a relevant or an irrelevant candidate")
    if len(groups) < MIN_TRAINING_PAIRS:
        raise TrainingDataError(
            f"split {split!r} of suite {suite.name!r} has {len(groups)} usable queries "
            f"(a relevant and an irrelevant candidate each); at least {MIN_TRAINING_PAIRS} "
            "are needed"
        )
    digest = hashlib.sha256()
    for qid, positives, negatives in groups:
        digest.update(f"group\t{qid}\t{data.queries[qid]}\t{positives}\t{negatives}\n".encode())
    for doc_id in sorted(data.corpus):
        digest.update(f"doc\t{doc_id}\t{data.corpus[doc_id]}\n".encode())
    used = {qid for qid, _, _ in groups}
    return RerankGroups(
        suite=suite.name,
        split=split,
        queries={q: t for q, t in data.queries.items() if q in used},
        corpus=data.corpus,
        groups=groups,
        fingerprint=digest.hexdigest(),
        warnings=warnings,
    )


@dataclass(frozen=True)
class LabelledTexts:
    """Training data of a classifier: texts with their gold labels."""

    suite: str
    split: str
    texts: list[str]
    labels: list[str]
    label_names: tuple[str, ...]
    fingerprint: str
    warnings: list[str] = field(default_factory=list)


def load_labelled(
    suite: SuiteSpec, split: str | None = None, *, data_root: Path | None = None
) -> LabelledTexts:
    from evals.classification_data import ClassificationSplit

    split = training_split(suite, split)
    data = _load(suite, split, data_root)
    assert isinstance(data, ClassificationSplit)
    present = sorted(set(data.labels))
    if len(present) < 2 or len(data.ids) < MIN_TRAINING_PAIRS:
        raise TrainingDataError(
            f"split {split!r} of suite {suite.name!r} has {len(data.ids)} rows over "
            f"{len(present)} label(s); training needs at least {MIN_TRAINING_PAIRS} rows and "
            "two labels"
        )
    digest = hashlib.sha256()
    digest.update(("labels\t" + "\t".join(data.label_names) + "\n").encode())
    for item_id, text, label in zip(data.ids, data.texts, data.labels, strict=True):
        digest.update(f"item\t{item_id}\t{label}\t{text}\n".encode())
    return LabelledTexts(
        suite=suite.name,
        split=split,
        texts=list(data.texts),
        labels=list(data.labels),
        label_names=data.label_names,
        fingerprint=digest.hexdigest(),
        warnings=list(data.warnings),
    )


def _load(suite: SuiteSpec, split: str, data_root: Path | None) -> object:
    try:
        return suite.load(split, data_root)
    except EvalError as exc:
        raise TrainingDataError(f"suite {suite.name!r}, split {split!r}: {exc}") from exc
