"""`taskfleet serve`: the control plane (REST API + dashboard) on one port, and its NATS side.

Beside the HTTP app it runs the control loops (`serving/control.py`): placement publisher,
fleet watcher and directory publisher, on the one control plane that leads when several run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
from pathlib import Path

import typer

from taskfleet.console import console
from taskfleet.context import get_settings, open_registry
from taskfleet.server_options import (
    ALLOWED_HOSTS,
    FORWARDED_ALLOW_IPS,
    INSECURE,
    MODEL_ROOTS,
    REEVALUATE,
    server_edge,
)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

out = console()


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8600, help="Port to bind."),
    auth: bool = typer.Option(
        True, "--auth/--no-auth", help="Require API keys (turn off only on a trusted laptop)."
    ),
    secure_cookies: bool | None = typer.Option(
        None,
        "--secure-cookies/--no-secure-cookies",
        help="Dashboard cookies over HTTPS only (default: TASKFLEET_SECURE_COOKIES, off).",
    ),
    nats_url: str | None = typer.Option(
        None,
        "--nats-url",
        help="NATS server URL(s) of the fleet, comma-separated for a cluster (env "
        "TASKFLEET_NATS_URL; default: the NATS of a running `taskfleet up` on this home, else "
        f"{DEFAULT_NATS_URL}); credentials and TLS: see `taskfleet --help`.",
    ),
    publish: bool = typer.Option(
        True,
        "--publish/--no-publish",
        help="Publish placements and mirror the fleet (one leader among all control planes "
        "on this NATS). --no-publish: the HTTP side only.",
    ),
    insecure: bool = INSECURE,
    forwarded_allow_ips: str | None = FORWARDED_ALLOW_IPS,
    allowed_host: list[str] | None = ALLOWED_HOSTS,
    model_root: list[Path] | None = MODEL_ROOTS,
    reevaluate: bool = REEVALUATE,
) -> None:
    """Run the control plane: REST API (OpenAPI docs at /docs), the web dashboard (/) and,
    unless --no-publish, the placement publisher and fleet watcher.

    Any number may run against one NATS and one database: one leads (a lock in NATS KV),
    the others stand by and take over when it dies. While NATS is unreachable the dashboard
    and REST API keep serving from the database; publishing waits for NATS.
    """
    from registry.api import create_app
    from serving.control import ControlLoops
    from taskfleet.baseline_builder import fit_baseline
    from taskfleet.cli_fleet import artifact_source, nats_url_or_none
    from taskfleet.stack import QuietServer
    from taskfleet.suite_registration import rest_suite_reader
    from taskfleet.variant_builder import build_variant

    edge = server_edge(
        host,
        auth=auth,
        insecure=insecure,
        forwarded_allow_ips=forwarded_allow_ips,
        allowed_hosts=allowed_host,
        model_roots=model_root,
    )
    settings = get_settings()
    registry = open_registry()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    loops: ControlLoops | None = None
    if publish:
        url = settings.nats_options(nats_url or nats_url_or_none() or DEFAULT_NATS_URL)
        assert url is not None
        from taskfleet.production import production_loops, shell_paths

        loops = ControlLoops(
            registry,
            url,
            announce=_say,
            artifact_source=artifact_source(),
            probe_period_s=settings.endpoint_probe_period_s,
            extra_loops=production_loops(
                registry, url, shell_paths(settings), reevaluate=reevaluate
            ),
        )
    app = create_app(
        registry,
        require_auth=auth,
        session_secret=settings.resolved_session_secret(),
        secure_cookies=settings.secure_cookies if secure_cookies is None else secure_cookies,
        health=loops.describe if loops else (lambda: {"publisher": "off"}),
        read_suite=rest_suite_reader(
            data_root=settings.data_dir, mteb_dir=settings.resolved_home / "suites"
        ),
        build_variant=build_variant,
        fit_baseline=functools.partial(fit_baseline, data_root=settings.data_dir),
        metrics_token=settings.metrics_token or None,
        model_roots=edge.model_roots,
        allowed_hosts=edge.allowed_hosts,
    )
    server = QuietServer(
        app, host, port, log_level="info", forwarded_allow_ips=edge.forwarded_allow_ips
    )
    if loops is None:
        _say(
            "not publishing (--no-publish): promotions reach the fleet through another "
            "control plane"
        )

    import asyncio  # not at module level: `--help` and the listings never run a loop

    async def main() -> None:
        # One handler for both parts: the server stops, then the loops (which hand the lead on).
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        running = asyncio.create_task(loops.run()) if loops else None
        try:
            await server.serve()
        finally:
            if loops is not None and running is not None:
                loops.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(running, 15)

    asyncio.run(main())


def _say(message: str) -> None:
    out.print(f"control plane: {message}", markup=False, highlight=False, soft_wrap=True)
