"""Load a sentence-transformers base model, optionally with a peft LoRA adapter, and encode.

Batches are formed by *tokens*, not by request count: texts are tokenised once, sorted by
length and cut into batches whose padded size stays under ``max_batch_tokens``. A (query,
passage) pair is encoded as one sequence (a cross-encoder's input) and counts both texts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TextKind = Literal["query", "passage"]


class ModelLoadError(RuntimeError):
    """The base model or adapter could not be loaded from its local path."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build an encoder: where the weights are and how to prompt them."""

    base_path: Path
    adapter_path: Path | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    max_seq_length: int | None = None

    def prefix(self, kind: TextKind) -> str:
        return self.query_prefix if kind == "query" else self.passage_prefix


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


@dataclass(frozen=True)
class Batch:
    """Indices into the input list and their token count (padded)."""

    indices: list[int]
    padded_tokens: int


def plan_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> list[Batch]:
    """Cut items into batches sorted by length so that padded tokens stay under the budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[Batch] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = max(1, lengths[i])
        new_longest = max(longest, n)
        if current and (
            new_longest * (len(current) + 1) > max_batch_tokens or len(current) >= max_batch_size
        ):
            batches.append(Batch(current, longest * len(current)))
            current, new_longest = [], n
        current.append(i)
        longest = new_longest
    if current:
        batches.append(Batch(current, longest * len(current)))
    return batches


def default_batch_limits(device: str) -> tuple[int, int]:
    """(padded tokens, texts) per forward pass. On a CPU small passes stay in cache: for MiniLM
    on GerLayQA passages 4096/32 ran ~20% faster than 16384/128 (and than
    sentence-transformers' own encode); accelerators want large batches."""
    return (4096, 32) if device == "cpu" else (16384, 128)


class Encoder:
    """A loaded base model (+ optional active LoRA adapter) that turns texts into vectors."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str = "cpu",
        max_batch_tokens: int | None = None,
        max_batch_size: int | None = None,
        model: Any | None = None,
    ) -> None:
        """``model``: an already loaded SentenceTransformer to share (the serving runtime keeps
        one base per path); by default the model is loaded from ``spec``."""
        self.spec = spec
        self.device = device
        default_tokens, default_size = default_batch_limits(device)
        self.max_batch_tokens = max_batch_tokens or default_tokens
        self.max_batch_size = max_batch_size or default_size
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
        if not texts:  # the tokenizer raises IndexError on an empty list
            return []
        tok = self.model.tokenizer
        enc = tok(list(texts), truncation=True, max_length=self.max_seq_length, padding=False)
        return [len(ids) for ids in enc["input_ids"]]

    def pair_token_lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        if not pairs:
            return []
        enc = pair_features(self.model, pairs, self.max_seq_length, tensors=False)
        return [len(ids) for ids in enc["input_ids"]]

    def iter_batches(
        self, texts: Sequence[str], kind: TextKind = "passage"
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings, stats) per token-bounded batch."""
        prefix = self.spec.prefix(kind)
        prepared = [prefix + t for t in texts]
        lengths = self.token_lengths(prepared)
        for batch in plan_batches(lengths, self.max_batch_tokens, self.max_batch_size):
            features = self.model.tokenize([prepared[i] for i in batch.indices])
            yield self._forward(batch, lengths, features)

    def iter_pair_batches(
        self, pairs: Sequence[tuple[str, str]]
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings of the pairs encoded together, stats) per batch."""
        lengths = self.pair_token_lengths(pairs)
        for batch in plan_batches(lengths, self.max_batch_tokens, self.max_batch_size):
            chosen = [pairs[i] for i in batch.indices]
            yield self._forward(
                batch, lengths, pair_features(self.model, chosen, self.max_seq_length)
            )

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
        result = np.zeros((len(texts), self.dims), dtype=np.float32)
        total = EncodeStats()
        for indices, vectors, stats in self.iter_batches(texts, kind):
            result[indices] = vectors
            total.add(stats)
        return result, total


def embedding_dimension(model: Any) -> int | None:
    """The model's output size (sentence-transformers 6 renamed the getter)."""
    getter = getattr(model, "get_embedding_dimension", None)
    dims = getter() if getter is not None else model.get_sentence_embedding_dimension()
    return int(dims) if dims is not None else None


def pair_features(
    model: Any, pairs: Sequence[tuple[str, str]], max_length: int, *, tensors: bool = True
) -> dict[str, Any]:
    """Tokenise (query, passage) pairs as one sequence each, the way BERT cross-encoders read
    them ([CLS] query [SEP] passage [SEP]); the longer text is cut first to fit. Serving,
    evaluation and training all build pair inputs here."""
    encoded = model.tokenizer(
        [q for q, _ in pairs],
        [p for _, p in pairs],
        padding=tensors,
        truncation="longest_first",
        max_length=max_length,
        return_tensors="pt" if tensors else None,
    )
    return dict(encoded)


def has_lora(adapter_path: Path | None) -> bool:
    """An adapter folder may hold a task head only (serving/runtime/heads.py), no LoRA."""
    return adapter_path is not None and (adapter_path / "adapter_config.json").is_file()


def check_adapter_folder(adapter_path: Path | None) -> None:
    """An adapter folder holds a peft LoRA, a task head (head.json), or both."""
    if adapter_path is None:
        return
    if not adapter_path.is_dir():
        raise ModelLoadError(f"adapter folder does not exist: {adapter_path}")
    if not has_lora(adapter_path) and not (adapter_path / "head.json").is_file():
        raise ModelLoadError(
            f"not an adapter folder (neither a peft adapter_config.json nor a head.json): "
            f"{adapter_path}"
        )


def load_sentence_transformer(spec: ModelSpec, *, device: str = "cpu") -> Any:
    """Load a sentence-transformers folder from a local path, then attach the adapter's LoRA."""
    from sentence_transformers import SentenceTransformer

    if not spec.base_path.is_dir():
        raise ModelLoadError(f"base model folder does not exist: {spec.base_path}")
    try:
        model = SentenceTransformer(str(spec.base_path), device=device, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad folder
        raise ModelLoadError(f"cannot load base model from {spec.base_path}: {exc}") from exc
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    check_adapter_folder(spec.adapter_path)
    if has_lora(spec.adapter_path):
        assert spec.adapter_path is not None
        attach_adapter(model, spec.adapter_path)
    model.eval()
    return model


def attach_adapter(model: Any, adapter_path: Path, name: str = "default") -> None:
    """Wrap the transformer inside a SentenceTransformer with a peft LoRA adapter.

    When the transformer is already wrapped, the adapter is added under ``name`` beside the
    others (activate one with ``set_adapter``), so many adapters share one loaded base.
    """
    from peft import PeftModel

    if not (adapter_path / "adapter_config.json").is_file():
        raise ModelLoadError(f"not a peft adapter folder (no adapter_config.json): {adapter_path}")
    transformer = model[0]
    try:
        if isinstance(transformer.auto_model, PeftModel):
            transformer.auto_model.load_adapter(
                str(adapter_path), adapter_name=name, is_trainable=False
            )
            return
        wrapped = PeftModel.from_pretrained(
            transformer.auto_model, str(adapter_path), adapter_name=name, is_trainable=False
        )
    except Exception as exc:
        raise ModelLoadError(f"adapter {adapter_path} does not fit this base model: {exc}") from exc
    replace_network(transformer, wrapped)


def detach_adapter(model: Any, name: str) -> None:
    """Remove the adapter ``name``; removing the last one restores the plain base network."""
    from peft import PeftModel

    transformer = model[0]
    wrapped = transformer.auto_model
    if not isinstance(wrapped, PeftModel) or name not in wrapped.peft_config:
        raise KeyError(f"no adapter named {name!r} is attached")
    if len(wrapped.peft_config) == 1:
        replace_network(transformer, wrapped.unload())
    else:
        wrapped.delete_adapter(name)


def replace_network(transformer: Any, network: Any) -> None:
    # sentence-transformers >= 6 keeps the network in `.model`; `auto_model` is a read-only view.
    if isinstance(getattr(type(transformer), "auto_model", None), property):
        transformer.model = network
    else:
        transformer.auto_model = network
