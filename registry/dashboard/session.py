"""Who is looking: API-key login into a server-side session, and per-session CSRF tokens.

The signed cookie (Starlette's SessionMiddleware) carries a random session token and the CSRF
token, never the key. The session lives in the registry (`dashboard_sessions`): logging out
ends it there, so a cookie copied before logout signs nobody in afterwards; every request
re-reads the session's key, so a revoked key or a changed role takes effect on the next click.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from starlette.requests import Request

from httpapi.errors import ErrorCode
from registry.access import Principal
from registry.entities import ApiKey
from registry.errors import PermissionDenied
from registry.service import Registry

SESSION_COOKIE = "taskfleet_session"
SESSION_MAX_AGE_S = 8 * 3600  # a working day; then the key is asked for again
CSRF_FIELD = "csrf_token"


class CsrfRefused(PermissionDenied):
    """A form POST without this session's token: forged, or from an expired session."""

    code = ErrorCode.CSRF_REFUSED


class LoginRequired(Exception):
    """Raised by pages that need a signed-in user; the dashboard answers with a redirect."""


def csrf_token(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def check_csrf(request: Request, submitted: str) -> None:
    expected = request.session.get("csrf")
    if not isinstance(expected, str) or not expected or not submitted:
        raise CsrfRefused("this form has no valid security token; reload the page and try again")
    if not hmac.compare_digest(expected.encode(), submitted.encode()):
        raise CsrfRefused("this form's security token does not match your session; reload it")


def sign_in(request: Request, registry: Registry, key: ApiKey) -> None:
    """Start a fresh session for the key (a new CSRF token defeats session fixation)."""
    Principal.of_key(key)  # caller-only keys are for applications, not people
    token = registry.start_session(key.name, max_age_s=SESSION_MAX_AGE_S)
    end_session(request, registry)
    request.session.update(sid=token, csrf=secrets.token_urlsafe(32))


def end_session(request: Request, registry: Registry) -> None:
    sid = request.session.get("sid")
    if isinstance(sid, str) and sid:
        registry.end_session(sid)
    request.session.clear()


def session_user(request: Request, registry: Registry) -> Principal | None:
    sid = request.session.get("sid")
    if not isinstance(sid, str) or not sid:
        return None
    key = registry.session_key(sid)
    if key is None:  # ended, expired, or its key revoked
        request.session.pop("sid", None)
        return None
    try:
        return Principal.of_key(key)
    except PermissionDenied:  # its roles changed to caller only
        end_session(request, registry)
        return None


def flash(request: Request, level: str, text: str) -> None:
    """A message for the next page the user sees (post/redirect/get)."""
    messages: list[dict[str, Any]] = list(request.session.get("flash", []))
    messages.append({"level": level, "text": text})
    request.session["flash"] = messages[-5:]


def pop_flashes(request: Request) -> list[dict[str, Any]]:
    messages = request.session.pop("flash", [])
    return list(messages) if isinstance(messages, list) else []
