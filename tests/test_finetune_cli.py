"""`taskfleet finetune lora` as a user runs it: a real subprocess, a real SQLite registry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.suites import declare_builtin
from finetune.errors import caused_by_ctrl_c
from registry import Registry
from tests.beir_fixture import build_beir

TASK = "legal"
SMALL = ["--batch-size", "4", "--max-seq-length", "32", "--rank", "2", "--alpha", "4"]


@pytest.fixture
def home(tmp_path: Path, tiny_model_path: Path) -> Path:
    home = tmp_path / "home"
    reg = Registry.open(
        f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor="test"
    )
    # german-legal-retrieval lives at <data root>/gerlayqa/beir; a tiny stand-in with its splits.
    build_beir(tmp_path / "data" / "gerlayqa" / "beir", queries={"eval": 8, "dev": 24})
    reg.add_suite(declare_builtin("german-legal-retrieval", tmp_path / "data")[0])
    reg.add_task(TASK, suite="german-legal-retrieval")
    reg.add_model("tiny", path=tiny_model_path)
    reg.close()
    return home


def cli(home: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TASKFLEET_HOME": str(home), "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    env["OMP_NUM_THREADS"] = "1"
    data_dir = str(home.parent / "data")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskfleet",
            "finetune",
            "lora",
            TASK,
            "--base",
            "tiny",
            "--data-dir",
            data_dir,
            "--no-mlflow",
            "--threads",
            "1",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run(home: Path, *args: str) -> tuple[int, str, str]:
    proc = cli(home, *args)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def adapters(home: Path) -> list[str]:
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        return [a.name for a in reg.list_adapters()]
    finally:
        reg.close()


def test_train_then_continue_from_the_adapter(home: Path) -> None:
    code, out, err = run(home, "--name", "one", "--no-eval", *SMALL)
    assert code == 0, err
    assert "adapter one on tiny" in out and "loss" in out and "sha256 " in out

    code, out, err = run(home, "--name", "two", "--parent", "one", "--eval-sample", "4", *SMALL)
    assert code == 0, err
    assert "(parent one)" in out
    assert "german-legal-retrieval/eval: ndcg_at_10" in out
    assert adapters(home) == ["one", "two"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target-modules", "q_proj,v_proj"], "q_proj, v_proj are not linear layers"),
        (["--split", "eval"], "is a test split"),
        (["--lr", "5"], "learning rate must be in (0, 1)"),
        (["--max-pairs", "2"], "at least 4 are needed"),
        (["--parent", "missing"], "missing"),
    ],
)
def test_bad_input_is_one_clear_line(home: Path, args: list[str], message: str) -> None:
    code, _, err = run(home, "--no-eval", *SMALL, *args)
    assert code == 1
    assert message in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert adapters(home) == []


def test_ctrl_c_registers_nothing(home: Path) -> None:
    proc = cli(home, "--name", "stopped", "--no-eval", "--epochs", "500", *SMALL)
    assert proc.stdout is not None
    # Interrupt once training has started (the "train:" phase line is printed first).
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        if line.startswith("train:") or time.monotonic() > deadline:
            break
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    # The first Ctrl-C is taken at the next step, wherever it landed (see StopAtNextStep).
    assert "stopping at the next step" in err
    assert "nothing was registered" in err or "interrupted" in err
    assert "Traceback" not in err
    assert adapters(home) == []


class _InterruptedWhileNamed:
    def __set_name__(self, owner: type, name: str) -> None:
        raise KeyboardInterrupt


def test_ctrl_c_that_python_wrapped_is_still_an_interruption() -> None:
    # Python 3.11 re-raises what `__set_name__` raises (a dataclass field, while the training
    # libraries import) as a RuntimeError caused by it: SIGINT landing there made the test above
    # print a traceback instead of the one line.
    caught: BaseException | None = None
    try:
        type("Owner", (), {"field": _InterruptedWhileNamed()})
    except BaseException as exc:  # KeyboardInterrupt itself on a Python that does not wrap
        caught = exc
    assert caught is not None and caused_by_ctrl_c(caught)
    try:
        raise RuntimeError("wrapped") from ValueError("not an interruption")
    except RuntimeError as exc:
        assert not caused_by_ctrl_c(exc)
