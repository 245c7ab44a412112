"""Turn a retrieval split into ranked results: dense (base model + optional LoRA) or BM25.

Dense encoding goes through serving/runtime's Encoder (what is evaluated is what is served)
and through the embedding cache, so only texts the cache lacks are encoded. Search is exact:
cosine similarity over the whole corpus, top-k per query, the way mteb's SearchEncoderWrapper
scores a sentence-transformers model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from evals.beir import RetrievalSplit
from evals.cache import CachedCost, EmbeddingCache, namespace, text_key
from evals.cost import Usage, add_runtime, metered, process_cpu_seconds

if TYPE_CHECKING:
    from serving.runtime.encoder import EncodeStats
    from serving.runtime.model_folder import ModelSpec, TextKind
    from serving.runtime.remote import RuntimeTarget, TextEncoder

ProgressFn = Callable[[str, int, int], None]  # (phase, items done now, phase total)
Results = dict[str, dict[str, float]]


def no_progress(phase: str, advance: int, total: int) -> None:
    return None


@dataclass
class RetrievalOutput:
    results: Results
    cost: dict[str, float]
    warnings: list[str] = field(default_factory=list)


def top_k(
    scores: np.ndarray, doc_ids: Sequence[str], k: int, *, positive_only: bool
) -> dict[str, float]:
    """The k best documents of one query's score row (optionally only those scoring > 0)."""
    k = min(k, scores.shape[0])
    best = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(k)
    return {doc_ids[i]: float(scores[i]) for i in best if not positive_only or scores[i] > 0.0}


class DenseRetriever:
    """A sentence-transformers base model, optionally with a LoRA adapter, behind a cache,
    encoded by a given runtime (in-process PyTorch by default; Candle or HTTP through the
    sidecar, see ``serving.runtime.remote``)."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        model_fingerprint: str,
        adapter_fingerprint: str | None,
        cache: EmbeddingCache,
        max_batch_tokens: int | None = None,
        runtime: RuntimeTarget | None = None,
    ) -> None:
        self.spec = spec
        self.model_fingerprint = model_fingerprint
        self.adapter_fingerprint = adapter_fingerprint
        self.cache = cache
        self.max_batch_tokens = max_batch_tokens
        self.runtime = runtime
        self._encoder: TextEncoder | None = None
        self._namespace: str | None = None
        # What encoding cost so far (evals/cost.py), over ``_encoded`` texts.
        self._usage = Usage()
        self._encoded = 0

    @property
    def runtime_kind(self) -> str:
        return self.runtime.kind if self.runtime else "torch"

    def _load(self) -> TextEncoder:
        from serving.runtime.remote import RuntimeTarget, open_encoder

        if self._encoder is None:
            self._encoder = open_encoder(
                self.spec, self.runtime or RuntimeTarget(), max_batch_tokens=self.max_batch_tokens
            )
        return self._encoder

    def close(self) -> None:
        """Stops a runtime process this retriever started (nothing to do in-process)."""
        close = getattr(self._encoder, "close", None)
        if close is not None:
            close()
        self._encoder = None

    @property
    def namespace(self) -> str:
        if self._namespace is None:
            # The sequence length is part of the key: truncation changes the vectors.
            max_len = self.spec.max_seq_length
            if max_len is None:
                # Only torch needs loading to know it; the sidecar runtimes apply the folder's
                # own limit, which the model fingerprint covers (0 stands for it).
                max_len = self._load().max_seq_length if self.runtime_kind == "torch" else 0
            self._namespace = namespace(
                self.model_fingerprint, self.adapter_fingerprint, max_len, self.runtime_kind
            )
        return self._namespace

    def embed(
        self, texts: Sequence[str], kind: TextKind, stats: EncodeStats, progress: ProgressFn
    ) -> tuple[np.ndarray, int]:
        """Vectors for texts (cached or freshly encoded) and how many came from the cache."""
        prefix = self.spec.prefix(kind)
        keys = [text_key(prefix + t) for t in texts]
        found = self.cache.get_many(self.namespace, keys)
        missing = [i for i, k in enumerate(keys) if k not in found]
        hits = len(texts) - len(missing)
        progress(kind, hits, len(texts))
        if missing:
            pid = getattr(self._encoder, "runtime_pid", None)
            runtime_cpu = process_cpu_seconds(pid) if pid else 0.0
            with metered() as usage:
                encoder = self._load()
                todo = [texts[i] for i in missing]
                for indices, vectors, batch_stats in encoder.iter_batches(todo, kind):
                    self.cache.put_many(
                        self.namespace,
                        ((keys[missing[i]], v) for i, v in zip(indices, vectors, strict=True)),
                    )
                    for i, v in zip(indices, vectors, strict=True):
                        found[keys[missing[i]]] = v
                    stats.add(batch_stats)
                    progress(kind, len(indices), len(texts))
            pid = getattr(encoder, "runtime_pid", None)
            if pid:
                add_runtime(usage, pid, runtime_cpu)
            self._usage.cpu_seconds += usage.cpu_seconds
            self._usage.peak_bytes = max(self._usage.peak_bytes, usage.peak_bytes)
            self._encoded += len(missing)
        matrix = np.stack([found[k] for k in keys]).astype(np.float32)
        return matrix, hits

    def resource_figures(self) -> dict[str, float]:
        """CPU per text encoded and peak memory of this retriever's encoding, recorded in the
        cache; a run that encoded nothing reports the figures of the run that did."""
        if self._encoded:
            self.cache.record_resources(
                self.namespace, self._encoded, self._usage.cpu_seconds, self._usage.peak_bytes
            )
            return self._usage.figures(self._encoded)
        previous = self.cache.last_resources(self.namespace)
        if previous is None:
            return {}
        items, cpu_seconds, peak_bytes = previous
        return Usage(cpu_seconds, peak_bytes).figures(items)

    def retrieve(
        self, data: RetrievalSplit, k: int, progress: ProgressFn = no_progress
    ) -> RetrievalOutput:
        from serving.runtime.encoder import EncodeStats

        stats = EncodeStats()
        doc_ids = list(data.corpus)
        query_ids = list(data.queries)
        docs, doc_hits = self.embed([data.corpus[d] for d in doc_ids], "passage", stats, progress)
        queries, query_hits = self.embed(
            [data.queries[q] for q in query_ids], "query", stats, progress
        )

        started = time.perf_counter()
        docs = _normalise(docs)
        queries = _normalise(queries)
        results: Results = {}
        for start in range(0, len(query_ids), 256):
            block = queries[start : start + 256] @ docs.T
            for row, qid in zip(block, query_ids[start : start + 256], strict=True):
                results[qid] = top_k(row, doc_ids, k, positive_only=False)
        search_seconds = time.perf_counter() - started

        cached = doc_hits + query_hits
        cost = {"encoded_items": float(stats.items), "cached_items": float(cached)}
        cost["search_seconds"] = search_seconds
        if stats.items:
            measured = CachedCost(
                stats.items,
                stats.tokens,
                stats.seconds,
                stats.latency_ms(0.5),
                stats.latency_ms(0.95),
            )
            self.cache.record_cost(self.namespace, measured)
            cost["cost_from_cache"] = 0.0
        else:
            # Nothing was encoded: report the cost measured when these vectors were made.
            previous = self.cache.last_cost(self.namespace)
            measured = previous or CachedCost(0, 0, 0.0, 0.0, 0.0)
            cost["cost_from_cache"] = 1.0
        cost.update(cost_figures(measured))
        cost.update(self.resource_figures())
        return RetrievalOutput(results=results, cost=cost)


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)


def measured_cost(stats: EncodeStats) -> dict[str, float]:
    """Cost figures of what an encoder just did (items/s, tokens/s, batch latencies)."""
    return cost_figures(
        CachedCost(
            stats.items, stats.tokens, stats.seconds, stats.latency_ms(0.5), stats.latency_ms(0.95)
        )
    )


def cost_figures(cost: CachedCost) -> dict[str, float]:
    return {
        "items_per_s": cost.items / cost.seconds if cost.seconds > 0 else 0.0,
        "tokens_per_s": cost.tokens / cost.seconds if cost.seconds > 0 else 0.0,
        "latency_p50_ms": cost.latency_p50_ms,
        "latency_p95_ms": cost.latency_p95_ms,
    }


def tokenize_german(text: str) -> list[str]:
    """Lowercase, runs of Unicode word characters (umlauts and ß kept, '§' dropped), minus
    bm25s's German stopword list (``serving.runtime.lexical.tokenize_words``, which the served
    BM25 baseline runs too).

    Stopwords matter here: lay questions are long (median ~1,100 characters) and full of
    "ich", "und", "der", and BM25 adds every query occurrence, so they drown the content words
    (GerLayQA eval nDCG@10: 0.050 with them, 0.068 without). No stemming: German
    decompounding/stemming is a modelling choice of its own, kept out of the baseline.
    """
    from evals.baselines import german_stopwords
    from serving.runtime.lexical import tokenize_words

    return tokenize_words(text, german_stopwords())


class BM25Retriever:
    """Lexical baseline: bm25s (Lucene BM25, k1=1.5, b=0.75) over ``tokenize_german``."""

    def __init__(self, *, k1: float = 1.5, b: float = 0.75, query_batch: int = 64) -> None:
        self.k1 = k1
        self.b = b
        self.query_batch = query_batch

    def retrieve(
        self, data: RetrievalSplit, k: int, progress: ProgressFn = no_progress
    ) -> RetrievalOutput:
        import bm25s

        doc_ids = list(data.corpus)
        started = time.perf_counter()
        index = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        index.index([tokenize_german(data.corpus[d]) for d in doc_ids], show_progress=False)
        index_seconds = time.perf_counter() - started
        progress("passage", len(doc_ids), len(doc_ids))

        results: Results = {}
        latencies: list[float] = []
        tokens = 0
        query_ids = list(data.queries)
        for start in range(0, len(query_ids), self.query_batch):
            batch = query_ids[start : start + self.query_batch]
            t0 = time.perf_counter()
            for qid in batch:
                words = tokenize_german(data.queries[qid])
                tokens += len(words)
                ids = index.get_tokens_ids(words)
                if ids:
                    row = np.asarray(index.get_scores_from_ids(ids), dtype=np.float64)
                else:
                    row = np.zeros(len(doc_ids))
                # A document sharing no word with the query is not retrieved at all.
                results[qid] = top_k(row, doc_ids, k, positive_only=True)
            latencies.append(time.perf_counter() - t0)
            progress("query", len(batch), len(query_ids))
        seconds = sum(latencies)
        cost = cost_figures(
            CachedCost(
                len(query_ids),
                tokens,
                seconds,
                float(np.quantile(latencies, 0.5) * 1000.0),
                float(np.quantile(latencies, 0.95) * 1000.0),
            )
        )
        cost.update(index_seconds=index_seconds, encoded_items=float(len(query_ids)))
        return RetrievalOutput(results=results, cost=cost)
