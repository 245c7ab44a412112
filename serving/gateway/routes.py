"""The gateway's routes: plain handler functions given the app's ``Gateway`` as a dependency,
on two routers: the calls (``POST /v1/tasks/{task}`` and the stock-client endpoints) and the
operator's routes (health, readiness, Prometheus).

``call_router(max_inputs)`` builds its router for a gateway's input limit, which its OpenAPI
documents. Each call handler authenticates, reads and parses the body, then runs the checks of
``checks.py`` inside ``measured``, so every answer (success or refusal) is counted.
"""

# No `from __future__ import annotations` here: FastAPI must resolve the `Annotated`
# dependencies at runtime.
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from httpapi.handlers import error_response
from httpapi.scrape import check_scraper
from serving.gateway import bodies, bodies_classify, bodies_rerank
from serving.gateway.checks import (
    Outcome,
    authenticate,
    find_task,
    headers_of,
    measured,
    queue_call,
    read_body,
    served_by,
    stock_task,
)
from serving.gateway.dispatch import TaskBody
from serving.gateway.errors import Unavailable
from serving.gateway.parts import Gateway, gateway_of
from serving.protocol import ClassifyReplyOk, ScoreReplyOk

GatewayDep = Annotated[Gateway, Depends(gateway_of)]

METRICS_RESPONSE_DOC: dict[str, Any] = {
    "description": "Prometheus text exposition (with the bearer metrics token).",
    "content": {"text/plain": {}},
}


# ---- calls ---------------------------------------------------------------------------------


async def call_task(task: str, request: Request, gateway: GatewayDep) -> Response:
    """A call in the task's own shape: the body is the task's kind's."""
    outcome = Outcome()
    settings = gateway.settings

    async def handle() -> Response:
        key = authenticate(gateway, request)
        call = headers_of(gateway, request)
        body = await read_body(request, settings.max_body_bytes)
        fmt = bodies.body_format(request.headers.get("content-type"))
        obj = bodies.decode_map(body, fmt)
        record, placement = find_task(gateway, task, key, outcome)
        limit = settings.max_inputs
        parsed: TaskBody
        if record.kind == "rerank":
            parsed = bodies_rerank.parse_rerank_body(obj, limit)
        elif record.kind == "classification":
            parsed = bodies_classify.parse_classify_body(obj, limit)
        else:
            parsed = bodies.parse_embed_body(obj, limit)
        reply = await queue_call(gateway, record, placement, parsed, key, call)
        out = bodies.response_format(fmt, request.headers.get("accept"))
        if isinstance(reply, ScoreReplyOk):
            content = bodies_rerank.rerank_response(reply, out)
        elif isinstance(reply, ClassifyReplyOk):
            content = bodies_classify.classify_response(reply, out)
        else:
            content = bodies.embed_response(reply, out)
        return Response(content, media_type=out.value, headers=served_by(reply))

    return await measured(gateway, outcome, handle)


async def stock_call(
    gateway: Gateway,
    request: Request,
    kind: str,
    parse: Callable[[bytes, int], Any],
    answer: Callable[[Any, Any], dict[str, Any]],
) -> Response:
    """A stock-client endpoint: its body names the task (``model``), which must be of
    ``kind``; ``answer(reply, parsed)`` is the client's response shape."""
    outcome = Outcome()
    settings = gateway.settings

    async def handle() -> Response:
        key = authenticate(gateway, request)
        call = headers_of(gateway, request)
        body = await read_body(request, settings.max_body_bytes)
        parsed = parse(body, settings.max_inputs)
        record, placement = stock_task(gateway, parsed.task, kind, outcome, key)
        reply = await queue_call(gateway, record, placement, parsed.request, key, call)
        return JSONResponse(answer(reply, parsed), headers=served_by(reply))

    return await measured(gateway, outcome, handle)


async def openai_embeddings(request: Request, gateway: GatewayDep) -> Response:
    """OpenAI's embeddings: ``model`` names a retrieval task."""
    return await stock_call(
        gateway, request, "retrieval", bodies.parse_openai_request, bodies.openai_response
    )


async def rerank(request: Request, gateway: GatewayDep) -> Response:
    """Cohere/Jina-style rerank (Cohere's v1 and v2 paths): ``model`` names a rerank task."""
    return await stock_call(
        gateway,
        request,
        "rerank",
        bodies_rerank.parse_cohere_rerank,
        lambda reply, parsed: bodies_rerank.cohere_response(reply, parsed, reply.request_id),
    )


async def classify(request: Request, gateway: GatewayDep) -> Response:
    """Label probabilities as ``[{label, score}]`` per input (TEI/infinity shape)."""
    return await stock_call(
        gateway,
        request,
        "classification",
        bodies_classify.parse_classify_api,
        lambda reply, parsed: bodies_classify.classify_api_response(
            reply, parsed, reply.request_id
        ),
    )


def call_router(max_inputs: int) -> APIRouter:
    """The call routes, documented for a gateway that takes at most ``max_inputs`` texts."""
    router = APIRouter()
    router.add_api_route(
        "/v1/tasks/{task}",
        call_task,
        methods=["POST"],
        openapi_extra=bodies.task_request_doc(max_inputs),
        responses={200: bodies.TASK_RESPONSE_DOC},
    )
    router.add_api_route(
        "/v1/embeddings",
        openai_embeddings,
        methods=["POST"],
        openapi_extra=bodies.openai_request_doc(max_inputs),
    )
    for path in ("/v2/rerank", "/v1/rerank"):
        router.add_api_route(
            path,
            rerank,
            methods=["POST"],
            openapi_extra=bodies_rerank.cohere_request_doc(max_inputs),
        )
    router.add_api_route(
        "/v1/classify",
        classify,
        methods=["POST"],
        openapi_extra=bodies_classify.classify_request_doc(max_inputs),
    )
    return router


# ---- the operator's routes -----------------------------------------------------------------

ops_router = APIRouter()


@ops_router.get("/healthz")
async def healthz(gateway: GatewayDep) -> dict[str, str]:
    return {"status": "ok", "gateway_id": gateway.settings.gateway_id}


@ops_router.get("/readyz")
async def readyz(gateway: GatewayDep) -> Response:
    """Ready: connected to NATS and both buckets read up to where they were at connect.
    The body says what this gateway has seen (revisions per bucket)."""
    dispatcher, view = gateway.dispatcher, gateway.view
    if not dispatcher.connected or not view.synced:
        why = "not connected to NATS" if not dispatcher.connected else "reading the fleet"
        return error_response(
            Unavailable(why, code="NOT_READY", retry_after_s=gateway.settings.retry_after_s)
        )
    return JSONResponse({"status": "ready", "nats": True, "view": view.describe()})


# Documented by hand: a text/plain response_class would document the JSON errors as text.
@ops_router.get("/metrics", responses={200: METRICS_RESPONSE_DOC})
async def prometheus(request: Request, gateway: GatewayDep) -> Response:
    """Prometheus text for the scraper: with a metrics token, only with that bearer token;
    without one, only when auth is off (the figures name every task and API key)."""
    settings, metrics = gateway.settings, gateway.metrics
    check_scraper(
        request.headers.get("authorization"),
        token=settings.metrics_token,
        require_auth=settings.require_auth,
    )
    metrics.set_queue(await gateway.dispatcher.queue_snapshot())
    return Response(metrics.render(), media_type=metrics.content_type)
