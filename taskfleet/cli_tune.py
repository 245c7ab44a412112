"""CLI verbs for runtime profiles: `taskfleet tune TASK` (the sweep, taskfleet/tune.py) and
`taskfleet profile ls|rm`. Wired in taskfleet/cli.py as ``tune`` and ``profile``."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from taskfleet.console import console
from taskfleet.context import get_settings, open_registry

out = console()
err = console(stderr=True)

profile_app = typer.Typer(
    help="Runtime profiles: the settings `taskfleet tune` found per model and machine class.",
    no_args_is_help=True,
)


def tune(
    task: str = typer.Argument(..., help="Task whose served model is tuned."),
    p99_ms: float = typer.Option(
        500.0, "--p99-ms", help="Latency bound: a level counts only if its p99 is within it."
    ),
    knob: list[str] | None = typer.Option(
        None,
        "--knob",
        help="NAME=V1[,V2...]: sweep only these values (repeatable; knobs: max_batch_tokens, "
        "max_batch_wait_ms, intra_op_threads, runtimes, max_padding, engine). Default: each "
        "knob's usual candidates. The defaults are always measured.",
    ),
    levels: str = typer.Option(
        "1,8,32", "--levels", help="Concurrency levels (requests of one text in flight)."
    ),
    seconds: float = typer.Option(8.0, "--seconds", help="Seconds each level is measured."),
    texts: Path | None = typer.Option(
        None, "--texts", help="A file of texts to send, one a line (default: the suite's)."
    ),
    device: str = typer.Option("cpu", help="torch device of the tuned runtime (cpu, cuda:0)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Measure, record nothing."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Also write the sweep's figures to this file."
    ),
) -> None:
    """Sweep the served model's runtime knobs on this machine through a private stack, apply the
    best, measure it again and record it as the model's profile for this machine class (only
    workers of this class apply it)."""
    from registry import InvalidInput
    from taskfleet.tune import TuneError, parse_knobs
    from taskfleet.tune import tune as run_tune

    try:
        concurrency = [int(x) for x in levels.split(",")]
    except ValueError:
        raise InvalidInput(f"--levels {levels!r} must be whole numbers, comma-separated") from None
    pool = None
    if texts is not None:
        if not texts.is_file():
            raise InvalidInput(f"--texts {texts} is not a file")
        pool = [t for t in texts.read_text(encoding="utf-8").splitlines() if t.strip()]
        if not pool:
            raise InvalidInput(f"--texts {texts} holds no text")
    try:
        result = run_tune(
            open_registry(), task, p99_ms=p99_ms, texts=pool, knobs=parse_knobs(knob or []),
            levels=concurrency, seconds=seconds, device=device,
            data_root=get_settings().data_dir, record=not dry_run, progress=out.print,
        )  # fmt: skip
    except TuneError as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if json_out is not None:
        json_out.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    table = Table("settings", "texts/s at the bound", *(f"c={c}" for c in concurrency))
    for m in result.sweep:
        table.add_row(
            json.dumps(m.settings) if m.settings else "defaults",
            f"{m.throughput:.1f}",
            *(f"{lv.texts_per_s:.1f}/s {lv.p99_ms:.0f} ms" for lv in m.levels),
        )
    out.print(table)
    best, again = result.best, result.again
    assert best is not None
    if result.profile is not None and again is not None:
        out.print(
            f"recorded profile {result.profile.id} for {result.model} on {result.machine_class}: "
            f"{json.dumps(best.settings)}; measured again {again.throughput:.1f} texts/s "
            f"({again.throughput / best.throughput:.2f}x the sweep's best)",
            markup=False,
        )
    elif not best.settings:
        out.print("the defaults were best: no profile recorded", markup=False)
    elif again is not None:
        out.print(
            f"{json.dumps(best.settings)} measured again {again.throughput:.1f} texts/s, below "
            f"the defaults' {result.defaults.throughput:.1f}: "
            + ("nothing recorded (--dry-run)" if dry_run else "the defaults are kept"),
            markup=False,
        )
    out.print(f"**{result.ratio:.2f}x** the defaults ({result.seconds:.0f} s)", markup=False)


@profile_app.command("ls")
def profile_ls(
    model: str | None = typer.Argument(None, help="Only this base model's profiles."),
) -> None:
    """List runtime profiles: model, machine class, settings, figures of their sweep."""
    table = Table("id", "model", "machine class", "settings", "texts/s", "x defaults", "task")
    for p in open_registry().list_profiles(model):
        ratio = p.throughput / p.default_throughput if p.default_throughput else 0.0
        table.add_row(
            str(p.id), p.model, p.machine_class, json.dumps(p.settings.changed()),
            f"{p.throughput:.1f}", f"{ratio:.2f}x", p.task,
        )  # fmt: skip
    out.print(table)


@profile_app.command("rm")
def profile_rm(
    model: str = typer.Argument(..., help="Base model name."),
    machine_class: str = typer.Argument(..., help="Machine class, as `profile ls` shows it."),
) -> None:
    """Remove a profile: the model's placements are published again without it."""
    removed = open_registry().remove_profile(model, machine_class)
    out.print(f"removed profile {removed.id} of {model} on {machine_class}", markup=False)
