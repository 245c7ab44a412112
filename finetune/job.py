"""One training job without bookkeeping: build the model, mine negatives, train, write the adapter.

The registry/MLflow side lives in `finetune.pipeline`; benchmarks call this directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune.config import LoraHyperparameters
from finetune.data import TrainingPairs
from finetune.modeling import save_adapter
from finetune.negatives import mine_bm25, mine_with_model
from finetune.trainer import StepCallback, TrainingResult, train_lora
from serving.runtime.encoder import ModelSpec, load_sentence_transformer


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
    )
    save_adapter(model, out_dir)
    return TrainedAdapter(path=out_dir, result=result, model=model, mining_seconds=mining_seconds)
