"""Rerank candidates: order each query's candidate list (the ``rerank`` suite kind).

- ``BM25Reranker`` — the lexical baseline: BM25 over the suite's documents, the same tokenizer
  and parameters as the retrieval baseline;
- ``RandomReranker`` — candidates in a seeded random order (what "no model" scores);
- ``BiEncoderReranker`` — cosine of query and passage embeddings (an embedding model, with or
  without a LoRA), through the embedding cache;
- ``CrossEncoderReranker`` — a cross-encoder (base + adapter with a ``score`` head) scoring each
  (query, passage) pair with serving/runtime's ``Scorer``: what is evaluated is what is served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from evals.cache import EmbeddingCache
from evals.rerank_data import RerankSplit, shuffled
from evals.retrievers import (
    DenseRetriever,
    ProgressFn,
    Results,
    RetrievalOutput,
    measured_cost,
    no_progress,
    tokenize_german,
)

if TYPE_CHECKING:
    from serving.runtime.encoder import ModelSpec


class BM25Reranker:
    def __init__(self, *, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        import time

        import bm25s

        started = time.perf_counter()
        doc_ids = list(data.corpus)
        position = {d: i for i, d in enumerate(doc_ids)}
        index = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        index.index([tokenize_german(data.corpus[d]) for d in doc_ids], show_progress=False)
        results: Results = {}
        for qid, candidates in data.candidates.items():
            ids = index.get_tokens_ids(tokenize_german(data.queries[qid]))
            row = (
                np.asarray(index.get_scores_from_ids(ids), dtype=np.float64)
                if ids
                else np.zeros(len(doc_ids))
            )
            results[qid] = {d: float(row[position[d]]) for d in candidates}
            progress("query", 1, len(data.candidates))
        seconds = time.perf_counter() - started
        cost = {"items_per_s": data.pairs / seconds if seconds > 0 else 0.0}
        return RetrievalOutput(results=results, cost=cost)


class RandomReranker:
    """Each query's candidates in a random order fixed by (seed, query id)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        results: Results = {}
        for qid, candidates in data.candidates.items():
            order = shuffled(candidates, self.seed, qid)
            results[qid] = {d: float(len(order) - rank) for rank, d in enumerate(order)}
        progress("query", len(results), len(results))
        return RetrievalOutput(results=results, cost={})


class BiEncoderReranker:
    """Cosine of embeddings; documents and queries come from the embedding cache when they
    were encoded before (by a retrieval eval of the same model, for instance)."""

    def __init__(self, dense: DenseRetriever) -> None:
        self.dense = dense

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        from serving.runtime.encoder import EncodeStats
        from serving.runtime.scorer import cosine_scores

        stats = EncodeStats()
        doc_ids = list(data.corpus)
        docs, _ = self.dense.embed([data.corpus[d] for d in doc_ids], "passage", stats, progress)
        query_ids = list(data.queries)
        queries, _ = self.dense.embed(
            [data.queries[q] for q in query_ids], "query", stats, progress
        )
        row = {d: i for i, d in enumerate(doc_ids)}
        results: Results = {}
        for qid, vector in zip(query_ids, queries, strict=True):
            candidates = data.candidates[qid]
            scores = cosine_scores(vector, docs[[row[d] for d in candidates]])
            results[qid] = {d: float(s) for d, s in zip(candidates, scores, strict=True)}
        return RetrievalOutput(results=results, cost=measured_cost(stats) if stats.items else {})


class CrossEncoderReranker:
    def __init__(self, spec: ModelSpec, *, max_batch_tokens: int | None = None) -> None:
        self.spec = spec
        self.max_batch_tokens = max_batch_tokens
        self._scorer: Any = None

    def scorer(self) -> Any:
        from serving.runtime.encoder import Encoder
        from serving.runtime.heads import load_head, with_head_limit
        from serving.runtime.scorer import Scorer

        if self._scorer is None:
            assert self.spec.adapter_path is not None
            spec = with_head_limit(self.spec)  # the length the head was trained with
            encoder = Encoder(spec, max_batch_tokens=self.max_batch_tokens)
            self._scorer = Scorer(encoder, load_head(self.spec.adapter_path))
        return self._scorer

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        from serving.runtime.encoder import EncodeStats

        stats = EncodeStats()
        query_ids = list(data.candidates)
        items = [(data.queries[q], [data.corpus[d] for d in data.candidates[q]]) for q in query_ids]
        total = data.pairs
        scores = self.scorer().score(items, stats, lambda n: progress("pairs", n, total))
        results: Results = {
            q: {d: float(s) for d, s in zip(data.candidates[q], row, strict=True)}
            for q, row in zip(query_ids, scores, strict=True)
        }
        return RetrievalOutput(results=results, cost=measured_cost(stats))


def dense_for_rerank(
    spec: ModelSpec, model_fingerprint: str, adapter_fingerprint: str | None, cache: EmbeddingCache
) -> BiEncoderReranker:
    return BiEncoderReranker(
        DenseRetriever(
            spec,
            model_fingerprint=model_fingerprint,
            adapter_fingerprint=adapter_fingerprint,
            cache=cache,
        )
    )
