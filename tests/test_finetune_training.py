"""LoRA training on a tiny random-initialised BERT: learning, determinism, bad input, parity.

No registry here (see test_finetune_pipeline.py); the data comes through the eval harness's
BEIR loader from a small generated suite folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evals.suites import SuiteSpec, beir_suite
from finetune.config import LoraHyperparameters, preset
from finetune.data import load_training_pairs, training_split
from finetune.errors import (
    AdapterConfigError,
    InvalidHyperparameters,
    TrainingDataError,
)
from finetune.job import train_adapter
from finetune.modeling import embed_no_grad
from finetune.negatives import mine_bm25
from finetune.trainer import MEMORY_SAVING_STEP_TOKENS, mean_loss, step_tokens
from registry.fingerprint import file_sha256
from serving.runtime.encoder import Encoder
from serving.runtime.model_folder import ModelSpec
from tests.beir_fixture import build_beir

# Small enough for a few seconds on one core, big enough for the loss to move clearly.
FAST = LoraHyperparameters(
    rank=4, alpha=8, dropout=0.0, batch_size=8, max_seq_length=32, learning_rate=5e-3, epochs=6
)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> SuiteSpec:
    folder = build_beir(tmp_path_factory.mktemp("beir"), queries={"test": 12, "dev": 40})
    # Declared like german-legal-retrieval: dev trains, test tests.
    return beir_suite("tiny-legal", folder, test_split="test", train_split="dev")


def test_loss_goes_down_and_run_is_deterministic(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_training_pairs(suite)
    first = train_adapter(tiny_model_path, data, FAST, tmp_path / "a")
    second = train_adapter(tiny_model_path, data, FAST, tmp_path / "b")

    losses = first.result.losses
    assert len(losses) == first.result.steps > 10
    assert mean_loss(losses, first=False) < 0.8 * mean_loss(losses, first=True)
    # Same seed, same CPU: identical curve and byte-identical adapter weights.
    assert second.result.losses == losses
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert file_sha256(first.path / name) == file_sha256(second.path / name)
    # Only the LoRA weights and config, never a merged copy of the base.
    assert sorted(p.name for p in first.path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]

    other_seed = train_adapter(tiny_model_path, data, FAST.with_overrides(seed=1), tmp_path / "c")
    assert other_seed.result.losses != losses
    # A small step trains plainly by default: recomputing layers costs time it does not need.
    assert (
        step_tokens(FAST) <= MEMORY_SAVING_STEP_TOKENS and not first.result.gradient_checkpointing
    )


def test_memory_saving_is_on_for_large_steps_only() -> None:
    # Preset epoch needs it for its 4 GB target (benchmarks/lora_memory.py); make demo's preset
    # runs ~1.7x slower with it.
    assert step_tokens(preset("epoch")) == 32 * 3 * 128 > MEMORY_SAVING_STEP_TOKENS
    assert step_tokens(preset("demo")) == 16 * 3 * 128 <= MEMORY_SAVING_STEP_TOKENS
    assert step_tokens(FAST) == 8 * 2 * 32  # no mined negatives: query + positive


def test_gradient_checkpointing_changes_no_value(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    # BERT's own dropout (0.1) is active while training: the recomputed forward pass must
    # replay the same masks for the adapters to match.
    data = load_training_pairs(suite)
    hp = FAST.with_overrides(epochs=2)
    kept = train_adapter(tiny_model_path, data, hp, tmp_path / "kept", checkpointing=False)
    recomputed = train_adapter(
        tiny_model_path, data, hp, tmp_path / "recomputed", checkpointing=True
    )
    assert (kept.result.gradient_checkpointing, recomputed.result.gradient_checkpointing) == (
        False,
        True,
    )
    assert recomputed.result.losses == kept.result.losses
    weights = "adapter_model.safetensors"
    assert file_sha256(recomputed.path / weights) == file_sha256(kept.path / weights)
    # Off again after training: the served/evaluated model runs plainly.
    network = recomputed.model[0].auto_model.get_base_model()
    if hasattr(network, "is_activation_checkpointing"):  # transformers 5's name
        assert not network.is_activation_checkpointing
    else:
        assert not network.is_gradient_checkpointing


def test_serving_encoder_reproduces_training_time_embeddings(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_training_pairs(suite)
    trained = train_adapter(tiny_model_path, data, FAST.with_overrides(epochs=1), tmp_path / "a")
    texts = [data.queries[q] for q in list(data.queries)[:5]] + list(data.corpus.values())[:5]
    at_training = embed_no_grad(trained.model, texts)

    # Served with the sequence length it was trained with (the registry records it).
    length = FAST.max_seq_length
    spec = ModelSpec(tiny_model_path, adapter_path=trained.path, max_seq_length=length)
    served, _ = Encoder(spec).encode(texts)
    np.testing.assert_allclose(served, at_training, atol=1e-5)
    plain, _ = Encoder(ModelSpec(tiny_model_path, max_seq_length=length)).encode(texts)
    assert not np.allclose(plain, at_training, atol=1e-3), "the adapter changed nothing"


def test_bm25_hard_negatives_exclude_positives_and_train(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_training_pairs(suite)
    mined = mine_bm25(data, depth=5)
    assert mined
    for query_id, negatives in mined.items():
        assert len(negatives) <= 5
        assert not set(negatives) & data.positives[query_id]
    hp = FAST.with_overrides(hard_negatives="bm25", epochs=2)
    trained = train_adapter(tiny_model_path, data, hp, tmp_path / "a")
    assert trained.result.steps == 2 * (len(data.pairs) // 8 + (len(data.pairs) % 8 >= 2))


def test_test_split_is_refused(suite: SuiteSpec) -> None:
    with pytest.raises(TrainingDataError, match="test split"):
        training_split(suite, "test")
    with pytest.raises(TrainingDataError, match="no training split 'nope'"):
        training_split(suite, "nope")
    assert training_split(suite, None) == "dev"


def test_tiny_split_is_refused(suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingDataError, match="at least 4 are needed"):
        load_training_pairs(suite, max_pairs=2)
    data = load_training_pairs(suite, max_pairs=6)
    with pytest.raises(TrainingDataError, match="fewer than one batch of 8"):
        train_adapter(tiny_model_path, data, FAST, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_wrong_target_modules_name_the_real_ones(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    data = load_training_pairs(suite)
    llama_style = FAST.with_overrides(target_modules=("q_proj", "v_proj"))
    with pytest.raises(AdapterConfigError) as info:
        train_adapter(tiny_model_path, data, llama_style, tmp_path / "a")
    message = str(info.value)
    assert "q_proj, v_proj" in message and "query" in message and "dense" in message
    assert not (tmp_path / "a").exists()


def test_bad_hyperparameters_are_refused_with_every_problem() -> None:
    with pytest.raises(InvalidHyperparameters) as info:
        LoraHyperparameters(rank=0, batch_size=1, hard_negatives="random")  # type: ignore[arg-type]
    message = str(info.value)
    assert "rank" in message and "batch size" in message and "hard negatives" in message
    with pytest.raises(InvalidHyperparameters, match="unknown preset"):
        preset("huge")
    assert preset("demo").max_steps is not None  # the demo preset is bounded


def test_base_model_hard_negatives_exclude_positives(
    suite: SuiteSpec, tiny_model_path: Path, tmp_path: Path
) -> None:
    from finetune.negatives import mine_with_model
    from serving.runtime.model_loading import load_sentence_transformer

    data = load_training_pairs(suite)
    model = load_sentence_transformer(ModelSpec(tiny_model_path, max_seq_length=32))
    mined = mine_with_model(data, model, 4, query_prefix="", passage_prefix="")
    assert set(mined) == set(data.queries)
    for query_id, negatives in mined.items():
        assert len(negatives) == 4 and not set(negatives) & data.positives[query_id]
    trained = train_adapter(
        tiny_model_path, data, FAST.with_overrides(hard_negatives="base", epochs=1), tmp_path / "a"
    )
    assert trained.result.steps > 0 and (tmp_path / "a" / "adapter_config.json").is_file()
