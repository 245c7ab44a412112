"""Tokenise what the encoder runs: texts cut to what a model reads, (query, passage) pairs
assembled like the tokenizer's own pair call, and pre-tokenised rows padded into model inputs.

Before any tokeniser runs, a text is cut to what the model can read (``cut_text``:
``CHARS_PER_TOKEN`` characters per token it reads), so the work of one text is bounded however
long it is; the sidecar cuts by the same rule (sidecar/src/worker/tokens.rs). Every path that
tokenises cuts here: ``Encoder``, ``PairTokenizer``, ``TextWindows``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

#: Characters of a text kept per token the model reads, before any tokeniser runs. A model
#: reading N tokens sees at most the first N word pieces, and a word piece spans few characters
#: (GerLayQA through MiniLM's tokenizer: 2.8 on average, at most 4.8 over a text's first 256
#: pieces), so N x 16 characters hold every piece a model reads of normal text while a 30 MB
#: text costs the tokeniser 4096 characters (MiniLM, N = 256). The same number is in
#: sidecar/src/worker/tokens.rs (a test keeps them equal).
CHARS_PER_TOKEN = 16


def cut_text(text: str, tokens: int) -> str:
    """The start of ``text`` a model reading ``tokens`` tokens can see: ``tokens x
    CHARS_PER_TOKEN`` characters (code points). Cutting twice is cutting once. A text whose
    first ``tokens`` pieces span more characters on average (long runs of whitespace, or words
    the tokenizer reads as one ``[UNK]``) loses pieces the model would have read."""
    limit = tokens * CHARS_PER_TOKEN
    return text if len(text) <= limit else text[:limit]


def cut_texts(texts: Sequence[str], tokens: int) -> list[str]:
    return [cut_text(t, tokens) for t in texts]


def text_lengths(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[int]:
    """Tokens of each text as the model reads it: cut, then truncated at ``max_length``."""
    if not texts:  # the tokenizer raises IndexError on an empty list
        return []
    enc = tokenizer(
        cut_texts(texts, max_length), truncation=True, max_length=max_length, padding=False
    )
    return [len(ids) for ids in enc["input_ids"]]


def preprocess(model: Any, texts: list[str]) -> dict[str, Any]:
    """The model's own padded tokenisation of ``texts`` (its features for a forward pass)."""
    # sentence-transformers 6 renamed `tokenize` to `preprocess` (the old name warns).
    call = getattr(model, "preprocess", None) or model.tokenize
    return dict(call(texts))


def pads_left(tokenizer: Any) -> bool:
    return getattr(tokenizer, "padding_side", "right") == "left"


def pair_features(
    model: Any, pairs: Sequence[tuple[str, str]], max_length: int, *, tensors: bool = True
) -> dict[str, Any]:
    """Tokenise (query, passage) pairs as one sequence each, the way BERT cross-encoders read
    them ([CLS] query [SEP] passage [SEP]); the longer text is cut first to fit. Serving,
    evaluation and training all build pair inputs here (through ``PairTokenizer``)."""
    return PairTokenizer(model.tokenizer, max_length).features(pairs, tensors=tensors)


# One entry of a tokenizer's pair template: ("A"|"B", type id) for a text, or (token ids,
# type id) for special tokens.
TemplatePiece = tuple[str | tuple[int, ...], int]


class PairTokenizer:
    """Cross-encoder inputs with exactly the ids, token types and truncation of the tokenizer's
    own pair call (``tokenizer(queries, passages, truncation="longest_first")``), built from
    each text's word pieces tokenised once.

    Why not the tokenizer's pair call: the fast tokenizer keeps every *overflowing* piece of a
    truncated pair, roughly (query pieces x passage pieces) encodings per pair: on GerLayQA
    (~1,000-character questions, cut to 128 word pieces) ~1.7 MB per pair, so scoring the 68k
    test pairs ran out of memory (20.7 GB). Here each text is tokenised once, cut to
    ``max_length`` word pieces, and the pair is assembled from the tokenizer's post-processor
    template with the same longest-first rule. A tokenizer whose post-processor is not a
    template falls back to the pair call, batch by batch.
    """

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.template = pair_template(tokenizer)
        specials = sum(len(p) for p, _ in self.template or () if not isinstance(p, str))
        self.budget = max(0, max_length - specials)
        self.specials = specials
        self._ids: dict[str, tuple[int, list[int]]] = {}

    def add_texts(self, texts: Sequence[str]) -> None:
        """Tokenise the texts not seen yet, each cut first (``cut_text``); keep each one's
        length (the truncation rule compares them) and its first ``max_length`` word pieces (a
        pair never keeps more)."""
        if self.template is None:
            return
        new = list(dict.fromkeys(t for t in texts if t not in self._ids))
        if not new:
            return
        cut = cut_texts(new, self.max_length)
        encoded = self.tokenizer(cut, add_special_tokens=False, verbose=False)
        for text, part, ids in zip(new, cut, encoded["input_ids"], strict=True):
            self._ids[text] = (
                _whole_length(len(ids), len(part), len(text)),
                ids[: self.max_length],
            )

    def kept(self, n1: int, n2: int) -> tuple[int, int]:
        """How many word pieces of each text a pair keeps: the tokenizers library's
        longest-first rule (the shorter text keeps at most half the budget, rounded down; on a
        tie the first text is the shorter)."""
        budget = self.budget
        if n1 + n2 <= budget:
            return n1, n2
        if n1 > n2:
            k2 = min(n2, budget // 2)
            return budget - k2, k2
        k1 = min(n1, budget // 2)
        return k1, budget - k1

    def lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        if self.template is None:
            return [len(ids) for ids in self._call(pairs, tensors=False)["input_ids"]]
        self.add_texts([t for pair in pairs for t in pair])
        return [self.specials + sum(self.kept(self._ids[q][0], self._ids[p][0])) for q, p in pairs]

    def encode(self, query: str, passage: str) -> tuple[list[int], list[int]]:
        """(input ids, token type ids) of one pair; its texts must have been added."""
        assert self.template is not None
        (n1, q), (n2, p) = self._ids[query], self._ids[passage]
        k1, k2 = self.kept(n1, n2)
        texts = {"A": q[:k1], "B": p[:k2]}
        ids: list[int] = []
        types: list[int] = []
        for piece, type_id in self.template:
            part = texts[piece] if isinstance(piece, str) else piece
            ids.extend(part)
            types.extend([type_id] * len(part))
        return ids, types

    def features(self, pairs: Sequence[tuple[str, str]], *, tensors: bool = True) -> dict[str, Any]:
        """The model inputs of the pairs (padded torch tensors, or lists without padding)."""
        if self.template is None:
            return self._call(pairs, tensors=tensors)
        self.add_texts([t for pair in pairs for t in pair])
        return padded_features(self.tokenizer, [self.encode(q, p) for q, p in pairs], tensors)

    def _call(self, pairs: Sequence[tuple[str, str]], *, tensors: bool) -> dict[str, Any]:
        encoded = self.tokenizer(
            cut_texts([q for q, _ in pairs], self.max_length),
            cut_texts([p for _, p in pairs], self.max_length),
            padding=tensors,
            truncation="longest_first",
            max_length=self.max_length,
            return_tensors="pt" if tensors else None,
        )
        return dict(encoded)


def _whole_length(pieces: int, kept_chars: int, chars: int) -> int:
    """A text's length in word pieces for the longest-first rule. A cut text (``cut_text``)
    counts as long as its characters say: its pieces scaled by the share of characters kept.
    The rule compares two texts' lengths, and when both were cut their cut lengths are about
    equal, so it would give the extra piece of an odd budget to the wrong text."""
    if kept_chars >= chars or kept_chars == 0:
        return pieces
    return max(pieces, pieces * chars // kept_chars)


def padded_features(
    tokenizer: Any, rows: Sequence[tuple[list[int], list[int]]], tensors: bool = True
) -> dict[str, Any]:
    """Model inputs of pre-tokenised rows of (input ids, token type ids): padded torch tensors
    on the tokenizer's padding side, or lists without padding; only the tokenizer's inputs."""
    names = tokenizer.model_input_names
    lists = {
        "input_ids": [ids for ids, _ in rows],
        "token_type_ids": [types for _, types in rows],
        "attention_mask": [[1] * len(ids) for ids, _ in rows],
    }
    if not tensors:
        return {k: v for k, v in lists.items() if k in names}
    import torch

    width = max((len(ids) for ids, _ in rows), default=0)
    pad = {
        "input_ids": tokenizer.pad_token_id or 0,
        "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0,
        "attention_mask": 0,
    }
    left = pads_left(tokenizer)
    out: dict[str, Any] = {}
    for key, values in lists.items():
        if key not in names:
            continue
        padded = [
            ([pad[key]] * (width - len(v)) + v) if left else (v + [pad[key]] * (width - len(v)))
            for v in values
        ]
        out[key] = torch.tensor(padded, dtype=torch.long).reshape(len(rows), width)
    return out


def pair_template(tokenizer: Any) -> list[TemplatePiece] | None:
    """The pair layout of a fast tokenizer's ``TemplateProcessing`` post-processor, or None."""
    return template(tokenizer, "pair")


def template(tokenizer: Any, layout: Literal["single", "pair"]) -> list[TemplatePiece] | None:
    """The ``single`` (one text: "A") or ``pair`` ("A", "B") layout of a fast tokenizer's
    ``TemplateProcessing`` post-processor, or None."""
    import json

    backend = getattr(tokenizer, "_tokenizer", None) or getattr(
        tokenizer, "backend_tokenizer", None
    )
    if backend is None:
        return None
    try:
        processor = json.loads(backend.to_str()).get("post_processor") or {}
    except (AttributeError, ValueError):
        return None
    if processor.get("type") != "TemplateProcessing":
        return None
    specials = processor.get("special_tokens", {})
    pieces: list[TemplatePiece] = []
    for entry in processor.get(layout, []):
        if "Sequence" in entry:
            pieces.append((str(entry["Sequence"]["id"]), int(entry["Sequence"]["type_id"])))
        elif "SpecialToken" in entry:
            token = specials.get(entry["SpecialToken"]["id"], {})
            pieces.append(
                (tuple(int(i) for i in token.get("ids", [])), int(entry["SpecialToken"]["type_id"]))
            )
        else:
            return None
    expected = ["A"] if layout == "single" else ["A", "B"]
    if [p for p, _ in pieces if isinstance(p, str)] != expected:
        return None
    return pieces
