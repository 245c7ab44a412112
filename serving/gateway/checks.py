"""The checks a call goes through, in the order ``app.py`` lists, and the queueing of a call
that passed them all.

Plain functions of the :class:`~serving.gateway.parts.Gateway` they are given: the caller's API
key, the task's record and placement come from the published view (never the registry), live
workers and epochs from the dispatcher, quotas from admission.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from httpapi.errors import ApiError, shown
from httpapi.handlers import error_response
from httpapi.tokens import bearer_token, key_prefix, token_matches
from serving import nats_layout
from serving.directory import KeyRecord, TaskRecord
from serving.gateway.dispatch import Served, TaskBody
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
from serving.gateway.metrics import OK_CODE, UNKNOWN_TASK_LABEL
from serving.gateway.parts import Gateway
from serving.gateway.sampling import SAMPLED_HEADER, Sampling
from serving.nats_layout import shadow_key
from serving.protocol import PlacementValue

log = logging.getLogger(__name__)

# Roles whose keys may call tasks: `caller` keys exist for applications; `admin` can do anything.
CALL_ROLES = frozenset({"caller", "admin"})

# The stock-client endpoint of each task kind.
KIND_ENDPOINT = {
    "retrieval": "/v1/embeddings",
    "rerank": "/v1/rerank",
    "classification": "/v1/classify",
}
# The kind of a placed task the directory does not list: control planes from before task
# kinds published only retrieval tasks.
LEGACY_KIND = "retrieval"


@dataclass
class Outcome:
    """What the metrics of one request need to know, filled in as the request goes."""

    task: str = UNKNOWN_TASK_LABEL


def find_key(gateway: Gateway, token: str) -> KeyRecord:
    """The published record of ``token``'s key (digest, roles, tasks), or 401."""
    prefix = key_prefix(token)
    if prefix is None:
        raise Unauthenticated("malformed API key")
    view = gateway.view
    if not view.directory_published:
        raise gateway.not_ready("API keys")
    record = view.keys.get(prefix)
    if record is None:
        raise Unauthenticated("unknown API key")
    if record.revoked or record.secret_hash is None:
        raise Unauthenticated(f"API key {record.name!r} was revoked")
    if not token_matches(token, record.secret_hash):
        raise Unauthenticated("unknown API key")
    return record


def authenticate(gateway: Gateway, request: Request) -> KeyRecord | None:
    """The caller's key, within its request quota; None when auth is off."""
    if not gateway.settings.require_auth:
        return None
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise Unauthenticated("send 'Authorization: Bearer <api key>'")
    key = find_key(gateway, token)
    if not CALL_ROLES & set(key.roles):
        raise Forbidden(f"API key {key.name!r} has none of the roles caller, admin")
    gateway.admission.charge_request(key)
    return key


def headers_of(gateway: Gateway, request: Request) -> CallHeaders:
    settings = gateway.settings
    return call_headers(
        request.headers,
        default_timeout_s=settings.default_timeout_s,
        max_timeout_s=settings.max_timeout_s,
    )


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


def find_task(
    gateway: Gateway, task: str, key: KeyRecord | None, outcome: Outcome
) -> tuple[TaskRecord, PlacementValue | None]:
    """The task's record (kind, limits) and placement, from the published view (never the
    registry); 403 outside the key's tasks, 404 when unknown, 503 until the directory is
    seen."""
    if key is not None and key.tasks and task not in key.tasks:
        raise Forbidden(f"this API key may not call task {shown(task)}")
    view = gateway.view
    placement = view.placements.get(task)
    record = view.tasks.get(task)
    if record is None:
        # A task is known from the directory, which also says its kind. A placement alone
        # serves only once the directory is read: an older control plane published placements
        # of retrieval tasks only; a newer one publishes the directory right after its
        # placements.
        if not (view.directory_published and view.synced):
            raise gateway.not_ready("tasks and placements")
        if placement is None:
            raise UnknownTask(f"unknown task {shown(task)}")
        record = TaskRecord(task, LEGACY_KIND)
    outcome.task = task
    return record, placement


def stock_task(
    gateway: Gateway, task: str, want: str, outcome: Outcome, key: KeyRecord | None
) -> tuple[TaskRecord, PlacementValue | None]:
    """A stock-client endpoint's task once its body is parsed: it exists and is of the
    endpoint's kind."""
    record, placement = find_task(gateway, task, key, outcome)
    if record.kind != want:
        raise BadRequest(
            f"task {task!r} is a {record.kind} task; call POST "
            f"{KIND_ENDPOINT.get(record.kind, '?')} (or POST /v1/tasks/{{task}})"
        )
    return record, placement


async def check_servable(
    gateway: Gateway, task: str, placement: PlacementValue | None
) -> PlacementValue:
    """The task can be served now: a fleet name, a placement, a live worker running it."""
    try:
        nats_layout.check_task_name(task)
    except nats_layout.InvalidTaskName as exc:
        raise BadRequest(str(exc), code="TASK_NOT_SERVABLE") from exc
    retry_after_s = gateway.settings.retry_after_s
    if placement is None:
        raise Unavailable(
            f"task {task!r} is not placed on the fleet yet (no promotion or placement)",
            code="NOT_PLACED",
            retry_after_s=retry_after_s,
        )
    if not await gateway.dispatcher.live_workers(task):
        raise Unavailable(
            f"no live worker serves task {task!r} yet",
            code="NO_WORKER",
            retry_after_s=retry_after_s,
        )
    return placement


async def queue_call(
    gateway: Gateway,
    record: TaskRecord,
    placement: PlacementValue | None,
    parsed: TaskBody,
    key: KeyRecord | None,
    call: CallHeaders,
) -> Served:
    """The checks of a parsed body of the task's kind, in order, then queue it and wait."""
    task = record.name
    parsed.check_limits(record)
    served = await check_servable(gateway, task, placement)
    dispatcher = gateway.dispatcher
    await dispatcher.await_epoch(task, call.min_epoch, call.timeout_s)
    gateway.admission.charge_tokens(key, parsed, served)
    return await dispatcher.submit(
        task,
        parsed,
        timeout_s=call.timeout_s,
        priority=call.priority,
        min_epoch=call.min_epoch,
        key=key.name if key is not None else None,
        sampling=await sampling_of(gateway, record, served, key),
    )


async def sampling_of(
    gateway: Gateway, record: TaskRecord, placement: PlacementValue, key: KeyRecord | None
) -> Sampling | None:
    """How this task's requests are sampled now; None when none are. The shadow gets copies
    only while a live worker holds its placement."""
    if record.sample_rate <= 0:
        return None
    shadow = gateway.view.shadows.get(record.name)
    if shadow is not None and not await gateway.dispatcher.live_workers(shadow_key(record.name)):
        shadow = None
    return Sampling(
        rate=record.sample_rate,
        retention_s=record.retention_s,
        kind=record.kind,
        candidate=placement.candidate,
        shadow=shadow,
        key=key.name if key is not None else None,
    )


async def answered(handler: Callable[[], Awaitable[Response]]) -> tuple[Response, str]:
    """``handler``'s response, or its refusal in the one error shape; and the code."""
    try:
        return await handler(), OK_CODE
    except Exception as exc:
        if not isinstance(exc, ApiError):  # the gateway's own refusals and the registry's
            # A bug or an unforeseen failure still answers in the one error shape; the
            # traceback goes to the log, not to the caller.
            log.exception("unexpected failure while serving a request")
            exc = GatewayError("internal gateway error; see its log")
        return error_response(exc), exc.code


async def measured(
    gateway: Gateway, outcome: Outcome, handler: Callable[[], Awaitable[Response]]
) -> Response:
    """``handler``'s response, any failure answered in the one error shape, both counted."""
    started = time.perf_counter()
    response, code = await answered(handler)
    gateway.metrics.observe(outcome.task, response.status_code, code, time.perf_counter() - started)
    return response


def served_by(served: Served) -> dict[str, str]:
    reply = served.reply
    headers = {
        "X-Taskfleet-Epoch": str(reply.epoch),
        "X-Taskfleet-Model": reply.model_key,
        "X-Request-Id": reply.request_id,
    }
    if served.sampled:  # feedback about it is taken (POST /v1/feedback)
        headers[SAMPLED_HEADER] = "1"
    return headers
