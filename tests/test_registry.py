"""Registry service on SQLite and PostgreSQL: records, invariants, refusals that change nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, func, select

from registry import AlreadyExists, ArtifactError, InvalidInput, LineageError, NotFound, Registry
from registry.entities import EvalRunCreate, TrainingRecord, WorkerReport
from registry.models import AdapterRow, AuditRow, BaseModelRow, CandidateRow
from testbed.declared_tasks import add_task, fake_fingerprint


def make_model_dir(root: Path, payload: bytes = b"weights") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (root / "model.safetensors").write_bytes(payload)
    return root


def make_adapter_dir(root: Path, payload: bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adapter_config.json").write_text(json.dumps({"r": 4, "peft_type": "LORA"}))
    (root / "adapter_model.safetensors").write_bytes(payload)
    return root


def training(split: str = "dev") -> TrainingRecord:
    return TrainingRecord("f" * 64, split, {"r": 4}, 7, "test", suite="s")


def one_query_eval(task: str) -> EvalRunCreate:
    """base-a's eval run on legal-suite: nDCG@10 0.5 on one query."""
    return EvalRunCreate(
        task,
        "base-a",
        "legal-suite",
        "1",
        fake_fingerprint("legal-suite"),
        "eval",
        "ndcg_at_10",
        {"ndcg_at_10": 0.5},
        {},
        {},
        {"q1": 0.5},
    )


def counts(reg: Registry) -> dict[str, int]:
    with reg.tx.read() as s:
        return {
            t.__tablename__: s.scalar(select(func.count()).select_from(t)) or 0
            for t in (AdapterRow, AuditRow, BaseModelRow, CandidateRow)
        }


@pytest.fixture
def seeded(registry: Registry, tmp_path: Path) -> Registry:
    add_task(registry, "legal", suite="legal-suite")
    registry.add_model("base-a", path=make_model_dir(tmp_path / "a", b"A"))
    registry.add_model("base-b", path=make_model_dir(tmp_path / "b", b"B"))
    return registry


def test_model_fingerprint_is_sha256_of_files(seeded: Registry, tmp_path: Path) -> None:
    a = seeded.get_model("base-a")
    assert len(a.sha256) == 64
    assert a.sha256 != seeded.get_model("base-b").sha256
    # Same content elsewhere fingerprints the same.
    again = seeded.add_model("base-a2", path=make_model_dir(tmp_path / "a2", b"A"))
    assert again.sha256 == a.sha256
    assert seeded.model_path("base-a") == (tmp_path / "a").resolve()


def test_refusals_leave_database_unchanged(seeded: Registry, tmp_path: Path) -> None:
    before = counts(seeded)
    with pytest.raises(AlreadyExists, match="task 'legal' already exists"):
        seeded.add_task("legal", suite="legal-suite")
    with pytest.raises(AlreadyExists, match="model 'base-a' already exists"):
        seeded.add_model("base-a", path=tmp_path / "a")
    with pytest.raises(InvalidInput, match="does not exist"):
        seeded.add_model("ghost", path=tmp_path / "missing")
    with pytest.raises(InvalidInput, match="invalid task name"):
        seeded.add_task("Bad Name!", suite="legal-suite")
    with pytest.raises(NotFound, match="unknown model 'nope'"):
        seeded.register_adapter(
            "x", base="nope", source_dir=make_adapter_dir(tmp_path / "x", b"x"), training=training()
        )
    with pytest.raises(NotFound, match="unknown task"):
        seeded.add_candidate("nope", base="base-a")
    assert counts(seeded) == before


def test_adapter_lineage_chain_and_base_mismatch(seeded: Registry, tmp_path: Path) -> None:
    root = seeded.register_adapter(
        "root",
        base="base-a",
        source_dir=make_adapter_dir(tmp_path / "r", b"r"),
        training=training(),
    )
    child = seeded.register_adapter(
        "child",
        base="base-a",
        parent="root",
        source_dir=make_adapter_dir(tmp_path / "c", b"c"),
        training=training(),
    )
    grandchild = seeded.register_adapter(
        "grandchild",
        base="base-a",
        parent="child",
        source_dir=make_adapter_dir(tmp_path / "g", b"g"),
        training=training(),
    )
    assert [a.name for a in seeded.lineage("grandchild")] == ["root", "child", "grandchild"]
    assert grandchild.parent == "child" and child.parent == "root" and root.parent is None
    assert [a.name for a in seeded.children("root")] == ["child"]
    before = counts(seeded)
    with pytest.raises(LineageError, match="parent 'root' is on base 'base-a'"):
        seeded.register_adapter(
            "wrong-base",
            base="base-b",
            parent="root",
            source_dir=make_adapter_dir(tmp_path / "w", b"w"),
            training=training(),
        )
    with pytest.raises(LineageError, match="cycle"):
        seeded.register_adapter(
            "self",
            base="base-a",
            parent="self",
            source_dir=make_adapter_dir(tmp_path / "s", b"s"),
            training=training(),
        )
    assert counts(seeded) == before


def test_artifact_store_round_trip_and_corruption(seeded: Registry, tmp_path: Path) -> None:
    src = make_adapter_dir(tmp_path / "src", b"\x00\x01payload")
    a = seeded.register_adapter("ad", base="base-a", source_dir=src, training=training())
    stored = seeded.adapter_path("ad")
    assert stored.name == a.sha256
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (stored / name).read_bytes() == (src / name).read_bytes()
    (stored / "adapter_model.safetensors").write_bytes(b"tampered")
    with pytest.raises(ArtifactError, match="corrupted"):
        seeded.adapter_path("ad")
    for f in stored.iterdir():
        f.unlink()
    stored.rmdir()
    with pytest.raises(ArtifactError, match="missing"):
        seeded.adapter_path("ad")


def test_candidates_unique_per_pairing(seeded: Registry, tmp_path: Path) -> None:
    seeded.register_adapter(
        "ad", base="base-a", source_dir=make_adapter_dir(tmp_path / "ad", b"1"), training=training()
    )
    assert seeded.add_candidate("legal", base="base-a").name == "base-a"
    assert seeded.add_candidate("legal", adapter="ad").name == "base-a+ad"
    assert seeded.add_candidate("legal", kind="bm25").name == "bm25"
    with pytest.raises(AlreadyExists, match="already has candidate 'base-a'"):
        seeded.add_candidate("legal", name="other", base="base-a")
    with pytest.raises(AlreadyExists):
        seeded.add_candidate("legal", kind="bm25", name="bm25-again")
    with pytest.raises(LineageError, match="trained on 'base-a'"):
        seeded.add_candidate("legal", base="base-b", adapter="ad")
    assert [c.name for c in seeded.list_candidates("legal")] == ["base-a", "base-a+ad", "bm25"]


def test_eval_runs_and_placements(seeded: Registry) -> None:
    seeded.add_candidate("legal", base="base-a")
    run = seeded.record_eval_run(
        EvalRunCreate(
            task="legal",
            candidate="base-a",
            suite_name="legal-suite",
            suite_version="1",
            suite_fingerprint=fake_fingerprint("legal-suite"),
            split="eval",
            main_metric="ndcg_at_10",
            metrics={"ndcg_at_10": 0.5},
            ci={"ndcg_at_10": (0.4, 0.6)},
            cost={"items_per_second": 10.0},
            per_query={"q1": 0.5, "q2": 0.5},
        )
    )
    assert seeded.latest_eval_run("legal", "base-a") == run
    assert run.ci["ndcg_at_10"] == (0.4, 0.6)
    seeded.promote("legal", "base-a", pinned=True)  # a first champion: its eval run suffices
    p1 = seeded.current_placement("legal")
    p2 = seeded.update_placement("legal", replicas=2)
    assert p1 is not None and (p1.epoch, p2.epoch) == (1, 2)
    assert [p.epoch for p in seeded.unpublished_placements()] == [2]
    seeded.mark_published("legal", 2)
    assert seeded.unpublished_placements() == []
    with pytest.raises(InvalidInput, match="main metric"):
        seeded.record_eval_run(
            EvalRunCreate(
                "legal", "base-a", "s", "1", "d", "eval", "mrr", {"ndcg": 1.0}, {}, {}, {"q": 1.0}
            )
        )


def test_the_placement_outbox_is_one_query_whatever_the_number_of_tasks(
    seeded: Registry,
) -> None:
    """The publisher reads the outbox every poll interval: it must cost one query, not one
    (or two) per placed task, and hold only each task's newest placement not yet published."""
    tasks = [f"legal-{i}" for i in range(6)]
    for task in tasks:
        add_task(seeded, task, suite="legal-suite")
        seeded.add_candidate(task, base="base-a")
        seeded.record_eval_run(one_query_eval(task))
        seeded.promote(task, "base-a", pinned=True)
        if task != "legal-2":
            seeded.mark_published(task, 1)
    seeded.update_placement("legal-4", replicas=2)  # epoch 2 over a published epoch 1
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    event.listen(seeded.tx.engine, "before_cursor_execute", count)
    try:
        outbox = seeded.unpublished_placements()
    finally:
        event.remove(seeded.tx.engine, "before_cursor_execute", count)
    assert [(p.task, p.epoch, p.candidate) for p in outbox] == [
        ("legal-2", 1, "base-a"),
        ("legal-4", 2, "base-a"),
    ]
    assert len(statements) == 1, statements
    placed = seeded.list_placements()
    assert [(p.task, p.epoch) for p in placed] == [(t, 2 if t == "legal-4" else 1) for t in tasks]
    assert [p.published_at is None for p in placed] == [t in ("legal-2", "legal-4") for t in tasks]


def test_a_committed_write_rings_the_commit_signal_and_the_fleet_mirror_does_not(
    seeded: Registry,
) -> None:
    """The publisher in the same process wakes on the signal: every actor's committed write
    rings it once; a refused write, the fleet watcher's worker reports and the publisher's own
    published marks do not (they would wake it every flush for nothing)."""
    rings: list[str] = []
    unsubscribe = seeded.subscribe_commits(lambda: rings.append("ring"))
    seeded.add_candidate("legal", base="base-a")
    assert rings == ["ring"]
    with pytest.raises(AlreadyExists):
        seeded.add_candidate("legal", base="base-a")
    assert rings == ["ring"]
    seeded.as_actor("lead", ("admin",)).add_candidate("legal", base="base-b")
    assert rings == ["ring", "ring"]
    seeded.record_eval_run(one_query_eval("legal"))
    seeded.promote("legal", "base-a", pinned=True)
    rung = len(rings)
    seeded.mark_published("legal", 1)
    now = datetime.now(UTC)
    seeded.record_worker_report(
        WorkerReport("w1", "h1", now, [], 0, 20, {}, ["torch"], {"legal": 1}, {}), seen_at=now
    )
    seeded.mark_workers_unreachable(worker_ids=["w1"])
    seeded.forget_workers(now + timedelta(seconds=1))
    assert len(rings) == rung
    unsubscribe()
    seeded.update_placement("legal", replicas=2)
    assert len(rings) == rung


def test_audit_log_records_every_write(seeded: Registry) -> None:
    actions = [a.action for a in seeded.audit_log()]
    assert actions == ["model.add", "model.add", "task.add", "suite.add"]
    assert {a.actor for a in seeded.audit_log()} == {"test"}


def test_api_keys_hashed_and_scoped(registry: Registry) -> None:
    _key, token = registry.create_api_key("lead", roles=["promoter"], tasks=["legal"])
    assert registry.authenticate(token).name == "lead"
    with registry.tx.read() as s:
        from registry.models import ApiKeyRow

        stored = s.scalar(select(ApiKeyRow.secret_hash))
    assert stored is not None and token not in stored
    registry.revoke_api_key("lead")
    from registry import Unauthenticated

    with pytest.raises(Unauthenticated, match="revoked"):
        registry.authenticate(token)
    with pytest.raises(InvalidInput, match="roles"):
        registry.create_api_key("x", roles=["god"])


def test_model_info_read_from_sentence_transformers_folders(
    registry: Registry, tiny_model_path: Path, minilm_path: Path
) -> None:
    tiny = registry.add_model("tiny", path=tiny_model_path)  # written by sentence-transformers 6
    assert (tiny.dims, tiny.max_seq_length) == (32, 64)
    minilm = registry.add_model("minilm", path=minilm_path)  # an older sentence-transformers folder
    assert (minilm.dims, minilm.max_seq_length) == (384, 256)
