"""`taskfleet serve`: the control plane (REST API + dashboard) on one port."""

from __future__ import annotations

import typer

from taskfleet.context import get_settings, open_registry


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
) -> None:
    """Run the control plane: REST API (OpenAPI docs at /docs) and the web dashboard (/)."""
    import uvicorn

    from registry.api import create_app

    settings = get_settings()
    app = create_app(
        open_registry(),
        require_auth=auth,
        session_secret=settings.resolved_session_secret(),
        secure_cookies=settings.secure_cookies if secure_cookies is None else secure_cookies,
    )
    uvicorn.run(app, host=host, port=port, log_level="info")
