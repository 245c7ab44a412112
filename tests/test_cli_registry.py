"""The `taskfleet` CLI as a user runs it: a real subprocess, a real SQLite/PostgreSQL registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_registry import make_adapter_dir


def run_cli(home: Path, db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TASKFLEET_HOME": str(home),
        "TASKFLEET_DATABASE_URL": db_url,
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_model_add_fingerprint_duplicate_and_lineage(
    db_url: str, tmp_path: Path, minilm_path: Path
) -> None:
    home = tmp_path / "home"
    r = run_cli(home, db_url, "model", "add", "minilm", "--path", str(minilm_path))
    assert r.returncode == 0, r.stderr
    sha_line = next(line for line in r.stdout.splitlines() if line.startswith("sha256 "))
    sha = sha_line.split()[1]
    assert len(sha) == 64

    r = run_cli(home, db_url, "model", "add", "minilm", "--path", str(minilm_path))
    assert r.returncode == 1
    assert r.stderr.strip() == "error: model 'minilm' already exists"
    assert "Traceback" not in r.stderr

    r = run_cli(home, db_url, "model", "add", "x", "--path", str(tmp_path / "missing"))
    assert r.returncode == 1 and "does not exist" in r.stderr and len(r.stderr.splitlines()) == 1

    hp = json.dumps({"r": 8})
    for name, parent in (("root", None), ("child", "root"), ("grandchild", "child")):
        args = ["adapter", "register", name, "--base", "minilm", "--split", "dev", "--seed", "3"]
        args += ["--path", str(make_adapter_dir(tmp_path / name, name.encode()))]
        args += ["--hyperparameters", hp] + (["--parent", parent] if parent else [])
        r = run_cli(home, db_url, *args)
        assert r.returncode == 0, r.stderr

    r = run_cli(home, db_url, "adapter", "lineage", "child")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    order = [
        next(i for i, line in enumerate(lines) if word in line)
        for word in ("minilm (base", "root", "child", "grandchild")
    ]
    assert order == sorted(order), r.stdout
    assert sha[:12] in r.stdout

    r = run_cli(
        home,
        db_url,
        "adapter",
        "register",
        "bad",
        "--base",
        "minilm",
        "--path",
        str(make_adapter_dir(tmp_path / "bad", b"b")),
        "--parent",
        "nope",
    )
    assert r.returncode == 1 and r.stderr.strip() == "error: unknown adapter 'nope'"

    r = run_cli(home, db_url, "db", "current")
    assert r.returncode == 0 and "up to date" in r.stdout


def test_malformed_database_url_is_one_line(tmp_path: Path) -> None:
    r = run_cli(tmp_path, "postgresql://user@:notaport/db", "task", "ls")
    assert r.returncode == 1
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
