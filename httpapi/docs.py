"""The OpenAPI pages of an app (Swagger UI at /docs, ReDoc at /redoc), with local assets.

FastAPI's own pages load their JavaScript and CSS from a CDN, so they are blank behind a
firewall. The assets here come from the `fastapi-offline` package (a PyPI wheel that ships
Swagger UI and ReDoc builds) and are served by the app itself. Create the app with
``docs_url=None, redoc_url=None`` and call :func:`mount_docs`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS_PATH = "/docs-assets"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))


def mount_docs(app: FastAPI) -> None:
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API reference",
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
