"""CLI verbs for eval suites: `taskfleet suite add|ls|show`.

A suite is declared data: a kind, a folder (or an MTEB task), splits and a main metric. `add`
reads every declared split (bad input: one line naming the file and line, nothing registered),
fingerprints it and registers it; adding a changed folder under the same name registers the
next version. The built-in suites are registered the same way (`taskfleet suite add NAME`).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from taskfleet.console import bold, console, line
from taskfleet.context import get_settings, open_listing, open_registry
from taskfleet.suite_registration import Registered, SuiteDeclaration, register_suite

out = console()
suite_app = typer.Typer(
    help="Eval suites: declared data (retrieval, rerank, classification), versioned by content.",
    no_args_is_help=True,
)


def mteb_dir() -> Path:
    return get_settings().resolved_home / "suites"


def print_registered(result: Registered) -> None:
    s = result.suite
    counts = "; ".join(
        f"{split}: " + ", ".join(f"{v:,} {k}" for k, v in c.items())
        for split, c in result.split_counts.items()
    )
    source = "built-in declaration" if result.builtin else s.location
    if result.created:
        out.print(
            line("suite ", bold(s.name), f" version {s.version} registered ({s.kind}, {source})"),
            highlight=False,
        )
    else:
        out.print(
            line("suite ", bold(s.name), f" is unchanged: version {s.version} has this content"),
            highlight=False,
        )
    out.print(f"fingerprint {s.fingerprint}", highlight=False)
    if counts:
        out.print(counts, highlight=False)


@suite_app.command("add")
def suite_add(
    name: str = typer.Argument(..., help="Suite name, e.g. support-tickets."),
    kind: str | None = typer.Option(
        None, "--kind", help="retrieval, rerank or classification (required with --path)."
    ),
    path: Path | None = typer.Option(
        None,
        "--path",
        help="The suite's folder: retrieval = BEIR (corpus.jsonl, queries.jsonl, "
        "qrels/<split>.tsv); rerank = BEIR + top_ranked/<split>.jsonl; classification = "
        "<split>.jsonl rows {id, text, label} + labels.json.",
    ),
    mteb: str | None = typer.Option(
        None,
        "--mteb",
        help="Declare an MTEB task by name (its dataset must be in the local Hugging Face cache).",
    ),
    test_split: str | None = typer.Option(
        None, "--test-split", help="Split that scores candidates (default: test)."
    ),
    train_split: str | None = typer.Option(
        None, "--train-split", help="Split fine-tuning may use (default: train, if present)."
    ),
    main_metric: str | None = typer.Option(
        None,
        "--main-metric",
        help="Metric that ranks candidates (default: ndcg_at_10 for retrieval and rerank, "
        "macro_f1 for classification).",
    ),
    description: str = typer.Option("", "--description", help="What the suite measures."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Data root of the built-in suites (env TASKFLEET_DATA_DIR)."
    ),
) -> None:
    """Register a suite (or a new version of it). Without --path or --mteb, NAME must be a
    built-in suite: german-legal-retrieval, german-legal-rerank, german-legal-area."""
    declaration = SuiteDeclaration(
        name=name,
        kind=kind,
        path=path,
        mteb_task=mteb,
        test_split=test_split,
        train_split=train_split,
        main_metric=main_metric,
        description=description,
    )
    with out.status(f"reading and fingerprinting suite {name}..."):
        result = register_suite(
            open_registry(),
            declaration,
            data_root=data_dir or get_settings().data_dir,
            mteb_dir=mteb_dir(),
        )
    print_registered(result)


@suite_app.command("ls")
def suite_ls() -> None:
    """List suites (their newest versions)."""
    table = Table("suite", "version", "kind", "test", "train", "main metric", "fingerprint")
    for s in open_listing().list_suites():
        table.add_row(
            s.name,
            str(s.version),
            s.kind,
            s.test_split,
            s.train_split or "-",
            s.main_metric,
            s.fingerprint[:12],
        )
    out.print(table)


@suite_app.command("show")
def suite_show(
    name: str = typer.Argument(..., help="Suite name."),
    version: int | None = typer.Option(None, "--version", help="A version (default: newest)."),
) -> None:
    """Show a suite version: declaration, counts, fingerprint, versions, tasks using it."""
    reg = open_registry()
    s = reg.get_suite(name, version)
    for key, value in (
        ("name", s.name),
        ("version", s.version),
        ("kind", s.kind),
        ("location", s.location),
        ("test split", s.test_split),
        ("train split", s.train_split or "-"),
        ("metrics", ", ".join(s.metrics)),
        ("main metric", s.main_metric),
        ("fingerprint", s.fingerprint),
        ("mteb task", s.mteb_task or "-"),
        ("description", s.description or "-"),
    ):
        out.print(f"{key:>12}: {value}", highlight=False)
    for split, counts in s.stats.items():
        listing = ", ".join(f"{v:,} {k}" for k, v in counts.items())
        out.print(f"{'split ' + split:>12}: {listing}", highlight=False)
    versions = ", ".join(
        f"{v.version} ({v.fingerprint[:12]}, {v.created_at:%Y-%m-%d %H:%M})"
        for v in reg.suite_versions(name)
    )
    out.print(f"{'versions':>12}: {versions}", highlight=False)
    tasks = [t.name for t in reg.list_tasks() if t.suite == name]
    out.print(f"{'tasks':>12}: {', '.join(tasks) or '-'}", highlight=False)
