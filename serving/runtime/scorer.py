"""Relevance scores of passages for a query: the ``score`` op and the rerank eval share this.

Two ways to score, chosen by the model: a **cross-encoder** (an adapter with a ``score`` head)
encodes each (query, passage) pair as one sequence and maps its embedding to one logit; a
**bi-encoder** (a plain embedding model) scores by the cosine of the query's and the passages'
embeddings. Pairs are batched by tokens across every query of a call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from serving.runtime.encoder import Encoder, EncodeStats
from serving.runtime.heads import HeadError, HeadSpec, check_fits

ScoreItem = tuple[str, Sequence[str]]  # (query, passages)
OnBatch = Callable[[int], None]  # called with the number of inputs each finished batch held


def cosine_scores(query: np.ndarray, passages: np.ndarray) -> np.ndarray:
    """Cosine similarity of one query vector with each passage vector, float32."""
    q = query.astype(np.float32) / max(float(np.linalg.norm(query)), 1e-12)
    norms = np.maximum(np.linalg.norm(passages, axis=1, keepdims=True), 1e-12)
    return np.asarray((passages.astype(np.float32) / norms) @ q, dtype=np.float32)


def apply_head(head: Any, embeddings: np.ndarray) -> np.ndarray:
    """Logits of a torch Linear head for a batch of embeddings, float32."""
    import torch

    with torch.inference_mode():
        logits = head(torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32)))
    return np.asarray(logits.float().cpu().numpy(), dtype=np.float32)


class Scorer:
    def __init__(self, encoder: Encoder, head: tuple[HeadSpec, Any] | None = None) -> None:
        if head is not None:
            if head[0].kind != "score":
                raise HeadError(f"a {head[0].kind!r} head cannot score passages")
            check_fits(head[0], encoder.dims, encoder.spec.adapter_path or encoder.spec.base_path)
        self.encoder = encoder
        self.head = head

    @property
    def cross_encoder(self) -> bool:
        return self.head is not None

    def score(
        self,
        items: Sequence[ScoreItem],
        stats: EncodeStats | None = None,
        on_batch: OnBatch | None = None,
    ) -> list[np.ndarray]:
        """Scores per item, each in its passages' order."""
        stats = stats if stats is not None else EncodeStats()
        if self.head is not None:
            return self._cross(items, stats, on_batch)
        return self._bi(items, stats)

    def _cross(
        self, items: Sequence[ScoreItem], stats: EncodeStats, on_batch: OnBatch | None
    ) -> list[np.ndarray]:
        assert self.head is not None
        pairs = [(query, passage) for query, passages in items for passage in passages]
        flat = np.zeros(len(pairs), dtype=np.float32)
        for indices, vectors, batch_stats in self.encoder.iter_pair_batches(pairs):
            flat[indices] = apply_head(self.head[1], vectors)[:, 0]
            stats.add(batch_stats)
            if on_batch is not None:
                on_batch(len(indices))
        return _split(flat, [len(p) for _, p in items])

    def _bi(self, items: Sequence[ScoreItem], stats: EncodeStats) -> list[np.ndarray]:
        queries, query_stats = self.encoder.encode([q for q, _ in items], "query")
        passages = [p for _, ps in items for p in ps]
        vectors, passage_stats = self.encoder.encode(passages, "passage")
        stats.add(query_stats)
        stats.add(passage_stats)
        rows = _split_rows(vectors, [len(p) for _, p in items])
        return [cosine_scores(q, rows[i]) for i, q in enumerate(queries)]


def _split(flat: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    out, start = [], 0
    for count in counts:
        out.append(flat[start : start + count])
        start += count
    return out


def _split_rows(matrix: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    out, start = [], 0
    for count in counts:
        out.append(matrix[start : start + count])
        start += count
    return out
