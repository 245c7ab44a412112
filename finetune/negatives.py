"""Hard negatives: passages that look relevant to a query but are not among its positives.

A random in-batch passage is usually easy to tell apart; a BM25 or base-model near miss teaches
the model the distinctions the eval actually tests (neighbouring BGB paragraphs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from finetune.data import TrainingPairs


def mine_bm25(data: TrainingPairs, depth: int) -> dict[str, list[str]]:
    """Rank the corpus for each training query with BM25 (German stop words)."""
    import bm25s
    from bm25s.stopwords import STOPWORDS_GERMAN

    doc_ids = sorted(data.corpus)
    query_ids = sorted(data.queries)
    stopwords = list(STOPWORDS_GERMAN)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([data.corpus[d] for d in doc_ids], stopwords=stopwords, show_progress=False),
        show_progress=False,
    )
    k = min(len(doc_ids), depth + max(len(p) for p in data.positives.values()))
    tokens = bm25s.tokenize(
        [data.queries[q] for q in query_ids], stopwords=stopwords, show_progress=False
    )
    ranked, _ = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    return _drop_positives(data, query_ids, [[doc_ids[i] for i in row] for row in ranked], depth)


def mine_with_model(
    data: TrainingPairs, model: Any, depth: int, *, query_prefix: str, passage_prefix: str
) -> dict[str, list[str]]:
    """Rank the corpus for each training query with the (not yet adapted) model itself."""
    from finetune.modeling import embed_no_grad

    doc_ids = sorted(data.corpus)
    query_ids = sorted(data.queries)
    docs = embed_no_grad(model, [passage_prefix + data.corpus[d] for d in doc_ids])
    queries = embed_no_grad(model, [query_prefix + data.queries[q] for q in query_ids])
    scores = queries @ docs.T
    k = min(len(doc_ids), depth + max(len(p) for p in data.positives.values()))
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return _drop_positives(data, query_ids, [[doc_ids[i] for i in row] for row in top], depth)


def _drop_positives(
    data: TrainingPairs, query_ids: list[str], ranked: list[list[str]], depth: int
) -> dict[str, list[str]]:
    mined: dict[str, list[str]] = {}
    for query_id, row in zip(query_ids, ranked, strict=True):
        negatives = [d for d in row if d not in data.positives[query_id]][:depth]
        if negatives:
            mined[query_id] = negatives
    return mined
