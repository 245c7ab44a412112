"""Public request bodies in, public response bodies out (docs/protocol.md "Public API"):
the shared parts (formats, decoding, input checks) and the embedding bodies. Rerank and
classification bodies live in ``bodies_rerank`` and ``bodies_classify``.

The gateway reads only the envelope of a request: the input strings and their kind. It checks
their *shape* (types, emptiness, count) so that nothing malformed reaches the queue, but never
looks inside a text.
"""

from __future__ import annotations

import base64
import json
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgpack
import numpy as np

from serving.gateway.errors import BadRequest, UnsupportedMediaType
from serving.protocol import PayloadRef, QueuePayload, ReplyOk, TextKind, inline_data

TEXT_KINDS: tuple[TextKind, ...] = typing.get_args(TextKind)
DEFAULT_KIND: TextKind = "query"


class Format(Enum):
    MSGPACK = "application/msgpack"
    JSON = "application/json"


_MSGPACK_TYPES = {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}


def texts_schema(max_inputs: int) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1}
    return {
        "oneOf": [text, {"type": "array", "items": text, "minItems": 1, "maxItems": max_inputs}]
    }


def task_request_doc(max_inputs: int) -> dict[str, Any]:
    """OpenAPI of `POST /v1/tasks/{task}` (the parsers are the rule; this documents them): the
    body of the task's kind. anyOf, not oneOf: a classification body is also an embedding one."""
    texts = texts_schema(max_inputs)
    embed = {
        "title": "retrieval task",
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "properties": {
            "inputs": texts,
            "kind": {"type": "string", "enum": list(TEXT_KINDS), "default": DEFAULT_KIND},
        },
    }
    rerank = {
        "title": "rerank task",
        "type": "object",
        "required": ["query", "documents"],
        "additionalProperties": False,
        "properties": {"query": {"type": "string", "minLength": 1}, "documents": texts},
    }
    classify = {
        "title": "classification task",
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "properties": {"inputs": texts},
    }
    schema = {"anyOf": [embed, rerank, classify]}
    return request_doc(schema, "msgpack (default) or JSON, the same map; the task's kind decides")


def openai_request_doc(max_inputs: int) -> dict[str, Any]:
    """OpenAPI of `POST /v1/embeddings`; `model` is the task name."""
    schema = {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "input": texts_schema(max_inputs),
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "kind": {"type": "string", "enum": list(TEXT_KINDS)},
        },
    }
    return request_doc(schema, "JSON")


TASK_RESPONSE_DOC: dict[str, Any] = {
    "description": "In the request's format unless Accept names the other one: `embeddings` "
    "(count x dims), rerank `scores` (one per document) or classification `probabilities` "
    "(count x labels, with `labels`); msgpack carries them as raw little-endian float32 bytes, "
    "JSON as lists.",
    "content": {"application/msgpack": {}, "application/json": {}},
}


def request_doc(schema: dict[str, Any], formats: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "description": f"Body: {formats}.",
            "content": {"application/json": {"schema": schema}},
        }
    }


@dataclass(frozen=True)
class EmbedRequest:
    inputs: list[str]
    kind: TextKind

    reply_type = ReplyOk

    @property
    def texts(self) -> list[str]:
        """The part of the request that may move to the object store when large."""
        return self.inputs

    def payload(self, task: str, texts: list[str] | PayloadRef) -> QueuePayload:
        return QueuePayload(task=task, kind=self.kind, inputs=texts)


def body_format(content_type: str | None) -> Format:
    """msgpack is the default when no Content-Type is sent."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if not media or media in _MSGPACK_TYPES:
        return Format.MSGPACK
    if media == "application/json" or media.endswith("+json"):
        return Format.JSON
    raise UnsupportedMediaType(
        f"Content-Type {media!r} is not supported; send application/msgpack or application/json"
    )


def response_format(request_format: Format, accept: str | None) -> Format:
    """Answer in the request's format unless ``Accept`` names the other one."""
    accepted = {a.split(";", 1)[0].strip().lower() for a in (accept or "").split(",")}
    if Format.JSON.value in accepted and not accepted & _MSGPACK_TYPES:
        return Format.JSON
    if accepted & _MSGPACK_TYPES and Format.JSON.value not in accepted:
        return Format.MSGPACK
    return request_format


def decode_body(body: bytes, fmt: Format) -> Any:
    """The decoded body; text that is not valid Unicode is refused (400) here, in one place.

    msgpack refuses invalid UTF-8 itself. JSON is trickier: ``\\ud800`` escapes decode to lone
    surrogates, which Python keeps in a ``str`` but no UTF-8 encoder (msgpack, the runtime,
    the database) accepts, so every string of a JSON body is checked before anything uses it.
    """
    if not body:
        raise BadRequest("the request body is empty")
    if fmt is Format.JSON:
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise BadRequest(f"the body is not valid JSON: {exc}") from exc
        check_unicode(obj)
        return obj
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise BadRequest(f"the body is not valid msgpack: {exc}") from exc


def check_unicode(obj: Any) -> None:
    """Raise BadRequest if any string (key or value) in ``obj`` cannot be encoded as UTF-8."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = value[exc.start : exc.end].encode("utf-8", "backslashreplace").decode()
                raise BadRequest(
                    f"the body holds text that is not valid Unicode (lone surrogate {bad})"
                ) from None
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def check_inputs(value: Any, field: str, max_inputs: int) -> list[str]:
    """A string or a non-empty list of non-empty strings."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise BadRequest(f"'{field}' must be a string or a list of strings")
    if not texts:
        raise BadRequest(f"'{field}' is empty; send at least one text")
    if len(texts) > max_inputs:
        raise BadRequest(f"'{field}' holds {len(texts)} texts; at most {max_inputs} per request")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(f"'{field}[{i}]' must be a string, got {type_name(text)}")
        if not text:
            raise BadRequest(f"'{field}[{i}]' is an empty string")
    return typing.cast(list[str], texts)


def check_kind(value: Any) -> TextKind:
    if value is None:
        return DEFAULT_KIND
    if value not in TEXT_KINDS:
        raise BadRequest(f"'kind' must be one of {', '.join(TEXT_KINDS)}; got {value!r}")
    return typing.cast(TextKind, value)


def decode_map(body: bytes, fmt: Format) -> dict[str, Any]:
    obj = decode_body(body, fmt)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a map, got {type_name(obj)}")
    return obj


def check_fields(obj: dict[str, Any], allowed: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in set(obj) - allowed)
    if unknown:
        expected = ", ".join(f"'{a}'" for a in sorted(allowed))
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; expected {expected}")
    for name in required:
        if name not in obj:
            raise BadRequest(f"missing field '{name}'")


def parse_embed_body(obj: dict[str, Any], max_inputs: int) -> EmbedRequest:
    """``{"inputs": [str] | str, "kind": "query" | "passage"}`` (kind optional)."""
    check_fields(obj, {"inputs", "kind"}, ("inputs",))
    return EmbedRequest(
        check_inputs(obj["inputs"], "inputs", max_inputs), check_kind(obj.get("kind"))
    )


@dataclass(frozen=True)
class OpenAIRequest:
    task: str
    request: EmbedRequest
    encoding_format: str


def parse_openai_request(body: bytes, max_inputs: int) -> OpenAIRequest:
    """OpenAI's embeddings request; ``model`` names the task, ``kind`` is our one extension."""
    obj = decode_body(body, Format.JSON)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a JSON object, got {type_name(obj)}")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must name the task, e.g. \"german-legal-retrieval\"")
    raw = obj.get("input")
    if isinstance(raw, list) and raw and not isinstance(raw[0], str):
        raise BadRequest(
            "'input' must be a string or a list of strings (token arrays are not supported)"
        )
    encoding = obj.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise BadRequest(f"'encoding_format' must be 'float' or 'base64'; got {encoding!r}")
    if obj.get("dimensions") is not None:
        raise BadRequest("'dimensions' is not supported: a task's model has fixed dimensions")
    request = EmbedRequest(check_inputs(raw, "input", max_inputs), check_kind(obj.get("kind")))
    return OpenAIRequest(task=model, request=request, encoding_format=encoding)


def embed_response(reply: ReplyOk, fmt: Format) -> bytes:
    """msgpack carries the embeddings as the reply's raw float32 bytes; JSON as float lists."""
    head = {"dims": reply.dims, "count": reply.count, "model_key": reply.model_key}
    if fmt is Format.MSGPACK:
        body = {"embeddings": inline_data(reply), **head, "epoch": reply.epoch}
        return typing.cast(bytes, msgpack.packb(body, use_bin_type=True))
    matrix = reply.matrix()
    return json.dumps({"embeddings": matrix.tolist(), **head, "epoch": reply.epoch}).encode()


def estimate_tokens(texts: list[str]) -> int:
    """A quarter of the characters: the gateway never tokenises (it does not hold the model's
    tokenizer; the sidecar counts real tokens for batching), so OpenAI's ``usage`` reports
    this estimate."""
    return sum(max(1, len(t) // 4) for t in texts)


def encode_response(body: dict[str, Any], fmt: Format) -> bytes:
    if fmt is Format.MSGPACK:
        return typing.cast(bytes, msgpack.packb(body, use_bin_type=True))
    return json.dumps(body).encode()


def openai_response(reply: ReplyOk, parsed: OpenAIRequest) -> dict[str, Any]:
    matrix = reply.matrix()
    data: list[dict[str, Any]] = []
    for i, row in enumerate(matrix):
        embedding: Any
        if parsed.encoding_format == "base64":
            embedding = base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode()
        else:
            embedding = row.tolist()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    tokens = estimate_tokens(parsed.request.inputs)
    return {
        "object": "list",
        "data": data,
        "model": parsed.task,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__
