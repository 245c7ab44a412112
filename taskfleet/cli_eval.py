"""CLI verbs for the eval harness: `taskfleet eval run|leaderboard|compare|report`.

Errors (EvalError, RegistryError) propagate to `taskfleet.cli.main`, which prints one line and
exits non-zero; Ctrl-C exits 130 and records nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from taskfleet.console import console, line, styled
from taskfleet.context import get_settings, open_registry

if TYPE_CHECKING:
    from evals.runner import EvalPaths
    from registry.entities import EvalRun
    from registry.store import EvalStore
    from serving.runtime.remote import RuntimeTarget

out = console()

eval_app = typer.Typer(
    help="Evaluate candidates on their task's suite; leaderboards and reports.",
    no_args_is_help=True,
)

_LABELS = {"passage": "corpus", "query": "queries"}


def _paths(data_dir: Path | None, suite_path: Path | None, mlflow: bool) -> EvalPaths:
    from evals.runner import EvalPaths

    settings = get_settings()
    return EvalPaths(
        cache_dir=settings.cache_dir,
        mlflow_uri=settings.resolved_mlflow_uri if mlflow else None,
        data_root=data_dir or settings.data_dir,
        suite_location=suite_path,
    )


def runtime_target(
    runtime: str, http_url: str | None, http_model: str | None, sidecar_bin: Path | None
) -> RuntimeTarget:
    """The runtime named on the command line; a bad combination is one clear error."""
    from evals.errors import EvalError
    from serving.runtime.remote import RuntimeTarget
    from taskfleet.stack import StackError, find_sidecar_binary

    if http_url and runtime != "http":
        raise EvalError("--http-url is for --runtime http")
    binary = None
    if runtime in ("candle", "http"):
        try:
            binary = find_sidecar_binary(sidecar_bin)
        except StackError as exc:
            raise EvalError(str(exc)) from None
    try:
        return RuntimeTarget(runtime, binary, http_url, http_model)
    except ValueError as exc:
        raise EvalError(str(exc)) from None


def default_runtime(reg: EvalStore, task: str, candidate: str) -> str:
    """The runtime a candidate is scored through unless one is named: its model's first (an
    endpoint model is reached by http only), torch for a model-free baseline."""
    base = reg.get_candidate(task, candidate).base_model
    return reg.get_model(base).runtime_kinds[0] if base else "torch"


def _ci(run: EvalRun, metric: str) -> str:
    value = run.metrics[metric]
    low, high = run.ci.get(metric, (value, value))
    return f"{value:.4f} [{low:.4f}, {high:.4f}]"


@eval_app.command("run")
def eval_run(
    task: str = typer.Argument(..., help="Task name."),
    candidate: str = typer.Option(..., "--candidate", "-c", help="Candidate name."),
    sample: int | None = typer.Option(
        None, "--sample", min=1, help="Only the first N judged queries (full corpus)."
    ),
    split: str | None = typer.Option(None, "--split", help="Split (default: the test split)."),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Data root holding suite folders (env TASKFLEET_DATA_DIR; "
        "default: ../shared/data next to the repo).",
    ),
    suite_path: Path | None = typer.Option(
        None,
        "--suite-path",
        help="Read the suite from this folder instead (it moved): its content must be the "
        "registered version; other data is a new version (`taskfleet suite add`).",
    ),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Log the run to MLflow."),
    runtime: str | None = typer.Option(
        None,
        "--runtime",
        help="Runtime to encode through: torch (in-process), candle (the sidecar's Candle "
        "runtime) or http (an OpenAI-compatible engine, see --http-url; an endpoint model "
        "names its own). Default: the first runtime the candidate's model lists (torch; http "
        "for an endpoint model). A placement on a runtime is promoted only from a run through "
        "it.",
    ),
    http_url: str | None = typer.Option(
        None, "--http-url", help="http runtime: the engine's base URL (e.g. http://127.0.0.1:7997)."
    ),
    http_model: str | None = typer.Option(
        None, "--http-model", help="http runtime: the engine's model id (default: its only one)."
    ),
    sidecar_bin: Path | None = typer.Option(
        None, "--sidecar-bin", help="taskfleet-sidecar binary for candle/http (default: found)."
    ),
) -> None:
    """Evaluate one candidate and record the run (registry + MLflow)."""
    from evals.runner import run_eval

    reg = open_registry()
    target = runtime_target(
        runtime or default_runtime(reg, task, candidate), http_url, http_model, sidecar_bin
    )
    columns = (
        TextColumn("{task.description:<8}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console(stderr=True), transient=False) as bars:
        ids: dict[str, TaskID] = {}

        def progress(phase: str, advance: int, total: int) -> None:
            if phase not in ids:
                ids[phase] = bars.add_task(_LABELS.get(phase, phase), total=total)
            bars.update(ids[phase], advance=advance)

        run = run_eval(
            reg,
            task,
            candidate,
            _paths(data_dir, suite_path, mlflow),
            split=split,
            sample=sample,
            progress=progress,
            runtime=target,
        )
    out.print(f"eval run {run.id}: {task} / {run.candidate} on {run.split} via {run.runtime}")
    for metric in run.metrics:
        marker = " (main)" if metric == run.main_metric else ""
        out.print(f"  {metric}{marker}: {_ci(run, metric)}")
    cost = run.cost
    out.print(
        f"  cost: {cost.get('items_per_s', 0):.1f} items/s, {cost.get('tokens_per_s', 0):.0f} "
        f"tokens/s, batch p50 {cost.get('latency_p50_ms', 0):.1f} ms, "
        f"p95 {cost.get('latency_p95_ms', 0):.1f} ms; wall {run.wall_seconds:.1f} s"
    )
    for warning in run.warnings:
        out.print(line("  ", styled("warning:", "yellow"), f" {warning}"), highlight=False)


@eval_app.command("leaderboard")
def eval_leaderboard(task: str = typer.Argument(..., help="Task name.")) -> None:
    """Candidates of a task ranked by their latest run's main metric."""
    from evals.runner import leaderboard

    board = leaderboard(open_registry(), task)
    if not board:
        out.print(f"task {task} has no eval runs yet")
        return
    ordered = sorted(board.values(), key=lambda r: -r.main_score)
    main = ordered[0].main_metric
    table = Table(
        "rank", "candidate", "runtime", f"{main} [95% CI]", "items/s", "queries", "split", "run"
    )
    for rank, run in enumerate(ordered, start=1):
        table.add_row(
            str(rank),
            run.candidate,
            run.runtime or "-",
            _ci(run, run.main_metric),
            f"{run.cost.get('items_per_s', 0):.1f}",
            f"sample {run.sample_size}" if run.sample_size else "all",
            run.split,
            str(run.id),
        )
    out.print(table)


@eval_app.command("compare")
def eval_compare(
    task: str = typer.Argument(..., help="Task name."),
    a: str = typer.Argument(..., help="Candidate A."),
    b: str = typer.Argument(..., help="Candidate B."),
) -> None:
    """Paired bootstrap CI of A - B on the main metric over the queries both were scored on."""
    from evals.runner import compare

    result = compare(open_registry(), task, a, b)
    d = result.difference
    metric = result.a.main_metric
    verdict = (
        f"{a} is better" if d.low > 0 else f"{b} is better" if d.high < 0 else "no clear difference"
    )
    out.print(f"{metric}: {a} {result.a.main_score:.4f}  vs  {b} {result.b.main_score:.4f}")
    out.print(
        f"difference {a} - {b}: {d.estimate:+.4f}  95% CI [{d.low:+.4f}, {d.high:+.4f}] "
        f"over {result.shared_queries} shared queries ({verdict})"
    )


@eval_app.command("report")
def eval_report(
    task: str = typer.Argument(..., help="Task name."),
    out_dir: Path = typer.Option(
        Path("reports"), "--out-dir", help="Reports folder; writes <out-dir>/<task>/."
    ),
) -> None:
    """Write reports/<task>/leaderboard.md and leaderboard.png from the latest runs."""
    from evals.errors import EvalError
    from evals.report import write_leaderboard
    from evals.runner import leaderboard

    board = leaderboard(open_registry(), task)
    if not board:
        raise EvalError(f"task {task!r} has no eval runs to report")
    md, png = write_leaderboard(task, board, out_dir / task)
    out.print(f"wrote {md} and {png}")
