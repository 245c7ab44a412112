"""The models a runtime holds: one loaded base per base path, LoRA adapters attached to it.

Many model keys can name the same base; the base is loaded once and each adapter is a named
peft adapter on it, with the task head its artifact carries (a cross-encoder's ``score`` head, a
classifier's ``classify`` head). So an embedding task, a rerank task and a classification task
fine-tuned from one base share that base in memory. For ``encode``, the rows of one request that
share a base (and a maximum sequence length) are tokenised together and run in the same forward
passes whatever their adapters: each LoRA layer adds every row's own adapter delta
(``serving.runtime.bgmv``). Adapters that cannot be stacked (DoRA, LoRA on embeddings, ...) and
``mixed_adapters=False`` fall back to one group of passes per (model key, kind) with that adapter
activated, as peft runs them; ``score`` and ``classify`` run one group per model key.

A base folder that is a fitted lexical baseline (serving/runtime/baseline_artifact.py: ``tfidf-lr``
classifies, ``bm25`` scores) is held beside the torch models under its key, with no encoder and
no adapter; the ops it cannot do answer ``UnsupportedOpError``.

Not thread-safe: the socket server confines every call except :meth:`ModelPool.snapshot` to
its single inference thread, but for ``encode`` of one model key loaded with ``runtimes`` > 1
(a model without adapter: no adapter state is touched), which runs on that many threads of its
own, sharing the weights and taking turns at the tokenizer (``engines.share_tokenizer``), and
for a shadow's batch of keys :meth:`ModelPool.alone` allows, which runs on the background thread
(never beside a load or unload). ``snapshot`` reads an immutable tuple that is swapped
atomically.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from serving.protocol import LoadSettings, ModelStats, TextKind
from serving.runtime import engines
from serving.runtime.baseline_artifact import (
    Baseline,
    BaselineError,
    baseline_kind,
    is_baseline,
    load_baseline,
)
from serving.runtime.bgmv import BASE_SLOT, MixedLora, mixed_lora
from serving.runtime.classifier import Classifier
from serving.runtime.encoder import Encoder
from serving.runtime.heads import HeadError, HeadSpec, has_head, load_head, with_head_limit
from serving.runtime.lexical import Bm25, TfidfLogReg
from serving.runtime.model_folder import (
    VARIANT_MANIFEST,
    ModelLoadError,
    ModelSpec,
    check_adapter_folder,
    has_lora,
    is_onnx_variant,
    refuse_adapter_on_variant,
)
from serving.runtime.model_loading import attach_adapter, detach_adapter, load_sentence_transformer
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
    #: The stacked adapters for mixed passes; rebuilt after an attach or detach.
    mixed: MixedLora | None = None
    mixed_stale: bool = True


@dataclass
class _Loaded:
    model_key: str
    spec: ModelSpec
    base: _Base
    adapter_name: str | None
    adapter_bytes: int
    encoder: Encoder
    head: tuple[HeadSpec, Any] | None = None
    settings: LoadSettings | None = None  # as the load asked
    applied: engines.Applied = field(default_factory=engines.Applied)  # as the model takes them


@dataclass(frozen=True)
class _LoadedBaseline:
    spec: ModelSpec
    model: Baseline

    def unable(self, model_key: str, op: str) -> UnsupportedOpError:
        kind = baseline_kind(self.model)
        does = "classifies" if isinstance(self.model, TfidfLogReg) else "scores documents"
        return UnsupportedOpError(
            f"model {model_key!r} is a {kind} baseline: it {does} only (no {op})"
        )


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
    """Parameter plus buffer bytes of a torch module (an ONNX variant knows its own size)."""
    if is_onnx_variant(module):
        return int(module.memory_bytes)
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
        mixed_adapters: bool = True,
    ) -> None:
        """``mixed_adapters`` False runs one group of passes per adapter (for comparison)."""
        self.device = device
        self.mixed_adapters = mixed_adapters
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_padding = max_padding
        self._bases: dict[str, _Base] = {}
        self._models: dict[str, _Loaded] = {}
        self._baselines: dict[str, _LoadedBaseline] = {}
        self._adapter_counter = 0
        self._snapshot: tuple[int, tuple[ModelStats, ...]] = (0, ())

    # ------------------------------------------------------------------ load / unload

    def load(self, model_key: str, spec: ModelSpec, settings: LoadSettings | None = None) -> int:
        """Load ``spec`` under ``model_key``, run as ``settings`` ask (``engines.applied``);
        returns the bytes this load added (0 if present). A fitted baseline takes no settings."""
        if is_baseline(spec.base_path):
            return self._load_baseline(model_key, spec)
        check_adapter_folder(spec.adapter_path)
        refuse_adapter_on_variant(spec)
        try:
            spec = with_head_limit(spec)
            how = engines.applied(settings, has_adapter=spec.adapter_path is not None)
        except (HeadError, engines.EngineError) as exc:
            raise ModelLoadError(str(exc)) from exc
        existing = self._models.get(model_key)
        if existing is not None:
            if (existing.spec, existing.settings) != (spec, settings):
                raise ModelKeyConflictError(
                    f"model key {model_key!r} is already loaded with a different spec; "
                    "unload it first"
                )
            return 0
        if how.threads is not None and how.engine == "torch" and not self.device.startswith("cuda"):
            import torch

            # Process-wide in torch: the newest load sets it for every torch model here.
            torch.set_num_threads(how.threads)
        added = 0
        # An engine other than torch is a base of its own (its own weights in memory).
        base_key = str(spec.base_path.resolve())
        if how.engine != "torch":
            base_key += f"#{how.engine}-t{how.threads or 0}"
        base = self._bases.get(base_key)
        if base is None:
            model = self._load_base(spec.base_path, how)
            # Threads take turns at its tokenizer: a model's lanes (runtimes > 1) and the
            # background thread's batches (``alone``) run beside the inference thread's.
            engines.share_tokenizer(model)
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
            max_padding=how.max_padding if how.max_padding is not None else self.max_padding,
            model=base.model,
        )
        base.users.add(model_key)
        self._models[model_key] = _Loaded(
            model_key, spec, base, adapter_name, adapter_bytes, encoder, head, settings, how
        )
        self._publish()
        return added + adapter_bytes

    def _load_baseline(self, model_key: str, spec: ModelSpec) -> int:
        existing = self._baselines.get(model_key)
        if existing is not None:
            if existing.spec != spec:
                raise ModelKeyConflictError(
                    f"model key {model_key!r} is already loaded with a different spec; "
                    "unload it first"
                )
            return 0
        if spec.adapter_path is not None:
            raise ModelLoadError(
                f"{spec.base_path} is a lexical baseline: it takes no adapter ({spec.adapter_path})"
            )
        try:
            model = load_baseline(spec.base_path)
        except BaselineError as exc:
            raise ModelLoadError(str(exc)) from None
        self._baselines[model_key] = _LoadedBaseline(spec, model)
        self._publish()
        return model.memory_bytes

    def _load_base(self, base_path: Path, how: engines.Applied) -> Any:
        if how.engine == "onnx":
            if (base_path / VARIANT_MANIFEST).is_file():
                raise ModelLoadError(f"{base_path} is a variant already: no engine applies")
            try:
                return engines.onnx_engine(base_path, how.threads)
            except engines.EngineError as exc:
                raise ModelLoadError(str(exc)) from exc
            except Exception as exc:  # the export: torch.onnx's and onnxruntime's own types
                raise ModelLoadError(f"cannot export {base_path} to ONNX: {exc}") from exc
        return load_sentence_transformer(ModelSpec(base_path=base_path), device=self.device)

    def alone(self, model_keys: Iterable[str]) -> bool:
        """Whether batches of these keys may run on another thread while the inference
        thread runs its own (the runtime's background thread, ``serving/runtime/server.py``):
        each is a fitted baseline (stateless), or a model whose base has no adapter among its
        users, all of one sequence length, so no call touches state another reads (``_activated``
        sets the base's length; adapters are switched or stacked on the base). Unknown keys
        are not: the inference thread answers them."""
        for key in model_keys:
            if key in self._baselines:
                continue
            loaded = self._models.get(key)
            if loaded is None or self._has_adapters(loaded.base):
                return False
            lengths = {self._seq_length(self._models[user]) for user in loaded.base.users}
            if len(lengths) > 1:
                return False
        return True

    def runtimes(self, model_key: str) -> int:
        """How many batches of the model may run at once (1 unless its profile says more)."""
        loaded = self._models.get(model_key)
        return loaded.applied.runtimes if loaded is not None else 1

    def unload(self, model_key: str) -> int:
        """Drop ``model_key``; returns the bytes freed (its adapter, and the base if last)."""
        baseline = self._baselines.pop(model_key, None)
        if baseline is not None:
            self._publish()
            return baseline.model.memory_bytes
        loaded = self._models.pop(model_key, None)
        if loaded is None:
            raise ModelNotLoadedError(f"model {model_key!r} is not loaded")
        freed = loaded.adapter_bytes
        base = loaded.base
        base.users.discard(model_key)
        if loaded.adapter_name is not None:
            detach_adapter(base.model, loaded.adapter_name)
            base.mixed, base.mixed_stale = None, True
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
        base.mixed, base.mixed_stale = None, True
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
        for item in items:
            if item.model_key in self._baselines:
                raise self._baselines[item.model_key].unable(item.model_key, "embed")
        results: list[np.ndarray | None] = [None] * len(items)
        # Rows of one base and one sequence length share their tokenisation and passes.
        shared: dict[tuple[str, int], list[int]] = {}
        for index, item in enumerate(items):
            loaded = self._models[item.model_key]
            shared.setdefault((loaded.base.key, self._seq_length(loaded)), []).append(index)
        for (base_key, seq_length), indices in shared.items():
            base = self._bases[base_key]
            mixed = self._mixed(base)
            if mixed is None and self._has_adapters(base):
                self._encode_grouped(items, indices, results)
            else:
                self._encode_mixed(base, mixed, seq_length, items, indices, results)
        return [r for r in results if r is not None]

    def _seq_length(self, loaded: _Loaded) -> int:
        return loaded.spec.max_seq_length or loaded.base.default_max_seq_length

    def _has_adapters(self, base: _Base) -> bool:
        return any(self._models[key].adapter_name is not None for key in base.users)

    def _mixed(self, base: _Base) -> MixedLora | None:
        """The base's adapters stacked for mixed passes; ``None`` without adapters, when mixing
        is off, or when one of them cannot be stacked."""
        if not self.mixed_adapters:
            return None
        if base.mixed_stale:
            names = sorted(
                name for key in base.users if (name := self._models[key].adapter_name) is not None
            )
            base.mixed = mixed_lora(base.model[0].auto_model, names) if names else None
            base.mixed_stale = False
        return base.mixed

    def _encode_mixed(
        self,
        base: _Base,
        mixed: MixedLora | None,
        seq_length: int,
        items: Sequence[EncodeItem],
        indices: list[int],
        results: list[np.ndarray | None],
    ) -> None:
        """One tokenisation and one plan for the rows of ``indices``, whatever their adapter."""
        prepared: list[str] = []
        slots: list[int] = []
        for i in indices:
            loaded = self._models[items[i].model_key]
            prefix = loaded.spec.prefix(items[i].kind)
            slot = BASE_SLOT
            if loaded.adapter_name is not None and mixed is not None:
                slot = mixed.slots[loaded.adapter_name]
            prepared.extend(prefix + text for text in items[i].texts)
            slots.extend([slot] * len(items[i].texts))
        encoder = self._models[items[indices[0]].model_key].encoder
        base.model.max_seq_length = seq_length
        if mixed is None:  # a base without adapters
            vectors, _ = encoder.encode_prepared(prepared)
        else:
            with mixed.active():
                vectors, _ = encoder.encode_prepared(
                    prepared, around_pass=lambda rows: mixed.rows([slots[r] for r in rows])
                )
        _split(vectors, items, indices, results)

    def _encode_grouped(
        self, items: Sequence[EncodeItem], indices: list[int], results: list[np.ndarray | None]
    ) -> None:
        """Items of one (model key, kind) are encoded together, one adapter active at a time."""
        groups: dict[tuple[str, TextKind], list[int]] = {}
        for index in indices:
            item = items[index]
            groups.setdefault((item.model_key, item.kind), []).append(index)
        for (model_key, kind), group in groups.items():
            loaded = self._models[model_key]
            texts = [t for i in group for t in items[i].texts]
            with self._activated(loaded):
                vectors, _ = loaded.encoder.encode(texts, kind)
            _split(vectors, items, group, results)

    def score(self, items: Sequence[ScoreWork]) -> list[np.ndarray]:
        """Scores per item (one per passage), in item order; pairs of one model key are
        batched by tokens together."""
        self._check_loaded(i.model_key for i in items)
        results: list[np.ndarray | None] = [None] * len(items)
        for model_key, indices in _groups(i.model_key for i in items).items():
            baseline = self._baselines.get(model_key)
            if baseline is not None:
                if not isinstance(baseline.model, Bm25):
                    raise baseline.unable(model_key, "score")
                for i in indices:
                    results[i] = baseline.model.score(items[i].query, items[i].passages)
                continue
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
            baseline = self._baselines.get(model_key)
            if baseline is not None:
                if not isinstance(baseline.model, TfidfLogReg):
                    raise baseline.unable(model_key, "classify")
                for i in indices:
                    probabilities = baseline.model.predict_proba(items[i].texts)
                    results[i] = (list(baseline.model.labels), probabilities)
                continue
            loaded = self._models[model_key]
            self._refuse_variant(loaded, "classify")
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

    def _refuse_variant(self, loaded: _Loaded, op: str) -> None:
        if is_onnx_variant(loaded.base.model):
            raise UnsupportedOpError(
                f"model {loaded.model_key!r} is an {loaded.base.model.variant} variant: it "
                f"embeds only (no {op})"
            )

    def _scorer(self, loaded: _Loaded) -> Scorer:
        self._refuse_variant(loaded, "score")
        if loaded.head is not None and loaded.head[0].kind != "score":
            raise UnsupportedOpError(
                f"model {loaded.model_key!r} has a {loaded.head[0].kind} head; it cannot score"
            )
        return Scorer(loaded.encoder, loaded.head)

    def _check_loaded(self, keys: Iterable[str]) -> None:
        missing = sorted({k for k in keys if k not in self._models and k not in self._baselines})
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
        total += sum(b.model.memory_bytes for b in self._baselines.values())
        models = tuple(
            ModelStats(
                model_key=m.model_key,
                memory_bytes=m.adapter_bytes
                + (m.base.memory_bytes if m.base.users == {m.model_key} else 0),
                base_key=m.base.key,
            )
            for m in self._models.values()
        ) + tuple(
            ModelStats(
                model_key=key,
                memory_bytes=b.model.memory_bytes,
                base_key=str(b.spec.base_path.resolve()),
            )
            for key, b in self._baselines.items()
        )
        self._snapshot = (total, models)


def _split(
    vectors: np.ndarray,
    items: Sequence[EncodeItem],
    indices: list[int],
    results: list[np.ndarray | None],
) -> None:
    """Hand the rows of ``vectors`` back to the items of ``indices``, in order."""
    start = 0
    for i in indices:
        count = len(items[i].texts)
        results[i] = vectors[start : start + count]
        start += count
