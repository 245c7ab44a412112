"""The knee benchmark's results and report: a step's measurements, the knee of a mode, the
markdown + PNG written from a run (benchmarks/knee.py measures; `--from-json` rewrites)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.knee_load import MODES


@dataclass
class Step:
    mode: str
    rate: float
    seconds: float
    sent: int = 0
    answered: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    wrong: int = 0
    texts: int = 0
    last_answer_s: float = 0.0
    small_latency: list[float] = field(default_factory=list)
    bulk_latency: list[float] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)
    # Per worker, during the step: runtime CPU seconds, requests answered, tokens batched.
    cpu_s: list[float] = field(default_factory=list)
    worker_replies: list[float] = field(default_factory=list)
    worker_tokens: list[float] = field(default_factory=list)
    load: float = 0.0

    @property
    def completed_rate(self) -> float:
        """Answered requests per second over the step, until its last answer: equal to the
        offered rate while the fleet keeps up, its capacity once it does not."""
        return self.answered / max(self.seconds, self.last_answer_s)

    def p(self, q: float, bulk: bool = False) -> float:
        values = self.bulk_latency if bulk else self.small_latency
        return float(np.percentile(values, q)) if values else float("nan")

    def ok(self, bound_s: float) -> bool:
        return (
            not self.errors
            and not self.wrong
            and self.answered == self.sent
            and self.p(99) <= bound_s
        )

    def row(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "rate": self.rate, "sent": self.sent, "answered": self.answered,
            "errors": self.errors, "wrong": self.wrong, "texts": self.texts,
            "completed_rate": round(self.completed_rate, 3),
            "p50_s": round(self.p(50), 3), "p95_s": round(self.p(95), 3),
            "p99_s": round(self.p(99), 3), "bulk_p99_s": round(self.p(99, bulk=True), 3),
            "send_lag_p99_s": round(float(np.percentile(self.send_lag, 99)), 3)
            if self.send_lag else 0.0,
            "cpu_s": [round(c, 1) for c in self.cpu_s],
            "replies": [int(r) for r in self.worker_replies],
            "tokens": [int(t) for t in self.worker_tokens],
            "load": round(self.load, 2),
        }  # fmt: skip


def knee(steps: list[Step], mode: str, bound_s: float) -> Step | None:
    """The highest step of ``mode`` below the knee: every step up to it met the bound."""
    best = None
    for step in sorted((s for s in steps if s.mode == mode), key=lambda s: s.rate):
        if not step.ok(bound_s):
            break
        best = step
    return best


@dataclass
class Run:
    """What a report is written from (saved as JSON beside it: --from-json)."""

    argv: list[str]
    command: str
    measured: str
    machine: str
    pull_task: str
    tasks: list[str]
    misplaced: list[str]
    steps: list[Step]
    #: Service times measured for the simulation (benchmarks/knee_sim.py ``Calibration``);
    #: absent from runs made before it.
    calibration: dict[str, Any] | None = None


def write_report(
    run: Run, args: argparse.Namespace, path: Path, simulation: list[str] | None = None
) -> None:
    """The report at ``path`` (+ PNG); ``simulation``: the lines of the simulated fleets'
    section (benchmarks/knee_sim.py ``section``), placed after the real run's result."""
    steps, misplaced = run.steps, run.misplaced
    bound = args.p99_bound_s
    knees = {mode: knee(steps, mode, bound) for mode in args.modes}
    sent = sum(s.sent for s in steps)
    answered = sum(s.answered for s in steps)
    wrong = sum(s.wrong for s in steps)
    errors = sum(sum(s.errors.values()) for s in steps)
    lines = [
        "# The knee: central pull queue vs push router, under uneven load",
        "",
        f"Measured {run.measured} on {run.machine}.",
        "",
        "## Result",
        "",
        f"Correctness: {sent} requests sent, {answered} answered, {sent - answered} lost, "
        f"{errors} errors, {wrong} with vectors other than in-process; "
        + (
            "every task answered only by its own workers."
            if not misplaced
            else f"**answered by the wrong workers: {', '.join(misplaced)}**."
        ),
        "",
        "| mode | knee: offered req/s | completed req/s | texts/s | p50 | p95 | p99 (1 query) "
        "| p99 (bulk) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, step in knees.items():
        if step is None:
            lines.append(f"| {mode} | below the lowest rate | | | | | | |")
            continue
        lines.append(
            f"| {mode} | {step.rate:.2f} | {step.completed_rate:.2f} | "
            f"{step.texts / max(step.seconds, step.last_answer_s):.1f} | {step.p(50):.2f} s | "
            f"{step.p(95):.2f} s | {step.p(99):.2f} s | {step.p(99, bulk=True):.2f} s |"
        )
    lines += ratio_lines(knees)
    other_bounds = sorted({2.0, 5.0, 10.0, bound})
    lines += [
        "",
        "The same steps under other p99 bounds (knee: offered req/s; ratio pull / push):",
        "",
        "| p99 bound | " + " | ".join(args.modes) + " | pull / push-rr | pull / push-lo |",
        "|---:|" + "---:|" * (len(args.modes) + 2),
    ]
    for b in other_bounds:
        at = {mode: knee(steps, mode, b) for mode in args.modes}
        rate = {m: (k.rate if k else None) for m, k in at.items()}
        cells = [f"{r:.2f}" if r else "-" for r in rate.values()]
        for push in ("push-rr", "push-lo"):
            p, q = rate.get("pull"), rate.get(push)
            cells.append(f"{p / q:.2f}x" if p and q else "-")
        lines.append(f"| {b:g} s | " + " | ".join(cells) + " |")
    if simulation:
        lines += ["", *simulation]
    f = args.slow_factor
    lines += [
        "",
        "## Set-up",
        "",
        f"- Two groups of {args.workers} workers on one nats-server, gateway and control plane: "
        "the pull group serves the pull task, push worker i only its own task (so each worker "
        "holds one task and both modes run on identical workers). Each worker is a real sidecar "
        "+ PyTorch runtime with `OMP_NUM_THREADS=1`; worker 0 of each group emulates a device "
        f"{f:g}x slower (benchmarks/slow_runtime.py sleeps {f - 1:g}x the time of each call). "
        "Sidecar flags: "
        + (f"`{args.sidecar_args}`, else " if args.sidecar_args else "")
        + "the defaults (5 ms batch wait, 2 batches in flight, 32768-token batches).",
        f"- Requests: Poisson arrivals; {100 * (1 - args.bulk_share):.0f}% embed one GerLayQA "
        f"question (a search query), {100 * args.bulk_share:.0f}% embed {args.bulk_size} "
        "GerLayQA passages (indexing). Same arrivals for every mode at a rate; modes "
        f"alternate per rate; {args.step_seconds:g} s per step; every request waits for its "
        "answer (a step ends when its last answer arrives).",
        f"- pull: task `{run.pull_task}` on every worker of the pull group (one JetStream "
        "queue, the product). push: worker i's own task ("
        + ", ".join(f"`{t}`" for t in run.tasks)
        + ", names chosen so the sidecars' rendezvous hashing places each on exactly its "
        "worker; checked after the run from every sidecar's /metrics); the load generator is "
        "the router: round-robin (push-rr) or least-outstanding requests from its own exact "
        "in-flight count (push-lo, a stronger baseline than a periodically refreshed view).",
        f"- Knee: the highest offered rate at which the one-query requests' p99 <= {bound:g} s, "
        "every request answered with the right vectors, all lower rates too; the ratio is "
        "that of the knees' offered rates. Latency is measured from the scheduled send time "
        "(the generator's own lag counts against the fleet). Completed req/s = answered / "
        "max(step, time to the last answer), reported but no criterion: with 30 s steps one "
        "bulk answer a few seconds after the step pulls it under the offered rate while the "
        "fleet keeps up; a fleet that does not keep up shows as a p99 that grows with the step.",
        f"- What capacity alone predicts: pull can keep both workers busy (1 + 1/{f:g} = "
        f"{1 + 1 / f:.2f} workers' worth); push-rr sends half the work to the slow one and "
        f"saturates at 2/{f:g} = {2 / f:.2f}: pull / push-rr <= {(f + 1) / 2:.2f}x from speed "
        "alone, more only through the variance of request sizes. push-lo follows the slow "
        "worker's backlog, so its capacity approaches pull's. On this machine all workers "
        "also share two cores with everything else: the slow worker's sleep leaves CPU to the "
        "fast one, so capacity is shared more than on machines where each worker owns its "
        "cores, and a policy matters less.",
        f"- Every reply's vectors compared with in-process sentence-transformers (cosine >= "
        f"0.999; pools of {args.query_pool} questions and {args.passage_pool} passages).",
        "- A 2-core machine shared with other work: the fleet's processes (2N sidecars and "
        "runtimes, nats-server, gateway, control plane, this generator) compete with each other "
        "and with other jobs (1-minute load in the last column), so absolute rates are low and "
        "noisy; the modes alternate per rate so that load hits them alike.",
        f"- Command: `{run.command}`",
        "",
        "## Every step",
        "",
        "| mode | offered req/s | sent | answered | errors | wrong | completed req/s | p50 | p99 "
        "| bulk p99 | send lag p99 | runtime CPU s per worker | requests per worker "
        "| tokens per worker | load |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for s in sorted(steps, key=lambda s: (MODES.index(s.mode), s.rate)):
        lines.append(
            f"| {s.mode} | {s.rate:.2f} | {s.sent} | {s.answered} | "
            f"{json.dumps(s.errors) if s.errors else 0} | {s.wrong} | {s.completed_rate:.2f} | "
            f"{s.p(50):.2f} | {s.p(99):.2f} | {s.p(99, bulk=True):.2f} | "
            f"{float(np.percentile(s.send_lag, 99)) if s.send_lag else 0:.3f} | "
            f"{' / '.join(f'{c:.1f}' for c in s.cpu_s)} | "
            f"{' / '.join(f'{r:.0f}' for r in s.worker_replies)} | "
            f"{' / '.join(f'{t:.0f}' for t in s.worker_tokens)} | {s.load:.1f} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    plot(steps, args, png)
    lines += ["", f"![p99 and completed against offered]({png.name})", ""]
    path.write_text("\n".join(lines))
    print(path.read_text())


def ratio_lines(knees: dict[str, Step | None]) -> list[str]:
    pull = knees.get("pull")
    lines = []
    for push in ("push-rr", "push-lo"):
        other = knees.get(push)
        if pull is None or other is None:
            continue
        ratio = pull.rate / other.rate
        verdict = "met" if ratio >= 1.5 else f"missed by {1.5 - ratio:.2f}"
        lines += [
            "",
            f"**pull / {push} at the knee: {ratio:.2f}x** offered requests/s "
            f"({pull.rate:g} / {other.rate:g}); target >= 1.5x {verdict}.",
        ]
    return lines


def plot(steps: list[Step], args: argparse.Namespace, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in args.modes:
        mine = sorted((s for s in steps if s.mode == mode), key=lambda s: s.rate)
        rates = [s.rate for s in mine]
        left.plot(rates, [s.p(99) for s in mine], marker="o", label=mode)
        right.plot(rates, [s.completed_rate for s in mine], marker="o", label=mode)
    left.axhline(args.p99_bound_s, color="grey", linestyle="--", label="p99 bound")
    left.set_yscale("log")
    left.set_xlabel("offered requests/s")
    left.set_ylabel("p99 of one-query requests (s)")
    right.plot(args.rates, args.rates, color="grey", linestyle=":", label="offered")
    right.set_xlabel("offered requests/s")
    right.set_ylabel("completed requests/s")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle("Pull (one JetStream queue) vs push router, uneven load")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
