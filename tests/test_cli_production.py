"""`taskfleet shadow` and `taskfleet production` as a user runs them: a real subprocess, a real
SQLite registry; refusals are one line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from registry import Registry
from testbed.declared_tasks import declare_suite, fake_fingerprint
from tests.evalrun_fixture import record_run
from tests.test_cli_registry import run_cli
from tests.test_registry import make_model_dir


def _seed(home: Path, tmp: Path) -> str:
    db = f"sqlite:///{home / 'registry.db'}"
    reg = Registry.open(db, artifact_dir=home / "artifacts")
    declare_suite(reg, "s")
    reg.add_task("t", suite="s")
    for name in ("a", "b"):
        reg.add_model(name, path=make_model_dir(tmp / name, name.encode()))
        reg.add_candidate("t", base=name)
        record_run(reg, "t", name, 0.3)
    reg.promote("t", "a", reason="first")
    reg.close()
    return db


def test_shadow_and_production_commands(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    db = _seed(home, tmp_path)

    r = run_cli(home, db, "shadow", "start", "t", "b", "--sample", "0.2", "--reason", "try")
    assert r.returncode == 0, r.stderr
    assert "shadow b started for t on the torch runtime, sampling 0.2" in r.stdout
    r = run_cli(home, db, "shadow", "start", "t", "a", "--sample", "0.2")
    assert (r.returncode, r.stderr.strip()) == (
        1,
        "error: 'a' is the champion of 't', not a challenger",
    )
    r = run_cli(home, db, "shadow", "start", "t", "b", "--sample", "2")
    assert r.returncode == 2 and "Traceback" not in r.stderr  # Typer's own range check

    r = run_cli(home, db, "production", "set", "t", "--evidence", "both", "--live-every", "50")
    assert r.returncode == 0, r.stderr
    assert "t: sample 0.2, retention 7 days, evidence both" in r.stdout
    assert "a live version every 50 labelled items" in r.stdout
    r = run_cli(home, db, "production", "set", "t", "--evidence", "vibes")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "evidence must be one of offline, live, both" in r.stderr
    r = run_cli(home, db, "production", "set", "t")
    assert r.returncode == 2 and "name at least one setting" in r.stderr

    r = run_cli(home, db, "production", "show", "t", "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["shadow"]["candidate"] == "b" and shown["settings"]["evidence"] == "both"
    assert shown["live"] == {"items": 0, "waiting": 0} and shown["stale"] == []

    # A new suite version: the champion's and the shadow's evidence is stale.
    reg = Registry.open(db, artifact_dir=home / "artifacts")
    declare_suite(reg, "s", fingerprint=fake_fingerprint("s", 2))
    reg.close()
    r = run_cli(home, db, "production", "show", "t")
    assert r.returncode == 0, r.stderr
    assert "stale: champion a (torch): its newest run is on s v1, not v2" in r.stdout
    assert "stale: shadow b (torch)" in r.stdout
    r = run_cli(home, db, "promote", "t", "b")
    assert r.returncode == 1 and "has no live split yet" in r.stderr  # evidence: both
    run_cli(home, db, "production", "set", "t", "--evidence", "offline")
    r = run_cli(home, db, "promote", "t", "b")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "its evidence is stale" in r.stderr and "`taskfleet eval run t -c b`" in r.stderr

    r = run_cli(home, db, "production", "cut", "t")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "error: task 't' has no labelled live items yet (feedback on sampled requests makes "
        "them: POST /v1/feedback)"
    )

    r = run_cli(home, db, "shadow", "stop", "t", "--reason", "done")
    assert r.returncode == 0 and "shadow b of t stopped" in r.stdout
    r = run_cli(home, db, "shadow", "ls", "--json")
    rows = json.loads(r.stdout)
    assert [(x["action"], x["candidate"], x["reason"]) for x in rows] == [
        ("stop", "b", "done"),
        ("start", "b", "try"),
    ]
    r = run_cli(home, db, "shadow", "stop", "t")
    assert (r.returncode, r.stderr.strip()) == (1, "error: task 't' has no shadow to stop")
