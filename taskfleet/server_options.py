"""What every command that runs an HTTP server (`serve`, `gateway`, `up`) is told about its
edge: whether it may run without keys where others reach it, which proxies' forwarded headers
it believes, which Host names the control plane answers to, which folders REST may register
models from; and (`serve`, `up`) whether the leading control plane runs re-evaluations. The
options are declared once here; flags override the `TASKFLEET_*` settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import typer

from taskfleet.console import console
from taskfleet.context import get_settings

err = console(stderr=True)

INSECURE = typer.Option(
    False,
    "--insecure",
    help="Allow --no-auth on an address other machines can reach (anyone there gets in "
    "without a key).",
)
FORWARDED_ALLOW_IPS = typer.Option(
    None,
    "--forwarded-allow-ips",
    help="Proxies whose X-Forwarded-For/-Proto are believed: IP addresses or networks, "
    "comma-separated, or * (env TASKFLEET_FORWARDED_ALLOW_IPS; default none: the peer "
    "address is the client, e.g. for the login throttle).",
)
ALLOWED_HOSTS = typer.Option(
    None,
    "--allowed-host",
    help="A Host name the control plane answers to; repeat for more, *.example.com for "
    "subdomains (env TASKFLEET_ALLOWED_HOSTS, comma-separated; default: localhost, the "
    "loopback addresses, this machine's host name and the bind address).",
)
MODEL_ROOTS = typer.Option(
    None,
    "--model-root",
    help="A folder the REST API may register base models and adapters from; repeat for more "
    "(env TASKFLEET_MODEL_ROOTS, comma-separated; default none: REST registers models by "
    "package only, the CLI is not bound).",
)

REEVALUATE = typer.Option(
    True,
    "--reevaluate/--no-reevaluate",
    help="Whether the leader queues and runs re-evaluations of stale pairings (one eval run "
    "at a time, on this machine's CPU). --no-reevaluate: none here (the dashboard still "
    "shows what is stale), e.g. on a machine that only serves, or while measuring it "
    "(`taskfleet tune`, benchmarks).",
)


@dataclass(frozen=True)
class ServerEdge:
    forwarded_allow_ips: str | None
    allowed_hosts: list[str] = field(default_factory=list)
    model_roots: list[Path] = field(default_factory=list)


def server_edge(
    host: str,
    *,
    auth: bool,
    insecure: bool,
    forwarded_allow_ips: str | None,
    allowed_hosts: list[str] | None = None,
    model_roots: list[Path] | None = None,
) -> ServerEdge:
    """The checked edge of a server bound to `host`; a refusal is one line and exit 1, before
    anything starts."""
    from serving.httpserver import BindRefused, check_bind, parse_forwarded_allow_ips
    from serving.httpserver import allowed_hosts as default_hosts

    settings = get_settings()
    forwarded = forwarded_allow_ips or settings.forwarded_allow_ips
    try:
        check_bind(host, require_auth=auth, insecure=insecure)
        parse_forwarded_allow_ips(forwarded)
    except BindRefused as exc:
        err.print(f"error: {exc}", style="red", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    configured = ",".join(allowed_hosts) if allowed_hosts else settings.allowed_hosts
    return ServerEdge(
        forwarded_allow_ips=forwarded,
        allowed_hosts=default_hosts(configured, host),
        model_roots=settings.resolved_model_roots(model_roots),
    )
