"""Every eval run measures what serving the candidate would cost: CPU per item and peak memory,
of this process and of a runtime process it drives, kept across cached re-runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evals.cache import EmbeddingCache
from evals.cost import add_runtime, metered
from evals.harness import evaluate
from evals.retrievers import DenseRetriever
from evals.suites import beir_suite
from serving.runtime.encoder import ModelSpec
from tests.beir_fixture import build_beir


def test_the_meter_counts_cpu_and_memory_of_the_block_and_of_a_runtime_process() -> None:
    with metered() as idle:
        time.sleep(0.3)
    with metered() as busy:
        block = np.ones((4096, 4096), dtype=np.float64)  # 128 MiB, touched
        deadline = time.process_time() + 0.3
        while time.process_time() < deadline:
            pass
    assert idle.cpu_seconds < 0.1 < 0.3 <= busy.cpu_seconds
    assert busy.peak_bytes >= 100 * 2**20 > idle.peak_bytes
    del block

    # The child says when it has spent its 0.5 s of CPU (a fixed sleep before measuring was
    # too short on a loaded machine: 0.4 s counted).
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nt = time.process_time() + 0.5\n"
            "while time.process_time() < t: pass\nprint('spent', flush=True)\ntime.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "spent"
        with metered() as usage:
            pass
        add_runtime(usage, child.pid)
        assert usage.cpu_seconds >= 0.5 and usage.peak_bytes > 2**20
    finally:
        child.kill()
        child.wait()


def test_a_cached_rerun_reports_the_resources_of_the_run_that_encoded(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    suite = beir_suite("fixture", build_beir(tmp_path / "beir"))
    cache = EmbeddingCache.in_dir(tmp_path / "cache")

    def dense() -> DenseRetriever:
        return DenseRetriever(
            ModelSpec(base_path=tiny_model_path),
            model_fingerprint="tiny",
            adapter_fingerprint=None,
            cache=cache,
        )

    first = evaluate(suite, "test", dense())
    second = evaluate(suite, "test", dense())
    assert first.cost["cpu_ms_per_item"] > 0 and first.cost["peak_memory_mb"] >= 0
    assert second.cost["cost_from_cache"] == 1.0
    assert second.cost["cpu_ms_per_item"] == pytest.approx(first.cost["cpu_ms_per_item"])
    assert second.cost["peak_memory_mb"] == pytest.approx(first.cost["peak_memory_mb"])
