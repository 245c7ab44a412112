"""The control plane: REST API under /api/v1 (registry/rest.py), the web dashboard and the
OpenAPI docs (Swagger UI, ReDoc, with local assets) on one port. Every failure answers in the
one public error shape of `httpapi`; the dashboard shows people the same facts as a page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response

from httpapi.docs import mount_docs
from httpapi.handlers import ERROR_RESPONSES, BodyLimit, install_error_handlers
from httpapi.scrape import check_scraper
from registry.access import ControlPlane
from registry.control_metrics import CONTENT_TYPE, registry_metrics
from registry.dashboard import mount_dashboard
from registry.dashboard.rendering import error_page
from registry.edge import HostCheck, SecurityHeaders
from registry.rest import router
from registry.rest_bodies import SuiteReader
from registry.service import Registry
from registry.store import BaselineBuilder, VariantBuilder
from registry.throttle import LoginThrottle

MAX_BODY_BYTES = 1 << 20


def create_app(
    registry: Registry,
    *,
    require_auth: bool = True,
    session_secret: str | None = None,
    secure_cookies: bool = False,
    throttle: LoginThrottle | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
    read_suite: SuiteReader | None = None,
    build_variant: VariantBuilder | None = None,
    model_roots: Sequence[Path] = (),
    allowed_hosts: Sequence[str] | None = None,
    fit_baseline: BaselineBuilder | None = None,
    metrics_token: str | None = None,
) -> FastAPI:
    """`session_secret` signs dashboard session cookies (without one, sessions end with the
    process); `secure_cookies` marks them `Secure` (send them over HTTPS only); `health` adds
    what the shell knows (e.g. whether this process publishes placements) to /healthz.
    `read_suite` lets `POST /api/v1/suites` read suite folders (the shell wires the eval harness
    in: the registry must not import it); without it that route answers 501 NOT_IMPLEMENTED.
    `build_variant` likewise lets `POST .../candidates` with a `variant` build it (the shell
    wires serving's ONNX export in); without it such a body answers 501. `model_roots`: the
    folders REST may register models and adapters from (none: by package only).
    `allowed_hosts`: the Host header values answered (registry/edge.py); None: any (the shell
    always passes a list, tests' in-process clients need none). `fit_baseline` fits a
    tfidf-lr (or rerank bm25) candidate into a servable artifact; without it one is added
    model-free (scored, never placed). `metrics_token` is the bearer token `/metrics` needs
    (httpapi/scrape.py: without one, /metrics answers only when auth is off)."""
    app = FastAPI(
        title="taskfleet control plane",
        version="1",
        description="Tasks, models, adapters, candidates, eval runs and placements.",
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )
    control = ControlPlane(
        registry,
        require_auth=require_auth,
        throttle=throttle or LoginThrottle(),
        read_suite=read_suite,
        build_variant=build_variant,
        model_roots=tuple(model_roots),
        fit_baseline=fit_baseline,
    )
    app.state.control = control
    app.state.health = health
    app.include_router(router)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", **(health() if health else {})}

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Stale endpoint models and pairings (registry/control_metrics.py), for the scraper
        only."""
        check_scraper(
            request.headers.get("authorization"), token=metrics_token, require_auth=require_auth
        )
        return Response(registry_metrics(registry), media_type=CONTENT_TYPE)

    mount_dashboard(app, control, session_secret=session_secret, secure_cookies=secure_cookies)
    mount_docs(app)
    # Bodies here are small JSON documents and forms; anything bigger is refused unread.
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    install_error_handlers(app, html=error_page)
    # Outermost: a foreign Host is refused before anything runs, and every answer (refusals
    # and last-resort 500s included) carries the security headers.
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=list(allowed_hosts))
    app.add_middleware(SecurityHeaders)
    return app
