"""Public request bodies in, public response bodies out (docs/protocol.md "Public API"):
the shared parts (formats, decoding, input checks) and the embedding bodies. Rerank and
classification bodies live in ``bodies_rerank`` and ``bodies_classify``.

The gateway parses every field of a body (unknown ones refused) for the task's kind: the input
strings and their kind here, a query and its documents, a stock client's fields. It checks their
*shape* (types, emptiness, count) and their *length* against the task's per-text limits (413;
``registry/limits.py``) so that nothing malformed or unbounded reaches the queue, but never
looks inside a text. What a request costs is estimated here too (``estimate_tokens``): the
gateway holds no tokenizer, so a text counts a quarter of its characters, at most the model's
``max_seq_length`` (workers cut every text to it).
"""

from __future__ import annotations

import base64
import json
import sys
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgpack
import numpy as np

from httpapi.errors import shown
from serving.directory import TaskRecord
from serving.gateway.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
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
class EmbedBody:
    inputs: list[str]
    kind: TextKind
    field: str = "inputs"  # what the caller's body calls the inputs, for messages

    reply_type = ReplyOk

    @property
    def texts(self) -> list[str]:
        """The part of the request that may move to the object store when large."""
        return self.inputs

    def payload(self, task: str, texts: list[str] | PayloadRef) -> QueuePayload:
        return QueuePayload(task=task, kind=self.kind, inputs=texts)

    def check_limits(self, task: TaskRecord) -> None:
        check_lengths(self.inputs, self.field, task.max_text_chars, "max_text_chars", task.name)

    def tokens(self, max_seq_length: int | None = None) -> int:
        return estimate_tokens(self.inputs, max_seq_length)


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


def check_lengths(texts: list[str], field: str, limit: int, setting: str, task: str) -> None:
    """413 for the first text above ``limit`` characters, naming it and the task's limit
    (``field`` names a list of texts; a field that is one text is named without an index)."""
    for i, text in enumerate(texts):
        if len(text) > limit:
            where = field if field == "query" else f"{field}[{i}]"
            raise PayloadTooLarge(
                f"'{where}' has {len(text)} characters; task {task!r} allows at most "
                f"{limit} per text ({setting})"
            )


# The gateway's estimate of a text's model tokens: a quarter of its characters.
CHARS_PER_TOKEN = 4


def estimate_tokens(texts: list[str], max_seq_length: int | None = None) -> int:
    """The estimated tokens of ``texts``: a quarter of the characters per text, at least 1 and
    at most ``max_seq_length`` (what the model reads of it; None: no cap). The gateway never
    tokenises (it holds no tokenizer; the sidecar counts real tokens for batching): quotas and
    OpenAI's ``usage`` use this estimate."""
    cap = max_seq_length or sys.maxsize
    return sum(min(cap, max(1, len(t) // CHARS_PER_TOKEN)) for t in texts)


def check_kind(value: Any) -> TextKind:
    if value is None:
        return DEFAULT_KIND
    if value not in TEXT_KINDS:
        raise BadRequest(f"'kind' must be one of {', '.join(TEXT_KINDS)}; got {shown(value)}")
    return typing.cast(TextKind, value)


def decode_map(body: bytes, fmt: Format) -> dict[str, Any]:
    obj = decode_body(body, fmt)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a map, got {type_name(obj)}")
    return obj


# How many unknown fields a refusal names (a body may hold a million).
SHOWN_FIELDS = 5


def check_fields(obj: dict[str, Any], allowed: set[str], required: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in set(obj) - allowed)
    if unknown:
        expected = ", ".join(f"'{a}'" for a in sorted(allowed))
        named = ", ".join(shown(k) for k in unknown[:SHOWN_FIELDS])
        more = f" and {len(unknown) - SHOWN_FIELDS} more" if len(unknown) > SHOWN_FIELDS else ""
        raise BadRequest(f"unknown field(s) {named}{more}; expected {expected}")
    for name in required:
        if name not in obj:
            raise BadRequest(f"missing field '{name}'")


def parse_embed_body(obj: dict[str, Any], max_inputs: int) -> EmbedBody:
    """``{"inputs": [str] | str, "kind": "query" | "passage"}`` (kind optional)."""
    check_fields(obj, {"inputs", "kind"}, ("inputs",))
    return EmbedBody(check_inputs(obj["inputs"], "inputs", max_inputs), check_kind(obj.get("kind")))


@dataclass(frozen=True)
class OpenAIRequest:
    task: str
    request: EmbedBody
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
        raise BadRequest(f"'encoding_format' must be 'float' or 'base64'; got {shown(encoding)}")
    if obj.get("dimensions") is not None:
        raise BadRequest("'dimensions' is not supported: a task's model has fixed dimensions")
    request = EmbedBody(
        check_inputs(raw, "input", max_inputs), check_kind(obj.get("kind")), field="input"
    )
    return OpenAIRequest(task=model, request=request, encoding_format=encoding)


def embed_response(reply: ReplyOk, fmt: Format) -> bytes:
    """msgpack carries the embeddings as the reply's raw float32 bytes; JSON as float lists."""
    head = {"dims": reply.dims, "count": reply.count, "model_key": reply.model_key}
    if fmt is Format.MSGPACK:
        body = {"embeddings": inline_data(reply), **head, "epoch": reply.epoch}
        return typing.cast(bytes, msgpack.packb(body, use_bin_type=True))
    matrix = reply.matrix()
    return json.dumps({"embeddings": matrix.tolist(), **head, "epoch": reply.epoch}).encode()


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
    tokens = parsed.request.tokens()
    return {
        "object": "list",
        "data": data,
        "model": parsed.task,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__
