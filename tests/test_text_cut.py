"""Texts are cut to what the model reads before any tokeniser runs (``cut_text``): a 20 MB
text costs what its first few thousand characters cost, and what the model reads of normal
text (tokens, vectors, pair inputs, windows) is unchanged."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

from serving.runtime.encoder import Encoder
from serving.runtime.model_folder import ModelSpec
from serving.runtime.tokenising import CHARS_PER_TOKEN, PairTokenizer, cut_text
from serving.runtime.windows import TextWindows
from tests.conftest import REPO

CLAUSE = "der vermieter kann das mietverhältnis wegen eigenbedarf kündigen, § 573 bgb. "


def long_text(chars: int) -> str:
    return (CLAUSE * (chars // len(CLAUSE) + 1))[:chars]


def test_the_cut_keeps_tokens_times_the_bound_and_is_idempotent() -> None:
    text = "ä" * 5000
    assert cut_text(text, 10) == "ä" * (10 * CHARS_PER_TOKEN)  # characters, not bytes
    assert cut_text(cut_text(text, 10), 10) == cut_text(text, 10)
    assert cut_text(cut_text(text, 100), 10) == cut_text(text, 10)
    assert cut_text("kurz", 1) == "kurz"


def test_the_sidecar_cuts_by_the_same_number() -> None:
    rust = (REPO / "sidecar" / "src" / "worker" / "tokens.rs").read_text()
    found = re.findall(r"pub const CHARS_PER_TOKEN: usize = (\d+);", rust)
    assert found == [str(CHARS_PER_TOKEN)]


def test_a_20_mb_text_costs_what_its_start_costs_and_reads_the_same(
    tiny_model_path: Path,
) -> None:
    """sentence-transformers tokenises the whole text and truncates the tokens; the encoder
    cuts the characters first: the same vector, at a fraction of the time (on main the 20 MB
    were tokenised whole, twice)."""
    from sentence_transformers import SentenceTransformer

    encoder = Encoder(ModelSpec(tiny_model_path))
    huge = long_text(20_000_000)
    started = time.perf_counter()
    vectors, _ = encoder.encode([huge, "kurze frage"], "passage")
    took = time.perf_counter() - started
    assert took < 5.0, f"a 20 MB text took {took:.1f} s to encode"
    assert encoder.token_lengths([huge]) == [encoder.max_seq_length]
    model = SentenceTransformer(str(tiny_model_path), device="cpu", local_files_only=True)
    whole = model.encode([long_text(20_000), "kurze frage"], convert_to_numpy=True)
    np.testing.assert_allclose(vectors, whole, atol=1e-6)


def test_pairs_and_windows_of_long_normal_texts_read_the_same(tiny_model_path: Path) -> None:
    """What a pair keeps of each text, and each window, as from the whole texts' pieces (the
    tokenizer's own pair call is the reference for short texts in test_pair_tokenizer.py; on
    texts this long it holds gigabytes of overflowing pieces)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))

    def pieces(text: str) -> list[int]:
        return list(tokenizer([text], add_special_tokens=False)["input_ids"][0])

    long_query, long_doc = long_text(50_000), long_text(30_000)
    pairs = [(long_query, "kurzes dokument"), ("kurze frage", long_doc), (long_query, long_doc)]
    for limit in (64, 63):  # odd and even budgets: the longer text keeps the odd piece
        ours = PairTokenizer(tokenizer, limit)
        for query, doc in pairs:
            q, d = pieces(query), pieces(doc)
            k1, k2 = ours.kept(len(q), len(d))
            cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
            expected = [cls, *q[:k1], sep, *d[:k2], sep]
            assert ours.features([(query, doc)], tensors=False)["input_ids"] == [expected]
    windows = TextWindows(tokenizer, 64, stride=32, max_windows=4)
    assert windows.read_tokens == 3 * 32 + 64
    whole = pieces(long_query)
    assert len(whole) > windows.read_tokens
    cut_windows = windows.split([long_query])[0]
    body = windows.body
    assert [w[0][1:-1] for w in cut_windows] == [whole[s : s + body] for s in (0, 32, 64, 96)]
