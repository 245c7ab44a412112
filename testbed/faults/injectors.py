"""The faults, each a plain function on a :class:`testbed.fleet.LocalFleet`.

Every injector records when the fault began and ended (``Window``), so a run can report the
latency of the calls made during it. Processes are found through ``/proc`` by parent id, never
by name, so nothing outside the fleet is touched.

Call injectors that start processes (a restart) from the main thread and run the calls in
another: fleet children get SIGTERM when the *thread* that started them ends
(``PR_SET_PDEATHSIG``, see ``taskfleet.stack``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from serving.embedded_nats import EmbeddedNatsCluster
from taskfleet.stack import SidecarProcess
from testbed.fleet import LocalFleet, wait_until


@dataclass
class Window:
    """When a fault was active, on the ``time.monotonic`` clock the counting client uses."""

    name: str
    began: float = field(default_factory=time.monotonic)
    ended: float = 0.0

    def close(self) -> Window:
        self.ended = time.monotonic()
        return self


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def runtime_pid(sidecar: SidecarProcess, timeout_s: float = 60.0) -> int:
    """The runtime process the sidecar started (its only child)."""
    assert sidecar.pid is not None

    def probe() -> int | None:
        kids = children_of(sidecar.pid or 0)
        return kids[0] if kids else None

    return wait_until(probe, timeout_s=timeout_s)


def holds_messages(fleet: LocalFleet, sidecar: SidecarProcess, task: str, since_ms: int) -> bool:
    """Whether the worker's heartbeat, stamped at ``since_ms`` (unix ms) or later, says it
    holds messages of ``task`` (pulled, not settled)."""
    beat = fleet.heartbeat(sidecar.worker_id)
    return beat is not None and beat.ts_ms >= since_ms and beat.queue_depth.get(task, 0) > 0


def wait_holding(
    fleet: LocalFleet, sidecar: SidecarProcess, task: str, timeout_s: float = 30.0
) -> None:
    """Until a heartbeat the worker made after this call began says it holds messages of
    ``task``. Called after ``freeze_runtime``, what it saw held stays held until the kill. A
    heartbeat from before the freeze could count messages the runtime answered just before it
    stopped: a kill on that word found the worker holding nothing (seen once under stress)."""
    since_ms = int(time.time() * 1000)
    wait_until(
        lambda: holds_messages(fleet, sidecar, task, since_ms), timeout_s=timeout_s, every_s=0.02
    )


def kill_sidecar(sidecar: SidecarProcess, *, restart: bool = False) -> Window:
    """SIGKILL the sidecar: no drain, no ack, no goodbye heartbeat. Its runtime is stopped
    with it (as a crashed host would lose it). ``restart`` starts it again at once under the
    same worker id, as ``taskfleet up``'s supervisor does."""
    window = Window("kill -9 sidecar" + (" + restart" if restart else ""))
    assert sidecar.process is not None
    orphans = children_of(sidecar.process.pid)
    sidecar.kill()
    for pid in orphans:
        _kill(pid)
    if restart:
        sidecar.start()
    return window.close()


def freeze_runtime(sidecar: SidecarProcess) -> int:
    """SIGSTOP the sidecar's runtime: batches sent to it stay unanswered, so the sidecar holds
    their messages until the runtime is killed (``kill_sidecar`` kills it with the sidecar)."""
    pid = runtime_pid(sidecar)
    os.kill(pid, signal.SIGSTOP)
    return pid


def kill_runtime(sidecar: SidecarProcess) -> Window:
    """SIGKILL the sidecar's runtime; the sidecar restarts it and reloads its models."""
    window = Window("kill -9 runtime")
    _kill(runtime_pid(sidecar))
    return window.close()


def restart_nats(fleet: LocalFleet, down_s: float = 1.0) -> Window:
    """Stop nats-server (SIGTERM) and start it again on the same port and store."""
    assert fleet.nats is not None
    window = Window("nats-server restart")
    fleet.nats.stop()
    time.sleep(down_s)
    fleet.nats.start()
    return window.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def kill_nats_node(fleet: LocalFleet, index: int, down_s: float = 3.0) -> Window:
    """SIGKILL one node of the fleet's NATS cluster; it starts again after ``down_s`` (same
    ports and store) and rejoins."""
    cluster = fleet.nats
    assert isinstance(cluster, EmbeddedNatsCluster)
    window = Window(f"kill -9 nats node {index}")
    node = cluster.nodes[index]
    node.kill()
    time.sleep(down_s)
    node.start()
    return window.close()
