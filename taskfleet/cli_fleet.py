"""CLI verbs for the fleet: placements (desired vs reported), dead letters, and `taskfleet up`.

Wired in taskfleet/cli.py as ``placement``, ``dlq`` and ``up``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.table import Table

from taskfleet.console import bold, console, line, styled
from taskfleet.context import get_settings, open_listing, open_registry
from taskfleet.server_options import (
    ALLOWED_HOSTS,
    FORWARDED_ALLOW_IPS,
    INSECURE,
    MODEL_ROOTS,
    REEVALUATE,
    server_edge,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from registry import Registry
    from registry.listing import Listing
    from serving.connection import NatsOptions
    from serving.dlq import ReplayOutcome

out = console()
err = console(stderr=True)
T = TypeVar("T")

placement_app = typer.Typer(
    help="Placements: which task runs what on the fleet.", no_args_is_help=True
)
dlq_app = typer.Typer(help="Dead letters: requests the fleet gave up on.", no_args_is_help=True)

STACK_FILE = "stack.json"


def fail(message: str) -> typer.Exit:
    err.print(f"error: {message}", style="red", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(1)


def stack_file() -> Path:
    return get_settings().resolved_home / "run" / STACK_FILE


def write_stack_state(path: Path, state: dict[str, Any]) -> None:
    """Publish ``state`` at ``path`` whole or not at all: a reader polling for the file (a CLI
    command looking for the running stack's NATS, a test, `taskfleet tune`) never sees it
    created but still empty, as `write_text` would show it between truncate and write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(state))
    os.replace(staging, path)


def nats_url_or_none() -> str | None:
    """TASKFLEET_NATS_URL, else the NATS of a running `taskfleet up` on this home."""
    settings = get_settings()
    if settings.nats_url:
        return settings.nats_url
    try:
        return str(json.loads(stack_file().read_text())["nats"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def artifact_source(given: str | None = None) -> str | None:
    """The artifact source (``given``, else TASKFLEET_ARTIFACT_SOURCE): None for the NATS
    object store, else an s3:// URL whose credentials are in the environment."""
    from serving.artifact_source_s3 import ArtifactSourceError, check_source

    try:
        return check_source(given or get_settings().artifact_source)
    except ArtifactSourceError as exc:
        raise fail(str(exc)) from None


def nats_target_or_none() -> NatsOptions | None:
    """:func:`nats_url_or_none` with the NATS credentials and TLS settings."""
    return get_settings().nats_options(nats_url_or_none())


def nats_call(url: NatsOptions, action: Callable[[NATS], Awaitable[T]]) -> T:
    """Run ``action(nc)`` on a fresh connection that fails fast when NATS is away."""
    from serving.connection import connect_once

    async def run() -> T:
        nc = await connect_once(url, name="taskfleet-cli")
        try:
            return await action(nc)
        finally:
            await nc.close()

    import asyncio  # not at module level: `--help` and the listings never run a loop

    return asyncio.run(run())


def _require_nats() -> NatsOptions:
    url = nats_target_or_none()
    if url is None:
        raise fail("no NATS to talk to: start `taskfleet up` or set TASKFLEET_NATS_URL")
    return url


# ---- placements --------------------------------------------------------------------------
@placement_app.command("set")
def placement_set(
    task: str = typer.Argument(..., help="Task name."),
    candidate: str | None = typer.Argument(
        None,
        help="Must be the task's champion: what is served changes only by `taskfleet promote` "
        "or `rollback`.",
    ),
    pinned: bool | None = typer.Option(
        None, "--pinned/--lazy", help="Keep loaded (never evicted), or load on first demand."
    ),
    replicas: int | None = typer.Option(
        None, "--replicas", min=1, help="Workers that should serve it."
    ),
    reason: str = typer.Option("", "--reason", help="Why (recorded in the promotion history)."),
) -> None:
    """Change how the champion of TASK is served (a new epoch), then publish it if NATS is up."""
    from serving.artifact_source_s3 import bucket_for
    from serving.nats_layout import ensure_layout
    from serving.publisher import (
        PlacementError,
        placement_value,
        put_placement,
        upload_artifacts,
    )

    source = artifact_source()
    reg = open_registry()
    placement = reg.update_placement(
        task, pinned=pinned, replicas=replicas, candidate=candidate, reason=reason
    )
    try:
        value, folders = placement_value(reg, placement)
    except PlacementError as exc:
        raise fail(
            f"placement {task}@{placement.epoch} recorded but cannot be served: {exc}"
        ) from None
    out.print(
        line(
            "placement ",
            bold(task),
            f" epoch {placement.epoch}: {placement.candidate} "
            f"({'pinned' if placement.pinned else 'lazy'}, {placement.replicas} replica(s), "
            f"model {value.model_key})",
        )
    )
    url = nats_target_or_none()

    async def publish(nc: NATS) -> None:
        layout = await ensure_layout(nc.jetstream())
        await upload_artifacts(bucket_for(source, layout.artifacts), folders)
        await put_placement(layout.placements, value)

    try:
        if url is None:
            raise ConnectionError("no NATS URL")
        nats_call(url, publish)
    except Exception as exc:  # NATS away: the outbox keeps it
        why = str(exc) or type(exc).__name__
        out.print(f"not published now ({why}); the running publisher will publish it")
        return
    reg.mark_published(task, placement.epoch)
    out.print(f"published to the fleet via {url}")


def _age(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = (datetime.now(UTC) - when).total_seconds()
    return f"{seconds:.0f}s ago" if seconds < 120 else f"{seconds / 60:.0f}m ago"


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@placement_app.command("ls")
def placement_ls(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Desired vs reported epoch per task, and what each worker holds (from the registry)."""
    reg = open_listing()
    if as_json:
        typer.echo(json.dumps(_fleet_json(reg), indent=2, default=str))
        return
    table = Table("task", "candidate", "desired", "mode", "published", "reported by workers", "ok")
    for s in reg.placement_status():
        reported = ", ".join(f"{w}@{e}" for w, e in sorted(s.reported.items())) or "-"
        table.add_row(
            s.task,
            s.candidate,
            str(s.desired_epoch),
            f"{'pinned' if s.pinned else 'lazy'} x{s.replicas}",
            _age(s.published_at) if s.published_at else styled("pending", "yellow"),
            reported,
            styled("yes", "green") if s.converged else styled("no", "yellow"),
        )
    out.print(table)
    workers = Table("worker", "host", "state", "last beat", "loaded", "memory", "queue")
    for w in reg.list_workers():
        workers.add_row(
            w.worker_id,
            w.host,
            styled("up", "green") if w.reachable else styled("silent", "red"),
            _age(w.seen_at),
            "\n".join(w.loaded) or "-",
            f"{_mb(w.memory_used)} / {_mb(w.memory_budget)}",
            ", ".join(f"{t}:{n}" for t, n in sorted(w.queue_depth.items())) or "-",
        )
    out.print(workers)


def _fleet_json(reg: Registry | Listing) -> dict[str, Any]:
    return {
        "placements": [
            {**asdict(s), "converged": s.converged, "converged_workers": s.converged_workers}
            for s in reg.placement_status()
        ],
        "workers": [asdict(w) for w in reg.list_workers()],
    }


# ---- dead letters ------------------------------------------------------------------------
@dlq_app.command("ls")
def dlq_ls(
    task: str | None = typer.Option(None, "--task", help="Only this task."),
    limit: int = typer.Option(100, min=1, help="At most this many (oldest first)."),
) -> None:
    """List dead letters with the error that sent them there."""
    from serving.dlq import list_dead_letters

    url = _require_nats()
    try:
        letters = nats_call(url, lambda nc: list_dead_letters(nc.jetstream(), task, limit))
    except ValueError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:
        raise fail(f"cannot read the DLQ from {url}: {exc or type(exc).__name__}") from None
    table = Table("#", "task", "request", "when", "what", "error")
    for d in letters:
        table.add_row(str(d.seq), d.task, d.request_id, _age(d.time), d.summary, d.error)
    out.print(table if letters else "the DLQ is empty")


@dlq_app.command("replay")
def dlq_replay(
    seqs: list[int] = typer.Argument(None, help="Dead letter numbers (from `dlq ls`)."),
    task: str | None = typer.Option(None, "--task", help="Replay every dead letter of a task."),
    wait: float = typer.Option(30.0, help="Seconds to wait for each reply (0: do not wait)."),
    keep: bool = typer.Option(False, "--keep", help="Leave the dead letters in the DLQ."),
) -> None:
    """Publish dead letters' original requests to tasks.<task> again."""
    from serving.dlq import DeadLetterNotFound, list_dead_letters, replay
    from serving.protocol import ReplyOk

    if not seqs and not task:
        raise fail("name dead letters by number or give --task")
    url = _require_nats()

    async def action(nc: NATS) -> list[ReplayOutcome]:
        chosen = list(seqs or [])
        if task:
            chosen += [d.seq for d in await list_dead_letters(nc.jetstream(), task, 10_000)]
        return await replay(nc, chosen, wait_s=wait, keep=keep)

    try:
        outcomes = nats_call(url, action)
    except (DeadLetterNotFound, ValueError) as exc:
        raise fail(str(exc)) from None
    for o in outcomes:
        if o.reply is None:
            state = "queued" if wait <= 0 else f"no reply within {wait:g}s"
        elif isinstance(o.reply, ReplyOk):
            state = f"ok ({o.reply.count} x {o.reply.dims}, {o.reply.model_key})"
        else:
            state = f"failed again: {o.reply.error.code}: {o.reply.error.message}"
        out.print(f"#{o.seq} {o.task} -> {o.request_id}: {state}")


# ---- one worker --------------------------------------------------------------------------
def worker(
    nats_url: str = typer.Option(
        ...,
        "--nats-url",
        envvar="TASKFLEET_NATS_URL",
        help="NATS server URL(s), comma-separated for a cluster; credentials and TLS: see "
        "`taskfleet --help`.",
    ),
    cache_dir: Path = typer.Option(
        ...,
        "--cache-dir",
        help="This worker's own folder: the runtime socket, and under artifacts/ the models "
        "and adapters it fetched from NATS (by sha256, verified; kept across restarts).",
    ),
    runtime: str = typer.Option("torch", "--runtime", help="torch, candle or http."),
    worker_id: str | None = typer.Option(None, "--worker-id", help="Default: <host>-<pid>."),
    memory_budget_mb: int = typer.Option(8192, "--memory-budget-mb", min=1),
    device: str = typer.Option("cpu", help="torch runtime: device (cpu, cuda:0)."),
    http_url: str | None = typer.Option(None, "--http-url", help="http runtime: engine URL."),
    http_model: str | None = typer.Option(None, "--http-model", help="http runtime: model id."),
    sidecar_bin: Path | None = typer.Option(None, help="taskfleet-sidecar binary to use."),
    cache_max_mb: int = typer.Option(
        0,
        "--cache-max-mb",
        min=0,
        help="Most MiB of models and adapters the cache keeps (0: no limit): after each fetch "
        "the least recently used ones no current placement names are removed.",
    ),
    source: str | None = typer.Option(
        None,
        "--artifact-source",
        envvar="TASKFLEET_ARTIFACT_SOURCE",
        help="Where models and adapters come from: empty for the NATS object store, or the "
        "control plane's s3://bucket/prefix (AWS_* variables: credentials, AWS_ENDPOINT_URL).",
    ),
) -> None:
    """Run one worker: the sidecar and its runtime. Needs NATS and a cache dir, no database.

    It serves the placements that name its runtime, until SIGTERM (in-flight batches finish)."""
    from taskfleet.stack import (
        REPO_ROOT,
        StackError,
        check_sidecar_runtimes,
        find_sidecar_binary,
        runtime_args,
    )

    nats = get_settings().nats_options(nats_url)
    assert nats is not None  # the option is required
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        binary = find_sidecar_binary(sidecar_bin)
        flags = runtime_args(
            runtime,
            device=device,
            socket_path=cache_dir / "runtime.sock",
            http_url=http_url,
            http_model=http_model,
        )
        check_sidecar_runtimes(binary, [runtime])
    except (StackError, OSError) as exc:
        raise fail(str(exc)) from None
    command = [str(binary), *nats.sidecar_args(), *flags]
    command += ["--memory-budget-bytes", str(memory_budget_mb * 2**20)]
    command += ["--artifact-cache", str(cache_dir / "artifacts")]
    command += ["--artifact-cache-max-bytes", str(cache_max_mb * 2**20)]
    source = artifact_source(source)
    if source:
        command += ["--artifact-source", source]
    if worker_id:
        command += ["--worker-id", worker_id]
    from serving.machine import machine_class

    command += ["--machine-class", machine_class(device if runtime == "torch" else "cpu")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **nats.sidecar_env()}
    # The torch runtime is `python -m serving.runtime.server`: it must find the project.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    out.print(f"worker ({runtime}) -> {nats}; cache {cache_dir}")
    # The sidecar takes this process's place: signals reach it directly.
    os.execve(str(binary), command, env)


# ---- the whole stack ---------------------------------------------------------------------
def up(
    workers: int = typer.Option(1, "--workers", min=0, help="Sidecar+runtime pairs to start."),
    host: str = typer.Option("127.0.0.1", help="Address the HTTP servers bind."),
    port: int = typer.Option(8700, "--port", help="Gateway port (embeddings API)."),
    control_port: int = typer.Option(8600, "--control-port", help="Control plane port."),
    nats_cluster: int = typer.Option(
        1,
        "--nats-cluster",
        min=1,
        help="Embedded nats-server nodes: 3 runs a local cluster (routes, one store dir each) "
        "with every stream, KV bucket and object store replicated on 3 nodes.",
    ),
    auth: bool = typer.Option(True, "--auth/--no-auth", help="Require API keys."),
    memory_budget_mb: int = typer.Option(
        8192, "--memory-budget-mb", min=1, help="Model memory per worker."
    ),
    device: str = typer.Option("cpu", help="torch device of the runtimes (cpu, cuda:0)."),
    sidecar_bin: Path | None = typer.Option(None, help="taskfleet-sidecar binary to use."),
    secure_cookies: bool | None = typer.Option(
        None,
        "--secure-cookies/--no-secure-cookies",
        help="Dashboard cookies over HTTPS only (default: TASKFLEET_SECURE_COOKIES, off).",
    ),
    candle_workers: int = typer.Option(
        0, "--candle-workers", min=0, help="Workers with the Candle runtime (no Python)."
    ),
    http_workers: int = typer.Option(
        0, "--http-workers", min=0, help="Workers driving an OpenAI-compatible engine."
    ),
    http_url: str | None = typer.Option(
        None,
        "--http-url",
        help="The engine's base URL for --http-workers (none: they serve endpoint models only, "
        "each at the URL it was registered with).",
    ),
    http_model: str | None = typer.Option(
        None, "--http-model", help="The engine's model id (default: its only one)."
    ),
    insecure: bool = INSECURE,
    forwarded_allow_ips: str | None = FORWARDED_ALLOW_IPS,
    allowed_host: list[str] | None = ALLOWED_HOSTS,
    model_root: list[Path] | None = MODEL_ROOTS,
    reevaluate: bool = REEVALUATE,
) -> None:
    """Start the whole fleet on this machine; Ctrl-C stops everything. `--workers` start torch
    workers; a task is served by the workers of the runtime its placement names."""
    from taskfleet.stack import StackConfig, StackError, StackUrls, run_stack

    edge = server_edge(
        host,
        auth=auth,
        insecure=insecure,
        forwarded_allow_ips=forwarded_allow_ips,
        allowed_hosts=allowed_host,
        model_roots=model_root,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    config = StackConfig(
        home=settings.resolved_home,
        workers=workers,
        host=host,
        port=port,
        control_port=control_port,
        nats_url=settings.nats_options(),
        nats_cluster=nats_cluster,
        require_auth=auth,
        metrics_token=settings.metrics_token or None,
        memory_budget_bytes=memory_budget_mb * 2**20,
        sidecar_binary=sidecar_bin,
        device=device,
        session_secret=settings.resolved_session_secret(),
        secure_cookies=settings.secure_cookies if secure_cookies is None else secure_cookies,
        candle_workers=candle_workers,
        http_workers=http_workers,
        http_url=http_url,
        http_model=http_model,
        data_dir=settings.data_dir,
        artifact_source=artifact_source(),
        forwarded_allow_ips=edge.forwarded_allow_ips,
        allowed_hosts=edge.allowed_hosts,
        model_roots=edge.model_roots,
        probe_period_s=settings.endpoint_probe_period_s,
        database_url=settings.resolved_database_url,
        mlflow_uri=settings.resolved_mlflow_uri,
        reevaluate=reevaluate,
    )
    state = stack_file()

    def ready(urls: StackUrls) -> None:
        write_stack_state(state, {**urls.__dict__, "pid": os.getpid()})
        out.print(f"gateway        {urls.gateway}   (POST /v1/tasks/<task>, /v1/embeddings)")
        out.print(f"control plane  {urls.control_plane}   (REST API, docs at /docs)")
        out.print(f"nats           {urls.nats}")
        out.print(f"workers        {', '.join(urls.workers) or '-'}")
        out.print(f"metrics        {' '.join(urls.metrics)}")
        if auth and not settings.metrics_token:
            out.print(
                "               (the gateway's /metrics is off: set TASKFLEET_METRICS_TOKEN "
                "to scrape it with that bearer token)"
            )
        out.print("Ctrl-C stops everything.")

    try:
        import asyncio

        asyncio.run(run_stack(config, open_registry(), ready))
    except StackError as exc:
        raise fail(str(exc)) from None
    finally:
        state.unlink(missing_ok=True)
    out.print("stopped")
