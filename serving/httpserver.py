"""How taskfleet's HTTP servers (gateway, control plane) run under uvicorn, and the rules for
where they may listen: every server's uvicorn config is built here.

Forwarded headers. uvicorn by default believes `X-Forwarded-For`/`-Proto` from loopback peers,
so any local process could claim to be any client (and step around the control plane's login
throttle, which counts per client). Here they are believed only from the proxies an operator
names (`--forwarded-allow-ips`, `TASKFLEET_FORWARDED_ALLOW_IPS`: addresses or networks,
comma-separated, or `*`); by default from nobody, and the peer address is the client.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import uvicorn

# How long the HTTP servers keep an idle connection open. Above the clients' own idle expiry
# (httpx, which the openai and cohere packages use too: 5 s; load balancers: 60 s) so that a
# client never sends on a connection the server is closing at that moment - with uvicorn's
# default of 5 s that race failed requests with a connection reset under load.
KEEP_ALIVE_S = 75


class BindRefused(ValueError):
    """A server would listen in a way its options do not allow (one line for the user)."""


def http_config(
    app: Any, host: str, port: int, log_level: str, *, forwarded_allow_ips: str | None = None
) -> uvicorn.Config:
    """`forwarded_allow_ips`: the proxies whose forwarded headers are believed (see
    :func:`parse_forwarded_allow_ips`); None or empty: nobody's."""
    trusted = parse_forwarded_allow_ips(forwarded_allow_ips)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        proxy_headers=bool(trusted),
        # uvicorn reads FORWARDED_ALLOW_IPS from the environment when this is None; an explicit
        # value keeps that variable (and its loopback default) out of it.
        forwarded_allow_ips=",".join(trusted) or "",
    )


def parse_forwarded_allow_ips(value: str | None) -> list[str]:
    """The trusted proxies of a comma-separated list of IP addresses and networks
    (`10.0.0.0/8`), or `*` (every peer: only when nothing but the proxy can reach the port)."""
    items = [item.strip() for item in (value or "").split(",") if item.strip()]
    for item in items:
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise BindRefused(
                f"--forwarded-allow-ips: {item!r} is not an IP address or network "
                "(e.g. 10.0.0.5, 10.0.0.0/8, or * for every peer)"
            ) from None
    return items


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only (`localhost` counts)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, *, require_auth: bool, insecure: bool) -> None:
    """`--no-auth` is for a trusted laptop: on an address other machines can reach it needs
    `--insecure` too, so nobody opens an unauthenticated door by accident."""
    if not require_auth and not insecure and not is_loopback(host):
        raise BindRefused(
            f"--no-auth on --host {host} lets anyone who reaches that address in without an "
            "API key; bind to 127.0.0.1, or add --insecure if that is what you mean"
        )


def allowed_hosts(configured: str | None, bind_host: str) -> list[str]:
    """The Host header values the control plane answers to: the configured list
    (`--allowed-host`, `TASKFLEET_ALLOWED_HOSTS`: names or addresses, comma-separated, `*.` for
    subdomains, `*` for any), else this machine's own names: localhost, the loopback
    addresses, its host name, and the bind address when it is one address (not 0.0.0.0)."""
    items = [item.strip().lower() for item in (configured or "").split(",") if item.strip()]
    if items:
        return items
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()]
    host = bind_host.strip().strip("[]").lower()
    try:
        if not ipaddress.ip_address(host).is_unspecified:
            names.append(host)
    except ValueError:
        names.append(host)  # bound by name
    return list(dict.fromkeys(n.lower() for n in names if n))
