"""Where an engine's time goes while benchmarks/peer.py measures it: the CPU seconds of every
process the engine runs, by what it runs (the model's runtime, the gateway, the sidecar, NATS;
infinity's one process), the client's own, and for taskfleet its sidecar's /metrics (texts per
batch, the runtime's time per single request). The report's "what limits it" lines are these
figures, not guesses."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import cpu_seconds

CLIENT = "client (openai, this process)"
#: What each process of an engine is called in the report, by the module or program it runs.
_NAMES = {
    "taskfleet": "taskfleet up (gateway, control plane)",
    "serving.runtime.server": "runtime (model)",
    "taskfleet-sidecar": "sidecar",
    "nats-server": "nats-server",
}
#: Processes that run the model (their share of the CPU is the model's, the rest is overhead).
MODEL_PROCESSES = ("runtime (model)", "infinity_emb")


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _label(argv: list[str]) -> str:
    if not argv:
        return "?"
    if "-m" in argv[:-1]:
        name = argv[argv.index("-m") + 1]
    elif len(argv) > 1 and Path(argv[0]).name.startswith("python"):
        name = Path(argv[1]).name
    else:
        name = Path(argv[0]).name
    return _NAMES.get(name, name)


def _tree(root: int) -> list[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def metrics_url(root: int) -> str | None:
    """The /metrics URL of the (first) sidecar under ``root`` (`taskfleet up` gives each one a
    ``--metrics-addr``)."""
    for pid in _tree(root):
        argv = _argv(pid)
        if "--metrics-addr" in argv[:-1] and _label(argv) == "sidecar":
            return f"http://{argv[argv.index('--metrics-addr') + 1]}/metrics"
    return None


_SAMPLES = {
    "taskfleet_sidecar_batch_messages_sum": "messages",
    "taskfleet_sidecar_batch_messages_count": "batches",
    "taskfleet_sidecar_runtime_seconds_sum": "infer_s",  # op="infer" only
    "taskfleet_sidecar_runtime_seconds_count": "infers",
}


def _sidecar_samples(url: str | None) -> dict[str, float]:
    """Batches, batch messages and runtime infer calls so far (all tasks)."""
    if url is None:
        return {}
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        base, _, labels = name.partition("{")
        key = _SAMPLES.get(base)
        if base.startswith("taskfleet_sidecar_runtime_seconds") and 'op="infer"' not in labels:
            key = None
        if key is not None:  # summed over the per-task series
            out[key] = out.get(key, 0.0) + float(value)
    return out


@dataclass
class Snapshot:
    cpu: dict[str, float]
    sidecar: dict[str, float]


@dataclass
class Usage:
    """One engine's figures summed over the phases of one kind (all rounds)."""

    wall_s: float = 0.0
    texts: int = 0
    requests: int = 0
    cpu_s: dict[str, float] = field(default_factory=dict)
    sidecar: dict[str, float] = field(default_factory=dict)

    def add(
        self, before: Snapshot, after: Snapshot, wall_s: float, texts: int, requests: int
    ) -> None:
        self.wall_s += wall_s
        self.texts += texts
        self.requests += requests
        for name, seconds in after.cpu.items():
            spent = seconds - before.cpu.get(name, 0.0)
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + max(0.0, spent)
        for name, value in after.sidecar.items():
            self.sidecar[name] = self.sidecar.get(name, 0.0) + value - before.sidecar.get(name, 0.0)

    def ms_per_text(self, names: tuple[str, ...] | None = None) -> float:
        spent = sum(s for n, s in self.cpu_s.items() if names is None or n in names)
        return 1000 * spent / max(1, self.texts)

    def server_ms_per_text(self) -> float:
        return self.ms_per_text(tuple(n for n in self.cpu_s if n != CLIENT))

    def model_ms_per_text(self) -> float:
        return self.ms_per_text(MODEL_PROCESSES)

    def cores(self) -> float:
        return sum(self.cpu_s.values()) / self.wall_s if self.wall_s else 0.0

    def texts_per_batch(self) -> float | None:
        batches = self.sidecar.get("batches", 0.0)
        return self.sidecar["messages"] / batches if batches else None

    def infer_ms(self) -> float | None:
        """The runtime's mean time per infer call (from the sidecar's histogram)."""
        calls = self.sidecar.get("infers", 0.0)
        return 1000 * self.sidecar["infer_s"] / calls if calls else None

    def breakdown(self) -> str:
        parts = sorted(self.cpu_s.items(), key=lambda item: -item[1])
        return ", ".join(
            f"{name} {1000 * seconds / max(1, self.texts):.1f}"
            for name, seconds in parts
            if seconds / max(1e-9, self.wall_s) >= 0.005  # under 0.5% of a core: left out
        )


class Probe:
    """Snapshots of one engine's processes (from its root process) and of this process."""

    def __init__(self, root: int | None) -> None:
        self.root = root
        self.metrics = metrics_url(root) if root is not None else None

    def snapshot(self) -> Snapshot:
        cpu: dict[str, float] = {CLIENT: cpu_seconds(os.getpid())}
        for pid in _tree(self.root) if self.root is not None else []:
            label = _label(_argv(pid))
            cpu[label] = cpu.get(label, 0.0) + cpu_seconds(pid)
        try:
            sidecar = _sidecar_samples(self.metrics)
        except Exception:  # metrics are a help, not a result: a failed scrape leaves them out
            sidecar = {}
        return Snapshot(cpu, sidecar)


# ---------------------------------------------------------------- what the report says


def k1_limit(name: str, u: Usage, peer: str, v: Usage) -> str:
    """What the measured CPU use says limits ``name`` at 32 x 1 text, against ``peer``."""
    cores = os.cpu_count() or 1
    model, total = u.model_ms_per_text(), u.server_ms_per_text()
    busy = u.cores()
    bound = (
        f"the machine's {cores} cores were {busy:.2f} busy (client included): CPU-bound, so "
        "texts/s follow CPU per text"
        if busy >= 0.85 * cores
        else f"it and the client kept {busy:.2f} of the machine's {cores} cores busy (the rest "
        "idle or taken by other load on the shared machine)"
    )
    per_batch = u.texts_per_batch()
    batch = f"; {per_batch:.1f} texts per runtime batch" if per_batch else ""
    return (
        f"  - What limits it (measured, table below): {name} spent {total:.1f} CPU-ms per text "
        f"in its processes, {model:.1f} in the model's runtime and {total - model:.1f} in the "
        f"rest of the path (gateway, sidecar, NATS), against {peer}'s {v.server_ms_per_text():.1f}"
        f" in all; {bound}{batch}."
    )


def p50_limit(name: str, u: Usage, peer: str, v: Usage) -> str:
    """Where a single request's time goes (the sidecar's runtime-infer histogram)."""
    mean = 1000 * u.wall_s / max(1, u.requests)
    peer_mean = 1000 * v.wall_s / max(1, v.requests)
    infer = u.infer_ms()
    inside = (
        f", of which the runtime's infer call {infer:.1f} ms and the path around it (HTTP, "
        f"gateway, JetStream, sidecar, socket) {mean - infer:.1f} ms"
        if infer is not None
        else ""
    )
    return (
        f"  - What limits it (measured): a single request took {mean:.1f} ms on average"
        f"{inside}; {peer}'s took {peer_mean:.1f} ms in all."
    )


def profile_table(results: Mapping[str, Any], concurrency: int) -> str:
    """CPU per text by process at ``concurrency`` x 1 text, and the single requests' time in the
    runtime, of each engine's results (``k1_usage``, ``single_usage``)."""
    cores = os.cpu_count() or 1
    rows = []
    for name, r in results.items():
        u, single = r.k1_usage, r.single_usage
        per_batch = u.texts_per_batch()
        infer = single.infer_ms()
        rows.append(
            f"| {name} | {u.breakdown()} | {u.server_ms_per_text():.1f} "
            f"({u.model_ms_per_text():.1f} model) | {u.cores():.2f} of {cores} "
            f"| {f'{per_batch:.1f}' if per_batch else '-'} "
            f"| {1000 * single.wall_s / max(1, single.requests):.1f} ms"
            f"{f' ({infer:.1f} ms runtime infer)' if infer is not None else ''} |"
        )
    return (
        "Where the time goes (measured in the same rounds: CPU seconds of each engine's "
        "processes from /proc, the client's own, and taskfleet's sidecar /metrics):\n\n"
        f"| engine | {concurrency} x 1 text: CPU-ms per text by process "
        "| server CPU-ms per text | cores busy | texts per runtime batch "
        "| single request: mean |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
