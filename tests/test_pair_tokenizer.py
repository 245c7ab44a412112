"""Cross-encoder inputs built from each text tokenised once equal the tokenizer's own pair call
(ids, token types, mask; padded or not), at several length limits and around the
longest-first rule's edges, on real GerLayQA pairs and synthetic ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serving.runtime.tokenising import PairTokenizer, pair_template

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gerlayqa-rerank"


def synthetic_pairs() -> list[tuple[str, str]]:
    word = "mietvertrag kündigung "
    pairs = [(word * a, word * b) for a in (0, 1, 20, 31, 32, 33, 60) for b in (0, 2, 31, 32, 90)]
    edges = [("", ""), ("kurz", "auch kurz"), ("Wer erbt? " * 20, "§ 1924 Gesetzliche Erben")]
    return [*pairs, *edges]


def real_pairs(queries: int = 3) -> list[tuple[str, str]]:
    """GerLayQA test pairs: ~1,000-character questions with BGB paragraphs (most get cut)."""
    if not DATA.is_dir():
        return []
    from evals.rerank_data import load_split

    data = load_split(DATA, "test").sample(queries)
    return [(data.queries[q], data.corpus[d]) for q in data.candidates for d in data.candidates[q]]


def reference(tokenizer: Any, pairs: list[tuple[str, str]], limit: int, padded: bool) -> Any:
    return dict(
        tokenizer(
            [q for q, _ in pairs],
            [p for _, p in pairs],
            truncation="longest_first",
            max_length=limit,
            padding=padded,
            return_tensors="pt" if padded else None,
        )
    )


@pytest.mark.parametrize("which", ["minilm", "tiny"])
def test_pair_inputs_equal_the_tokenizers_pair_call(
    which: str, minilm_path: Path, tiny_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    folder = minilm_path if which == "minilm" else tiny_model_path
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert pair_template(tokenizer) is not None  # the fast path is the one tested
    pairs = synthetic_pairs() + real_pairs()
    for limit in (128, 127, 64):
        ours = PairTokenizer(tokenizer, limit)
        assert ours.features(pairs, tensors=False) == reference(tokenizer, pairs, limit, False)
        assert ours.lengths(pairs) == [
            len(ids) for ids in reference(tokenizer, pairs, limit, False)["input_ids"]
        ]
        padded, expected = ours.features(pairs), reference(tokenizer, pairs, limit, True)
        assert set(padded) == set(expected)
        for key, tensor in expected.items():
            assert padded[key].shape == tensor.shape and bool((padded[key] == tensor).all()), key


def test_a_tokenizer_without_a_template_falls_back_to_the_pair_call(minilm_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    ours = PairTokenizer(tokenizer, 64)
    ours.template = None  # what a RoBERTa-style post-processor gives
    pairs = synthetic_pairs()
    assert ours.features(pairs, tensors=False) == reference(tokenizer, pairs, 64, False)
