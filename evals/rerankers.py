"""Rerank candidates: order each query's candidate list (the ``rerank`` suite kind).

- ``BaselineReranker`` — the lexical baseline: a fitted ``bm25`` artifact (the term statistics
  of the suite's corpus, the retrieval baseline's tokenizer and parameters) scoring the given
  documents with serving/runtime/lexical.py, as the runtime serves it; ``BM25Reranker`` fits
  one at eval time for a candidate registered without one;
- ``RandomReranker`` — candidates in a seeded random order (what "no model" scores);
- ``BiEncoderReranker`` — cosine of query and passage embeddings (an embedding model, with or
  without a LoRA), through the embedding cache;
- ``CrossEncoderReranker`` — a cross-encoder (base + adapter with a ``score`` head) scoring each
  (query, passage) pair with serving/runtime's ``Scorer``: what is evaluated is what is served.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evals.baselines import BM25_B, BM25_K1
from evals.cache import EmbeddingCache
from evals.cost import metered
from evals.errors import CandidateError
from evals.rerank_data import RerankSplit, shuffled
from evals.retrievers import (
    DenseRetriever,
    ProgressFn,
    Results,
    RetrievalOutput,
    measured_cost,
    no_progress,
)

if TYPE_CHECKING:
    from serving.runtime.model_folder import ModelSpec
    from serving.runtime.remote import RuntimeTarget


class BaselineReranker:
    """A fitted ``bm25`` artifact folder scoring each query's candidates with serving/runtime's
    code (the runtime's ``score`` op runs the same)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        from serving.runtime.baseline_artifact import BaselineError, load_baseline
        from serving.runtime.lexical import Bm25

        with metered() as usage:
            try:
                model = load_baseline(self.folder)
            except BaselineError as exc:
                raise CandidateError(str(exc)) from None
            if not isinstance(model, Bm25):
                raise CandidateError(f"{self.folder} is not a bm25 artifact")
            started = time.perf_counter()
            results: Results = {}
            for qid, candidates in data.candidates.items():
                scores = model.score(data.queries[qid], [data.corpus[d] for d in candidates])
                results[qid] = {d: float(s) for d, s in zip(candidates, scores, strict=True)}
                progress("query", 1, len(data.candidates))
            seconds = time.perf_counter() - started
        cost = {"items_per_s": data.pairs / seconds if seconds > 0 else 0.0}
        cost.update(usage.figures(data.pairs))
        return RetrievalOutput(results=results, cost=cost)


class BM25Reranker:
    """BM25 for a candidate registered without an artifact: the term statistics of the
    documents the split's candidate lists name, fitted at eval time into a temporary artifact
    and scored as ``BaselineReranker``."""

    def __init__(self, *, k1: float = BM25_K1, b: float = BM25_B) -> None:
        self.k1 = k1
        self.b = b

    def rerank(self, data: RerankSplit, progress: ProgressFn = no_progress) -> RetrievalOutput:
        from evals.baselines import fit_bm25

        with tempfile.TemporaryDirectory(prefix="taskfleet-bm25-") as tmp:
            folder = Path(tmp) / "bm25"
            fit_bm25(list(data.corpus.values()), folder, k1=self.k1, b=self.b)
            return BaselineReranker(folder).rerank(data, progress)


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

    def close(self) -> None:
        self.dense.close()

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
        cost = measured_cost(stats) if stats.items else {}
        # Per text encoded: a served pair costs about one passage encoding.
        cost.update(self.dense.resource_figures())
        return RetrievalOutput(results=results, cost=cost)


class CrossEncoderReranker:
    """Scores each (query, passage) pair: a base + adapter with a ``score`` head in-process, or
    through a runtime of the sidecar (``runtime``: a rerank endpoint through http), each with
    the code that serves it."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        max_batch_tokens: int | None = None,
        runtime: RuntimeTarget | None = None,
    ) -> None:
        self.spec = spec
        self.max_batch_tokens = max_batch_tokens
        self.runtime = runtime
        self._scorer: Any = None

    @property
    def runtime_pid(self) -> int | None:
        return getattr(self._scorer, "runtime_pid", None)

    def close(self) -> None:
        close = getattr(self._scorer, "close", None)
        if close is not None:
            close()
        self._scorer = None

    def scorer(self) -> Any:
        from serving.runtime.encoder import Encoder
        from serving.runtime.heads import load_head, with_head_limit
        from serving.runtime.remote import RemoteScorer
        from serving.runtime.scorer import Scorer

        if self._scorer is None and self.runtime is not None and self.runtime.kind != "torch":
            self._scorer = RemoteScorer(self.spec, self.runtime)
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
    spec: ModelSpec,
    model_fingerprint: str,
    adapter_fingerprint: str | None,
    cache: EmbeddingCache,
    runtime: RuntimeTarget | None = None,
) -> BiEncoderReranker:
    """A bi-encoder reranker whose vectors come through ``runtime`` (default in-process): an
    embedding endpoint's vectors through the http runtime, cached like any other."""
    return BiEncoderReranker(
        DenseRetriever(
            spec,
            model_fingerprint=model_fingerprint,
            adapter_fingerprint=adapter_fingerprint,
            cache=cache,
            runtime=runtime,
        )
    )
