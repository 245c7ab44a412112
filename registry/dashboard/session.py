"""Who is looking: API-key login into a signed session cookie, and per-session CSRF tokens.

The cookie (signed by Starlette's SessionMiddleware) holds the key's name and prefix, never the
secret. Every request re-reads the key, so a revoked key or a changed role takes effect on the
next click rather than when the cookie expires.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from httpapi.errors import ErrorCode
from registry.entities import ApiKey
from registry.errors import PermissionDenied
from registry.promotions import PROMOTE_ROLES
from registry.service import Registry

SESSION_COOKIE = "taskfleet_session"
CSRF_FIELD = "csrf_token"
DASHBOARD_ROLES = ("viewer", "promoter", "admin")


class CsrfRefused(PermissionDenied):
    """A form POST without this session's token: forged, or from an expired session."""

    code = ErrorCode.CSRF_REFUSED


class LoginRequired(Exception):
    """Raised by pages that need a signed-in user; the dashboard answers with a redirect."""


@dataclass(frozen=True)
class User:
    name: str
    roles: tuple[str, ...]
    signed_in: bool = True  # False for the implicit local user (no login, no logout)

    @property
    def actor(self) -> str:
        # Same form as the REST API's actors, so the history reads alike whichever door was used.
        return f"key:{self.name}" if self.signed_in else "dashboard:anonymous"

    @property
    def can_promote(self) -> bool:
        return bool(set(self.roles) & set(PROMOTE_ROLES))

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles


# With `--no-auth` (a trusted laptop) there is no login; the single local user is admin.
LOCAL_USER = User("local", ("admin",), signed_in=False)


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


def sign_in(request: Request, key: ApiKey) -> None:
    """Start a fresh session for the key (a new CSRF token defeats session fixation)."""
    if not set(key.roles) & set(DASHBOARD_ROLES):
        raise PermissionDenied(
            f"API key {key.name!r} has only the roles {', '.join(key.roles)}; the dashboard "
            "needs viewer, promoter or admin"
        )
    request.session.clear()
    request.session.update(key=key.name, prefix=key.prefix, csrf=secrets.token_urlsafe(32))


def sign_out(request: Request) -> None:
    request.session.clear()


def session_user(request: Request, registry: Registry) -> User | None:
    name, prefix = request.session.get("key"), request.session.get("prefix")
    if not name or not prefix:
        return None
    key = next((k for k in registry.list_api_keys() if k.prefix == prefix), None)
    if key is None or key.name != name or key.revoked_at is not None:
        request.session.pop("key", None)
        request.session.pop("prefix", None)
        return None
    return User(key.name, tuple(key.roles))


def flash(request: Request, level: str, text: str) -> None:
    """A message for the next page the user sees (post/redirect/get)."""
    messages: list[dict[str, Any]] = list(request.session.get("flash", []))
    messages.append({"level": level, "text": text})
    request.session["flash"] = messages[-5:]


def pop_flashes(request: Request) -> list[dict[str, Any]]:
    messages = request.session.pop("flash", [])
    return list(messages) if isinstance(messages, list) else []
