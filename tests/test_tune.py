"""`taskfleet tune` (issue 21) on the tiny model, a short sweep through its real private stack:
the defaults are measured first, every configuration is applied as a profile the worker
reports, what is recorded is the measured-again best and never below the defaults, the ratio
line reads ``**N.NNx** the defaults``, and a worker started after the tuning (a fleet on the
same registry) serves the task with exactly what was recorded. The sweep is marked ``bench``;
tests/test_runtime_profiles.py holds the profile path (other class carried but not applied,
a worker started after recording applies it) within make test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from registry import Registry
from serving.machine import machine_class
from testbed.fleet import LocalFleet, register_served_task, wait_until

TEXTS = ["Der Mieter muss die Kündigung schriftlich erklären.", "haus", "Kaution " * 30]


def taskfleet(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
    return subprocess.run(
        [
            sys.executable, "-m", "taskfleet", "--home", str(root / "home"),
            "--database-url", f"sqlite:///{root / 'registry.db'}", *args,
        ],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_bad_tune_input_is_one_line(tmp_path: Path, tiny_model_path: Path) -> None:
    reg = Registry.open(f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "a")
    register_served_task(reg, "served", tiny_model_path, model_name="tiny")
    reg.close()
    for args, says in (
        (["tune", "nope"], "error: unknown task 'nope'"),
        (["tune", "served", "--knob", "threads=2"], "error: --knob 'threads=2' must read"),
        (["tune", "served", "--knob", "runtimes=two"], "error: --knob runtimes: 'two' is not"),
        (["tune", "served", "--levels", "1,x"], "error: --levels '1,x' must be whole numbers"),
        (["tune", "served", "--texts", str(tmp_path / "none.txt")], "is not a file"),
        (["profile", "rm", "tiny", "cpu:Other x2"], "error: model 'tiny' has no runtime"),
    ):
        done = taskfleet(tmp_path, *args)
        assert done.returncode == 1, done
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.bench  # ~3 min on the shared 2-core machine (two stacks in turn): make bench runs it
@pytest.mark.timeout(900)
def test_tune_records_the_measured_again_best_and_a_later_worker_applies_it(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    reg = Registry.open(f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "a")
    register_served_task(reg, "served", tiny_model_path, model_name="tiny", pinned=True)
    reg.close()
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    sweep = tmp_path / "sweep.json"
    done = taskfleet(
        tmp_path, "tune", "served", "--p99-ms", "5000", "--levels", "1,4", "--seconds", "2",
        "--knob", "max_batch_wait_ms=0", "--knob", "runtimes=2", "--texts", str(texts),
        "--json", str(sweep),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(sweep.read_text())
    settings = [m["settings"] for m in result["sweep"]]
    assert settings[:3] == [{}, {"max_batch_wait_ms": 0}, {"runtimes": 2}]
    assert all(m["throughput"] > 0 for m in result["sweep"])
    assert all(len(m["levels"]) == 2 for m in result["sweep"])
    defaults = result["sweep"][0]["throughput"]
    ratio = re.search(r"\*\*(\d+\.\d\d)x\*\* the defaults", done.stdout)
    assert ratio is not None, done.stdout

    reg = Registry.open(f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "a")
    profiles = reg.list_profiles("tiny")
    reg.close()
    if result["profile_id"] is None:  # the defaults won, or the best fell below them again
        assert profiles == []
        assert ratio.group(1) == "1.00"
        expected: dict[str, int] = {}
    else:
        (profile,) = profiles
        assert profile.id == result["profile_id"]
        assert profile.machine_class == machine_class()
        assert profile.settings.changed() == result["best"]["settings"] != {}
        assert profile.throughput == result["again"]["throughput"] >= defaults
        assert profile.default_throughput == defaults
        assert float(ratio.group(1)) == pytest.approx(profile.throughput / defaults, abs=0.01)
        expected = {"served": profile.id}
    listed = taskfleet(tmp_path, "profile", "ls")
    assert listed.returncode == 0 and ("tiny" in listed.stdout) == bool(profiles), listed

    # A worker started after the tuning, on the same registry, applies what was recorded.
    with LocalFleet(tmp_path, workers=1) as fleet:
        placement = fleet.reg.current_placement("served")
        assert placement is not None
        fleet.serving("served", placement.epoch)

        def reported() -> dict[str, int] | None:
            beat = fleet.heartbeat(fleet.sidecars[0].worker_id)
            if beat is None or beat.epochs.get("served") != placement.epoch:
                return None
            return dict(beat.profiles or {})

        assert wait_until(lambda: (reported(),) if reported() is not None else None)[0] == (
            expected
        )
