"""What the control plane tells browsers and checks of them: the Host check and the security
headers on every answer.

Host check. A page on another site can point its own name at 127.0.0.1 (DNS rebinding) and
then read the dashboard and REST answers as same-origin; answering only to the names this
control plane is reached by stops that. The shell passes the names (`--allowed-host`,
`TASKFLEET_ALLOWED_HOSTS`, by default this machine's own); `/healthz` answers any Host, since
probes (a kubelet's sends the pod IP) cannot be told the name.

Headers. The dashboard is server-rendered Jinja2 and SVG with one same-origin script and
stylesheet, so its pages run under a strict Content-Security-Policy (no inline script or
style, nothing from elsewhere) and may not be framed (`X-Frame-Options: DENY`,
`frame-ancestors 'none'`): a promote button inside someone else's frame is a click away from a
promotion. The API docs (Swagger UI, ReDoc) need inline script and style, and get that only.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from httpapi.errors import ApiError, ErrorCode
from httpapi.handlers import error_response

DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Swagger UI and ReDoc start from an inline script, inject styles, and ReDoc runs a worker.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
DOCS_PATHS = ("/docs", "/redoc")
UNCHECKED_HOST_PATHS = ("/healthz",)


class SecurityHeaders:
    """Framing, sniffing, referrer and content-security headers on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = DOCS_CSP if scope.get("path") in DOCS_PATHS else DASHBOARD_CSP

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = policy
                headers["X-Frame-Options"] = "DENY"
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "same-origin"
            await send(message)

        await self.app(scope, receive, with_headers)


class HostCheck:
    """400 `BAD_REQUEST` (the one error shape) for a Host header not in `allowed`: names or
    addresses, `*.example.com` for its subdomains, `*` for any. Ports are not compared."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = [a.strip().lower().strip("[]") for a in allowed if a.strip()]

    def allows(self, host: str) -> bool:
        for pattern in self.allowed:
            if pattern == "*" or host == pattern:
                return True
            if pattern.startswith("*.") and host.endswith(pattern[1:]):
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNCHECKED_HOST_PATHS:
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        host = host_name(raw)
        if self.allows(host):
            await self.app(scope, receive, send)
            return
        shown = raw if len(raw) <= 100 else raw[:100] + "..."
        refused = ApiError(
            f"this control plane does not answer to the host {shown!r}; add it with "
            "--allowed-host or TASKFLEET_ALLOWED_HOSTS",
            code=ErrorCode.BAD_REQUEST,
        )
        await error_response(refused)(scope, receive, send)


def host_name(header: str) -> str:
    """The name of a Host header without its port: `[::1]:8600` -> `::1`."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value
