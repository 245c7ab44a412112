"""FastAPI glue: every failure of an app answers in the one public error shape.

`install_error_handlers(app)` covers the app's own `ApiError`s, the framework's answers (unknown
route 404, wrong method 405, request validation) and unexpected exceptions (500, traceback to
the log only). An app that also serves people (the dashboard) passes `html`, which may answer a
browser with a page carrying the same code and message instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from httpapi.errors import ApiError, ErrorCode, code_for_status

log = logging.getLogger("taskfleet.http")

# Answers a browser with a page, or returns None to answer in JSON.
HtmlErrorPage = Callable[[Request, ApiError], Response | None]


class ErrorDetail(BaseModel):
    code: ErrorCode
    message: str
    retryable: bool


class ErrorBody(BaseModel):
    """The one public error shape."""

    error: ErrorDetail


# For `FastAPI(responses=...)`: every operation documents the error shape, so generated
# clients and schemathesis know it (and FastAPI's own 422 schema is not advertised).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "The request was refused (see the error code)."},
    "5XX": {"model": ErrorBody, "description": "The server or a dependency failed."},
}


def error_response(exc: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def validation_message(exc: RequestValidationError | ValidationError) -> str:
    """The first problem of a request that does not match its schema, as one line."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    # A location names what the caller sent (an unknown field's key): shown, but bounded.
    where = ".".join(_clipped(str(p)) for p in first.get("loc", ()))
    message = f"{where}: {first.get('msg', 'invalid request')}"
    return message if len(errors) <= 1 else f"{message} (and {len(errors) - 1} more)"


def _clipped(part: str, limit: int = 64) -> str:
    return part if len(part) <= limit else part[: limit - 3] + "..."


def install_error_handlers(app: FastAPI, *, html: HtmlErrorPage | None = None) -> None:
    def answer(request: Request, exc: ApiError) -> Response:
        page = html(request, exc) if html is not None else None
        return page if page is not None else error_response(exc)

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return answer(request, exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = code_for_status(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else code.value
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.url.path!r} here"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path!r}"
        error = ApiError(message, code=code, status=exc.status_code)
        response = answer(request, error)
        for name, value in (exc.headers or {}).items():  # e.g. Allow on a 405
            response.headers.setdefault(name, value)
        return response

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return answer(request, ApiError(validation_message(exc), code=ErrorCode.BAD_REQUEST))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_middleware(CatchAll)


class BodyLimit:
    """413 `PAYLOAD_TOO_LARGE` for a request body above `max_bytes`, before the app reads it
    all (FastAPI parses a JSON body before the route's auth dependency runs).

    A declared `Content-Length` above the limit is refused unread. A chunked body is counted
    as it arrives; past the limit the app's read fails, and whatever the app answers to that
    (FastAPI's body parser turns any failure into its own 400) is replaced by the 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = ApiError(
            f"the body is above the limit of {self.max_bytes} bytes",
            code=ErrorCode.PAYLOAD_TOO_LARGE,
        )
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(too_large)(scope, receive, send)
            return
        seen = 0
        exceeded = False

        async def counted() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                exceeded = True
                raise _TooLarge
            return message

        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if exceeded:  # the app's answer to a read we cut short: ours goes instead
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await error_response(too_large)(scope, _no_body, send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            if started:
                raise
            await error_response(too_large)(scope, receive, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class _TooLarge(Exception):
    pass


class CatchAll:
    """Last resort: an exception nothing else handled answers 500 INTERNAL in the one shape.

    (Starlette's own last resort answers plain text.) The traceback goes to the log only.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unexpected failure: %s %s", scope.get("method"), scope.get("path"))
            if started:  # too late for another answer; the connection just ends
                raise
            error = ApiError("internal error; the server log has details")
            await error_response(error)(scope, receive, send)
