"""One training job without bookkeeping: build the model, (mine negatives,) train, write the
adapter: a LoRA for an embedding model, a LoRA plus a task head for a cross-encoder or a
classifier, or a head alone fitted by logistic regression on frozen embeddings.

The registry/MLflow side lives in `finetune.pipeline`; benchmarks call this directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config import LoraHyperparameters
from finetune.data import LabelledTexts, RerankGroups, TrainingPairs
from finetune.errors import TrainingDataError
from finetune.head_training import train_classifier, train_cross_encoder
from finetune.modeling import save_adapter
from finetune.negatives import mine_bm25, mine_with_model
from finetune.trainer import StepCallback, TrainingResult, train_lora
from serving.runtime.heads import (
    HeadKind,
    HeadSpec,
    has_head,
    load_head,
    new_head,
    save_head,
    save_linear_head,
)
from serving.runtime.model_folder import ModelSpec, embedding_dimension
from serving.runtime.model_loading import load_sentence_transformer


@dataclass
class TrainedAdapter:
    path: Path
    result: TrainingResult
    model: Any  # the trained SentenceTransformer, in eval mode
    mining_seconds: float


def train_adapter(
    base_path: Path,
    data: TrainingPairs,
    hp: LoraHyperparameters,
    out_dir: Path,
    *,
    parent_adapter: Path | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    on_step: StepCallback | None = None,
    checkpointing: bool | None = None,
) -> TrainedAdapter:
    """Train and write the adapter (peft files only) into out_dir, which must not exist yet."""
    spec = ModelSpec(
        base_path=base_path,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        max_seq_length=hp.max_seq_length,
    )
    model = load_sentence_transformer(spec)

    started = time.perf_counter()
    negatives: dict[str, list[str]] | None = None
    if hp.hard_negatives == "bm25":
        negatives = mine_bm25(data, hp.hard_negative_depth)
    elif hp.hard_negatives == "base":
        # Mined before the LoRA is added (or the parent attached): the base model's near misses.
        negatives = mine_with_model(
            data,
            model,
            hp.hard_negative_depth,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
        )
    mining_seconds = time.perf_counter() - started

    result = train_lora(
        model,
        data,
        hp,
        parent_adapter=parent_adapter,
        hard_negatives=negatives,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        on_step=on_step,
        checkpointing=checkpointing,
    )
    save_adapter(model, out_dir)
    return TrainedAdapter(path=out_dir, result=result, model=model, mining_seconds=mining_seconds)


def _load_for_training(
    base_path: Path, hp: LoraHyperparameters, query_prefix: str, passage_prefix: str
) -> Any:
    spec = ModelSpec(
        base_path=base_path,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        max_seq_length=hp.max_seq_length,
    )
    return load_sentence_transformer(spec)


def _initial_head(spec: HeadSpec, parent_adapter: Path | None, seed: int) -> Any:
    """A fresh head, or the parent's when it has one of the same kind and shape."""
    if has_head(parent_adapter):
        assert parent_adapter is not None
        parent_spec, parent_head = load_head(parent_adapter)
        if parent_spec == spec:
            return parent_head
    return new_head(spec, seed=seed)


def train_head_adapter(
    kind: HeadKind,
    base_path: Path,
    data: RerankGroups | LabelledTexts,
    hp: LoraHyperparameters,
    out_dir: Path,
    *,
    parent_adapter: Path | None = None,
    query_prefix: str = "",
    on_step: StepCallback | None = None,
) -> TrainedAdapter:
    """A cross-encoder (``score``) or classifier (``classify``): LoRA + head in out_dir."""
    model = _load_for_training(base_path, hp, query_prefix, "")
    dims = embedding_dimension(model) or 0
    if kind == "score":
        assert isinstance(data, RerankGroups)
        spec = HeadSpec(kind="score", dims=dims, max_seq_length=hp.max_seq_length)
        head = _initial_head(spec, parent_adapter, hp.seed)
        result = train_cross_encoder(
            model, head, data, hp, parent_adapter=parent_adapter, on_step=on_step
        )
    else:
        assert isinstance(data, LabelledTexts)
        spec = HeadSpec(
            kind="classify",
            dims=dims,
            labels=data.label_names,
            max_seq_length=hp.max_seq_length,
            window_stride=hp.window_stride,
            max_windows=hp.max_windows if hp.window_stride is not None else 1,
        )
        head = _initial_head(spec, parent_adapter, hp.seed)
        result = train_classifier(
            model,
            head,
            data,
            hp,
            parent_adapter=parent_adapter,
            query_prefix=query_prefix,
            on_step=on_step,
        )
    save_adapter(model, out_dir)
    save_head(out_dir, spec, head)
    return TrainedAdapter(path=out_dir, result=result, model=model, mining_seconds=0.0)


def fit_linear_head(
    base_path: Path,
    data: LabelledTexts,
    out_dir: Path,
    *,
    c: float = 1.0,
    query_prefix: str = "",
    max_iter: int = 1000,
) -> tuple[Path, TrainingResult]:
    """mteb's classification protocol made an artifact: logistic regression (class-balanced)
    on the frozen model's embeddings of the training texts, written as a classify head."""
    import time

    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from serving.runtime.encoder import Encoder

    started = time.perf_counter()
    cpu_started = time.process_time()
    encoder = Encoder(ModelSpec(base_path=base_path, query_prefix=query_prefix))
    vectors, _ = encoder.encode(data.texts, "query")
    classifier = LogisticRegression(C=c, class_weight="balanced", max_iter=max_iter, random_state=0)
    classifier.fit(vectors, data.labels)
    labels = tuple(str(label) for label in classifier.classes_)
    weight, bias = classifier.coef_, classifier.intercept_
    if len(labels) == 2:
        # scikit-learn keeps one row for two classes: P(second) = sigmoid(w.x + b), which is
        # softmax over the logits (0, w.x + b).
        weight = np.vstack([np.zeros_like(weight[0]), weight[0]])
        bias = np.asarray([0.0, bias[0]])
    missing = [label for label in data.label_names if label not in labels]
    if missing:
        raise TrainingDataError(
            f"label(s) {', '.join(missing)} never occur in split {data.split!r}; "
            "a head cannot learn them"
        )
    spec = HeadSpec(kind="classify", dims=int(vectors.shape[1]), labels=labels)
    save_linear_head(out_dir, spec, weight, bias)
    result = TrainingResult(
        steps=int(np.max(classifier.n_iter_)),
        wall_seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu_started,
        pairs=len(data.texts),
        trainable_parameters=int(weight.size + bias.size),
    )
    return out_dir, result
