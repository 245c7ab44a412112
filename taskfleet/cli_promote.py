"""CLI verbs for promotion: promote a challenger, roll back, read a task's promotion history.

The lead wires them as top-level commands (`taskfleet promote|rollback|promotions`). Desired vs
reported placement epochs are `taskfleet placement ls` (taskfleet/cli_fleet.py).
Local CLI users hold the database itself, so the registry lets them act as admin.
"""

from __future__ import annotations

import typer
from rich.table import Table

from taskfleet.console import bold, console, line, styled
from taskfleet.context import open_registry

out = console()


def promote(
    task: str = typer.Argument(..., help="Task name."),
    candidate: str = typer.Argument(..., help="The challenger to make champion."),
    reason: str = typer.Option("", "--reason", help="Why (recorded in the promotion history)."),
    override: bool = typer.Option(
        False, "--override", help="Promote although the rule is not met (admin; needs --reason)."
    ),
    pinned: bool | None = typer.Option(
        None,
        "--pinned/--lazy",
        help="Keep the model loaded, or load it on first demand (default: as the previous "
        "placement; pinned for a first champion).",
    ),
    replicas: int | None = typer.Option(
        None, "--replicas", min=1, help="Workers that should serve it (default: as before; 1)."
    ),
    runtime: str | None = typer.Option(
        None,
        "--runtime",
        help="Serve it on this runtime (torch, candle, http); default: the runtime of its "
        "latest eval run. Switching the champion's runtime needs an eval run through the new one.",
    ),
) -> None:
    """Make CANDIDATE (on a runtime) the champion of TASK if the promotion rule allows it."""
    reg = open_registry()
    check = reg.check_promotion(task, candidate, runtime)
    verdict = styled("passes", "green") if check.passes else styled("not met", "yellow")
    out.print(line("rule: ", verdict, f" - {check.reason}"), highlight=False)
    done = reg.promote(
        task,
        candidate,
        reason=reason,
        override=override,
        pinned=pinned,
        replicas=replicas,
        runtime=runtime,
    )
    was = f" (was {done.previous_candidate})" if done.previous_candidate else ""
    out.print(
        line(
            "promoted ",
            bold(done.candidate),
            f" to champion of {task}{was}; placement epoch {done.epoch} on the {done.runtime} "
            "runtime. Watch the fleet converge: taskfleet placement ls",
        ),
        highlight=False,
    )


def rollback(
    task: str = typer.Argument(..., help="Task name."),
    reason: str = typer.Option("", "--reason", help="Why (recorded in the promotion history)."),
) -> None:
    """Return TASK to the champion it had before the current one."""
    done = open_registry().rollback(task, reason=reason)
    out.print(
        line(
            f"rolled {task} back from {done.previous_candidate} to ",
            bold(done.candidate),
            f"; placement epoch {done.epoch} on the {done.runtime} runtime",
        ),
        highlight=False,
    )


def promotions(task: str = typer.Argument(..., help="Task name.")) -> None:
    """The promotion history of TASK, newest first: who, when, why, which epoch."""
    table = Table("when (UTC)", "kind", "from", "to", "runtime", "who", "epoch", "why")
    for p in open_registry().list_promotions(task):
        table.add_row(
            p.created_at.strftime("%Y-%m-%d %H:%M"),
            p.kind,
            p.previous_candidate or "-",
            p.candidate,
            p.runtime,
            p.actor,
            str(p.epoch),
            p.reason,
        )
    out.print(table)


def recommend(task: str = typer.Argument(..., help="Task name.")) -> None:
    """What TASK should serve under its preference (`taskfleet task prefer TASK best|cheapest`),
    with the reason and why each other candidate was not chosen. Writes nothing: promoting the
    recommendation is still a promotion."""
    reg = open_registry()
    rec = reg.recommend(task)
    t = reg.get_task(task)
    out.print(
        f"{task}: prefer {rec.prefer}, margin {t.margin:g}; champion {rec.champion or '-'}",
        highlight=False,
    )
    if rec.candidate is None:
        out.print(f"no recommendation: {rec.reason}", highlight=False)
    else:
        out.print(
            line("recommend ", bold(rec.candidate), f" on {rec.runtime}: {rec.reason}"),
            highlight=False,
        )
    for considered in rec.considered:
        out.print(f"  - {considered}", highlight=False)
    if rec.candidate and rec.candidate != rec.champion:
        out.print(f"promote it: taskfleet promote {task} {rec.candidate} --reason ...")
