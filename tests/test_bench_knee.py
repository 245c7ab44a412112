"""Smoke run of benchmarks/knee.py on the tiny model (a real fleet: nats-server, `taskfleet serve`
and `gateway`, two sidecars with runtimes, one of them slowed), and the parts the full run
leans on: push task names that land on their own worker, the routers, the arrivals."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from benchmarks import knee


@pytest.mark.bench  # ~1.5 min on the shared 2-core machine: make bench runs it
def test_smoke(tmp_path: Path, tiny_model_path: Path) -> None:
    report = tmp_path / "knee.md"
    code = knee.main(
        [
            "--model", str(tiny_model_path), "--rates", "3", "--step-seconds", "2",
            "--bulk-share", "0.3", "--bulk-size", "4", "--query-pool", "8",
            "--passage-pool", "8", "--p99-bound-s", "60", "--report", "--report-path", str(report),
        ]
    )  # fmt: skip
    # 0: every reply equal to in-process, every push request answered by its own worker.
    assert code == 0
    text = report.read_text()
    for mode in knee.MODES:
        assert f"| {mode} | 3.00 |" in text
    assert "pull / push-rr at the knee" in text
    assert (tmp_path / "knee.png").stat().st_size > 1000


def test_task_names_land_on_the_chosen_workers() -> None:
    workers = ["pull-w0", "pull-w1", "push-w0", "push-w1"]
    pull = knee.task_on("knee-pull", workers[:2], workers)
    assert knee.holders(pull, 2, workers) == {"pull-w0", "pull-w1"}
    for worker in workers[2:]:
        assert knee.holders(knee.task_on(f"t-{worker}", [worker], workers), 1, workers) == {worker}


def test_routers() -> None:
    rr = knee.Router("push-rr", 2)
    assert [rr.pick() for _ in range(4)] == [0, 1, 0, 1]
    lo = knee.Router("push-lo", 2)
    first = lo.pick()
    second = lo.pick()
    assert {first, second} == {0, 1}
    lo.done(second)
    assert lo.pick() == second  # the worker with nothing in flight
    pull = knee.Router("pull", 2)
    assert pull.pick() == -1  # the shared queue: no worker chosen


def test_arrivals_are_the_same_for_every_mode_and_poisson() -> None:
    one = knee.schedule(10.0, 200.0, 0.1, 16, (5, 7), seed=3)
    assert one == knee.schedule(10.0, 200.0, 0.1, 16, (5, 7), seed=3)
    assert len(one) == 2000  # 10/s for 200 s
    gaps = np.diff([a.at for a in one])
    assert min(gaps) >= 0 and 0.08 < float(np.mean(gaps)) < 0.12
    assert 0.8 < float(np.std(gaps) / np.mean(gaps)) < 1.2  # exponential: std = mean
    bulk = [a for a in one if a.bulk]
    assert 0.07 < len(bulk) / len(one) < 0.13
    assert all(len(a.texts) == 16 and max(a.texts) < 7 for a in bulk)
    assert all(len(a.texts) == 1 and a.texts[0] < 5 for a in one if not a.bulk)


def test_report_from_raw_results(tmp_path: Path) -> None:
    """The knee, the ratios and the other bounds from saved steps (--from-json), no fleet."""

    def step(mode: str, rate: float, p99: float) -> knee.Step:
        sent = int(rate * 10)
        return knee.Step(
            mode, rate, 10.0, sent=sent, answered=sent, texts=sent, last_answer_s=10.0,
            small_latency=[0.1] * 98 + [p99] * 2, cpu_s=[1.0, 2.0],
            worker_replies=[1, 2], worker_tokens=[10, 20],
        )  # fmt: skip

    steps = [
        step("pull", 1.0, 0.5), step("pull", 2.0, 1.0), step("pull", 3.0, 9.0),
        step("push-rr", 1.0, 0.5), step("push-rr", 2.0, 6.0),
        step("push-lo", 1.0, 0.5), step("push-lo", 2.0, 1.0), step("push-lo", 3.0, 20.0),
    ]  # fmt: skip
    run = knee.Run(
        argv=["--rates", "1,2,3"], command="knee.py", measured="today", machine="here",
        pull_task="p", tasks=["a", "b"], misplaced=[], steps=steps,
    )  # fmt: skip
    raw = tmp_path / "knee.json"
    raw.write_text(json.dumps({**asdict(run), "steps": [asdict(s) for s in steps]}))
    report = tmp_path / "knee.md"
    assert knee.main(["--from-json", str(raw), "--report-path", str(report)]) == 0
    text = report.read_text()
    assert "**pull / push-rr at the knee: 2.00x** offered requests/s (2 / 1)" in text  # p99 5 s
    assert "**pull / push-lo at the knee: 1.00x**" in text
    assert "target >= 1.5x missed by 0.50" in text
    assert "| 10 s | 3.00 | 2.00 | 2.00 | 1.50x | 1.50x |" in text
    assert "0 lost" in text and "every task answered only by its own workers" in text
