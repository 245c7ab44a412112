"""`taskfleet --help` and the registry's own commands load no heavy library.

A newcomer types the README's commands; each should answer in a fraction of a second, not wait
for torch, mteb or MLflow to import. The commands run as a user runs them (a subprocess on a real
SQLite registry); what they loaded is read from `sys.modules` when the process exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from registry import Registry
from testbed.declared_tasks import add_task

# Top-level packages no registry-only command needs: the model stack, the eval harness, the
# trainer's tracking, plotting, the serving stack, and Alembic once the schema is current.
HEAVY = frozenset(
    {
        "torch",
        "transformers",
        "sentence_transformers",
        "peft",
        "mteb",
        "datasets",
        "mlflow",
        "sklearn",
        "scipy",
        "pandas",
        "matplotlib",
        "onnx",
        "onnxruntime",
        "bm25s",
        "numpy",
        "nats",
        "aiohttp",
        "fastapi",
        "uvicorn",
        "boto3",
        "alembic",
        # Validation for the web APIs: typer 0.29's coercion and pydantic-settings loaded it on
        # every command, more import time than the rest of a listing took.
        "pydantic",
        "pydantic_settings",
        "evals",
        "finetune",
        "serving",
    }
)

# Runs the CLI's entry point and, on exit (SystemExit included), writes the loaded modules.
PROBE = (
    "import atexit, json, sys\n"
    "out = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(sorted(sys.modules))))\n"
    "sys.argv[0] = 'taskfleet'\n"
    "from taskfleet.cli import main\n"
    "main()\n"
)

REGISTRY_ONLY = [
    ["--help"],
    ["task", "ls"],
    ["candidate", "ls", "tickets"],
    ["suite", "ls"],
    ["placements"],
    ["key", "create", "lead", "--role", "promoter"],
]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry at the newest schema with a task and a candidate to list."""
    home = tmp_path_factory.mktemp("home")
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    add_task(reg, "tickets", kind="classification")
    reg.add_candidate("tickets", kind="majority")
    reg.close()
    return home


def _loaded(
    home: Path, args: list[str], out: Path
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**os.environ, "TASKFLEET_HOME": str(home), "COLUMNS": "200"}
    env.pop("TASKFLEET_DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = set(json.loads(out.read_text())) if out.exists() else set()
    return done, {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("args", REGISTRY_ONLY, ids=" ".join)
def test_a_registry_only_command_loads_no_heavy_library(
    home: Path, tmp_path: Path, args: list[str]
) -> None:
    done, packages = _loaded(home, args, tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert packages, "the probe wrote no module list"
    assert "typer" in packages  # the probe sees what the command loaded
    assert not packages & HEAVY, sorted(packages & HEAVY)


# Listing commands on a current SQLite registry read it with sqlite3 (registry/listing.py), and
# `key create` writes with it (registry/key_writer.py): importing SQLAlchemy and the ORM took
# longer than the rest of such a command together.
WITHOUT_SQLALCHEMY = [
    ["task", "ls"],
    ["candidate", "ls", "tickets"],
    ["suite", "ls"],
    ["placements"],
    ["placement", "ls", "--json"],
    ["key", "create", "writer", "--role", "caller"],
]


@pytest.mark.parametrize("args", WITHOUT_SQLALCHEMY, ids=" ".join)
def test_a_listing_or_key_command_runs_without_sqlalchemy(
    home: Path, tmp_path: Path, args: list[str]
) -> None:
    done, packages = _loaded(home, args, tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert "typer" in packages
    assert "sqlalchemy" not in packages
    if args[1:] == ["ls"]:
        assert "tickets" in done.stdout, done.stdout  # it read the registry


def test_a_listing_on_a_new_home_goes_through_the_registry(tmp_path: Path) -> None:
    """Only the Registry creates or migrates a schema: on a home without a database the
    listing command loads it, and leaves a current database behind."""
    home = tmp_path / "new-home"
    done, packages = _loaded(home, ["task", "ls"], tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert "sqlalchemy" in packages
    again, packages = _loaded(home, ["task", "ls"], tmp_path / "again.json")
    assert again.returncode == 0, again.stderr
    assert "sqlalchemy" not in packages


def test_the_probe_sees_a_heavy_import(home: Path, tmp_path: Path) -> None:
    """Not blind: a command that needs the eval harness is seen loading it."""
    done, packages = _loaded(home, ["eval", "leaderboard", "tickets"], tmp_path / "modules.json")
    assert done.returncode == 0, done.stderr
    assert "evals" in packages


def test_an_error_loads_no_heavy_library(home: Path, tmp_path: Path) -> None:
    """A registry error is one line, without importing the other areas' error classes."""
    done, packages = _loaded(home, ["candidate", "ls", "nope"], tmp_path / "modules.json")
    assert done.returncode == 1
    assert done.stderr.strip() == "error: unknown task 'nope'"
    assert not packages & HEAVY, sorted(packages & HEAVY)
    assert "sqlalchemy" not in packages


def test_a_command_imports_only_its_own_areas_module(home: Path, tmp_path: Path) -> None:
    """`main` builds only the group the command line names: the other areas' `cli_*` modules
    (and what they import) are never loaded, whatever global options come first."""
    out = tmp_path / "modules.json"
    done, _ = _loaded(home, ["--home", str(home), "task", "ls"], out)
    assert done.returncode == 0, done.stderr
    assert "tickets" in done.stdout
    areas = {m for m in json.loads(out.read_text()) if m.startswith("taskfleet.cli_")}
    assert areas == {"taskfleet.cli_registry"}, sorted(areas)


def test_a_word_that_names_nothing_gets_the_whole_app(home: Path, tmp_path: Path) -> None:
    done, _ = _loaded(home, ["tsk", "ls"], tmp_path / "modules.json")
    assert done.returncode == 2
    assert "No such command 'tsk'. Did you mean 'task'?" in done.stderr


def test_every_command_is_registered_once() -> None:
    from taskfleet.cli import app

    names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    assert not twice, f"registered more than once: {twice}"
