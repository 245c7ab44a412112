"""Run a loaded base model (+ optional active LoRA adapter) over texts, pass by pass.

``Encoder`` turns texts into vectors: it tokenises a chunk of texts once
(``serving/runtime/tokenising.py``: cut to what the model reads), plans the chunk's forward
passes by tokens (``serving/runtime/batch_planning.py``), runs each pass on a slice of that one
tokenisation and measures its cost (``EncodeStats``). A (query, passage) pair is encoded as one
sequence (a cross-encoder's input) and counts both texts. The model comes from
``serving/runtime/model_loading.py`` (or is shared by the caller).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from serving.runtime.batch_planning import (
    DEFAULT_MAX_PADDING,
    Batch,
    default_batch_limits,
    plan_batches,
    real_lengths,
    slice_rows,
)
from serving.runtime.model_folder import ModelLoadError, ModelSpec, TextKind, embedding_dimension
from serving.runtime.model_loading import load_sentence_transformer
from serving.runtime.tokenising import (
    PairTokenizer,
    cut_texts,
    padded_features,
    pads_left,
    preprocess,
    text_lengths,
)

#: Entered around one forward pass with the (input) indices of its rows, in row order.
AroundPass = Callable[[list[int]], AbstractContextManager[Any]]


@dataclass
class EncodeStats:
    """Cost measured while encoding: what the eval harness reports as cost."""

    items: int = 0
    tokens: int = 0
    seconds: float = 0.0
    batch_latencies: list[float] = field(default_factory=list)

    def add(self, other: EncodeStats) -> None:
        self.items += other.items
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.batch_latencies.extend(other.batch_latencies)

    @property
    def items_per_second(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self, quantile: float) -> float:
        if not self.batch_latencies:
            return 0.0
        return float(np.quantile(np.asarray(self.batch_latencies), quantile) * 1000.0)


#: Texts tokenised (and planned) together: the runtime's requests fit in one chunk (the gateway
#: takes at most 2048 texts); an eval corpus is encoded chunk by chunk.
TOKENISE_CHUNK = 4096


class Encoder:
    """A loaded base model (+ optional active LoRA adapter) that turns texts into vectors."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str = "cpu",
        max_batch_tokens: int | None = None,
        max_batch_size: int | None = None,
        max_padding: float | None = None,
        model: Any | None = None,
    ) -> None:
        """``model``: an already loaded SentenceTransformer to share (the serving runtime keeps
        one base per path); by default the model is loaded from ``spec``."""
        self.spec = spec
        self.device = device
        default_tokens, default_size = default_batch_limits(device)
        self.max_batch_tokens = max_batch_tokens or default_tokens
        self.max_batch_size = max_batch_size or default_size
        self.max_padding = DEFAULT_MAX_PADDING if max_padding is None else max_padding
        self.model = model if model is not None else load_sentence_transformer(spec, device=device)

    @property
    def dims(self) -> int:
        dims = embedding_dimension(self.model)
        if dims is None:
            raise ModelLoadError("model does not report an embedding dimension")
        return int(dims)

    @property
    def max_seq_length(self) -> int:
        return int(self.model.max_seq_length)

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        return text_lengths(self.model.tokenizer, texts, self.max_seq_length)

    def pair_token_lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        if not pairs:
            return []
        return PairTokenizer(self.model.tokenizer, self.max_seq_length).lengths(pairs)

    def iter_batches(
        self,
        texts: Sequence[str],
        kind: TextKind = "passage",
        *,
        around_pass: AroundPass | None = None,
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings, stats) per forward pass (see ``plan_batches``)."""
        prefix = self.spec.prefix(kind)
        yield from self.iter_prepared([prefix + t for t in texts], around_pass=around_pass)

    def iter_prepared(
        self, prepared: Sequence[str], *, around_pass: AroundPass | None = None
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """``iter_batches`` of texts that already carry their prefix. ``around_pass`` is
        entered around each forward pass with the indices of its rows, in row order."""
        # Planned in chunks, so that one padded tokenisation of a whole eval corpus is never
        # held at once (a chunk is at most TOKENISE_CHUNK x max_seq_length ids).
        for start in range(0, len(prepared), TOKENISE_CHUNK):
            chunk = cut_texts(prepared[start : start + TOKENISE_CHUNK], self.max_seq_length)
            for indices, vectors, stats in self._iter_chunk(chunk, start, around_pass):
                yield [start + i for i in indices], vectors, stats

    def _iter_chunk(
        self, prepared: list[str], start: int, around_pass: AroundPass | None
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        features = preprocess(self.model, prepared)
        real = real_lengths(features, len(prepared))
        # A layout we cannot slice is tokenised again, pass by pass (never on a CPU).
        lengths = real if real is not None else self.token_lengths(prepared)
        plan = plan_batches(lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding)
        for batch in plan:
            if real is None:
                part = preprocess(self.model, [prepared[i] for i in batch.indices])
            else:
                width = max(lengths[i] for i in batch.indices)
                part = slice_rows(features, batch.indices, width, pads_left(self.model.tokenizer))
            around = (
                around_pass([start + i for i in batch.indices])
                if around_pass is not None
                else contextlib.nullcontext()
            )
            with around:
                result = self._forward(batch, lengths, part)
            yield result

    def iter_pair_batches(
        self, pairs: Sequence[tuple[str, str]]
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings of the pairs encoded together, stats) per forward pass:
        planned like texts (``plan_batches``, padding bound included). Each distinct text of a
        chunk is tokenised once (a query heads ~30 pairs) and ``PairTokenizer`` assembles only
        the pass's rows, so no padded tokenisation of all pairs is ever held at once."""
        for start in range(0, len(pairs), TOKENISE_CHUNK):
            chunk = list(pairs[start : start + TOKENISE_CHUNK])
            tokenizer = PairTokenizer(self.model.tokenizer, self.max_seq_length)
            tokenizer.add_texts([t for pair in chunk for t in pair])
            lengths = tokenizer.lengths(chunk)
            plan = plan_batches(
                lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding
            )
            for batch in plan:
                chosen = [chunk[i] for i in batch.indices]
                indices, vectors, stats = self._forward(batch, lengths, tokenizer.features(chosen))
                yield [start + i for i in indices], vectors, stats

    def iter_token_rows(
        self, rows: Sequence[tuple[list[int], list[int]]]
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings, stats) per forward pass of rows tokenised already
        ((input ids, token type ids), special tokens included; e.g. a long text's windows),
        planned like texts (``plan_batches``)."""
        lengths = [len(ids) for ids, _ in rows]
        plan = plan_batches(lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding)
        tokenizer = self.model.tokenizer
        for batch in plan:
            features = padded_features(tokenizer, [rows[i] for i in batch.indices])
            yield self._forward(batch, lengths, features)

    def _forward(
        self, batch: Batch, lengths: Sequence[int], features: dict[str, Any]
    ) -> tuple[list[int], np.ndarray, EncodeStats]:
        import torch

        started = time.perf_counter()
        # sentence-transformers >= 6 adds non-tensor entries (e.g. "modality").
        features = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in features.items()}
        with torch.inference_mode():
            out = self.model(features)
        vectors = out["sentence_embedding"].float().cpu().numpy()
        elapsed = time.perf_counter() - started
        stats = EncodeStats(
            items=len(batch.indices),
            tokens=sum(lengths[i] for i in batch.indices),
            seconds=elapsed,
            batch_latencies=[elapsed],
        )
        return batch.indices, vectors, stats

    def encode(
        self, texts: Sequence[str], kind: TextKind = "passage"
    ) -> tuple[np.ndarray, EncodeStats]:
        """Encode all texts, returning vectors in input order and the measured cost."""
        return self._collect(len(texts), self.iter_batches(texts, kind))

    def encode_prepared(
        self, prepared: Sequence[str], *, around_pass: AroundPass | None = None
    ) -> tuple[np.ndarray, EncodeStats]:
        """``encode`` of texts that already carry their prefix (see ``iter_prepared``)."""
        return self._collect(len(prepared), self.iter_prepared(prepared, around_pass=around_pass))

    def _collect(
        self, count: int, passes: Iterator[tuple[list[int], np.ndarray, EncodeStats]]
    ) -> tuple[np.ndarray, EncodeStats]:
        result = np.zeros((count, self.dims), dtype=np.float32)
        total = EncodeStats()
        for indices, vectors, stats in passes:
            result[indices] = vectors
            total.add(stats)
        return result, total
