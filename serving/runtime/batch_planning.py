"""Plan forward passes by *tokens*, not by request count, and slice each pass's rows.

Texts tokenised together are ordered longest first and cut into passes whose padded size stays
under ``max_batch_tokens`` and whose padding stays under ``max_padding`` of it
(``plan_batches``); each pass is then a slice of that one padded tokenisation
(``slice_rows``), so no text is tokenised twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Batch:
    """Indices into the input list and their token count (padded)."""

    indices: list[int]
    padded_tokens: int


#: Share of a forward pass's padded tokens that may be padding before the planner cuts a new
#: pass. On a CPU the cost of a pass is its padded tokens, so ragged passes waste time: with
#: MiniLM, calls of 10 ragged GerLayQA texts padded to 1.55x their real tokens in one pass
#: (49.9 texts/s) and to 1.07x cut at 10% (61.8 texts/s; reports/serving/padding.md).
DEFAULT_MAX_PADDING = 0.10


def plan_batches(
    lengths: Sequence[int],
    max_batch_tokens: int,
    max_batch_size: int,
    max_padding: float = DEFAULT_MAX_PADDING,
) -> list[Batch]:
    """Cut items into forward passes: longest first, a new pass where the padded tokens would
    pass ``max_batch_tokens``, the texts ``max_batch_size``, or the padding ``max_padding`` of
    the padded tokens. ``max_padding`` 1.0 turns the padding bound off."""
    if not 0.0 <= max_padding <= 1.0:
        raise ValueError(f"max_padding must be within 0..1, not {max_padding}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[Batch] = []
    current: list[int] = []
    longest = real = 0
    for i in order:
        n = max(1, lengths[i])
        new_longest = max(longest, n)
        padded = new_longest * (len(current) + 1)
        if current and (
            padded > max_batch_tokens
            or len(current) >= max_batch_size
            or padded - (real + n) > max_padding * padded
        ):
            batches.append(Batch(current, longest * len(current)))
            current, new_longest, real = [], n, 0
        current.append(i)
        longest = new_longest
        real += n
    if current:
        batches.append(Batch(current, longest * len(current)))
    return batches


def default_batch_limits(device: str) -> tuple[int, int]:
    """(padded tokens, texts) per forward pass. On a CPU small passes stay in cache: for MiniLM
    on GerLayQA passages 4096/32 ran ~20% faster than 16384/128 (and than
    sentence-transformers' own encode); accelerators want large batches."""
    return (4096, 32) if device == "cpu" else (16384, 128)


def real_lengths(features: dict[str, Any], rows: int) -> list[int] | None:
    """Tokens per text from the attention mask of one padded tokenisation; ``None`` when the
    features are not plain (rows, width) tensors (e.g. inputs flattened for flash attention)."""
    tensors = [v for v in features.values() if hasattr(v, "shape")]
    mask = features.get("attention_mask")
    if mask is None or any(len(v.shape) != 2 or v.shape[0] != rows for v in tensors):
        return None
    return [int(n) for n in mask.sum(dim=1).tolist()]


def slice_rows(
    features: dict[str, Any], indices: list[int], width: int, pads_left: bool
) -> dict[str, Any]:
    """The features of ``indices`` alone, padded to their own longest (``width``) tokens:
    exactly what tokenising those texts by themselves gives."""
    import torch

    rows = torch.as_tensor(indices, dtype=torch.long)
    part: dict[str, Any] = {}
    for key, value in features.items():
        if not hasattr(value, "shape"):
            part[key] = value
            continue
        picked = value.index_select(0, rows)
        part[key] = picked[:, -width:] if pads_left else picked[:, :width]
    return part
