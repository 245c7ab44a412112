"""The public HTTP edge: ``create_gateway(nats_url)`` returns the ASGI app.

Every request goes the same way, and stops at the first check that fails: authenticate (401;
503 until the control plane's directory is seen) -> the key's request quota (429) -> the
X-Taskfleet-* headers (400) -> read the body within the size limit (413) -> decode it (400/415)
-> the key's roles and tasks (403) -> the task exists (404) -> the body fits the task's kind
(400: embeddings for a retrieval task, query + documents for a rerank task, inputs for a
classification task) -> every text within the task's per-text limits (413) -> the task is
placed (503) -> a live worker runs it (503) -> the caller's minimum epoch is one this gateway
knows (503 after a short wait) -> the key's token quota (429, or 413 above its burst) -> queue
it and wait for the reply (504 at the deadline). Nothing is published before every check
passed, so a rejected request never reaches the queue, and no accepted one asks a worker for
more than the task allows.

The gateway needs NATS only: keys and tasks (with their kind) come from KV ``directory``,
placements from KV ``placements`` (both published by the leading control plane, followed in
``serving/gateway/view.py``), live workers from KV ``workers``. No database on the hot path.

This module only assembles the app: the parts every route is given (``parts.Gateway``), the
routers of plain handlers (``routes.py``), the checks in the order above (``checks.py``;
``bodies*.py`` for what a body holds).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from httpapi.docs import mount_docs
from httpapi.handlers import ERROR_RESPONSES, install_error_handlers
from serving.connection import NatsTarget
from serving.gateway.admission import Admission
from serving.gateway.dispatch import Dispatcher, DispatchSettings
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.parts import Gateway, GatewaySettings
from serving.gateway.routes import call_router, ops_router

__all__ = ["GatewaySettings", "create_gateway"]


def create_gateway(nats_url: NatsTarget, settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway on NATS at ``nats_url`` (URL(s), or options with credentials and TLS)."""
    settings = settings or GatewaySettings()
    metrics = GatewayMetrics()
    dispatcher = Dispatcher(
        nats_url,
        DispatchSettings(
            gateway_id=settings.gateway_id,
            inline_limit_bytes=settings.inline_limit_bytes,
            workers_refresh_s=settings.workers_refresh_s,
            retry_after_s=settings.retry_after_s,
            min_epoch_wait_s=settings.min_epoch_wait_s,
        ),
        metrics,
    )
    gateway = Gateway(
        settings=settings, metrics=metrics, admission=Admission(metrics), dispatcher=dispatcher
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        dispatcher.start()
        try:
            yield
        finally:
            await dispatcher.close()

    app = FastAPI(
        title="taskfleet gateway",
        version="1",
        description="Tasks by name: POST /v1/tasks/{task}, OpenAI's /v1/embeddings, "
        "Cohere-style /v1/rerank and a /v1/classify in the TEI/infinity shape.",
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    mount_docs(app)
    app.state.gateway = gateway
    # The fleet test harness asks the dispatcher which NATS node it is connected to.
    app.state.dispatcher = dispatcher
    app.include_router(call_router(settings.max_inputs))
    app.include_router(ops_router)
    return app
