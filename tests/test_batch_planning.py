"""Padding-aware batch planning in the runtime's encoder: every forward pass stays under the
padding bound, replies come back in input order, and nothing is tokenised twice; at the limits
(one text, 2048 texts, one text far above the model's sequence length)."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.runtime.batch_planning import DEFAULT_MAX_PADDING, plan_batches
from serving.runtime.encoder import Encoder
from serving.runtime.model_folder import ModelSpec

REPO = Path(__file__).resolve().parents[1]
WORDS = ["der", "mieter", "muss", "die", "kündigung", "schriftlich", "erklären", "haftung"]


def _check_plan(lengths: list[int], max_tokens: int, max_size: int, max_padding: float) -> None:
    plan = plan_batches(lengths, max_tokens, max_size, max_padding)
    seen = sorted(i for batch in plan for i in batch.indices)
    assert seen == list(range(len(lengths))), "every text lands in exactly one pass"
    for batch in plan:
        sizes = [max(1, lengths[i]) for i in batch.indices]
        padded = max(sizes) * len(sizes)
        assert batch.padded_tokens == padded
        assert len(sizes) <= max_size
        if len(sizes) > 1:
            assert padded <= max_tokens
            assert padded - sum(sizes) <= max_padding * padded + 1e-9


@pytest.mark.parametrize("seed", range(5))
def test_padding_bound_holds_on_ragged_lengths(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(3, 30), rng.randint(30, 256)]) for _ in range(500)]
    _check_plan(lengths, 4096, 32, DEFAULT_MAX_PADDING)
    _check_plan(lengths, 4096, 32, 0.0)
    _check_plan(lengths, 512, 8, 0.25)


def test_ten_ragged_texts_are_cut_where_padding_would_pass_the_bound() -> None:
    # The profile's worst case: ~10 texts of very different lengths in one sidecar batch.
    lengths = [12, 250, 40, 41, 180, 13, 90, 250, 39, 12]
    plan = plan_batches(lengths, 4096, 32, 0.10)
    padded = sum(b.padded_tokens for b in plan)
    assert padded <= 1.10 * sum(lengths)
    assert [sorted(lengths[i] for i in b.indices) for b in plan] == [
        [180, 250, 250],  # 70 of 750 padded tokens: 9.3%
        [90],
        [39, 40, 41],
        [12, 12, 13],
    ]
    # Without the bound, one pass pads everything to 250 tokens: 2.7x the real tokens.
    (one,) = plan_batches(lengths, 4096, 32, 1.0)
    assert one.padded_tokens == 2500


def test_plan_at_the_limits() -> None:
    assert [b.indices for b in plan_batches([7], 4096, 32)] == [[0]]
    assert plan_batches([], 4096, 32) == []
    # 2048 texts of one length: full passes of max_batch_size, no padding at all.
    plan = plan_batches([20] * 2048, 4096, 32)
    assert len(plan) == 64 and all(b.padded_tokens == 640 for b in plan)
    # A text longer than the whole token budget still runs, alone.
    plan = plan_batches([5, 9000, 6], 4096, 32)
    assert plan[0].indices == [1]
    with pytest.raises(ValueError, match="max_padding"):
        plan_batches([1], 4096, 32, 1.5)


# ---- the encoder that the runtime, the eval harness and the trainer share ---------------


@pytest.fixture(scope="module")
def encoder(tiny_model_path: Path) -> Encoder:
    return Encoder(ModelSpec(base_path=tiny_model_path))


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny_model_path), device="cpu", local_files_only=True)


def _ragged_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.choice([1, 3, 8, 20, 45]))) for _ in range(n)]


def _in_process(reference: Any, texts: list[str]) -> np.ndarray:
    return np.asarray(reference.encode(texts, convert_to_numpy=True), dtype=np.float32)


def test_replies_keep_input_order_and_equal_in_process(encoder: Encoder, reference: Any) -> None:
    texts = _ragged_texts(64)
    vectors, stats = encoder.encode(texts)
    np.testing.assert_allclose(vectors, _in_process(reference, texts), atol=1e-5)
    assert stats.items == 64
    # Cut by length, the ragged texts took several passes (the in-process reference took 2).
    assert len(stats.batch_latencies) > 2


def test_limits_one_text_2048_texts_and_one_very_long_text(
    encoder: Encoder, reference: Any
) -> None:
    one, stats = encoder.encode(["der mieter"])
    np.testing.assert_allclose(one, _in_process(reference, ["der mieter"]), atol=1e-5)
    assert len(stats.batch_latencies) == 1

    many = _ragged_texts(2048, seed=1)
    vectors, stats = encoder.encode(many)
    assert vectors.shape[0] == 2048 and stats.items == 2048
    np.testing.assert_allclose(vectors, _in_process(reference, many), atol=1e-5)

    # Far above max_seq_length (64 for the tiny model): truncated as in-process, and alone.
    long_text = " ".join(WORDS * 200)
    texts = ["haus", long_text, "der vermieter"]
    vectors, stats = encoder.encode(texts)
    np.testing.assert_allclose(vectors, _in_process(reference, texts), atol=1e-5)
    assert stats.tokens == sum(encoder.token_lengths(texts))
    assert max(encoder.token_lengths(texts)) == encoder.max_seq_length


def test_each_text_is_tokenised_once(encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    preprocess = encoder.model.preprocess

    def counting(texts: list[str], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(texts))
        return preprocess(texts, *args, **kwargs)

    monkeypatch.setattr(encoder.model, "preprocess", counting)
    texts = _ragged_texts(300, seed=2)
    _, stats = encoder.encode(texts)
    assert len(stats.batch_latencies) > 1
    assert calls == [300]


def test_padding_bound_is_a_runtime_flag() -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "serving.runtime.server", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--max-padding" in help_text
    bad = subprocess.run(
        [sys.executable, "-m", "serving.runtime.server", "--socket", "/tmp/x.sock",
         "--max-padding", "1.5"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert bad.returncode == 2 and "must be within 0..1" in bad.stderr
