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
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from httpapi.docs import mount_docs
from httpapi.errors import ApiError, shown
from httpapi.handlers import ERROR_RESPONSES, error_response, install_error_handlers
from httpapi.tokens import bearer_token, key_prefix, token_matches
from serving import nats_layout
from serving.connection import NatsTarget
from serving.directory import KeyRecord, TaskRecord
from serving.gateway import bodies, bodies_classify, bodies_rerank
from serving.gateway.admission import Admission
from serving.gateway.dispatch import Dispatcher, DispatchSettings, TaskRequest
from serving.gateway.errors import (
    BadRequest,
    Forbidden,
    GatewayError,
    PayloadTooLarge,
    Unauthenticated,
    Unavailable,
    UnknownTask,
)
from serving.gateway.headers import CallHeaders, call_headers
from serving.gateway.metrics import OK_CODE, UNKNOWN_TASK_LABEL, GatewayMetrics, check_scraper
from serving.protocol import AnyReplyOk, ClassifyReplyOk, PlacementValue, ScoreReplyOk

log = logging.getLogger(__name__)

# Roles whose keys may call tasks: `caller` keys exist for applications; `admin` can do anything.
CALL_ROLES = frozenset({"caller", "admin"})
# The stock-client endpoint of each task kind.
KIND_ENDPOINT = {
    "retrieval": "/v1/embeddings",
    "rerank": "/v1/rerank",
    "classification": "/v1/classify",
}
METRICS_RESPONSE_DOC: dict[str, Any] = {
    "description": "Prometheus text exposition (with the bearer metrics token).",
    "content": {"text/plain": {}},
}
# The kind of a placed task the directory does not list: control planes from before task
# kinds published only retrieval tasks.
LEGACY_KIND = "retrieval"


@dataclass(frozen=True)
class GatewaySettings:
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    require_auth: bool = True
    max_body_bytes: int = 32 * 1024 * 1024
    max_inputs: int = 2048
    default_timeout_s: float = 30.0
    max_timeout_s: float = 300.0
    inline_limit_bytes: int = 1_000_000
    workers_refresh_s: float = 1.0
    retry_after_s: int = 2
    # How long a caller's X-Taskfleet-Min-Epoch ahead of this gateway's placement may wait for
    # the placement to arrive (dispatch.Dispatcher.await_epoch).
    min_epoch_wait_s: float = 2.0
    # The bearer token /metrics requires; None: /metrics is open only when auth is off.
    metrics_token: str | None = None


@dataclass
class _Outcome:
    """What the metrics of one request need to know, filled in as the request goes."""

    task: str = UNKNOWN_TASK_LABEL


def create_gateway(nats_url: NatsTarget, settings: GatewaySettings | None = None) -> FastAPI:
    """The gateway on NATS at ``nats_url`` (URL(s), or options with credentials and TLS)."""
    settings = settings or GatewaySettings()
    metrics = GatewayMetrics()
    admission = Admission(metrics)
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
    app.state.dispatcher = dispatcher
    app.state.metrics = metrics
    app.state.settings = settings

    view = dispatcher.view

    def not_ready(what: str) -> Unavailable:
        return Unavailable(
            f"the gateway has not received the control plane's {what} yet (is a `taskfleet "
            "serve` or `taskfleet up` connected to this NATS?)",
            code="NOT_READY",
            retry_after_s=settings.retry_after_s,
        )

    def find_key(token: str) -> KeyRecord:
        """The published record of ``token``'s key (digest, roles, tasks), or 401."""
        prefix = key_prefix(token)
        if prefix is None:
            raise Unauthenticated("malformed API key")
        if not view.directory_published:
            raise not_ready("API keys")
        record = view.keys.get(prefix)
        if record is None:
            raise Unauthenticated("unknown API key")
        if record.revoked or record.secret_hash is None:
            raise Unauthenticated(f"API key {record.name!r} was revoked")
        if not token_matches(token, record.secret_hash):
            raise Unauthenticated("unknown API key")
        return record

    async def authenticate(request: Request) -> KeyRecord | None:
        """The caller's key, within its quota; None when auth is off."""
        if not settings.require_auth:
            return None
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise Unauthenticated("send 'Authorization: Bearer <api key>'")
        key = find_key(token)
        if not CALL_ROLES & set(key.roles):
            raise Forbidden(f"API key {key.name!r} has none of the roles caller, admin")
        admission.charge_request(key)
        return key

    def headers_of(request: Request) -> CallHeaders:
        return call_headers(
            request.headers,
            default_timeout_s=settings.default_timeout_s,
            max_timeout_s=settings.max_timeout_s,
        )

    def find_task(
        task: str, key: KeyRecord | None, outcome: _Outcome
    ) -> tuple[TaskRecord, PlacementValue | None]:
        """The task's record (kind, limits) and placement, from the published view (never the
        registry); 403 outside the key's tasks, 404 when unknown, 503 until the directory is
        seen."""
        if key is not None and key.tasks and task not in key.tasks:
            raise Forbidden(f"this API key may not call task {shown(task)}")
        placement = view.placements.get(task)
        record = view.tasks.get(task)
        if record is None:
            # A task is known from the directory, which also says its kind. A placement
            # alone serves only once the directory is read: an older control plane published
            # placements of retrieval tasks only; a newer one publishes the directory right
            # after its placements.
            if not (view.directory_published and view.synced):
                raise not_ready("tasks and placements")
            if placement is None:
                raise UnknownTask(f"unknown task {shown(task)}")
            record = TaskRecord(task, LEGACY_KIND)
        outcome.task = task
        return record, placement

    async def check_servable(task: str, placement: PlacementValue | None) -> PlacementValue:
        try:
            nats_layout.check_task_name(task)
        except nats_layout.InvalidTaskName as exc:
            raise BadRequest(str(exc), code="TASK_NOT_SERVABLE") from exc
        if placement is None:
            raise Unavailable(
                f"task {task!r} is not placed on the fleet yet (no promotion or placement)",
                code="NOT_PLACED",
                retry_after_s=settings.retry_after_s,
            )
        if not await dispatcher.live_workers(task):
            raise Unavailable(
                f"no live worker serves task {task!r} yet",
                code="NO_WORKER",
                retry_after_s=settings.retry_after_s,
            )
        return placement

    async def run(
        record: TaskRecord,
        placement: PlacementValue | None,
        parsed: TaskRequest,
        key: KeyRecord | None,
        call: CallHeaders,
    ) -> AnyReplyOk:
        """The checks of a parsed body of the task's kind, in order, then queue it."""
        task = record.name
        parsed.check_limits(record)
        served = await check_servable(task, placement)
        await dispatcher.await_epoch(task, call.min_epoch, call.timeout_s)
        admission.charge_tokens(key, parsed, served)
        return await dispatcher.submit(
            task,
            parsed,
            timeout_s=call.timeout_s,
            priority=call.priority,
            min_epoch=call.min_epoch,
            key=key.name if key is not None else None,
        )

    def stock_task(
        task: str, want: str, outcome: _Outcome, key: KeyRecord | None
    ) -> tuple[TaskRecord, PlacementValue | None]:
        """A stock-client endpoint's task once its body is parsed: it exists and is of the
        endpoint's kind."""
        record, placement = find_task(task, key, outcome)
        if record.kind != want:
            raise BadRequest(
                f"task {task!r} is a {record.kind} task; call POST "
                f"{KIND_ENDPOINT.get(record.kind, '?')} (or POST /v1/tasks/{{task}})"
            )
        return record, placement

    async def measured(outcome: _Outcome, handler: Callable[[], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        code = OK_CODE
        try:
            response = await handler()
        except Exception as exc:
            if not isinstance(exc, ApiError):  # the gateway's own refusals and the registry's
                # A bug or an unforeseen failure still answers in the one error shape; the
                # traceback goes to the log, not to the caller.
                log.exception("unexpected failure while serving a request")
                exc = GatewayError("internal gateway error; see its log")
            code = exc.code
            response = error_response(exc)
        metrics.observe(outcome.task, response.status_code, code, time.perf_counter() - started)
        return response

    @app.post(
        "/v1/tasks/{task}",
        openapi_extra=bodies.task_request_doc(settings.max_inputs),
        responses={200: bodies.TASK_RESPONSE_DOC},
    )
    async def call_task(task: str, request: Request) -> Response:
        outcome = _Outcome()

        async def handle() -> Response:
            key = await authenticate(request)
            call = headers_of(request)
            body = await read_body(request, settings.max_body_bytes)
            fmt = bodies.body_format(request.headers.get("content-type"))
            obj = bodies.decode_map(body, fmt)
            record, placement = find_task(task, key, outcome)
            limit = settings.max_inputs
            parsed: TaskRequest
            if record.kind == "rerank":
                parsed = bodies_rerank.parse_rerank_body(obj, limit)
            elif record.kind == "classification":
                parsed = bodies_classify.parse_classify_body(obj, limit)
            else:
                parsed = bodies.parse_embed_body(obj, limit)
            reply = await run(record, placement, parsed, key, call)
            out = bodies.response_format(fmt, request.headers.get("accept"))
            if isinstance(reply, ScoreReplyOk):
                content = bodies_rerank.rerank_response(reply, out)
            elif isinstance(reply, ClassifyReplyOk):
                content = bodies_classify.classify_response(reply, out)
            else:
                content = bodies.embed_response(reply, out)
            return Response(content, media_type=out.value, headers=served_by(reply))

        return await measured(outcome, handle)

    async def stock_endpoint(
        request: Request,
        kind: str,
        parse: Callable[[bytes, int], Any],
        answer: Callable[[Any, Any], dict[str, Any]],
    ) -> Response:
        """A stock-client endpoint: its body names the task (``model``), which must be of
        ``kind``; ``answer(reply, parsed)`` is the client's response shape."""
        outcome = _Outcome()

        async def handle() -> Response:
            key = await authenticate(request)
            call = headers_of(request)
            body = await read_body(request, settings.max_body_bytes)
            parsed = parse(body, settings.max_inputs)
            record, placement = stock_task(parsed.task, kind, outcome, key)
            reply = await run(record, placement, parsed.request, key, call)
            return JSONResponse(answer(reply, parsed), headers=served_by(reply))

        return await measured(outcome, handle)

    @app.post("/v1/embeddings", openapi_extra=bodies.openai_request_doc(settings.max_inputs))
    async def openai_embeddings(request: Request) -> Response:
        """OpenAI's embeddings: ``model`` names a retrieval task."""
        return await stock_endpoint(
            request, "retrieval", bodies.parse_openai_request, bodies.openai_response
        )

    @app.post("/v1/rerank", openapi_extra=bodies_rerank.cohere_request_doc(settings.max_inputs))
    @app.post("/v2/rerank", openapi_extra=bodies_rerank.cohere_request_doc(settings.max_inputs))
    async def rerank(request: Request) -> Response:
        """Cohere/Jina-style rerank (Cohere's v1 and v2 paths): ``model`` names a rerank task."""
        return await stock_endpoint(
            request,
            "rerank",
            bodies_rerank.parse_cohere_rerank,
            lambda reply, parsed: bodies_rerank.cohere_response(reply, parsed, reply.request_id),
        )

    @app.post(
        "/v1/classify", openapi_extra=bodies_classify.classify_request_doc(settings.max_inputs)
    )
    async def classify(request: Request) -> Response:
        """Label probabilities as ``[{label, score}]`` per input (TEI/infinity shape)."""
        return await stock_endpoint(
            request,
            "classification",
            bodies_classify.parse_classify_api,
            lambda reply, parsed: bodies_classify.classify_api_response(
                reply, parsed, reply.request_id
            ),
        )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "gateway_id": settings.gateway_id}

    @app.get("/readyz")
    async def readyz() -> Response:
        """Ready: connected to NATS and both buckets read up to where they were at connect.
        The body says what this gateway has seen (revisions per bucket)."""
        if not dispatcher.connected or not view.synced:
            why = "not connected to NATS" if not dispatcher.connected else "reading the fleet"
            return error_response(
                Unavailable(why, code="NOT_READY", retry_after_s=settings.retry_after_s)
            )
        return JSONResponse({"status": "ready", "nats": True, "view": view.describe()})

    # Documented by hand: a text/plain response_class would document the JSON errors as text.
    @app.get("/metrics", responses={200: METRICS_RESPONSE_DOC})
    async def prometheus(request: Request) -> Response:
        """Prometheus text for the scraper: with a metrics token, only with that bearer token;
        without one, only when auth is off (the figures name every task and API key)."""
        check_scraper(
            request.headers.get("authorization"),
            token=settings.metrics_token,
            require_auth=settings.require_auth,
        )
        metrics.set_queue(await dispatcher.queue_snapshot())
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def served_by(reply: AnyReplyOk) -> dict[str, str]:
    return {
        "X-Taskfleet-Epoch": str(reply.epoch),
        "X-Taskfleet-Model": reply.model_key,
        "X-Request-Id": reply.request_id,
    }


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it is known to exceed ``limit`` (before reading it all)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body has {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
