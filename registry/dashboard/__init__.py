"""The web dashboard of the control plane: server-rendered pages over the registry service.

`create_app` mounts it beside the REST API, so one port serves both. It reads the registry only
(the fleet watcher mirrors heartbeats there), so it stays usable while NATS is down.
"""

from __future__ import annotations

import secrets

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware.sessions import SessionMiddleware

from registry.access import ControlPlane
from registry.dashboard.actions import action_router
from registry.dashboard.context import DEFAULT_STALE_AFTER_S, Dashboard
from registry.dashboard.pages import page_router
from registry.dashboard.rendering import STATIC_DIR
from registry.dashboard.session import SESSION_COOKIE, SESSION_MAX_AGE_S


def mount_dashboard(
    app: FastAPI,
    control: ControlPlane,
    *,
    session_secret: str | None = None,
    secure_cookies: bool = False,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> None:
    """Add the dashboard's pages, static files and signed session cookie to `app`.

    Without a `session_secret`, a random one is made: sessions then end when the process does.
    `secure_cookies` sends the cookie over HTTPS only (set it whenever the dashboard is served
    over HTTPS, directly or behind a proxy); plain http on localhost needs it off.
    """
    app.add_middleware(
        SessionMiddleware,
        secret_key=session_secret or secrets.token_urlsafe(32),
        session_cookie=SESSION_COOKIE,
        max_age=SESSION_MAX_AGE_S,
        same_site="lax",  # plus a CSRF token on every form
        https_only=secure_cookies,
    )
    dash = Dashboard(control, stale_after_s=stale_after_s)
    app.include_router(action_router(dash))
    app.include_router(page_router(dash))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")


__all__ = ["mount_dashboard"]
