"""The training loop shared by every kind (``optimize``), and the contrastive LoRA training of
embedding models on it: in-batch negatives, optional mined hard negatives.

For a batch of B (query, positive) pairs the loss is cross-entropy over scaled cosine
similarities of each query against all B positives (plus B hard negatives when mined), with
the query's own other positives masked out so a second relevant paragraph is never pushed away.
Deterministic given the seed on CPU: LoRA init, dropout, shuffling and negative choice all
draw from seeded generators.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune.config import LoraHyperparameters
from finetune.data import TrainingPairs
from finetune.errors import TrainingDataError, TrainingOutOfMemory
from finetune.modeling import (
    add_trainable_lora,
    embed,
    gradient_checkpointing,
    trainable_parameters,
)
from serving.runtime.memory import release_freed_tensors


@dataclass(frozen=True)
class StepReport:
    step: int
    total_steps: int
    epoch: int
    loss: float
    learning_rate: float
    elapsed_seconds: float


@dataclass
class TrainingResult:
    losses: list[float] = field(default_factory=list)
    steps: int = 0
    wall_seconds: float = 0.0
    # CPU time of this process (all threads): comparable across runs on a shared machine.
    cpu_seconds: float = 0.0
    pairs: int = 0
    trainable_parameters: int = 0
    # Whether layers were recomputed in the backward pass instead of kept (see modeling.py).
    gradient_checkpointing: bool = False


StepCallback = Callable[[StepReport], None]

#: Tokens of one training step above which ``train_lora`` saves memory by default: layers
#: recomputed in the backward pass (gradient checkpointing) and glibc's mmap threshold fixed at
#: 1 MiB (finetune/modeling.py). Preset ``epoch`` (32 queries + 32 positives + 32 hard negatives
#: at 128 tokens = 12,288) peaked at 9.7 GB without and 1.96 GB with
#: (reports/german-legal-retrieval/lora-memory.md). Both cost time, so smaller steps go
#: without: the recomputation is one more forward pass per step, and with the threshold every
#: activation tensor is a fresh mapping whose pages the kernel faults in and zeroes on each use.
#: `make demo`'s LoRA step (preset ``demo``, 6,144 tokens) ran with both after issue 13 and took
#: ~1.7x its time before, with 58 million minor page faults and a third of its CPU time in the
#: kernel.
MEMORY_SAVING_STEP_TOKENS = 8192


def step_tokens(hp: LoraHyperparameters) -> int:
    """Tokens one contrastive step encodes at most: each query, its positive, and its mined
    hard negative when negatives are mined, at ``max_seq_length``."""
    texts_per_query = 3 if hp.hard_negatives != "none" else 2
    return hp.batch_size * texts_per_query * hp.max_seq_length


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def plan_steps(pairs: int, hp: LoraHyperparameters) -> tuple[int, int]:
    """(steps per epoch, total steps); a trailing batch of one pair has no negatives: dropped."""
    per_epoch = pairs // hp.batch_size + (1 if pairs % hp.batch_size >= 2 else 0)
    total = per_epoch * hp.epochs
    if hp.max_steps is not None:
        total = min(total, hp.max_steps)
    return per_epoch, total


@dataclass(frozen=True)
class Step:
    """One optimizer step: its epoch and how to compute its loss."""

    epoch: int
    loss: Callable[[], Any]


def optimize(
    modules: list[Any],
    param_groups: list[dict[str, Any]],
    hp: LoraHyperparameters,
    total_steps: int,
    steps: Iterable[Step],
    on_step: StepCallback | None,
) -> TrainingResult:
    """The one training loop: AdamW, linear warm-up and decay, gradient clipping at 1.0, a
    report per step; ``modules`` are put in train mode for the run and eval mode after."""
    import torch

    params = [p for group in param_groups for p in group["params"]]
    optimizer = torch.optim.AdamW(param_groups, weight_decay=0.0)
    warmup = int(total_steps * hp.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _linear_schedule(warmup, total_steps))
    result = TrainingResult(trainable_parameters=sum(p.numel() for p in params))
    for module in modules:
        module.train()
    started = time.perf_counter()
    cpu_started = time.process_time()
    step = 0
    try:
        for item in steps:
            if step >= total_steps:
                break
            loss = item.loss()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            result.losses.append(float(loss.detach()))
            if on_step is not None:
                on_step(
                    StepReport(
                        step=step,
                        total_steps=total_steps,
                        epoch=item.epoch,
                        loss=result.losses[-1],
                        learning_rate=float(scheduler.get_last_lr()[0]),
                        elapsed_seconds=time.perf_counter() - started,
                    )
                )
    except (RuntimeError, MemoryError) as exc:
        if isinstance(exc, torch.OutOfMemoryError | MemoryError) or "can't allocate" in str(exc):
            raise TrainingOutOfMemory(
                f"out of memory at step {step + 1} (batch {hp.batch_size}, max length "
                f"{hp.max_seq_length}); lower --batch-size or --max-seq-length"
            ) from exc
        raise
    finally:
        for module in modules:
            module.eval()
    result.steps = step
    result.wall_seconds = time.perf_counter() - started
    result.cpu_seconds = time.process_time() - cpu_started
    return result


def train_lora(
    model: Any,
    data: TrainingPairs,
    hp: LoraHyperparameters,
    *,
    parent_adapter: Path | None = None,
    hard_negatives: dict[str, list[str]] | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    on_step: StepCallback | None = None,
    checkpointing: bool | None = None,
) -> TrainingResult:
    """Add a LoRA (or continue the parent's) to `model` and train it in place.

    ``checkpointing`` trades time for a fraction of the memory (see
    ``MEMORY_SAVING_STEP_TOKENS``; None: on for steps above it) and changes no value (a test
    trains both ways and compares the adapters byte for byte)."""
    if len(data.pairs) < hp.batch_size:
        raise TrainingDataError(
            f"the training split has {len(data.pairs)} pairs, fewer than one batch of "
            f"{hp.batch_size}; lower --batch-size or use a larger split"
        )
    seed_everything(hp.seed)
    if checkpointing is None:
        checkpointing = step_tokens(hp) > MEMORY_SAVING_STEP_TOKENS
    if checkpointing:
        release_freed_tensors()
    add_trainable_lora(model, hp, parent_adapter)
    per_epoch, total_steps = plan_steps(len(data.pairs), hp)

    def steps() -> Iterator[Step]:
        for epoch in range(hp.epochs):
            rng = random.Random(hp.seed * 1_000_003 + epoch)
            order = list(data.pairs)
            rng.shuffle(order)
            for start in range(0, per_epoch * hp.batch_size, hp.batch_size):
                batch = order[start : start + hp.batch_size]
                yield Step(
                    epoch,
                    functools.partial(
                        _batch_loss,
                        model,
                        data,
                        batch,
                        hp,
                        rng,
                        hard_negatives,
                        query_prefix,
                        passage_prefix,
                    ),
                )

    groups = [{"params": trainable_parameters(model), "lr": hp.learning_rate}]
    with gradient_checkpointing(model, enabled=checkpointing) as checkpointed:
        result = optimize([model], groups, hp, total_steps, steps(), on_step)
    result.gradient_checkpointing = checkpointed
    result.pairs = len(data.pairs)
    return result


def _batch_loss(
    model: Any,
    data: TrainingPairs,
    batch: list[tuple[str, str]],
    hp: LoraHyperparameters,
    rng: random.Random,
    hard_negatives: dict[str, list[str]] | None,
    query_prefix: str,
    passage_prefix: str,
) -> Any:
    import torch

    query_ids = [q for q, _ in batch]
    doc_ids = [d for _, d in batch]
    if hard_negatives:
        for query_id in query_ids:
            mined = hard_negatives.get(query_id)
            # A query with nothing mined still gets a (random) extra negative so shapes match.
            doc_ids.append(rng.choice(mined) if mined else rng.choice(sorted(data.corpus)))
    queries = embed(model, [query_prefix + data.queries[q] for q in query_ids])
    docs = embed(model, [passage_prefix + data.corpus[d] for d in doc_ids])
    scores = (
        hp.scale
        * torch.nn.functional.normalize(queries, dim=-1)
        @ (torch.nn.functional.normalize(docs, dim=-1).T)
    )
    mask = torch.tensor(
        [
            [j != i and doc_id in data.positives[query_id] for j, doc_id in enumerate(doc_ids)]
            for i, query_id in enumerate(query_ids)
        ]
    )
    scores = scores.masked_fill(mask, float("-inf"))
    targets = torch.arange(len(batch))
    return torch.nn.functional.cross_entropy(scores, targets)


def _linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        remaining = max(1, total - warmup)
        return max(0.0, 1.0 - (step - warmup) / remaining) if total > 1 else 1.0

    return factor


def mean_loss(losses: list[float], first: bool, fraction: float = 0.2) -> float:
    """Mean of the first or last fraction of the loss curve (a noisy curve needs averaging)."""
    n = max(1, math.ceil(len(losses) * fraction))
    window = losses[:n] if first else losses[-n:]
    return sum(window) / len(window)
