"""End to end: a fleet of one torch and one candle worker. A task promoted onto candle is
served by the candle worker only, through the real gateway, with sentence-transformers'
vectors; a runtime switch to torch (promoted from an eval run through torch) moves it, and the
candle worker lets the task go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serving.client import Client
from testbed.declared_tasks import add_task
from testbed.fleet import LocalFleet, free_port, unique_task, wait_until
from tests.evalrun_fixture import record_run
from tests.test_runtime_candle import TEXTS, sentence_transformers


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    stack = LocalFleet(tmp_path_factory.mktemp("fleet"), runtimes=["torch", "candle"]).start()
    try:
        yield stack
    finally:
        stack.stop()


def serving_workers(fleet: LocalFleet, task: str) -> dict[str, list[str]]:
    """runtime -> ids of live workers that run a loop for the task."""
    found: dict[str, list[str]] = {}
    for beat in fleet.heartbeats().values():
        if task in beat.queue_depth:
            for runtime in beat.runtimes:
                found.setdefault(runtime, []).append(beat.worker_id)
    return found


@pytest.mark.candle
def test_placement_runtime_picks_the_workers(fleet: LocalFleet, tiny_model_path: Path) -> None:
    reg = fleet.reg
    task = unique_task("rt")
    add_task(reg, task, suite="legal-suite")
    reg.add_model(f"m-{task}", path=tiny_model_path, runtime_kinds=["torch", "candle"])
    candidate = reg.add_candidate(task, base=f"m-{task}").name
    record_run(reg, task, candidate, 0.3, runtime="candle")
    first = reg.promote(task, candidate, reason="first champion, on candle")
    assert first.runtime == "candle"
    try:
        fleet.serving(task, first.epoch, workers=1)
    except AssertionError:
        pytest.fail(f"no worker serves the task:\n{fleet.logs()}")
    assert set(serving_workers(fleet, task)) == {"candle"}

    expected = sentence_transformers(tiny_model_path, TEXTS)
    with Client(fleet.gateway_url) as client:
        result = client.embed_with_info(task, TEXTS, kind="passage")
    np.testing.assert_allclose(result.vectors, expected, atol=1e-5)
    assert result.epoch == first.epoch

    # Back to torch: a promotion of the same candidate, from a run through torch.
    record_run(reg, task, candidate, 0.3, runtime="torch")
    switched = reg.promote(task, candidate, runtime="torch", reason="torch pool has room")
    assert (switched.runtime, switched.previous_candidate) == ("torch", candidate)
    wait_until(lambda: set(serving_workers(fleet, task)) == {"torch"}, timeout_s=40)
    fleet.serving(task, switched.epoch, workers=1)
    with Client(fleet.gateway_url) as client:
        result = client.embed_with_info(task, TEXTS, kind="passage")
    np.testing.assert_allclose(result.vectors, expected, atol=1e-5)
    assert result.epoch == switched.epoch


@pytest.mark.candle
def test_taskfleet_worker_joins_with_its_runtime(fleet: LocalFleet, tmp_path: Path) -> None:
    """`taskfleet worker` alone (NATS URL + cache dir, no database) beats as a candle worker."""
    assert fleet.nats is not None
    worker_id = f"solo-{tmp_path.name[-8:]}".replace("_", "-")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "taskfleet", "worker", "--runtime", "candle",
            "--nats-url", fleet.nats.url, "--cache-dir", str(tmp_path / "cache"),
            "--worker-id", worker_id,
        ],
        env={**os.environ, "TASKFLEET_HOME": str(tmp_path / "no-home")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        beat = wait_until(lambda: fleet.heartbeats().get(worker_id), timeout_s=40)
        assert beat.runtimes == ["candle"]
        assert not (tmp_path / "no-home").exists(), "a worker needs no registry home"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_taskfleet_worker_refuses_bad_settings_in_one_line(tmp_path: Path) -> None:
    for args, message in (
        (["--runtime", "onnx"], "unknown runtime 'onnx'"),
        # Without --http-url an http worker serves endpoint models (each names its URL).
        (["--runtime", "http", "--http-url", "ftp://x"], "must start with http:// or https://"),
    ):
        proc = subprocess.run(
            [
                sys.executable, "-m", "taskfleet", "worker", "--nats-url", "nats://127.0.0.1:1",
                "--cache-dir", str(tmp_path), *args,
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1
        assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_sidecar_without_candle_says_how_to_get_it(tiny_model_path: Path, tmp_path: Path) -> None:
    """`make sidecar` (what make test builds) leaves the Candle runtime out. Asking it for one
    fails at once with the command that builds it: the eval harness at start, `taskfleet worker`
    and `taskfleet up` before any worker starts."""
    from serving.runtime.model_folder import ModelSpec
    from serving.runtime.remote import RemoteEncoder, RemoteRuntimeError, RuntimeTarget
    from taskfleet.stack import find_sidecar_binary, sidecar_runtimes

    binary = find_sidecar_binary()
    if "candle" in sidecar_runtimes(binary):
        pytest.skip("this sidecar was built with the candle feature (make sidecar-candle)")
    assert sidecar_runtimes(binary) == {"torch", "http"}
    with pytest.raises(RemoteRuntimeError, match="built without the candle runtime"):
        RemoteEncoder(ModelSpec(base_path=tiny_model_path), RuntimeTarget("candle", binary))
    port, control_port = free_port(), free_port()
    env = {**os.environ, "TASKFLEET_HOME": str(tmp_path / "home")}
    for command in (
        [
            "worker", "--runtime", "candle", "--nats-url", "nats://127.0.0.1:1",
            "--cache-dir", str(tmp_path / "worker"),
        ],
        [
            "up", "--workers", "0", "--candle-workers", "1",
            "--port", str(port), "--control-port", str(control_port),
        ],
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "taskfleet", *command],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert proc.returncode == 1, (command, proc.stderr)
        assert "make sidecar-candle" in proc.stderr and "Traceback" not in proc.stderr, command


@pytest.mark.candle
def test_up_serves_a_task_from_candle_workers_alone(tmp_path: Path, tiny_model_path: Path) -> None:
    """`taskfleet up --workers 0 --candle-workers 1`: no Python runtime anywhere, and a task
    placed on candle is served by name with sentence-transformers' vectors."""

    from registry import Registry
    from tests.test_e2e_up import REPO, _env

    home = tmp_path / "home"
    task = unique_task("upcandle")
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    add_task(reg, task, suite="s")
    reg.add_model("tiny", path=tiny_model_path, runtime_kinds=["torch", "candle"])
    candidate = reg.add_candidate(task, base="tiny").name
    placed = reg.promote(
        task, candidate, override=True, reason="test: no eval run", runtime="candle"
    )
    assert placed.runtime == "candle"
    reg.close()
    port, control_port = free_port(), free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "0",
             "--candle-workers", "1", "--no-auth", "--port", str(port),
             "--control-port", str(control_port)],
            cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_until(lambda: (home / "run" / "stack.json").is_file(), timeout_s=60)
            workers = json.loads((home / "run" / "stack.json").read_text())["workers"]
            assert len(workers) == 1 and workers[0].endswith("-candle0"), workers
            with Client(f"http://127.0.0.1:{port}", max_retries=60) as client:
                result = client.embed_with_info(task, TEXTS, kind="passage")
            np.testing.assert_allclose(
                result.vectors, sentence_transformers(tiny_model_path, TEXTS), atol=1e-5
            )
            assert result.epoch == placed.epoch
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
    assert code == 0, log_path.read_text()[-3000:]
