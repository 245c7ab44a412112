"""In-process vectors: what every answer of the fleet must equal, text by text.

The reference is sentence-transformers' own ``encode`` in this process, computed once per text
and cached, so a counting run can check thousands of replies without re-encoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

# Vectors from a batch and from a single call differ by padding noise only (~1e-6).
COSINE_MIN = 0.99999
ABS_TOL = 1e-4


class Reference:
    """``reference[text]`` -> the in-process float32 vector of ``text`` (query or passage)."""

    def __init__(
        self,
        model_path: Path,
        *,
        query_prefix: str = "",
        passage_prefix: str = "",
        adapter_path: Path | None = None,
    ) -> None:
        """``adapter_path``: a LoRA on the model, loaded by the runtime's own loader."""
        from sentence_transformers import SentenceTransformer

        self.model_path = model_path
        self._model: Any
        if adapter_path is None:
            self._model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
        else:
            from serving.runtime.model_folder import ModelSpec
            from serving.runtime.model_loading import load_sentence_transformer

            spec = ModelSpec(model_path, adapter_path)
            self._model = load_sentence_transformer(spec, device="cpu")
        self._prefix = {"query": query_prefix, "passage": passage_prefix}
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    @property
    def dims(self) -> int:
        return int(self._model.get_sentence_embedding_dimension())

    def prepare(self, texts: Iterable[str], kind: str = "query") -> None:
        """Encode every text not cached yet, in one call."""
        todo = list(dict.fromkeys(t for t in texts if (kind, t) not in self._cache))
        if not todo:
            return
        vectors = self._model.encode(
            [self._prefix[kind] + t for t in todo], convert_to_numpy=True, batch_size=64
        )
        for text, vector in zip(todo, np.asarray(vectors, dtype=np.float32), strict=True):
            self._cache[(kind, text)] = vector

    def vector(self, text: str, kind: str = "query") -> np.ndarray:
        if (kind, text) not in self._cache:
            self.prepare([text], kind)
        return self._cache[(kind, text)]

    def matches(self, texts: list[str], vectors: np.ndarray, kind: str = "query") -> bool:
        """Whether ``vectors`` are, row by row, the in-process vectors of ``texts``."""
        if vectors.shape != (len(texts), self.dims):
            return False
        expected = np.stack([self.vector(t, kind) for t in texts])
        if not np.all(np.isfinite(vectors)):
            return False
        if np.max(np.abs(vectors - expected)) > ABS_TOL:
            return False
        norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
        cosine = np.sum(vectors * expected, axis=1) / np.maximum(norms, 1e-12)
        return bool(np.all(cosine >= COSINE_MIN))
