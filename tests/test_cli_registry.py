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


# Rich markup, an emoji code and a link, as users and workers may write them into the registry.
MARKUP = "[/x] [bold]b :smile: [link=http://e.example]l"


def test_cli_prints_user_strings_as_text(tmp_path: Path) -> None:
    """Every table and line the CLI prints shows stored strings as they are: `suite show` once
    crashed on a description `[/x]` (rich read it as a closing tag)."""
    from datetime import UTC, datetime

    from typer.testing import CliRunner

    from registry import Registry
    from registry.entities import WorkerReport
    from taskfleet.cli import app
    from taskfleet.context import state
    from testbed.declared_tasks import declare_suite
    from tests.evalrun_fixture import record_run
    from tests.test_registry import make_model_dir, training

    home = tmp_path / "home"
    folder = make_model_dir(tmp_path / MARKUP.replace("/", "_"), b"M")
    reg = Registry.open(
        f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor=MARKUP
    )
    try:
        declare_suite(reg, "s", description=MARKUP, location=f"/data/{MARKUP}")
        reg.add_task("t", suite="s", description=MARKUP, owner=MARKUP)
        reg.add_model("m", path=folder, query_prefix=MARKUP)
        reg.register_adapter(
            "a", base="m", source_dir=make_adapter_dir(tmp_path / "ad", b"a"), training=training()
        )
        reg.add_candidate("t", base="m")
        record_run(reg, "t", "m", 0.4)
        reg.promote("t", "m", reason=MARKUP)
        now = datetime.now(UTC)
        reg.record_worker_report(WorkerReport(MARKUP, MARKUP, now, [MARKUP], 1, 2, {}, [], {}))
    finally:
        reg.close()

    commands = [
        ["suite", "show", "s"],
        ["task", "show", "t"],
        ["task", "ls"],
        ["model", "show", "m"],
        ["model", "ls"],
        ["promotions", "t"],
        ["placement", "ls"],
    ]
    state.reset()  # nothing an earlier test opened in this process
    for command in commands:
        result = CliRunner().invoke(app, ["--home", str(home), *command], env={"COLUMNS": "300"})
        state.reset()
        assert result.exception is None, (command, repr(result.exception))
        assert result.exit_code == 0, (command, result.output)
        shown = " ".join(result.output.split())  # tables may wrap a long cell
        assert ":smile:" in shown and "[link=" in shown and "[bold]" in shown, (command, shown)
        if command != ["model", "ls"]:  # the folder's name has "_" for "/"; the rest has it
            assert "[/x]" in shown, (command, shown)
