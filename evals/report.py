"""Markdown and PNG reports of eval runs: one run, or a task's leaderboard with its cost
columns and a quality-vs-cost chart.

Works on anything shaped like an eval run (the registry's ``EvalRun`` or the harness's
``EvalResult``), so reports need no database.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Protocol

import numpy as np

from registry.costs import DEFAULT_CPU_HOUR_PRICE, Cost, serving_cost


class ScoredRun(Protocol):
    @property
    def split(self) -> str: ...
    @property
    def main_metric(self) -> str: ...
    @property
    def metrics(self) -> dict[str, float]: ...
    @property
    def ci(self) -> dict[str, tuple[float, float]]: ...
    @property
    def cost(self) -> dict[str, float]: ...
    @property
    def sample_size(self) -> int | None: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def wall_seconds(self) -> float: ...
    @property
    def suite_fingerprint(self) -> str: ...


def machine_description() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores usable, {platform.system()} {platform.release()}, no GPU used"


def _fmt_ci(run: ScoredRun, metric: str) -> str:
    value = run.metrics.get(metric)
    if value is None:
        return "-"
    low, high = run.ci.get(metric, (value, value))
    return f"{value:.4f} [{low:.4f}, {high:.4f}]"


def _queries(run: ScoredRun) -> str:
    return f"sample {run.sample_size}" if run.sample_size else "all"


def run_markdown(task: str, candidate: str, run: ScoredRun) -> str:
    """One run: metrics with 95% CIs, cost, warnings."""
    lines = [
        f"# Eval run: {task} / {candidate}",
        "",
        f"- split: `{run.split}` ({_queries(run)} queries), suite fingerprint "
        f"`{run.suite_fingerprint[:12]}`",
        f"- wall time: {run.wall_seconds:.1f} s",
        "",
        "| metric | value [95% CI] |",
        "|---|---|",
    ]
    lines += [
        f"| {m}{' (main)' if m == run.main_metric else ''} | {_fmt_ci(run, m)} |"
        for m in run.metrics
    ]
    lines += ["", "| cost | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in sorted(run.cost.items())]
    if run.warnings:
        lines += ["", "## Warnings", "", *[f"- {w}" for w in run.warnings]]
    return "\n".join(lines) + "\n"


def _serving_cost(
    name: str, run: ScoredRun, endpoint_prices: Mapping[str, float] | None
) -> Cost | None:
    price = (endpoint_prices or {}).get(name)
    return serving_cost(run.cost, endpoint_price_per_million=price)


def leaderboard_markdown(
    task: str,
    runs: Mapping[str, ScoredRun],
    *,
    title_note: str = "",
    extra_lines: Sequence[str] = (),
    endpoint_prices: Mapping[str, float] | None = None,
) -> str:
    """A table of candidates sorted by the main metric (CIs in brackets), with cost: what
    serving costs (CPU per item, peak memory, price per million items) and the throughput
    measured."""
    ordered = sorted(runs.items(), key=lambda kv: -kv[1].metrics[kv[1].main_metric])
    metrics: list[str] = []
    for _, run in ordered:
        metrics += [m for m in run.metrics if m not in metrics]
    header = ["rank", "candidate", *metrics, "CPU ms/item", "peak MB", "$/1M items"]
    header += ["items/s", "tokens/s", "p50 ms", "p95 ms", "items", "wall s"]
    lines = [f"# Leaderboard: {task}", ""]
    if title_note:
        lines += [title_note, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, (name, run) in enumerate(ordered, start=1):
        cost = run.cost
        row = [str(rank), f"`{name}`", *[_fmt_ci(run, m) for m in metrics]]
        serving = _serving_cost(name, run, endpoint_prices)
        row += (
            [
                f"{serving.cpu_ms_per_item:.3g}",
                f"{serving.peak_memory_mb:.0f}" if serving.peak_memory_mb is not None else "-",
                f"{serving.price_per_million:.3g}",
            ]
            if serving
            else ["-", "-", "-"]
        )
        row += [
            f"{cost.get('items_per_s', 0.0):.1f}",
            f"{cost.get('tokens_per_s', 0.0):.0f}",
            f"{cost.get('latency_p50_ms', 0.0):.1f}",
            f"{cost.get('latency_p95_ms', 0.0):.1f}",
            _queries(run),
            f"{run.wall_seconds:.1f}",
        ]
        lines.append("| " + " | ".join(row) + " |")
    main = ordered[0][1].main_metric if ordered else "-"
    lines += [
        "",
        f"Main metric: `{main}`. Brackets: 95% percentile bootstrap CI over queries or items "
        "(1000 resamples, seed 0; macro-F1 recomputed per resample). Cost: CPU milliseconds per "
        "item and peak memory of the serving work on the runtime that would serve it "
        "(evals/cost.py), and the price of a million items at "
        f"${DEFAULT_CPU_HOUR_PRICE:g} per CPU-hour plus an endpoint's own price "
        "(registry/costs.py); encoded items/s and tokens/s, per-batch latency (for a fully "
        "cached run, the cost measured when its vectors were encoded).",
        f"Generated {datetime.now().astimezone():%Y-%m-%d %H:%M %Z} on {machine_description()}.",
        *extra_lines,
    ]
    return "\n".join(lines) + "\n"


def leaderboard_chart(task: str, runs: Mapping[str, ScoredRun], path: Path) -> Path:
    """Main metric with CI whiskers (left) and throughput (right), one bar per candidate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(runs.items(), key=lambda kv: -kv[1].metrics[kv[1].main_metric])
    names = [n for n, _ in ordered]
    main = ordered[0][1].main_metric if ordered else "score"
    values = np.array([r.metrics[r.main_metric] for _, r in ordered])
    lows = np.array(
        [r.ci.get(r.main_metric, (v, v))[0] for (_, r), v in zip(ordered, values, strict=True)]
    )
    highs = np.array(
        [r.ci.get(r.main_metric, (v, v))[1] for (_, r), v in zip(ordered, values, strict=True)]
    )
    # floor at 0.01 so the log axis can draw a run with no measured cost
    speed = [max(r.cost.get("items_per_s", 0.0), 0.01) for _, r in ordered]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 0.6 * len(names) + 2.2), squeeze=True)
    y = np.arange(len(names))
    ax1.barh(y, values, xerr=[values - lows, highs - values], capsize=4, color="#4c72b0")
    ax1.set_yticks(y, names)
    ax1.invert_yaxis()
    ax1.set_xlabel(f"{main} (95% bootstrap CI)")
    ax2.barh(y, speed, color="#dd8452")
    ax2.set_xscale("log")  # BM25 and a transformer differ by orders of magnitude
    for yi, value in zip(y, speed, strict=True):
        ax2.text(value, yi, f" {value:,.1f}", va="center")
    ax2.set_yticks(y, [""] * len(names))
    ax2.invert_yaxis()
    ax2.set_xlabel("items/s (cost, log scale)")
    fig.suptitle(f"{task}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def quality_cost_chart(
    task: str,
    runs: Mapping[str, ScoredRun],
    path: Path,
    endpoint_prices: Mapping[str, float] | None = None,
) -> Path:
    """Main metric (95% CI) against the price of a million items (log scale), one point per
    candidate whose run measured its cost: the cheap-and-good corner is top left."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for name, run in runs.items():
        serving = _serving_cost(name, run, endpoint_prices)
        if serving is not None:
            value = run.metrics[run.main_metric]
            low, high = run.ci.get(run.main_metric, (value, value))
            points.append((name, max(serving.price_per_million, 1e-6), value, low, high))
    main = next(iter(runs.values())).main_metric if runs else "score"
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for name, price, value, low, high in points:
        ax.errorbar([price], [value], yerr=[[value - low], [high - value]], fmt="o", capsize=4)
        ax.annotate(name, (price, value), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(f"USD per 1M items (CPU at ${DEFAULT_CPU_HOUR_PRICE:g}/CPU-hour, log scale)")
    ax.set_ylabel(f"{main} (95% bootstrap CI)")
    ax.set_title(f"{task}: quality vs cost" + ("" if points else " (no run measured its cost)"))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_leaderboard(
    task: str,
    runs: Mapping[str, ScoredRun],
    out_dir: Path,
    *,
    title_note: str = "",
    extra_lines: Sequence[str] = (),
    endpoint_prices: Mapping[str, float] | None = None,
) -> tuple[Path, Path]:
    """Write ``leaderboard.md``, ``leaderboard.png`` and ``quality-cost.png`` under out_dir."""
    if not runs:
        raise ValueError(f"task {task!r} has no eval runs to report")
    out_dir.mkdir(parents=True, exist_ok=True)
    png = leaderboard_chart(task, runs, out_dir / "leaderboard.png")
    quality_cost_chart(task, runs, out_dir / "quality-cost.png", endpoint_prices)
    text = leaderboard_markdown(
        task,
        runs,
        title_note=title_note,
        extra_lines=extra_lines,
        endpoint_prices=endpoint_prices,
    )
    md = out_dir / "leaderboard.md"
    charts = "\n![leaderboard](leaderboard.png)\n\n![quality vs cost](quality-cost.png)\n"
    md.write_text(text + charts, encoding="utf-8")
    return md, png


def confusion_chart(
    title: str, labels: Sequence[str], matrix: Sequence[Sequence[int]], path: Path
) -> Path:
    """A confusion matrix as a picture: rows gold, columns predicted, each row normalised to
    the share of its gold label (the counts are printed in the cells)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.asarray(matrix, dtype=np.float64)
    shares = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    size = 1.1 * len(labels) + 2.5
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    for i in range(len(labels)):
        for j in range(len(labels)):
            colour = "white" if shares[i, j] > 0.6 else "black"
            ax.text(j, i, f"{int(counts[i, j])}", ha="center", va="center", color=colour)
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the gold label")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
