"""Fleet CLI verbs without a running fleet: what a user sees when NATS is away or input is bad."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from registry import Registry
from serving.embedded_nats import free_port
from testbed.declared_tasks import add_task

REPO = Path(__file__).resolve().parent.parent


def run_cli(
    home: Path, *args: str, nats_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    env.update(TASKFLEET_HOME=str(home), COLUMNS="200", PYTHONPATH=str(REPO))
    if nats_url:
        env["TASKFLEET_NATS_URL"] = nats_url
    return subprocess.run(
        [sys.executable, "-m", "taskfleet", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_placement_set_while_nats_is_down_stays_in_the_outbox(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    home = tmp_path / "home"
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    add_task(reg, "legal", suite="s")
    reg.add_model("tiny", path=tiny_model_path)
    reg.add_candidate("legal", base="tiny")
    reg.close()
    down = f"nats://127.0.0.1:{free_port()}"  # nothing listens there

    # Placing a candidate is a promotion: without a champion the placement route refuses.
    r = run_cli(home, "placement", "set", "legal", "tiny", nats_url=down)
    assert r.returncode == 1 and "no champion yet: promote a candidate first" in r.stderr
    r = run_cli(home, "promote", "legal", "tiny", "--override", "--reason", "smoke", "--lazy")
    assert r.returncode == 0 and "placement epoch 1" in r.stdout, r.stderr
    r = run_cli(home, "placement", "set", "legal", "tiny", "--replicas", "2", nats_url=down)
    assert r.returncode == 0, r.stderr
    assert "epoch 2" in r.stdout and "the running publisher will publish it" in r.stdout

    r = run_cli(home, "placement", "ls", "--json")
    (status,) = json.loads(r.stdout)["placements"]
    assert status["published_at"] is None and status["replicas"] == 2
    assert status["converged"] is False and json.loads(r.stdout)["workers"] == []

    r = run_cli(home, "placement", "ls")
    assert r.returncode == 0 and "pending" in r.stdout

    r = run_cli(home, "placement", "set", "legal", "nope")
    assert r.returncode == 1 and "would change what 'legal' serves" in r.stderr
    assert "Traceback" not in r.stderr

    r = run_cli(home, "dlq", "ls")
    assert r.returncode == 1 and "start `taskfleet up` or set TASKFLEET_NATS_URL" in r.stderr
    r = run_cli(home, "dlq", "ls", nats_url=down)
    assert r.returncode == 1 and "cannot read the DLQ" in r.stderr
    r = run_cli(home, "dlq", "replay", nats_url=down)
    assert r.returncode == 1 and "name dead letters by number or give --task" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_stack_file_is_never_seen_empty_or_half_written(tmp_path: Path) -> None:
    """`taskfleet up` publishes stack.json while readers poll for it (`nats_url_or_none` in every
    fleet command, `taskfleet tune`, scripts): a reader that finds the file parses it whole.
    Written in place, a reader caught it between truncate and write and read "" (seen as a
    JSONDecodeError in the `up` end-to-end test under load)."""
    import threading

    from taskfleet.cli_fleet import write_stack_state

    path = tmp_path / "run" / "stack.json"
    states = [{"nats": f"nats://127.0.0.1:{n}", "pad": "x" * 200_000} for n in range(200)]
    done = threading.Event()
    seen: list[str] = []

    def write_all() -> None:
        for state in states:
            write_stack_state(path, state)
        done.set()

    writer = threading.Thread(target=write_all)
    writer.start()
    while not done.is_set():
        if path.is_file():
            seen.append(json.loads(path.read_text())["nats"])
    writer.join()
    assert seen, "the reader never found the file"
    assert json.loads(path.read_text())["nats"] == states[-1]["nats"]
    assert [p.name for p in path.parent.iterdir()] == ["stack.json"], "a staging file was left"
