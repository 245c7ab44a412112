"""`finetune_lora` against a real registry (SQLite) and a real MLflow store: lineage, artifact
round trip, evaluation right after training, and nothing registered when a run is interrupted.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from evals.suites import beir_suite, declare
from finetune.config import LoraHyperparameters
from finetune.errors import AdapterConfigError, TrainingDataError, TrainingInterrupted
from finetune.pipeline import FinetuneRequest, finetune_lora
from finetune.trainer import StepReport
from registry import AlreadyExists, LineageError, Registry
from registry.fingerprint import file_sha256, tree_sha256
from serving.runtime.encoder import Encoder
from serving.runtime.model_folder import ModelSpec
from testbed.tiny_model import build_tiny_model
from tests.beir_fixture import build_beir

TASK = "tiny-legal-retrieval"
SUITE = "tiny-legal"
HP = LoraHyperparameters(
    rank=4, alpha=8, dropout=0.0, batch_size=8, max_seq_length=32, learning_rate=5e-3, epochs=1
)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # german-legal-retrieval's split names (dev trains, eval tests) over a tiny generated corpus.
    return build_beir(tmp_path_factory.mktemp("beir"), queries={"eval": 12, "dev": 32})


@pytest.fixture
def reg(tmp_path: Path, tiny_model_path: Path, suite_dir: Path) -> Iterator[Registry]:
    registry = Registry.open(
        f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "artifacts", actor="test"
    )
    registry.add_suite(
        declare(SUITE, "retrieval", suite_dir, test_split="eval", train_split="dev")[0]
    )
    registry.add_task(TASK, suite=SUITE)
    registry.add_model("tiny", path=tiny_model_path)
    try:
        yield registry
    finally:
        registry.close()


def request(suite_dir: Path, **changes: object) -> FinetuneRequest:
    fields: dict[str, object] = {
        "task": TASK,
        "base": "tiny",
        "hyperparameters": HP,
        "evaluate": False,
    }
    fields.update(changes)
    return FinetuneRequest(**fields)  # type: ignore[arg-type]


def test_trains_registers_logs_and_evaluates(
    reg: Registry, suite_dir: Path, tmp_path: Path
) -> None:
    mlflow_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    outcome = finetune_lora(
        reg,
        request(suite_dir, name="first", evaluate=True),
        tracking_uri=mlflow_uri,
        cache_dir=tmp_path / "cache",
    )
    adapter = reg.get_adapter("first")
    assert adapter == outcome.adapter and adapter.parent is None
    record = adapter.training
    assert record.train_split == "dev" and record.suite == SUITE
    assert record.data_fingerprint == outcome.data.fingerprint
    assert record.hyperparameters == HP.as_dict() and record.seed == HP.seed
    assert record.code_version != "unknown"
    assert record.mlflow_run_id == outcome.mlflow_run_id is not None

    # Stored content-addressed: the folder hashes to the recorded sha256.
    assert tree_sha256(reg.adapter_path("first")).sha256 == adapter.sha256

    # Evaluated on the suite's test split and recorded as an eval run of the new candidate.
    runs = reg.list_eval_runs(TASK, outcome.candidate.name)
    assert [r.id for r in runs] == [outcome.eval_run.id if outcome.eval_run else -1]
    assert runs[0].split == "eval" and runs[0].adapter_fingerprint == adapter.sha256

    import mlflow

    run = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rank"] == "4" and run.data.params["train_split"] == "dev"
    history = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_metric_history(
        run.info.run_id, "loss"
    )
    assert [m.value for m in history] == pytest.approx(outcome.training.losses)


def test_child_of_a_child_has_full_lineage(reg: Registry, suite_dir: Path) -> None:
    finetune_lora(reg, request(suite_dir, name="gen1"))
    # A child continues its parent's matrices: a different --rank has no effect and is not
    # what the record says.
    wider = HP.with_overrides(rank=8, alpha=16)
    finetune_lora(reg, request(suite_dir, name="gen2", parent="gen1", hyperparameters=wider))
    finetune_lora(reg, request(suite_dir, name="gen3", parent="gen2", split="dev"))
    chain = reg.lineage("gen3")
    assert [a.name for a in chain] == ["gen1", "gen2", "gen3"]
    assert [a.parent for a in chain] == [None, "gen1", "gen2"]
    # Each generation continued training: three different artifacts.
    assert len({a.sha256 for a in chain}) == 3
    assert [a.training.hyperparameters["rank"] for a in chain] == [4, 4, 4]


def test_artifact_round_trip_and_served_embeddings(
    reg: Registry, suite_dir: Path, tmp_path: Path
) -> None:
    """What training wrote is what the store returns, bit for bit, and what serving computes."""
    from evals.provenance import code_version
    from finetune.data import load_training_pairs
    from finetune.job import train_adapter
    from finetune.modeling import embed_no_grad
    from registry.entities import TrainingRecord

    data = load_training_pairs(beir_suite(SUITE, suite_dir, test_split="eval", train_split="dev"))
    trained = train_adapter(reg.model_path("tiny"), data, HP, tmp_path / "adapter")
    texts = list(data.queries.values())[:4] + list(data.corpus.values())[:4]
    at_training = embed_no_grad(trained.model, texts)
    record = TrainingRecord(data.fingerprint, data.split, HP.as_dict(), HP.seed, code_version())
    reg.register_adapter("rt", base="tiny", source_dir=trained.path, training=record)

    stored = reg.adapter_path("rt")
    written = sorted(p.name for p in trained.path.iterdir())
    assert sorted(p.name for p in stored.iterdir()) == written
    for name in written:
        assert (stored / name).read_bytes() == (trained.path / name).read_bytes()
        assert file_sha256(stored / name) == file_sha256(trained.path / name)

    spec = ModelSpec(reg.model_path("tiny"), adapter_path=stored, max_seq_length=HP.max_seq_length)
    served, _ = Encoder(spec).encode(texts)
    np.testing.assert_allclose(served, at_training, atol=1e-5)


def test_interrupt_registers_nothing_and_leaves_no_files(
    reg: Registry, suite_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def ctrl_c(step: StepReport) -> None:
        if step.step == 2:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match="nothing was registered"):
        finetune_lora(reg, request(suite_dir, name="stopped"), on_step=ctrl_c)
    assert reg.list_adapters() == []
    assert reg.list_candidates(TASK) == []
    assert list(scratch.iterdir()) == []


def test_bad_requests_fail_before_training(reg: Registry, suite_dir: Path, tmp_path: Path) -> None:
    started: list[int] = []

    def count(step: StepReport) -> None:
        started.append(step.step)

    with pytest.raises(TrainingDataError, match="test split"):
        finetune_lora(reg, request(suite_dir, split="eval"), on_step=count)
    with pytest.raises(AdapterConfigError, match="q_proj"):
        bad = HP.with_overrides(target_modules=("q_proj",))
        finetune_lora(reg, request(suite_dir, hyperparameters=bad), on_step=count)
    assert started == []

    other = build_tiny_model(tmp_path / "other", seed=3)
    reg.add_model("other", path=other)
    finetune_lora(reg, request(suite_dir, name="on-tiny"))
    with pytest.raises(LineageError, match="not on 'other'"):
        finetune_lora(reg, request(suite_dir, base="other", parent="on-tiny"), on_step=count)
    with pytest.raises(AlreadyExists, match="on-tiny"):
        finetune_lora(reg, request(suite_dir, name="on-tiny"), on_step=count)
    assert [a.name for a in reg.list_adapters()] == ["on-tiny"]
