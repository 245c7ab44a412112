"""Load a sentence-transformers base model, optionally with a peft LoRA adapter, and encode.

Batches are formed by *tokens*, not by request count: texts are tokenised once, sorted by
length and cut into forward passes whose padded size stays under ``max_batch_tokens`` and whose
padding stays under ``max_padding`` of it (``plan_batches``); each pass is a slice of that one
tokenisation, so no text is tokenised twice. A (query, passage) pair is encoded as one sequence
(a cross-encoder's input) and counts both texts.

Before any tokeniser runs, a text is cut to what the model can read (``cut_text``:
``CHARS_PER_TOKEN`` characters per token it reads), so the work of one text is bounded however
long it is; the sidecar cuts by the same rule (sidecar/src/worker/tokens.rs).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: A model folder holding this file is an optimised variant (serving/runtime/onnx_variant.py).
VARIANT_MANIFEST = "taskfleet_variant.json"
TextKind = Literal["query", "passage"]
#: Entered around one forward pass with the (input) indices of its rows, in row order.
AroundPass = Callable[[list[int]], AbstractContextManager[Any]]


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


#: Share of a forward pass's padded tokens that may be padding before the planner cuts a new
#: pass. On a CPU the cost of a pass is its padded tokens, so ragged passes waste time: with
#: MiniLM, calls of 10 ragged GerLayQA texts padded to 1.55x their real tokens in one pass
#: (49.9 texts/s) and to 1.07x cut at 10% (61.8 texts/s; reports/serving/padding.md).
DEFAULT_MAX_PADDING = 0.10
#: Texts tokenised (and planned) together: the runtime's requests fit in one chunk (the gateway
#: takes at most 2048 texts); an eval corpus is encoded chunk by chunk.
TOKENISE_CHUNK = 4096
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


class Encoder:
    """A loaded base model (+ optional active LoRA adapter) that turns texts into vectors."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        device: str = "cpu",
        max_batch_tokens: int | None = None,
        max_batch_size: int | None = None,
        max_padding: float | None = None,
        model: Any | None = None,
    ) -> None:
        """``model``: an already loaded SentenceTransformer to share (the serving runtime keeps
        one base per path); by default the model is loaded from ``spec``."""
        self.spec = spec
        self.device = device
        default_tokens, default_size = default_batch_limits(device)
        self.max_batch_tokens = max_batch_tokens or default_tokens
        self.max_batch_size = max_batch_size or default_size
        self.max_padding = DEFAULT_MAX_PADDING if max_padding is None else max_padding
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
        cut = cut_texts(texts, self.max_seq_length)
        enc = tok(cut, truncation=True, max_length=self.max_seq_length, padding=False)
        return [len(ids) for ids in enc["input_ids"]]

    def pair_token_lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        if not pairs:
            return []
        return PairTokenizer(self.model.tokenizer, self.max_seq_length).lengths(pairs)

    def iter_batches(
        self,
        texts: Sequence[str],
        kind: TextKind = "passage",
        *,
        around_pass: AroundPass | None = None,
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings, stats) per forward pass (see ``plan_batches``)."""
        prefix = self.spec.prefix(kind)
        yield from self.iter_prepared([prefix + t for t in texts], around_pass=around_pass)

    def iter_prepared(
        self, prepared: Sequence[str], *, around_pass: AroundPass | None = None
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """``iter_batches`` of texts that already carry their prefix. ``around_pass`` is
        entered around each forward pass with the indices of its rows, in row order."""
        # Planned in chunks, so that one padded tokenisation of a whole eval corpus is never
        # held at once (a chunk is at most TOKENISE_CHUNK x max_seq_length ids).
        for start in range(0, len(prepared), TOKENISE_CHUNK):
            chunk = cut_texts(prepared[start : start + TOKENISE_CHUNK], self.max_seq_length)
            for indices, vectors, stats in self._iter_chunk(chunk, start, around_pass):
                yield [start + i for i in indices], vectors, stats

    def _iter_chunk(
        self, prepared: list[str], start: int, around_pass: AroundPass | None
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        features = self._preprocess(prepared)
        real = _real_lengths(features, len(prepared))
        # A layout we cannot slice is tokenised again, pass by pass (never on a CPU).
        lengths = real if real is not None else self.token_lengths(prepared)
        plan = plan_batches(lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding)
        for batch in plan:
            if real is None:
                part = self._preprocess([prepared[i] for i in batch.indices])
            else:
                width = max(lengths[i] for i in batch.indices)
                part = _slice_rows(features, batch.indices, width, self._pads_left())
            around = (
                around_pass([start + i for i in batch.indices])
                if around_pass is not None
                else contextlib.nullcontext()
            )
            with around:
                result = self._forward(batch, lengths, part)
            yield result

    def iter_pair_batches(
        self, pairs: Sequence[tuple[str, str]]
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings of the pairs encoded together, stats) per forward pass:
        planned like texts (``plan_batches``, padding bound included). Each distinct text of a
        chunk is tokenised once (a query heads ~30 pairs) and ``PairTokenizer`` assembles only
        the pass's rows, so no padded tokenisation of all pairs is ever held at once."""
        for start in range(0, len(pairs), TOKENISE_CHUNK):
            chunk = list(pairs[start : start + TOKENISE_CHUNK])
            tokenizer = PairTokenizer(self.model.tokenizer, self.max_seq_length)
            tokenizer.add_texts([t for pair in chunk for t in pair])
            lengths = tokenizer.lengths(chunk)
            plan = plan_batches(
                lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding
            )
            for batch in plan:
                chosen = [chunk[i] for i in batch.indices]
                indices, vectors, stats = self._forward(batch, lengths, tokenizer.features(chosen))
                yield [start + i for i in indices], vectors, stats

    def iter_token_rows(
        self, rows: Sequence[tuple[list[int], list[int]]]
    ) -> Iterator[tuple[list[int], np.ndarray, EncodeStats]]:
        """Yield (indices, embeddings, stats) per forward pass of rows tokenised already
        ((input ids, token type ids), special tokens included; e.g. a long text's windows),
        planned like texts (``plan_batches``)."""
        lengths = [len(ids) for ids, _ in rows]
        plan = plan_batches(lengths, self.max_batch_tokens, self.max_batch_size, self.max_padding)
        tokenizer = self.model.tokenizer
        for batch in plan:
            features = padded_features(tokenizer, [rows[i] for i in batch.indices])
            yield self._forward(batch, lengths, features)

    def _preprocess(self, texts: list[str]) -> dict[str, Any]:
        # sentence-transformers 6 renamed `tokenize` to `preprocess` (the old name warns).
        preprocess = getattr(self.model, "preprocess", None) or self.model.tokenize
        return dict(preprocess(texts))

    def _pads_left(self) -> bool:
        return getattr(self.model.tokenizer, "padding_side", "right") == "left"

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
        return self._collect(len(texts), self.iter_batches(texts, kind))

    def encode_prepared(
        self, prepared: Sequence[str], *, around_pass: AroundPass | None = None
    ) -> tuple[np.ndarray, EncodeStats]:
        """``encode`` of texts that already carry their prefix (see ``iter_prepared``)."""
        return self._collect(len(prepared), self.iter_prepared(prepared, around_pass=around_pass))

    def _collect(
        self, count: int, passes: Iterator[tuple[list[int], np.ndarray, EncodeStats]]
    ) -> tuple[np.ndarray, EncodeStats]:
        result = np.zeros((count, self.dims), dtype=np.float32)
        total = EncodeStats()
        for indices, vectors, stats in passes:
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
    left = getattr(tokenizer, "padding_side", "right") == "left"
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


def _real_lengths(features: dict[str, Any], rows: int) -> list[int] | None:
    """Tokens per text from the attention mask of one padded tokenisation; ``None`` when the
    features are not plain (rows, width) tensors (e.g. inputs flattened for flash attention)."""
    tensors = [v for v in features.values() if hasattr(v, "shape")]
    mask = features.get("attention_mask")
    if mask is None or any(len(v.shape) != 2 or v.shape[0] != rows for v in tensors):
        return None
    return [int(n) for n in mask.sum(dim=1).tolist()]


def _slice_rows(
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


def load_sentence_transformer(spec: ModelSpec, *, device: str = "cpu") -> Any:
    """Load a sentence-transformers folder from a local path, then attach the adapter's LoRA."""
    from sentence_transformers import SentenceTransformer

    if not spec.base_path.is_dir():
        raise ModelLoadError(f"base model folder does not exist: {spec.base_path}")
    if (spec.base_path / VARIANT_MANIFEST).is_file():
        return load_onnx_variant(spec)
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


def load_onnx_variant(spec: ModelSpec) -> Any:
    """An ONNX variant folder (serving/runtime/onnx_variant.py), run by ONNX Runtime; it embeds
    only, so an adapter (LoRA or head) is refused."""
    from serving.runtime.onnx_variant import OnnxModel

    refuse_adapter_on_variant(spec)
    try:
        model = OnnxModel(spec.base_path)
    except Exception as exc:  # VariantError, or onnxruntime's own types for a bad graph
        raise ModelLoadError(f"cannot load ONNX variant from {spec.base_path}: {exc}") from exc
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    return model


def refuse_adapter_on_variant(spec: ModelSpec) -> None:
    """A variant embeds only: a spec pairing one with an adapter (LoRA or head) is refused."""
    if spec.adapter_path is not None and (spec.base_path / VARIANT_MANIFEST).is_file():
        raise ModelLoadError(
            f"{spec.base_path} is an ONNX variant: it embeds only and cannot apply the "
            f"adapter {spec.adapter_path}"
        )


def is_onnx_variant(model: Any) -> bool:
    return getattr(model, "variant", None) is not None and hasattr(model, "session")


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
