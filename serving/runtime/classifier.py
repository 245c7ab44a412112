"""Label probabilities for texts: the ``classify`` op and the classification eval share this.

A classifier is an embedding model (base, optionally with a LoRA) plus a ``classify`` head: a
linear layer on the text's sentence embedding whose softmax gives one probability per label.
The head comes either from logistic regression on frozen embeddings (mteb's classification
protocol) or from fine-tuning it together with a LoRA. Texts are read as queries (their
prefix), as mteb encodes classification inputs. A head trained on windows reads a long text as
windows and averages their logits (serving/runtime/windows.py), here for eval and serving alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.runtime.encoder import Encoder, EncodeStats
from serving.runtime.heads import HeadError, HeadSpec, check_fits
from serving.runtime.scorer import OnBatch, apply_head
from serving.runtime.windows import TextWindows


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (the same function for eval and serving)."""
    shifted = logits.astype(np.float32) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=1, keepdims=True), dtype=np.float32)


class Classifier:
    def __init__(self, encoder: Encoder, head: tuple[HeadSpec, Any]) -> None:
        spec, _ = head
        if spec.kind != "classify":
            raise HeadError(f"a {spec.kind!r} head cannot classify texts")
        check_fits(spec, encoder.dims, encoder.spec.adapter_path or encoder.spec.base_path)
        self.encoder = encoder
        self.head = head

    @property
    def labels(self) -> tuple[str, ...]:
        return self.head[0].labels

    def predict_proba(
        self,
        texts: Sequence[str],
        stats: EncodeStats | None = None,
        on_batch: OnBatch | None = None,
    ) -> np.ndarray:
        """(len(texts), len(labels)) probabilities, rows in input order."""
        stats = stats if stats is not None else EncodeStats()
        if self.head[0].window_stride is not None:
            return self._predict_windows(texts, stats, on_batch)
        probabilities = np.zeros((len(texts), len(self.labels)), dtype=np.float32)
        for indices, vectors, batch_stats in self.encoder.iter_batches(texts, "query"):
            probabilities[indices] = softmax(apply_head(self.head[1], vectors))
            stats.add(batch_stats)
            if on_batch is not None:
                on_batch(len(indices))
        return probabilities

    def _predict_windows(
        self, texts: Sequence[str], stats: EncodeStats, on_batch: OnBatch | None
    ) -> np.ndarray:
        """Softmax of each text's mean window logits; windows of all texts share passes."""
        spec, layer = self.head
        assert spec.window_stride is not None and spec.max_seq_length is not None
        splitter = TextWindows(
            self.encoder.model.tokenizer, spec.max_seq_length, spec.window_stride, spec.max_windows
        )
        prefix = self.encoder.spec.prefix("query")
        per_text = splitter.split([prefix + t for t in texts])
        owners = np.asarray([i for i, windows in enumerate(per_text) for _ in windows], dtype=int)
        rows = [window for windows in per_text for window in windows]
        counts = np.asarray([len(windows) for windows in per_text], dtype=np.float64)
        left = counts.copy()
        sums = np.zeros((len(texts), len(self.labels)), dtype=np.float64)
        for indices, vectors, batch_stats in self.encoder.iter_token_rows(rows):
            owner = owners[indices]
            np.add.at(sums, owner, apply_head(layer, vectors).astype(np.float64))
            np.subtract.at(left, owner, 1)
            finished = int(np.count_nonzero(left[np.unique(owner)] == 0))
            batch_stats.items = finished  # cost per text, not per window
            stats.add(batch_stats)
            if on_batch is not None and finished:
                on_batch(finished)
        return softmax(sums / counts[:, None])
