"""Two processes registering at once: no corruption, no duplicate rows, one clear loser."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

from sqlalchemy import func, select

from registry import AlreadyExists, Registry
from registry.models import AuditRow, BaseModelRow


def _register(url: str, artifacts: str, model_dir: str, name: str, results: mp.Queue) -> None:
    reg = Registry.open(url, artifact_dir=Path(artifacts), actor="proc")
    outcomes = []
    for i in range(8):
        try:
            reg.add_model(f"{name}-{i}", path=Path(model_dir))
            outcomes.append("ok")
        except AlreadyExists:
            outcomes.append("exists")
    reg.close()
    results.put(outcomes)


def test_concurrent_writers(db_url: str, tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"x": 1}))
    Registry.open(db_url, artifact_dir=tmp_path / "a").close()  # migrate once up front
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_register, args=(db_url, str(tmp_path / "a"), str(model_dir), "m", results)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    flat = [o for run in outcomes for o in run]
    assert flat.count("ok") == 8 and flat.count("exists") == 8
    reg = Registry.open(db_url, artifact_dir=tmp_path / "a")
    with reg.tx.read() as s:
        assert s.scalar(select(func.count()).select_from(BaseModelRow)) == 8
        assert s.scalar(select(func.count()).select_from(AuditRow)) == 8
    reg.close()
