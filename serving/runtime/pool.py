"""The models a runtime holds: one loaded base per base path, LoRA adapters attached to it.

Many model keys can name the same base; the base is loaded once and each adapter is a named
peft adapter on it, with the task head its artifact carries (a cross-encoder's ``score`` head, a
classifier's ``classify`` head). So an embedding task, a rerank task and a classification task
fine-tuned from one base share that base in memory. Every op activates the right adapter (or
disables all of them for a plain base key) group by group, so one request may mix adapters.

Not thread-safe: the socket server confines every call except :meth:`ModelPool.snapshot` to
its single inference thread. ``snapshot`` reads an immutable tuple that is swapped atomically.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.protocol import ModelStats, TextKind
from serving.runtime.classifier import Classifier
from serving.runtime.encoder import (
    Encoder,
    ModelLoadError,
    ModelSpec,
    attach_adapter,
    check_adapter_folder,
    detach_adapter,
    has_lora,
    load_sentence_transformer,
)
from serving.runtime.heads import HeadError, HeadSpec, has_head, load_head, with_head_limit
from serving.runtime.scorer import Scorer


class ModelNotLoadedError(LookupError):
    """An infer or unload named a model key this runtime does not hold."""


class ModelKeyConflictError(ValueError):
    """A load reused a model key that is already loaded with a different spec."""


class UnsupportedOpError(ValueError):
    """The model cannot do what was asked (classify without a classify head, ...)."""


@dataclass
class _Base:
    key: str
    model: Any
    memory_bytes: int
    default_max_seq_length: int
    users: set[str] = field(default_factory=set)


@dataclass
class _Loaded:
    model_key: str
    spec: ModelSpec
    base: _Base
    adapter_name: str | None
    adapter_bytes: int
    encoder: Encoder
    head: tuple[HeadSpec, Any] | None = None


@dataclass(frozen=True)
class EncodeItem:
    model_key: str
    kind: TextKind
    texts: Sequence[str]


@dataclass(frozen=True)
class ScoreWork:
    model_key: str
    query: str
    passages: Sequence[str]


@dataclass(frozen=True)
class ClassifyWork:
    model_key: str
    texts: Sequence[str]


def _load_head(adapter_path: Path | None) -> tuple[HeadSpec, Any] | None:
    if not has_head(adapter_path):
        return None
    assert adapter_path is not None
    try:
        return load_head(adapter_path)
    except HeadError as exc:
        raise ModelLoadError(str(exc)) from exc


def _groups(keys: Iterable[str]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return groups


def module_bytes(module: Any) -> int:
    """Parameter plus buffer bytes of a torch module."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


class ModelPool:
    def __init__(
        self,
        *,
        device: str,
        max_batch_tokens: int | None,
        max_batch_size: int | None,
        max_padding: float | None = None,
    ) -> None:
        self.device = device
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_padding = max_padding
        self._bases: dict[str, _Base] = {}
        self._models: dict[str, _Loaded] = {}
        self._adapter_counter = 0
        self._snapshot: tuple[int, tuple[ModelStats, ...]] = (0, ())

    # ------------------------------------------------------------------ load / unload

    def load(self, model_key: str, spec: ModelSpec) -> int:
        """Load ``spec`` under ``model_key``; returns the bytes this load added (0 if present)."""
        check_adapter_folder(spec.adapter_path)
        try:
            spec = with_head_limit(spec)
        except HeadError as exc:
            raise ModelLoadError(str(exc)) from exc
        existing = self._models.get(model_key)
        if existing is not None:
            if existing.spec != spec:
                raise ModelKeyConflictError(
                    f"model key {model_key!r} is already loaded with a different spec; "
                    "unload it first"
                )
            return 0
        added = 0
        base_key = str(spec.base_path.resolve())
        base = self._bases.get(base_key)
        if base is None:
            base_spec = ModelSpec(base_path=spec.base_path)
            model = load_sentence_transformer(base_spec, device=self.device)
            base = _Base(base_key, model, module_bytes(model), int(model.max_seq_length))
            self._bases[base_key] = base
            added += base.memory_bytes
        try:
            head = _load_head(spec.adapter_path)
            adapter_name, adapter_bytes = self._attach(base, spec.adapter_path)
        except ModelLoadError:
            self._forget_base_if_unused(base)
            raise
        if head is not None:
            adapter_bytes += module_bytes(head[1])
        encoder = Encoder(
            spec,
            device=self.device,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=self.max_batch_size,
            max_padding=self.max_padding,
            model=base.model,
        )
        base.users.add(model_key)
        self._models[model_key] = _Loaded(
            model_key, spec, base, adapter_name, adapter_bytes, encoder, head
        )
        self._publish()
        return added + adapter_bytes

    def unload(self, model_key: str) -> int:
        """Drop ``model_key``; returns the bytes freed (its adapter, and the base if last)."""
        loaded = self._models.pop(model_key, None)
        if loaded is None:
            raise ModelNotLoadedError(f"model {model_key!r} is not loaded")
        freed = loaded.adapter_bytes
        base = loaded.base
        base.users.discard(model_key)
        if loaded.adapter_name is not None:
            detach_adapter(base.model, loaded.adapter_name)
        if not base.users:
            freed += base.memory_bytes
        self._forget_base_if_unused(base)
        self._publish()
        return freed

    def _attach(self, base: _Base, adapter_path: Path | None) -> tuple[str | None, int]:
        if adapter_path is None or not has_lora(adapter_path):
            return None, 0
        # peft adapter names become module attribute names, so model keys (with '.', '@')
        # cannot be used directly.
        self._adapter_counter += 1
        name = f"adapter{self._adapter_counter}"
        attach_adapter(base.model, adapter_path, name=name)
        marker = f".{name}."
        adapter_bytes = sum(
            p.numel() * p.element_size()
            for pname, p in base.model.named_parameters()
            if marker in pname
        )
        return name, adapter_bytes

    def _forget_base_if_unused(self, base: _Base) -> None:
        if base.users or self._bases.get(base.key) is not base:
            return
        del self._bases[base.key]
        base.model = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ encode

    def encode(self, items: Sequence[EncodeItem]) -> list[np.ndarray]:
        """Embeddings per item, in item order. Unknown keys fail before any work is done."""
        self._check_loaded(i.model_key for i in items)
        # Items of one (model key, kind) are encoded together so token batching spans them.
        groups: dict[tuple[str, TextKind], list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault((item.model_key, item.kind), []).append(index)
        results: list[np.ndarray | None] = [None] * len(items)
        for (model_key, kind), indices in groups.items():
            loaded = self._models[model_key]
            texts = [t for i in indices for t in items[i].texts]
            with self._activated(loaded):
                vectors, _ = loaded.encoder.encode(texts, kind)
            start = 0
            for i in indices:
                count = len(items[i].texts)
                results[i] = vectors[start : start + count]
                start += count
        return [r for r in results if r is not None]

    def score(self, items: Sequence[ScoreWork]) -> list[np.ndarray]:
        """Scores per item (one per passage), in item order; pairs of one model key are
        batched by tokens together."""
        self._check_loaded(i.model_key for i in items)
        results: list[np.ndarray | None] = [None] * len(items)
        for model_key, indices in _groups(i.model_key for i in items).items():
            loaded = self._models[model_key]
            scorer = self._scorer(loaded)
            with self._activated(loaded):
                scores = scorer.score([(items[i].query, items[i].passages) for i in indices])
            for i, row in zip(indices, scores, strict=True):
                results[i] = row
        return [r for r in results if r is not None]

    def classify(self, items: Sequence[ClassifyWork]) -> list[tuple[list[str], np.ndarray]]:
        """(labels, probabilities) per item, in item order."""
        self._check_loaded(i.model_key for i in items)
        results: list[tuple[list[str], np.ndarray] | None] = [None] * len(items)
        for model_key, indices in _groups(i.model_key for i in items).items():
            loaded = self._models[model_key]
            if loaded.head is None or loaded.head[0].kind != "classify":
                raise UnsupportedOpError(f"model {model_key!r} has no classify head")
            classifier = Classifier(loaded.encoder, loaded.head)
            texts = [t for i in indices for t in items[i].texts]
            with self._activated(loaded):
                matrix = classifier.predict_proba(texts)
            start = 0
            for i in indices:
                count = len(items[i].texts)
                results[i] = (list(classifier.labels), matrix[start : start + count])
                start += count
        return [r for r in results if r is not None]

    def _scorer(self, loaded: _Loaded) -> Scorer:
        if loaded.head is not None and loaded.head[0].kind != "score":
            raise UnsupportedOpError(
                f"model {loaded.model_key!r} has a {loaded.head[0].kind} head; it cannot score"
            )
        return Scorer(loaded.encoder, loaded.head)

    def _check_loaded(self, keys: Iterable[str]) -> None:
        missing = sorted({k for k in keys if k not in self._models})
        if missing:
            raise ModelNotLoadedError(f"model(s) not loaded: {', '.join(map(repr, missing))}")

    @contextlib.contextmanager
    def _activated(self, loaded: _Loaded) -> Iterator[None]:
        from peft import PeftModel

        base = loaded.base
        base.model.max_seq_length = loaded.spec.max_seq_length or base.default_max_seq_length
        network = base.model[0].auto_model
        if loaded.adapter_name is not None:
            network.set_adapter(loaded.adapter_name)
            yield
        elif isinstance(network, PeftModel):
            with network.disable_adapter():
                yield
        else:
            yield

    # ------------------------------------------------------------------ stats

    def snapshot(self) -> tuple[int, tuple[ModelStats, ...]]:
        """(total bytes, per-model stats) as of the last load/unload; safe from any thread."""
        return self._snapshot

    def _publish(self) -> None:
        total = sum(b.memory_bytes for b in self._bases.values())
        total += sum(m.adapter_bytes for m in self._models.values())
        models = tuple(
            ModelStats(
                model_key=m.model_key,
                memory_bytes=m.adapter_bytes
                + (m.base.memory_bytes if m.base.users == {m.model_key} else 0),
                base_key=m.base.key,
            )
            for m in self._models.values()
        )
        self._snapshot = (total, models)
