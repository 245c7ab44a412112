"""Rerank bodies: ``POST /v1/tasks/{task}`` for a rerank task, and ``POST /v1/rerank`` in the
shape Cohere and Jina define (and infinity and vLLM accept), ``model`` naming the task."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from httpapi.errors import shown
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
    type_name,
)
from serving.gateway.errors import BadRequest
from serving.protocol import PayloadRef, ScorePayload, ScoreReplyOk, inline_data


@dataclass(frozen=True)
class RerankBody:
    query: str
    documents: list[str]

    reply_type: ClassVar[type] = ScoreReplyOk

    @property
    def texts(self) -> list[str]:
        return self.documents

    def payload(self, task: str, texts: list[str] | PayloadRef) -> ScorePayload:
        return ScorePayload(task=task, query=self.query, documents=texts)

    def check_limits(self, task: TaskRecord) -> None:
        """The query and each document against their own limits (a query is read with every
        document, so tasks keep it shorter)."""
        check_lengths([self.query], "query", task.max_query_chars, "max_query_chars", task.name)
        check_lengths(
            self.documents, "documents", task.max_document_chars, "max_document_chars", task.name
        )

    def tokens(self, max_seq_length: int | None = None) -> int:
        """Each (query, document) pair is one sequence holding both texts, as the model reads
        it: the query counts once per document, each pair at most ``max_seq_length``."""
        query = estimate_tokens([self.query])
        cap = max_seq_length or sys.maxsize
        return sum(min(cap, query + estimate_tokens([d])) for d in self.documents)


def check_query(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'query' must be a non-empty string, got {type_name(value)}")
    return value


def parse_rerank_body(obj: dict[str, Any], max_inputs: int) -> RerankBody:
    """``{"query": str, "documents": [str]}``: one score per document, in input order."""
    check_fields(obj, {"query", "documents"}, ("query", "documents"))
    return RerankBody(
        check_query(obj["query"]), check_inputs(obj["documents"], "documents", max_inputs)
    )


def rerank_response(reply: ScoreReplyOk, fmt: Format) -> bytes:
    """msgpack carries the scores as the reply's raw little-endian float32 bytes."""
    head = {"count": reply.count, "model_key": reply.model_key, "epoch": reply.epoch}
    scores: Any = inline_data(reply) if fmt is Format.MSGPACK else reply.array().tolist()
    return encode_response({"scores": scores, **head}, fmt)


# ---- Cohere / Jina ------------------------------------------------------------------------
@dataclass(frozen=True)
class CohereRerank:
    task: str
    request: RerankBody
    top_n: int | None
    return_documents: bool


def cohere_request_doc(max_inputs: int) -> dict[str, Any]:
    """OpenAPI of `POST /v1/rerank` (and /v2/rerank); `model` is the task name."""
    text = {"type": "string", "minLength": 1}
    document = {
        "anyOf": [
            text,
            {
                "type": "object",
                "required": ["text"],
                "additionalProperties": False,
                "properties": {"text": text},
            },
        ]
    }
    schema = {
        "type": "object",
        "required": ["model", "query", "documents"],
        "additionalProperties": False,
        "properties": {
            "model": text,
            "query": text,
            "documents": {
                "type": "array",
                "items": document,
                "minItems": 1,
                "maxItems": max_inputs,
            },
            "top_n": {"type": "integer", "minimum": 1},
            "return_documents": {"type": "boolean", "default": False},
        },
    }
    return request_doc(schema, "JSON")


def parse_cohere_rerank(body: bytes, max_inputs: int) -> CohereRerank:
    """``{"model", "query", "documents": [str | {"text": str}], "top_n", "return_documents"}``."""
    obj = decode_body(body, Format.JSON)
    if not isinstance(obj, dict):
        raise BadRequest(f"the body must be a JSON object, got {type_name(obj)}")
    check_fields(
        obj, {"model", "query", "documents", "top_n", "return_documents"}, ("query", "documents")
    )
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must name the task, e.g. \"german-legal-rerank\"")
    raw = obj["documents"]
    if isinstance(raw, list):
        raw = [_document_text(d, i) for i, d in enumerate(raw)]
    top_n = obj.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise BadRequest(f"'top_n' must be a positive integer; got {shown(top_n)}")
    return_documents = obj.get("return_documents", False)
    if not isinstance(return_documents, bool):
        raise BadRequest("'return_documents' must be true or false")
    request = RerankBody(check_query(obj["query"]), check_inputs(raw, "documents", max_inputs))
    return CohereRerank(model, request, top_n, return_documents)


def _document_text(document: Any, index: int) -> Any:
    """Cohere accepts ``{"text": ...}`` objects as documents; a string passes as is."""
    if isinstance(document, dict):
        if set(document) != {"text"}:
            raise BadRequest(
                f"'documents[{index}]' must be a string or {{\"text\": str}} "
                "(structured documents and rank_fields are not supported)"
            )
        return document["text"]
    return document


def cohere_response(reply: ScoreReplyOk, parsed: CohereRerank, request_id: str) -> dict[str, Any]:
    """Results best first (ties keep input order), cut to ``top_n``; ``relevance_score`` is the
    model's raw score (a cross-encoder's logit, a bi-encoder's cosine)."""
    scores = reply.array()
    order = np.argsort(-scores, kind="stable")
    if parsed.top_n is not None:
        order = order[: parsed.top_n]
    results: list[dict[str, Any]] = []
    for index in order:
        result: dict[str, Any] = {"index": int(index), "relevance_score": float(scores[index])}
        if parsed.return_documents:
            result["document"] = {"text": parsed.request.documents[int(index)]}
        results.append(result)
    tokens = parsed.request.tokens()
    return {
        "id": request_id,
        "results": results,
        "model": parsed.task,
        "meta": {"api_version": {"version": "1"}, "billed_units": {"search_units": 1}},
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
