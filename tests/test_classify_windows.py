"""Classify heads that read long texts as windows (serving/runtime/windows.py): the windows
cover the text and start with the cut text, the averaged probabilities equal an independent
computation, the rule travels in head.json, and training draws windows repeatably."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from evals.classifiers import ModelClassifier
from evals.suites import SuiteSpec
from finetune.config import LoraHyperparameters
from finetune.data import load_labelled
from finetune.errors import InvalidHyperparameters
from finetune.job import train_head_adapter
from registry.fingerprint import file_sha256
from serving.runtime.heads import HeadError, read_spec
from serving.runtime.model_folder import ModelSpec
from serving.runtime.model_loading import load_sentence_transformer
from serving.runtime.pool import ClassifyWork, ModelPool
from serving.runtime.windows import TextWindows, WindowError, window_starts
from testbed.tiny_model import build_tiny_head
from tests.kinds_fixture import build_classification

LONG = (
    "der mieter will die kaution zurück und der vermieter sagt nein weil die wohnung einen "
    "mangel hat und die frist für die kündigung nicht eingehalten wurde was gilt nach dem bgb"
)
TEXTS = [LONG, "die miete ist zu hoch", LONG + " " + LONG, ""]


def test_window_starts_cover_the_text() -> None:
    assert window_starts(5, 10, 4, 8) == [0]  # fits: one window
    assert window_starts(10, 10, 4, 8) == [0]
    assert window_starts(11, 10, 4, 8) == [0, 4]  # 4 + 10 >= 11
    assert window_starts(30, 10, 10, 8) == [0, 10, 20]
    assert window_starts(31, 10, 10, 8) == [0, 10, 20, 30]
    assert window_starts(1000, 10, 10, 3) == [0, 10, 20]  # capped


def test_first_window_is_the_cut_text(tiny_model_path: Path) -> None:
    model = load_sentence_transformer(ModelSpec(tiny_model_path, max_seq_length=16))
    splitter = TextWindows(model.tokenizer, 16, 6, 50)
    pieces = model.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    assert len(pieces) > 40
    windows = splitter.split([LONG, "miete"])
    cut = model.tokenize([LONG])["input_ids"][0].tolist()
    assert windows[0][0][0] == cut and len(cut) == 16
    bodies = [ids[1:-1] for ids, _ in windows[0]]
    assert all(len(b) == 14 for b in bodies[:-1])
    assert bodies[-1] == pieces[len(pieces) - len(bodies[-1]) :]  # the last reaches the end
    assert [b[0] for b in bodies] == [pieces[i] for i in range(0, len(pieces) - 14 + 6, 6)][
        : len(bodies)
    ]
    assert windows[1] == [(model.tokenize(["miete"])["input_ids"][0].tolist(), [0] * 3)]
    with pytest.raises(WindowError, match="stride"):
        TextWindows(model.tokenizer, 16, 15, 4)


def _independent(base: Path, adapter: Path, texts: list[str], body: int, stride: int) -> np.ndarray:
    """sentence-transformers with the LoRA, windows cut by hand, the head's raw weights."""
    import torch
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    model.load_adapter(str(adapter))
    weights = load_file(str(adapter / "head.safetensors"))
    tok = model.tokenizer
    rows = []
    for text in texts:
        pieces = tok(text, add_special_tokens=False)["input_ids"]
        starts = [0]
        while starts[-1] + body < len(pieces):
            starts.append(starts[-1] + stride)
        logits = []
        for s in starts:
            ids = torch.tensor([[tok.cls_token_id, *pieces[s : s + body], tok.sep_token_id]])
            features = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            features["token_type_ids"] = torch.zeros_like(ids)
            with torch.inference_mode():
                vector = model(features)["sentence_embedding"][0].numpy()
            logits.append(weights["weight"] @ vector + weights["bias"])
        mean = np.mean(logits, axis=0)
        rows.append(np.exp(mean - mean.max()) / np.exp(mean - mean.max()).sum())
    return np.asarray(rows)


def test_windowed_head_is_evaluated_and_served_as_computed_by_hand(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    windowed = build_tiny_head(
        tiny_model_path, tmp_path / "w", seed=5, max_seq_length=12, window_stride=7, max_windows=50
    )
    manifest = json.loads((windowed / "head.json").read_text())
    assert (manifest["window_stride"], manifest["max_windows"]) == (7, 50)
    classifier = ModelClassifier(ModelSpec(tiny_model_path, windowed)).classifier()
    evaluated = classifier.predict_proba(TEXTS)
    expected = _independent(tiny_model_path, windowed, TEXTS, body=10, stride=7)
    np.testing.assert_allclose(evaluated, expected, atol=1e-5)

    pool = ModelPool(device="cpu", max_batch_tokens=64, max_batch_size=3)  # windows in many passes
    pool.load("w", ModelSpec(tiny_model_path, windowed))
    labels, served = pool.classify([ClassifyWork("w", TEXTS)])[0]
    assert labels == list(classifier.labels)
    np.testing.assert_allclose(served, evaluated, atol=1e-5)

    # The same head cutting texts instead: equal on a text that fits one window only.
    cut = build_tiny_head(tiny_model_path, tmp_path / "c", seed=5, max_seq_length=12)
    plain = ModelClassifier(ModelSpec(tiny_model_path, cut)).classifier().predict_proba(TEXTS)
    np.testing.assert_allclose(plain[1], evaluated[1], atol=1e-6)
    assert np.abs(plain[0] - evaluated[0]).max() > 1e-4  # the long text reads differently


def test_window_rule_in_head_json_is_checked(tiny_model_path: Path, tmp_path: Path) -> None:
    folder = build_tiny_head(tiny_model_path, tmp_path / "h", lora=False, max_seq_length=12)
    manifest = json.loads((folder / "head.json").read_text())
    assert "window_stride" not in manifest and read_spec(folder).window_stride is None
    for bad in (
        {"window_stride": 0, "max_windows": 4},
        {"window_stride": 4, "max_windows": 0},
        {"window_stride": 4, "max_seq_length": None},
        {"window_stride": 4, "kind": "score"},
    ):
        (folder / "head.json").write_text(json.dumps({**manifest, **bad}))
        with pytest.raises(HeadError, match="window_stride"):
            read_spec(folder)
    with pytest.raises(InvalidHyperparameters, match="window stride"):
        LoraHyperparameters(max_seq_length=32, window_stride=33)


def test_training_on_windows_is_repeatable_and_writes_the_rule(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    folder = build_classification(tmp_path / "area", splits={"test": 6, "train": 12})
    data = load_labelled(SuiteSpec("area", "classification", folder, "test", "train"))
    hp = LoraHyperparameters(
        rank=4, alpha=8, dropout=0.0, batch_size=4, max_seq_length=8, epochs=2,
        learning_rate=5e-3, window_stride=3, max_windows=8,
    )  # fmt: skip
    first = train_head_adapter("classify", tiny_model_path, data, hp, tmp_path / "a")
    second = train_head_adapter("classify", tiny_model_path, data, hp, tmp_path / "b")
    assert first.result.steps == 6
    assert first.result.losses == second.result.losses
    cut = train_head_adapter(
        "classify", tiny_model_path, data, replace(hp, window_stride=None), tmp_path / "c"
    )
    assert cut.result.losses != first.result.losses  # other windows than the first were read
    assert file_sha256(first.path / "head.safetensors") == file_sha256(
        second.path / "head.safetensors"
    )
    spec = read_spec(first.path)
    assert (spec.max_seq_length, spec.window_stride, spec.max_windows) == (8, 3, 8)
