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
from starlette.responses import JSONResponse, RedirectResponse, Response

from registry.dashboard.session import LoginRequired, csrf_token, pop_flashes
from registry.errors import RegistryError

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
    context.update(csrf=csrf_token(request), flashes=pop_flashes(request))
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/html" not in accept


def error_response(
    request: Request, status: int, code: str, message: str, retryable: bool = False
) -> Response:
    """The public error shape for programs; the same facts as a page for people."""
    from registry.api import error_body  # the API module mounts the dashboard: import late

    if wants_json(request):
        return JSONResponse(error_body(code, message, retryable), status_code=status)
    return render(request, "error.html", status, status=status, code=code, message=message)


class DashboardRoute(APIRoute):
    """Turns registry errors into error pages, unexpected ones into a plain 500 page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except LoginRequired:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            except RegistryError as exc:
                return error_response(request, exc.http_status, exc.code, str(exc), exc.retryable)
            except (HTTPException, RequestValidationError):
                raise  # the app's own handlers answer these
            except Exception:
                log.exception("dashboard page failed: %s %s", request.method, request.url.path)
                return error_response(
                    request, 500, "INTERNAL", "something went wrong; the server log has details"
                )

        return guarded
