"""``POST /v1/feedback``: what a caller says about a sampled request becomes suite data.

A body names the request by the id every reply carries (``id`` / ``X-Request-Id``) and, by the
task's kind, the truth about one of its inputs (``index``, default 0):
``{"request_id", "label"}`` (classification), ``{"request_id", "relevant": [document index]}``
(rerank), ``{"request_id", "relevant_ids": [corpus id]}`` (retrieval). Checked in this order,
each refusal one answer of the public error shape (docs/protocol.md "Feedback"):

1. the body's shape (400);
2. the request was sampled and its record is still kept (404 ``UNKNOWN_REQUEST``: unknown,
   expired or not sampled; the gateway keeps no record of requests it did not sample);
3. the key may act on the request's task (403);
4. the truth fits the request: the label is one of the task's labels, the document indexes are
   the request's, the index names one of its inputs (400); corpus ids are checked by the
   control plane when it joins the feedback (it knows the corpus, the gateway does not);
5. nothing was said about that input yet (409 ``FEEDBACK_EXISTS``): the stream keeps the first
   message per ``feedback.<task>.<request id>.<index>`` and refuses the next.

Accepted feedback is answered 202: the control plane joins it with the sampled inputs into a
labelled item of the task's live split. The gateway reads NATS and publishes; no database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from contract import HEADERS
from httpapi.errors import ErrorCode, shown
from serving import nats_layout
from serving import protocol as p
from serving.directory import KeyRecord
from serving.gateway.bodies import check_fields
from serving.gateway.errors import BadRequest, Forbidden, GatewayError, Unavailable
from serving.sample_records import (
    HEADER_TTL,
    ROLE_CHAMPION,
    ChampionSample,
    Feedback,
    decode_sample,
    encode,
    ttl_header,
)

# Stream error code of a publish refused by ``discard_new_per_subject``: feedback exists.
_SUBJECT_FULL = 10077
MAX_FEEDBACK_BYTES = 1024 * 1024
MAX_RELEVANT = 2048
FIELDS = {"request_id", "index", "label", "relevant", "relevant_ids"}
TRUTHS = ("label", "relevant", "relevant_ids")


class UnknownRequest(GatewayError):
    code = ErrorCode.UNKNOWN_REQUEST


class FeedbackExists(GatewayError):
    code = ErrorCode.FEEDBACK_EXISTS


@dataclass(frozen=True)
class FeedbackRequest:
    request_id: str
    index: int
    label: str | None = None
    relevant: list[int] | None = None
    relevant_ids: list[str] | None = None


def parse_feedback(obj: dict[str, Any]) -> FeedbackRequest:
    """The body's shape, before anything is looked up."""
    check_fields(obj, FIELDS, ("request_id",))
    request_id = obj["request_id"]
    if not isinstance(request_id, str) or not request_id:
        raise BadRequest("'request_id' must be the id a reply carried (X-Request-Id)")
    try:
        nats_layout.check_token(request_id)
    except ValueError:
        raise BadRequest(f"{shown(request_id)} is not a request id") from None
    index = obj.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise BadRequest("'index' must be an integer >= 0 (the input of the request)")
    given = [name for name in TRUTHS if name in obj]
    if len(given) != 1:
        raise BadRequest(
            "send exactly one of 'label' (classification), 'relevant' (rerank: document "
            "indexes) or 'relevant_ids' (retrieval: corpus ids)"
        )
    truth, value = given[0], obj[given[0]]
    if truth == "label":
        if not isinstance(value, str) or not value:
            raise BadRequest("'label' must be a label of the task")
        return FeedbackRequest(request_id, index, label=value)
    if not isinstance(value, list) or len(value) > MAX_RELEVANT:
        raise BadRequest(f"{truth!r} must be a list of at most {MAX_RELEVANT} entries")
    if truth == "relevant":
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise BadRequest("'relevant' holds document indexes (integers >= 0)")
        return FeedbackRequest(request_id, index, relevant=list(value))
    if not all(isinstance(v, str) and v for v in value):
        raise BadRequest("'relevant_ids' holds ids of the suite's corpus (strings)")
    return FeedbackRequest(request_id, index, relevant_ids=list(value))


async def find_sample(js: JetStreamContext, request_id: str) -> ChampionSample:
    """The gateway's record of a sampled request, of whatever task (404 when not kept)."""
    subject = f"{nats_layout.SAMPLES_SUBJECT_PREFIX}*.{request_id}.{ROLE_CHAMPION}"
    try:
        message = await js.get_last_msg(nats_layout.SAMPLES_STREAM, subject)
    except NotFoundError:
        raise UnknownRequest(
            f"no sampled request {shown(request_id)} is kept: the id is unknown, its task's "
            "retention has passed, or it was not sampled (only replies with "
            "X-Taskfleet-Sampled: 1 take feedback)"
        ) from None
    except (nats.errors.Error, TimeoutError) as exc:
        raise Unavailable(
            f"the sampled requests could not be read from NATS: {exc}",
            code="QUEUE_UNAVAILABLE",
            retry_after_s=2,
        ) from exc
    return decode_sample(message.data or b"")


def check_truth(feedback: FeedbackRequest, record: ChampionSample) -> None:
    """The truth fits the request: its kind's field, a known label, its documents, its inputs."""
    payload, reply = record.inputs(), record.answer()
    if isinstance(payload, p.ScorePayload):
        inputs = 1
        documents = payload.documents
        if feedback.relevant is None:
            raise BadRequest("a rerank request takes 'relevant' (indexes of its documents)")
        count = len(documents) if isinstance(documents, list) else 0
        outside = [k for k in feedback.relevant if k >= count]
        if outside:
            raise BadRequest(f"document index {outside[0]} is outside the request's {count}")
    else:
        texts = payload.inputs
        inputs = len(texts) if isinstance(texts, list) else 0
        if isinstance(reply, p.ClassifyReplyOk):
            if feedback.label is None:
                raise BadRequest("a classification request takes 'label'")
            if feedback.label not in reply.labels:
                listing = ", ".join(shown(label) for label in reply.labels[:10])
                raise BadRequest(
                    f"label {shown(feedback.label)} is not a label of task "
                    f"{shown(record.task)} ({listing})"
                )
        else:
            if feedback.relevant_ids is None:
                raise BadRequest("a retrieval request takes 'relevant_ids' (ids of the corpus)")
            if getattr(payload, "kind", "query") != "query":
                raise BadRequest("feedback on a retrieval request is about queries only")
    if feedback.index >= inputs:
        raise BadRequest(f"index {feedback.index} is outside the request's {inputs} input(s)")


async def record_feedback(
    js: JetStreamContext,
    feedback: FeedbackRequest,
    record: ChampionSample,
    key: KeyRecord | None,
    retention_s: float,
) -> None:
    """Check the key and the truth against the request's record (``find_sample``), and
    publish the feedback once. Raises the refusals of the module docstring."""
    if key is not None and key.tasks and record.task not in key.tasks:
        raise Forbidden(f"this API key may not act on task {shown(record.task)}")
    check_truth(feedback, record)
    message = Feedback(
        task=record.task,
        request_id=feedback.request_id,
        index=feedback.index,
        label=feedback.label,
        relevant=feedback.relevant,
        relevant_ids=feedback.relevant_ids,
        key=key.name if key is not None else None,
        ts_ms=int(time.time() * 1000),
    )
    subject = nats_layout.feedback_subject(record.task, feedback.request_id, feedback.index)
    headers = {HEADERS.msg_id: subject, HEADER_TTL: ttl_header(retention_s)}
    exists = FeedbackExists(
        f"feedback on input {feedback.index} of request {shown(feedback.request_id)} is "
        "already recorded"
    )
    try:
        ack = await js.publish(
            subject,
            encode(message),
            timeout=2.0,
            stream=nats_layout.FEEDBACK_STREAM,
            headers=headers,
        )
    except APIError as exc:
        if exc.err_code == _SUBJECT_FULL:
            raise exists from None
        raise Unavailable(
            f"JetStream did not take the feedback: {exc}",
            code="QUEUE_UNAVAILABLE",
            retry_after_s=2,
        ) from exc
    except (nats.errors.Error, TimeoutError) as exc:
        raise Unavailable(
            f"the feedback could not be published: {exc}",
            code="QUEUE_UNAVAILABLE",
            retry_after_s=2,
        ) from exc
    if ack.duplicate:  # the same message within the duplicate window: already recorded
        raise exists


FEEDBACK_RESPONSE_DOC: dict[str, Any] = {
    "description": "Accepted: the control plane joins it into the task's live split.",
    "content": {
        "application/json": {
            "example": {"status": "accepted", "request_id": "9f0c...", "task": "t", "index": 0}
        }
    },
}


def feedback_doc() -> dict[str, Any]:
    """The request body of ``POST /v1/feedback`` for the API docs."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["request_id"],
                        "properties": {
                            "request_id": {"type": "string", "description": "X-Request-Id"},
                            "index": {"type": "integer", "minimum": 0, "default": 0},
                            "label": {"type": "string", "description": "classification"},
                            "relevant": {
                                "type": "array",
                                "items": {"type": "integer", "minimum": 0},
                                "description": "rerank: indexes of the relevant documents",
                            },
                            "relevant_ids": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "retrieval: ids of the suite's corpus",
                            },
                        },
                        "additionalProperties": False,
                    },
                    "example": {"request_id": "9f0c...", "label": "schuldrecht"},
                }
            },
        }
    }
