"""Train a LoRA together with a task head: a cross-encoder (rerank) or a classifier.

Both read their inputs exactly as serving/runtime does (``pair_features`` for (query, passage)
pairs; the model's own tokenizer and the query prefix for texts to classify), and both put the
head on the model's sentence embedding, as ``Scorer`` and ``Classifier`` apply it.

- cross-encoder: listwise softmax over groups of one relevant and ``group_size - 1`` other
  candidates of a training query (drawn from its candidate list, seeded);
- classifier: cross-entropy over the labels, by default weighted so that every label counts
  alike (macro-F1 is the metric); with a window stride, on one window of each text per epoch
  (serving/runtime/windows.py), as the head then reads texts.

Deterministic given the seed on CPU, like the embedding trainer.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finetune.config import LoraHyperparameters
from finetune.data import LabelledTexts, RerankGroups
from finetune.errors import TrainingDataError
from finetune.modeling import add_trainable_lora, trainable_parameters
from finetune.trainer import Step, StepCallback, TrainingResult, optimize, seed_everything
from serving.runtime.tokenising import padded_features, pair_features
from serving.runtime.windows import TextWindows


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def _embed(model: Any, features: dict[str, Any]) -> Any:
    device = _device(model)
    features = {k: v.to(device) if hasattr(v, "to") else v for k, v in features.items()}
    return model(features)["sentence_embedding"]


def _groups(hp: LoraHyperparameters, head: Any, model: Any) -> list[dict[str, Any]]:
    return [
        {"params": trainable_parameters(model), "lr": hp.learning_rate},
        {"params": list(head.parameters()), "lr": hp.effective_head_learning_rate},
    ]


def _steps_per_epoch(items: int, batch_size: int) -> int:
    return items // batch_size + (1 if items % batch_size else 0)


def train_cross_encoder(
    model: Any,
    head: Any,
    data: RerankGroups,
    hp: LoraHyperparameters,
    *,
    parent_adapter: Path | None = None,
    on_step: StepCallback | None = None,
) -> TrainingResult:
    """Add a LoRA (or continue the parent's) to ``model`` and train it with the score head."""
    import torch

    seed_everything(hp.seed)
    add_trainable_lora(model, hp, parent_adapter)
    per_epoch = _steps_per_epoch(len(data.groups), hp.batch_size)
    total = min(per_epoch * hp.epochs, hp.max_steps or per_epoch * hp.epochs)
    max_length = int(model.max_seq_length)

    def loss(batch: list[tuple[str, list[str], list[str]]], rng: random.Random) -> Any:
        pairs: list[tuple[str, str]] = []
        for query_id, positives, negatives in batch:
            query = data.queries[query_id]
            chosen = [rng.choice(positives)]
            wanted = hp.group_size - 1
            chosen += (
                rng.sample(negatives, wanted)
                if len(negatives) >= wanted
                else rng.choices(negatives, k=wanted)
            )
            pairs += [(query, data.corpus[d]) for d in chosen]
        logits = head(_embed(model, pair_features(model, pairs, max_length)))[:, 0]
        logits = logits.view(len(batch), hp.group_size)
        targets = torch.zeros(len(batch), dtype=torch.long)  # the positive comes first
        return torch.nn.functional.cross_entropy(logits, targets)

    def steps() -> Iterator[Step]:
        for epoch in range(hp.epochs):
            rng = random.Random(hp.seed * 1_000_003 + epoch)
            order = list(data.groups)
            rng.shuffle(order)
            for start in range(0, len(order), hp.batch_size):
                batch = order[start : start + hp.batch_size]
                yield Step(epoch, functools.partial(loss, batch, rng))

    result = optimize([model, head], _groups(hp, head, model), hp, total, steps(), on_step)
    result.pairs = min(total * hp.batch_size, len(data.groups) * hp.epochs) * hp.group_size
    return result


def class_weights(data: LabelledTexts, hp: LoraHyperparameters) -> list[float]:
    """n / (labels x count) per label (scikit-learn's "balanced"), or all ones."""
    counts = [data.labels.count(label) for label in data.label_names]
    if hp.class_weighting == "none":
        return [1.0] * len(counts)
    n, k = len(data.labels), sum(1 for c in counts if c)
    return [n / (k * c) if c else 0.0 for c in counts]


def train_classifier(
    model: Any,
    head: Any,
    data: LabelledTexts,
    hp: LoraHyperparameters,
    *,
    parent_adapter: Path | None = None,
    query_prefix: str = "",
    on_step: StepCallback | None = None,
) -> TrainingResult:
    """Add a LoRA (or continue the parent's) to ``model`` and train it with the classify head."""
    import torch

    if len(data.texts) < hp.batch_size:
        raise TrainingDataError(
            f"the training split has {len(data.texts)} rows, fewer than one batch of "
            f"{hp.batch_size}; lower --batch-size"
        )
    seed_everything(hp.seed)
    add_trainable_lora(model, hp, parent_adapter)
    index = {label: i for i, label in enumerate(data.label_names)}
    targets_of = [index[label] for label in data.labels]
    weight = torch.tensor(class_weights(data, hp), dtype=torch.float32)
    per_epoch = _steps_per_epoch(len(data.texts), hp.batch_size)
    total = min(per_epoch * hp.epochs, hp.max_steps or per_epoch * hp.epochs)

    windows = (
        TextWindows(model.tokenizer, hp.max_seq_length, hp.window_stride, hp.max_windows).split(
            [query_prefix + t for t in data.texts]
        )
        if hp.window_stride is not None
        else None
    )

    def features(rows: list[int], rng: random.Random) -> dict[str, Any]:
        if windows is None:
            return dict(model.tokenize([query_prefix + data.texts[i] for i in rows]))
        # One of the text's windows, drawn afresh each epoch: over the epochs the head learns
        # from every part of the text, at the cost of one cut text per step.
        return padded_features(model.tokenizer, [rng.choice(windows[i]) for i in rows])

    def loss(rows: list[int], rng: random.Random) -> Any:
        logits = head(_embed(model, features(rows, rng)))
        targets = torch.tensor([targets_of[i] for i in rows], dtype=torch.long)
        return torch.nn.functional.cross_entropy(logits, targets, weight=weight)

    def steps() -> Iterator[Step]:
        for epoch in range(hp.epochs):
            order = list(range(len(data.texts)))
            rng = random.Random(hp.seed * 1_000_003 + epoch)
            rng.shuffle(order)
            for start in range(0, len(order), hp.batch_size):
                rows = order[start : start + hp.batch_size]
                yield Step(epoch, functools.partial(loss, rows, rng))

    result = optimize([model, head], _groups(hp, head, model), hp, total, steps(), on_step)
    result.pairs = min(total * hp.batch_size, len(data.texts) * hp.epochs)
    return result
