"""Templates, the error page, and the route class that keeps tracebacks off every page."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from httpapi.errors import ApiError, ErrorCode
from httpapi.handlers import error_response as json_error
from registry.dashboard.session import LoginRequired, csrf_token, pop_flashes

log = logging.getLogger("taskfleet.dashboard")
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def _ago(when: datetime | None) -> str:
    if when is None:
        return "never"
    seconds = (datetime.now(UTC) - when).total_seconds()
    if seconds < 90:
        return f"{max(0, int(seconds))} s ago"
    if seconds < 5400:
        return f"{int(seconds // 60)} min ago"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h ago"
    return when.strftime("%Y-%m-%d")


def _stamp(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC") if when else "-"


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bytes(value: int) -> str:
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _path(value: str) -> str:
    # Candidate names may contain '+', which must survive as itself in a path segment.
    return quote(value, safe="")


templates = Jinja2Templates(directory=str(TEMPLATE_DIR))
templates.env.filters.update(ago=_ago, stamp=_stamp, num=_num, bytes=_bytes, path=_path)


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    context.setdefault("user", getattr(request.state, "user", None))
    context.update(
        csrf=csrf_token(request),
        flashes=pop_flashes(request),
        publishing=publishing_notice(request),
    )
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def publishing_notice(request: Request) -> str | None:
    """What every page says while this control plane cannot publish to the fleet (the shell
    reports its NATS side through the app's ``health`` hook; the registry knows no NATS)."""
    health = getattr(request.app.state, "health", None)
    status = health() if health is not None else {}
    if status.get("publisher") != "waiting for NATS":
        return None
    return (
        f"Publishing to the fleet waits for NATS ({status.get('nats', 'not reachable')}): "
        "promotions and rollbacks are recorded and reach the workers once NATS is back."
    )


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def error_page(request: Request, exc: ApiError) -> Response | None:
    """The same facts as the public error shape, as a page for people; None for programs
    (the REST API under /api/, or a client that asks for JSON), which get the JSON shape."""
    if request.url.path.startswith("/api/") or wants_json(request):
        return None
    status, code, message = exc.status, exc.code, exc.message
    return render(request, "error.html", status, status=status, code=code, message=message)


def error_response(request: Request, exc: ApiError) -> Response:
    return error_page(request, exc) or json_error(exc)


class DashboardRoute(APIRoute):
    """Turns registry errors into error pages, unexpected ones into a plain 500 page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                if wants_json(request):  # a program: say so, do not redirect it to a form
                    error = ApiError("log in at /login first", code=ErrorCode.UNAUTHENTICATED)
                    return json_error(error)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            except ApiError as exc:
                return error_response(request, exc)
            except (HTTPException, RequestValidationError):
                raise  # the app's own handlers answer these
            except Exception:
                log.exception("dashboard page failed: %s %s", request.method, request.url.path)
                return error_response(
                    request, ApiError("something went wrong; the server log has details")
                )

        return guarded
