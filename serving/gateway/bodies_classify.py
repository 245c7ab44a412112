"""Classification bodies: ``POST /v1/tasks/{task}`` for a classification task, and
``POST /v1/classify`` answering with per-input ``[{label, score}]`` lists, best first, the shape
TEI (``/predict``) and infinity (``/classify``) return; ``model`` names the task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from serving.directory import TaskRecord
from serving.gateway.bodies import (
    Format,
    check_fields,
    check_inputs,
    check_lengths,
    decode_body,
    encode_response,
    estimate_tokens,
    request_doc,
    texts_schema,
    type_name,
)
from serving.gateway.errors import BadRequest
from serving.protocol import ClassifyPayload, ClassifyReplyOk, PayloadRef, inline_data


@dataclass(frozen=True)
class ClassifyBody:
    inputs: list[str]
    field: str = "inputs"  # what the caller's body calls the inputs, for messages

    reply_type: ClassVar[type] = ClassifyReplyOk

    @property
    def texts(self) -> list[str]:
        return self.inputs

    def payload(self, task: str, texts: list[str] | PayloadRef) -> ClassifyPayload:
        return ClassifyPayload(task=task, inputs=texts)

    def check_limits(self, task: TaskRecord) -> None:
        check_lengths(self.inputs, self.field, task.max_text_chars, "max_text_chars", task.name)

    def tokens(self, max_seq_length: int | None = None) -> int:
        return estimate_tokens(self.inputs, max_seq_length)


def parse_classify_body(obj: dict[str, Any], max_inputs: int) -> ClassifyBody:
    """``{"inputs": [str] | str}``: label probabilities per input."""
    check_fields(obj, {"inputs"}, ("inputs",))
    return ClassifyBody(check_inputs(obj["inputs"], "inputs", max_inputs))


def classify_response(reply: ClassifyReplyOk, fmt: Format) -> bytes:
    """msgpack carries the probabilities as raw little-endian float32 bytes (count x labels)."""
    head = {"labels": reply.labels, "count": reply.count, "model_key": reply.model_key}
    if fmt is Format.MSGPACK:
        body = {"probabilities": inline_data(reply), **head, "epoch": reply.epoch}
    else:
        body = {"probabilities": reply.matrix().tolist(), **head, "epoch": reply.epoch}
    return encode_response(body, fmt)


@dataclass(frozen=True)
class ClassifyApiRequest:
    task: str
    request: ClassifyBody


def classify_request_doc(max_inputs: int) -> dict[str, Any]:
    """OpenAPI of `POST /v1/classify`; `model` is the task name."""
    schema = {
        "type": "object",
        "required": ["model", "input"],
        "additionalProperties": False,
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": texts_schema(max_inputs),
            "raw_scores": {"type": "boolean", "enum": [False], "default": False},
        },
    }
    return request_doc(schema, "JSON")


def parse_classify_api(body: bytes, max_inputs: int) -> ClassifyApiRequest:
    """``{"model": <task>, "input": str | [str]}`` (infinity's body; ``raw_scores`` false)."""
    obj = decode_body(body, Format.JSON)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a JSON object, got {type_name(obj)}")
    check_fields(obj, {"model", "input", "raw_scores"}, ("input",))
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must name the task, e.g. \"german-legal-area\"")
    raw_scores = obj.get("raw_scores", False)
    if not isinstance(raw_scores, bool):
        raise BadRequest("'raw_scores' must be false (or left out)")
    if raw_scores:
        raise BadRequest("'raw_scores' is not supported: scores are label probabilities")
    inputs = check_inputs(obj["input"], "input", max_inputs)
    return ClassifyApiRequest(model, ClassifyBody(inputs, field="input"))


def classify_api_response(
    reply: ClassifyReplyOk, parsed: ClassifyApiRequest, request_id: str
) -> dict[str, Any]:
    matrix = reply.matrix()
    data = []
    for row in matrix:
        pairs = [(label, float(p)) for label, p in zip(reply.labels, row, strict=True)]
        ranked = sorted(pairs, key=lambda pair: -pair[1])
        data.append([{"label": label, "score": score} for label, score in ranked])
    tokens = parsed.request.tokens()
    return {
        "object": "classify",
        "id": request_id,
        "data": data,
        "model": parsed.task,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
