"""Long texts for a classify head: the whole text read as windows of word pieces.

A classify head may say how it reads a text longer than its ``max_seq_length``
(``HeadSpec.window_stride``, stored in ``head.json``). Without a stride the text is cut at
``max_seq_length`` tokens, as every model reads by default. With one, the text's word pieces
are cut into windows of ``max_seq_length`` tokens (special tokens included), one starting every
``window_stride`` word pieces until the text's end is covered (at most ``max_windows``); each
window is encoded on its own, the head gives its logits, and the text's logits are the mean
over its windows. The first window is exactly the cut text, so a short text reads the same
either way.

Training (finetune/head_training.py), evaluation and the served ``classify`` op all split texts
here, so the windows a head was trained on are the windows it is judged and served on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from serving.runtime.tokenising import cut_texts, template

#: (input ids, token type ids) of one window, special tokens included.
Window = tuple[list[int], list[int]]


class WindowError(ValueError):
    """A window rule that cannot be applied (bad numbers, or a tokenizer without a template)."""


def window_starts(pieces: int, body: int, stride: int, max_windows: int) -> list[int]:
    """Where each window starts in a text of ``pieces`` word pieces: 0, stride, 2 x stride, ...
    until a window reaches the end (``body`` pieces each), at most ``max_windows``."""
    count = 1 if pieces <= body else 1 + math.ceil((pieces - body) / stride)
    return [i * stride for i in range(min(count, max_windows))]


class TextWindows:
    """Splits texts into windows with the tokenizer's single-text template ([CLS] A [SEP])."""

    def __init__(self, tokenizer: Any, max_length: int, stride: int, max_windows: int) -> None:
        layout = template(tokenizer, "single")
        if layout is None:
            raise WindowError(
                "this model's tokenizer has no single-text template (a fast tokenizer's "
                "TemplateProcessing); it cannot read texts as windows"
            )
        specials = sum(len(p) for p, _ in layout if not isinstance(p, str))
        self.body = max_length - specials
        if self.body < 1 or not 1 <= stride <= self.body or max_windows < 1:
            raise WindowError(
                f"windows of {max_length} tokens ({self.body} word pieces) need a stride in "
                f"1..{max(self.body, 1)} and max_windows >= 1 (got stride {stride}, "
                f"max_windows {max_windows})"
            )
        self.tokenizer = tokenizer
        self.layout = layout
        self.stride = stride
        self.max_windows = max_windows
        # The word pieces the windows read at most, special tokens counted: what a text is cut
        # to (in characters, ``cut_text``) before it is tokenised.
        self.read_tokens = stride * (max_windows - 1) + max_length

    def split(self, texts: Sequence[str]) -> list[list[Window]]:
        """Per text, its windows in reading order (at least one; an empty text gives the
        template alone)."""
        if not texts:
            return []
        cut = cut_texts(texts, self.read_tokens)
        encoded = self.tokenizer(cut, add_special_tokens=False, verbose=False)
        out: list[list[Window]] = []
        for pieces in encoded["input_ids"]:
            starts = window_starts(len(pieces), self.body, self.stride, self.max_windows)
            out.append([self._assemble(pieces[s : s + self.body]) for s in starts])
        return out

    def _assemble(self, body: list[int]) -> Window:
        ids: list[int] = []
        types: list[int] = []
        for piece, type_id in self.layout:
            part = body if isinstance(piece, str) else list(piece)
            ids.extend(part)
            types.extend([type_id] * len(part))
        return ids, types
