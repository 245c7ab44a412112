"""CLI verbs for production: shadows (`taskfleet shadow start|stop|ls`) and how a task is
watched (`taskfleet production set|show|cut`).

A shadow is a challenger placed beside the champion that answers a sampled copy of live
requests; its answers never reach a caller and are compared with the champion's. Sampling, the
retention of sampled inputs, the evidence the promotion rule reads, drift and the live split
are the task's production settings. Local CLI users hold the database itself, so the registry
lets them act as admin (promoter rights suffice for shadows).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from taskfleet.console import bold, console, line
from taskfleet.context import open_registry

if TYPE_CHECKING:
    from registry import entities as e

out = console()
shadow_app = typer.Typer(help="A challenger beside the champion, on a sampled copy of traffic.")
production_app = typer.Typer(
    help="How a task is watched in production: sampling, feedback, drift, live split."
)


@shadow_app.command("start")
def shadow_start(
    task: str = typer.Argument(..., help="Task name."),
    candidate: str = typer.Argument(..., help="The challenger to run as the shadow."),
    sample: float = typer.Option(
        ..., "--sample", min=0.0, max=1.0, help="Share of the task's requests sampled (0..1)."
    ),
    runtime: str | None = typer.Option(
        None, "--runtime", help="Its runtime (default: the runtime of its newest eval run)."
    ),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the start)."),
) -> None:
    """Place CANDIDATE as TASK's shadow and sample a share of its requests (a recorded row)."""
    shadow = open_registry().start_shadow(
        task, candidate, sample_rate=sample, runtime=runtime, reason=reason
    )
    out.print(
        line(
            "shadow ",
            bold(shadow.candidate),
            f" started for {task} on the {shadow.runtime} runtime, sampling {sample:g} of its "
            f"requests (shadow epoch {shadow.epoch}). Agreement: taskfleet production show {task}",
        ),
        highlight=False,
    )


@shadow_app.command("stop")
def shadow_stop(
    task: str = typer.Argument(..., help="Task name."),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the stop)."),
) -> None:
    """End TASK's shadow (sampling goes on at the task's rate; `production set --sample 0`)."""
    shadow = open_registry().stop_shadow(task, reason=reason)
    out.print(line("shadow ", bold(shadow.candidate), f" of {task} stopped"), highlight=False)


@shadow_app.command("ls")
def shadow_ls(
    task: str | None = typer.Argument(None, help="Only this task."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Every shadow start and stop, newest first."""
    rows = open_registry().shadow_history(task)
    if as_json:
        typer.echo(json.dumps([_shadow_json(s) for s in rows], indent=1))
        return
    table = Table("when (UTC)", "task", "action", "candidate", "runtime", "sample", "who", "why")
    for s in rows:
        table.add_row(
            s.created_at.strftime("%Y-%m-%d %H:%M"),
            s.task,
            s.action,
            s.candidate,
            s.runtime,
            f"{s.sample_rate:g}",
            s.actor,
            s.reason,
        )
    out.print(table)


def _shadow_json(s: e.Shadow) -> dict[str, object]:
    return {
        "task": s.task,
        "action": s.action,
        "candidate": s.candidate,
        "runtime": s.runtime,
        "sample_rate": s.sample_rate,
        "epoch": s.epoch,
        "actor": s.actor,
        "reason": s.reason,
        "created_at": s.created_at.isoformat(),
        "published": s.published_at is not None,
    }


@production_app.command("set")
def production_set(
    task: str = typer.Argument(..., help="Task name."),
    sample: float | None = typer.Option(
        None, "--sample", min=0.0, max=1.0, help="Share of requests sampled (0: none kept)."
    ),
    retention_days: float | None = typer.Option(
        None, "--retention-days", help="How long sampled inputs are kept (default 7)."
    ),
    evidence: str | None = typer.Option(
        None,
        "--evidence",
        help="What the promotion rule compares: offline (the test split), live (the live "
        "split) or both.",
    ),
    drift_alpha: float | None = typer.Option(
        None, "--drift-alpha", help="False-alarm rate per drift window the task accepts."
    ),
    drift_window: int | None = typer.Option(
        None, "--drift-window", help="Sampled inputs per drift window."
    ),
    live_every: int | None = typer.Option(
        None, "--live-every", help="Labelled items per new live version of the suite."
    ),
) -> None:
    """Change some of TASK's production settings (the others keep their value)."""
    given = {
        "sample_rate": sample,
        "retention_days": retention_days,
        "evidence": evidence,
        "drift_alpha": drift_alpha,
        "drift_window": drift_window,
        "live_every": live_every,
    }
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        raise typer.BadParameter("name at least one setting to change (see --help)")
    settings = open_registry().set_production_settings(task, **changes)
    out.print(_settings_line(settings), highlight=False)


def _settings_line(s: e.ProductionSettings) -> str:
    return (
        f"{s.task}: sample {s.sample_rate:g}, retention {s.retention_days:g} days, evidence "
        f"{s.evidence}, drift alpha {s.drift_alpha:g} over windows of {s.drift_window}, a live "
        f"version every {s.live_every} labelled items"
    )


@production_app.command("show")
def production_show(
    task: str = typer.Argument(..., help="Task name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """TASK in production: settings, shadow and its agreement, drift, live split, staleness
    and the re-evaluation queue."""
    reg = open_registry()
    settings = reg.production_settings(task)
    shadow = reg.current_shadow(task)
    summary = reg.agreement_summary(task)
    windows = reg.drift_windows(task, limit=5)
    labelled, waiting = reg.live_counts(task)
    stale = reg.stale_pairings(task)
    queue = reg.list_reevaluations(task, limit=10)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "settings": settings.__dict__,
                    "shadow": _shadow_json(shadow) if shadow else None,
                    "agreement": _agreement_json(summary),
                    "drift": [_drift_json(w) for w in windows],
                    "live": {"items": labelled, "waiting": waiting},
                    "stale": [s.__dict__ for s in stale],
                    "reevaluations": [_reeval_json(r) for r in queue],
                },
                indent=1,
                default=str,
            )
        )
        return
    out.print(_settings_line(settings), highlight=False)
    who = f"{shadow.candidate} on {shadow.runtime}" if shadow else "none"
    out.print(f"shadow: {who}", highlight=False)
    if summary.estimate is not None:
        out.print(
            f"agreement of {summary.shadow}: {summary.estimate:.3f} "
            f"[{summary.low:.3f}, {summary.high:.3f}] over {summary.inputs} inputs; copies "
            + ", ".join(f"{k} {v}" for k, v in summary.outcomes.items()),
            highlight=False,
        )
    for w in windows:
        flag = "DRIFT" if w.drifted else "ok"
        signals = ", ".join(f"{s['name']} p={s['p_value']:.4f}" for s in w.signals)
        out.print(f"drift window {w.id} ({w.size} inputs): {flag} - {signals}", highlight=False)
    out.print(f"live split: {labelled} labelled items, {waiting} not in a version yet")
    for s in stale:
        out.print(f"stale: {s.role} {s.candidate} ({s.runtime}): {'; '.join(s.reasons)}")
    for r in queue:
        out.print(
            f"re-evaluation {r.id}: {r.candidate} on {r.split} of v{r.suite_version} - {r.state}"
            + (f" ({r.error})" if r.error else ""),
            highlight=False,
        )


def _agreement_json(s: e.AgreementSummary) -> dict[str, object]:
    return {
        "shadow": s.shadow,
        "inputs": s.inputs,
        "estimate": s.estimate,
        "ci": [s.low, s.high],
        "extra": s.extra,
        "outcomes": s.outcomes,
        "series": [p.__dict__ for p in s.series],
    }


def _drift_json(w: e.DriftWindow) -> dict[str, object]:
    return {
        "id": w.id,
        "size": w.size,
        "drifted": w.drifted,
        "p_min": w.p_min,
        "signals": w.signals,
    }


def _reeval_json(r: e.Reevaluation) -> dict[str, object]:
    return {
        "id": r.id,
        "candidate": r.candidate,
        "runtime": r.runtime,
        "suite_version": r.suite_version,
        "split": r.split,
        "state": r.state,
        "reason": r.reason,
        "eval_run_id": r.eval_run_id,
        "error": r.error,
    }


@production_app.command("cut")
def production_cut(task: str = typer.Argument(..., help="Task name.")) -> None:
    """Cut a live version of TASK's suite now, holding every labelled item (the control
    plane does this by itself every `--live-every` items)."""
    from taskfleet.context import get_settings
    from taskfleet.live_split import cut_live_version

    settings = get_settings()
    version, created = cut_live_version(
        open_registry(), task, settings.resolved_home, data_root=settings.data_dir
    )
    items = version.stats.get("live", {}).get("items", 0)
    what = "registered" if created else "already registered"
    out.print(
        line(
            f"live version {version.name}@{version.version} {what}: ",
            bold(f"{items} labelled items"),
            f"; evaluate on it with `taskfleet eval run {task} -c CANDIDATE --split live`",
        ),
        highlight=False,
    )
