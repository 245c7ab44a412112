"""Optimised variants (ONNX fp32, ONNX int8) as candidates: derived and fingerprinted with
lineage to their source, evaluated by the real harness, promoted only by the rule, refused in one
line where a variant cannot be built or cannot serve."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from evals.runner import EvalPaths, run_eval
from evals.suites import declare
from registry import InvalidInput, Registry
from registry.fingerprint import tree_sha256
from registry.runtimes import MODEL_VARIANTS
from taskfleet.variant_builder import build_variant
from testbed.declared_tasks import add_task
from testbed.tiny_model import build_tiny_head
from tests.evalrun_fixture import record_run
from tests.test_cli_registry import run_cli

REPO = Path(__file__).resolve().parent.parent
TASK = "legal"
SUITE = "legal-suite"
TEXTS = [
    "Der Mieter muss die Kündigung schriftlich erklären.",
    "Wer haftet für den Schaden am Haus?",
    "the tenant gives notice " * 20,  # cut at the model's max_seq_length
    "kauf",
]


def _st_vectors(model_path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)


@pytest.fixture(scope="module")
def beir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.beir_fixture import build_beir

    return build_beir(tmp_path_factory.mktemp("beir") / "beir", queries={"eval": 24, "dev": 12})


@pytest.fixture(scope="module")
def reg(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path, beir: Path
) -> Iterator[Registry]:
    home = tmp_path_factory.mktemp("variants")
    registry = Registry.open(
        f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor="test"
    )
    create, _ = declare(SUITE, "retrieval", beir, test_split="eval", train_split="dev")
    registry.add_suite(create)
    registry.add_task(TASK, suite=SUITE, margin=0.01)
    registry.add_model("tiny", path=tiny_model_path)
    registry.add_candidate(TASK, name="tiny-base", base="tiny")
    registry.add_variant_candidate(TASK, base="tiny", variant="onnx", build=build_variant)
    registry.add_variant_candidate(TASK, base="tiny", variant="onnx-int8", build=build_variant)
    try:
        yield registry
    finally:
        registry.close()


def test_a_variant_is_a_fingerprinted_model_with_lineage(
    reg: Registry, tiny_model_path: Path
) -> None:
    from serving.runtime.onnx_variant import OnnxModel, read_variant

    source = reg.get_model("tiny")
    for variant in ("onnx", "onnx-int8"):
        model = reg.get_model(f"tiny-{variant}")
        assert (model.source, model.variant, model.runtime_kinds) == ("tiny", variant, ["torch"])
        folder = reg.model_path(model.name)
        assert tree_sha256(folder).sha256 == model.sha256  # stored content-addressed
        assert reg.artifacts.verify(model.sha256) == folder
        manifest = read_variant(folder)
        assert manifest is not None and manifest["source_sha256"] == source.sha256
        assert (model.dims, model.max_seq_length) == (source.dims, source.max_seq_length)
        assert not any(folder.glob("*.safetensors"))  # the graph, not the torch weights
        candidate = reg.get_candidate(TASK, f"tiny-{variant}")
        assert (candidate.kind, candidate.base_model) == ("embedding", model.name)
    # fp32: the source's pipeline (transformer, mean pooling, normalisation) to 1e-5.
    expected = _st_vectors(tiny_model_path, TEXTS)
    got = OnnxModel(reg.model_path("tiny-onnx")).encode(TEXTS)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # The same variant on a second task is the same model, not a second export.
    add_task(reg, "legal-two", suite=SUITE)
    again = reg.add_variant_candidate("legal-two", base="tiny", variant="onnx", build=build_variant)
    assert again.base_model == "tiny-onnx"
    derived = [a for a in reg.audit_log() if a.action == "model.derive"]
    assert len(derived) == 2 and {a.detail["variant"] for a in derived} == {"onnx", "onnx-int8"}


def test_variants_are_evaluated_and_promoted_by_the_rule(
    reg: Registry, beir: Path, tmp_path: Path
) -> None:
    paths = EvalPaths(cache_dir=tmp_path / "cache")
    torch_run = run_eval(reg, TASK, "tiny-base", paths)
    onnx_run = run_eval(reg, TASK, "tiny-onnx", paths)
    int8_run = run_eval(reg, TASK, "tiny-onnx-int8", paths)
    metric = torch_run.main_metric
    assert onnx_run.metrics[metric] == pytest.approx(torch_run.metrics[metric], abs=1e-6)
    assert int8_run.metrics[metric] > 0
    reg.promote(TASK, "tiny-base", reason="first champion")
    # fp32 scores what torch scores: a build of the champion's model within the margin.
    check = reg.check_promotion(TASK, "tiny-onnx")
    assert check.passes, check.reason
    assert "builds of one model" in check.reason and "within the task's margin" in check.reason
    # int8 passes exactly when its score holds within the margin (0.01).
    check = reg.check_promotion(TASK, "tiny-onnx-int8")
    assert check.difference is not None
    assert check.passes == (check.difference >= -0.01), check.reason


def test_a_variant_worse_than_the_margin_is_not_promoted(reg: Registry) -> None:
    task = "legal-margin"
    add_task(reg, task, suite=SUITE, margin=0.01)
    reg.add_candidate(task, name="src", base="tiny")
    reg.add_variant_candidate(task, base="tiny", variant="onnx-int8", build=build_variant)
    record_run(reg, task, "src", 0.50, noise=0.01)
    reg.promote(task, "src", reason="first champion")
    record_run(reg, task, "tiny-onnx-int8", 0.48, noise=0.01)
    check = reg.check_promotion(task, "tiny-onnx-int8")
    assert not check.passes
    assert "worse than the task's margin -0.01" in check.reason
    with pytest.raises(InvalidInput, match="worse than the task's margin"):
        reg.promote(task, "tiny-onnx-int8")
    record_run(reg, task, "tiny-onnx-int8", 0.495, noise=0.01)
    promoted = reg.promote(task, "tiny-onnx-int8")
    assert promoted.candidate == "tiny-onnx-int8"


def test_what_a_variant_cannot_be_is_refused_in_one_line(
    reg: Registry, tiny_model_path: Path, tmp_path: Path
) -> None:
    # A sequence classifier (cross-encoder) base: only its config says so.
    classifier = tmp_path / "classifier"
    shutil.copytree(tiny_model_path, classifier)
    config = json.loads((classifier / "config.json").read_text())
    config["architectures"] = ["BertForSequenceClassification"]
    (classifier / "config.json").write_text(json.dumps(config))
    reg.add_model("clf", path=classifier)
    with pytest.raises(InvalidInput, match="sequence classifier"):
        reg.add_variant_candidate(TASK, base="clf", variant="onnx", build=build_variant)
    with pytest.raises(InvalidInput, match="already an onnx variant of 'tiny'"):
        reg.derive_model("tiny-onnx", "onnx-int8", build=build_variant)
    add_task(reg, "legal-rerank", suite="rerank-suite", kind="rerank")
    with pytest.raises(InvalidInput, match="embeds only and serves retrieval tasks"):
        reg.add_variant_candidate("legal-rerank", base="tiny", variant="onnx", build=build_variant)
    with pytest.raises(InvalidInput, match="only the Python runtime"):
        reg.set_model_runtimes("tiny-onnx", ["torch", "candle"])

    with pytest.raises(InvalidInput, match="an onnx variant needs the base model"):
        reg.add_candidate(TASK, variant="onnx")
    with pytest.raises(InvalidInput, match="cannot carry a LoRA adapter"):
        reg.add_candidate(TASK, base="tiny", adapter="some-lora", variant="onnx")
    # The CLI prints the registry's refusal as one line.
    r = run_cli(
        tmp_path / "home", f"sqlite:///{tmp_path / 'cli.db'}",
        "candidate", "add", TASK, "--base", "tiny", "--variant", "fp16",
    )  # fmt: skip
    assert r.returncode == 1, r.stdout
    assert r.stderr.strip() == "error: unknown variant 'fp16'; known: onnx, onnx-int8"


def test_the_runtime_embeds_with_a_variant_and_refuses_other_ops(
    reg: Registry, tiny_model_path: Path, tmp_path: Path
) -> None:
    from serving.runtime.model_folder import ModelLoadError, ModelSpec
    from serving.runtime.pool import (
        ClassifyWork,
        EncodeItem,
        ModelPool,
        ScoreWork,
        UnsupportedOpError,
    )

    pool = ModelPool(device="cpu", max_batch_tokens=None, max_batch_size=None)
    folder = reg.model_path("tiny-onnx")
    pool.load("v", ModelSpec(base_path=folder))
    (vectors,) = pool.encode([EncodeItem("v", "passage", TEXTS)])
    np.testing.assert_allclose(vectors, _st_vectors(tiny_model_path, TEXTS), atol=1e-5)
    with pytest.raises(UnsupportedOpError, match="onnx variant: it embeds only \\(no score\\)"):
        pool.score([ScoreWork("v", "frage", ["antwort"])])
    with pytest.raises(UnsupportedOpError, match="embeds only \\(no classify\\)"):
        pool.classify([ClassifyWork("v", ["text"])])
    head = build_tiny_head(tiny_model_path, tmp_path / "head", kind="score")
    with pytest.raises(ModelLoadError, match="ONNX variant: it embeds only"):
        pool.load("v-head", ModelSpec(base_path=folder, adapter_path=head))


def test_an_int8_vector_is_the_same_alone_and_in_any_batch(reg: Registry) -> None:
    """Dynamic quantisation scales activations per call: int8 runs each text alone, unpadded,
    so a text's vector does not depend on the texts batched with it (padding included)."""
    from serving.runtime.model_folder import ModelSpec
    from serving.runtime.onnx_variant import OnnxModel
    from serving.runtime.pool import EncodeItem, ModelPool

    model = OnnxModel(reg.model_path("tiny-onnx-int8"))
    others = ["kurz", TEXTS[0] * 3, "ein mittellanger Satz über das Mietrecht", *TEXTS[1:]]
    batch = model.encode([*others, TEXTS[0]])
    alone = model.encode([TEXTS[0]])[0]
    np.testing.assert_allclose(batch[-1], alone, atol=1e-6)
    np.testing.assert_allclose(model.encode(others), batch[:-1], atol=1e-6)
    pool = ModelPool(device="cpu", max_batch_tokens=None, max_batch_size=None)
    pool.load("v", ModelSpec(base_path=reg.model_path("tiny-onnx-int8")))
    (pooled,) = pool.encode([EncodeItem("v", "passage", [*others, TEXTS[0]])])
    np.testing.assert_allclose(pooled, batch, atol=1e-6)


def test_the_registry_builds_variants_through_the_shell() -> None:
    """The registry imports no serving code (docs/architecture.md): it derives a variant through
    the builder its caller passes, and the runtime's list of variants is the registry's."""
    from serving.runtime.onnx_variant import VARIANTS

    assert tuple(MODEL_VARIANTS) == VARIANTS
    code = (
        "import sys, registry, registry.api, registry.variants; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('serving', 'evals', 'finetune', 'taskfleet')); print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rest_adds_a_variant_candidate_through_the_shells_builder(reg: Registry) -> None:
    from fastapi.testclient import TestClient

    from registry.api import create_app

    add_task(reg, "legal-rest", suite=SUITE)
    body = {"base": "tiny", "variant": "onnx"}
    no_builder = TestClient(create_app(reg, require_auth=False))
    r = no_builder.post("/api/v1/tasks/legal-rest/candidates", json=body)
    assert r.status_code == 501 and r.json()["error"]["code"] == "NOT_IMPLEMENTED"
    client = TestClient(create_app(reg, require_auth=False, build_variant=build_variant))
    r = client.post("/api/v1/tasks/legal-rest/candidates", json={**body, "variant": "fp16"})
    assert r.status_code == 400 and "unknown variant 'fp16'" in r.json()["error"]["message"]
    # The onnx variant of `tiny` exists already (the module's fixture): reused, not exported.
    r = client.post("/api/v1/tasks/legal-rest/candidates", json=body)
    assert r.status_code == 201, r.text
    assert (r.json()["name"], r.json()["base_model"]) == ("tiny-onnx", "tiny-onnx")
