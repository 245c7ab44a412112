"""The `taskfleet` command line: one Typer app, one sub-app per area.

`--help` and the registry's own commands answer in a fraction of a second: the `cli_*` modules
import nothing heavy at module level (torch, mteb, MLflow, scikit-learn, NATS and the like are
imported inside the commands that use them), and `main` builds only the command or group the
command line names, so `taskfleet task ls` imports `cli_registry` and not the other areas'
modules (`tests/test_cli_imports.py` holds both lines).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import typer

from registry import RegistryError
from taskfleet import __version__
from taskfleet.console import console
from taskfleet.context import state

err = console(stderr=True)

# Every group (a sub-app) and command, as (module, attribute), in the order `--help` lists them.
GROUPS: dict[str, tuple[str, str]] = {
    "suite": ("taskfleet.cli_suite", "suite_app"),
    "task": ("taskfleet.cli_registry", "task_app"),
    "model": ("taskfleet.cli_registry", "model_app"),
    "adapter": ("taskfleet.cli_registry", "adapter_app"),
    "candidate": ("taskfleet.cli_registry", "candidate_app"),
    "db": ("taskfleet.cli_registry", "db_app"),
    "key": ("taskfleet.cli_registry", "key_app"),
    "eval": ("taskfleet.cli_eval", "eval_app"),
    "finetune": ("taskfleet.cli_finetune", "finetune_app"),
    "placement": ("taskfleet.cli_fleet", "placement_app"),
    "dlq": ("taskfleet.cli_fleet", "dlq_app"),
    "artifacts": ("taskfleet.cli_artifacts", "artifacts_app"),
    "profile": ("taskfleet.cli_tune", "profile_app"),
    "shadow": ("taskfleet.cli_production", "shadow_app"),
    "production": ("taskfleet.cli_production", "production_app"),
}
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("taskfleet.cli_serve", "serve"),
    "gateway": ("taskfleet.cli_gateway", "gateway"),
    "call": ("taskfleet.cli_gateway", "call"),
    "worker": ("taskfleet.cli_fleet", "worker"),
    "up": ("taskfleet.cli_fleet", "up"),
    "tune": ("taskfleet.cli_tune", "tune"),
    "promote": ("taskfleet.cli_promote", "promote"),
    "rollback": ("taskfleet.cli_promote", "rollback"),
    "promotions": ("taskfleet.cli_promote", "promotions"),
    "recommend": ("taskfleet.cli_promote", "recommend"),
    "placements": ("taskfleet.cli_fleet", "placement_ls"),
}
COMMAND_HELP = {"placements": "Desired vs reported placement epochs (same as `placement ls`)."}


def _attribute(where: tuple[str, str]) -> Any:
    module, name = where
    return getattr(importlib.import_module(module), name)


def build_app(only: str | None = None) -> typer.Typer:
    """The command line with every group and command, or with only the one named ``only``
    (what `main` runs: the others' modules are then never imported)."""
    built = typer.Typer(
        name="taskfleet",
        help="Serve a fleet of small, evaluated open models by task name.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    built.callback()(_global)
    for name, where in GROUPS.items():
        if only in (None, name):
            built.add_typer(_attribute(where), name=name)
    for name, where in COMMANDS.items():
        if only in (None, name):
            built.command(name, help=COMMAND_HELP.get(name))(_attribute(where))
    return built


def __getattr__(name: str) -> typer.Typer:
    """`taskfleet.cli.app`: the whole command line (tests, docs), built on first use."""
    if name == "app":
        whole = build_app()
        globals()["app"] = whole
        return whole
    raise AttributeError(f"module 'taskfleet.cli' has no attribute {name!r}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"taskfleet {__version__}")
        raise typer.Exit()


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


def _command_word(args: list[str]) -> str | None:
    """The group or command ``args`` name: the first word that is not a global option or the
    value of one (`taskfleet --home H task ls` names `task`)."""
    takes_value = {
        decl
        for parameter in inspect.signature(_global).parameters.values()
        if parameter.default.default is not False  # --version is the one flag
        for decl in parameter.default.param_decls
    }
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("-"):
            return word
        i += 2 if word in takes_value else 1
    return None


def main() -> None:
    _quiet_libraries()
    word = _command_word(sys.argv[1:])
    # A word that names nothing gets the whole app, so the error lists what there is.
    app = build_app(word if word in GROUPS or word in COMMANDS else None)
    try:
        app()
    except _known_errors() as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except (KeyboardInterrupt, Exception) as exc:
        # Ctrl-C, also when Python passed it on wrapped (see caused_by_ctrl_c).
        from finetune.errors import caused_by_ctrl_c

        if not caused_by_ctrl_c(exc):
            raise
        err.print("interrupted; nothing half-written was recorded")
        sys.exit(130)
