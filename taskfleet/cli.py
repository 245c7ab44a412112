"""The `taskfleet` command line: one Typer app, one sub-app per area.

`--help` and the registry's own commands answer in a fraction of a second because the
`cli_*` modules import nothing heavy at module level: torch, mteb, MLflow, scikit-learn,
NATS and the like are imported inside the commands that use them
(`tests/test_cli_imports.py` holds that line).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from registry import RegistryError
from taskfleet import __version__
from taskfleet.cli_artifacts import artifacts_app
from taskfleet.cli_eval import eval_app
from taskfleet.cli_finetune import finetune_app
from taskfleet.cli_fleet import dlq_app, placement_app, placement_ls, up, worker
from taskfleet.cli_gateway import call, gateway
from taskfleet.cli_production import production_app, shadow_app
from taskfleet.cli_promote import promote, promotions, recommend, rollback
from taskfleet.cli_registry import adapter_app, candidate_app, db_app, key_app, model_app, task_app
from taskfleet.cli_serve import serve
from taskfleet.cli_suite import suite_app
from taskfleet.cli_tune import profile_app, tune
from taskfleet.console import console
from taskfleet.context import state

err = console(stderr=True)

app = typer.Typer(
    name="taskfleet",
    help="Serve a fleet of small, evaluated open models by task name.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(suite_app, name="suite")
app.add_typer(task_app, name="task")
app.add_typer(model_app, name="model")
app.add_typer(adapter_app, name="adapter")
app.add_typer(candidate_app, name="candidate")
app.add_typer(db_app, name="db")
app.add_typer(key_app, name="key")
app.add_typer(eval_app, name="eval")
app.add_typer(finetune_app, name="finetune")
app.add_typer(placement_app, name="placement")
app.add_typer(dlq_app, name="dlq")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(profile_app, name="profile")
app.add_typer(shadow_app, name="shadow")
app.add_typer(production_app, name="production")
app.command("serve")(serve)
app.command("gateway")(gateway)
app.command("call")(call)
app.command("worker")(worker)
app.command("up")(up)
app.command("tune")(tune)
app.command("promote")(promote)
app.command("rollback")(rollback)
app.command("promotions")(promotions)
app.command("recommend")(recommend)
app.command("placements", help="Desired vs reported placement epochs (same as `placement ls`).")(
    placement_ls
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"taskfleet {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    home: Path | None = typer.Option(
        None, "--home", help="Data directory (env TASKFLEET_HOME; default ~/.taskfleet)."
    ),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        help="Registry database URL (env TASKFLEET_DATABASE_URL; default SQLite under home).",
    ),
    actor: str | None = typer.Option(
        None, "--actor", help="Name recorded in the audit log (env TASKFLEET_ACTOR)."
    ),
    nats_url: str | None = typer.Option(
        None,
        "--nats-url",
        help="NATS server URL(s), comma-separated for a cluster (env TASKFLEET_NATS_URL).",
    ),
    nats_user: str | None = typer.Option(
        None,
        "--nats-user",
        help="NATS user (env TASKFLEET_NATS_USER); the password only from TASKFLEET_NATS_PASSWORD.",
    ),
    nats_creds: Path | None = typer.Option(
        None, "--nats-creds", help="NATS credentials file, JWT + nkey (env TASKFLEET_NATS_CREDS)."
    ),
    nats_tls_ca: Path | None = typer.Option(
        None,
        "--nats-tls-ca",
        help="CA certificate to trust for NATS TLS (env TASKFLEET_NATS_TLS_CA).",
    ),
    nats_tls_cert: Path | None = typer.Option(
        None,
        "--nats-tls-cert",
        help="Client certificate for NATS TLS (env TASKFLEET_NATS_TLS_CERT).",
    ),
    nats_tls_key: Path | None = typer.Option(
        None, "--nats-tls-key", help="Client certificate's key (env TASKFLEET_NATS_TLS_KEY)."
    ),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    state.overrides.update(
        home=home,
        database_url=database_url,
        actor=actor,
        nats_url=nats_url,
        nats_user=nats_user,
        nats_creds=nats_creds,
        nats_tls_ca=nats_tls_ca,
        nats_tls_cert=nats_tls_cert,
        nats_tls_key=nats_tls_key,
    )


def _known_errors() -> tuple[type[BaseException], ...]:
    """Errors the user can act on: printed as one line, never as a traceback.

    Looked up in `sys.modules`, never imported: an error can only have been raised by a module
    that is loaded, and the except clause in `main` is evaluated for every exception that
    reaches it, SystemExit of a successful command included."""
    errors: list[type[BaseException]] = [RegistryError]
    for module, name in (
        ("serving.runtime.model_folder", "ModelLoadError"),
        ("evals.errors", "EvalError"),
        ("finetune.errors", "FinetuneError"),
        ("serving.connection", "NatsOptionsError"),
        ("taskfleet.tune", "TuneError"),
        ("taskfleet.settings", "SettingsError"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:
            errors.append(getattr(loaded, name))
    return tuple(errors)


def _quiet_libraries() -> None:
    """Our progress bars and one-line messages are what a user should read; the libraries'
    weight-loading bars and deprecation chatter are noise on every command."""
    import logging
    import os
    import warnings

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)


def main() -> None:
    _quiet_libraries()
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted; nothing half-written was recorded")
        sys.exit(130)
    except _known_errors() as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
