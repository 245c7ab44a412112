"""Python client of the gateway, one call per task kind, by task name:
``embed(task, texts)`` -> vectors, ``rerank(task, query, documents)`` -> one score per document,
``classify(task, texts)`` -> label probabilities; ``feedback(request_id, ...)`` says what was
right about a sampled request (its result's ``sampled``), which becomes suite data.

The sync and the async client share one implementation: :func:`_task_steps` builds the
request, decides about retries and parses the answer, and only *asks* its driver to send a
request or to wait. The two drivers (``Client`` over ``httpx.Client``, ``AsyncClient`` over
``httpx.AsyncClient``) do nothing else, so they cannot drift apart.

Retries: an error the server marks ``retryable`` - a 503 (no worker can take the task yet, the
queue or the registry is unreachable), a 429 (the key is over its quota) or a 504 whose worker
died meanwhile - is retried after the server's ``Retry-After``, up to ``max_retries`` times.
Nothing was queued for a 503 or a 429, and a request that missed its deadline is dropped by
the worker that finds it, so a retry never runs a request twice. Every other error raises at
once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

import httpx
import msgpack
import numpy as np

from serving.protocol import embeddings_from_bytes, floats_from_bytes

R = TypeVar("R")

TextKind = Literal["query", "passage"]
MSGPACK = "application/msgpack"
DEFAULT_RETRY_AFTER_S = 1.0
# Statuses retried when the error says retryable.
RETRY_STATUSES = frozenset({429, 503, 504})
MAX_RETRY_AFTER_S = 60.0
MIN_EPOCH_HEADER = "X-Taskfleet-Min-Epoch"
SAMPLED_HEADER = "X-Taskfleet-Sampled"


class TaskfleetError(Exception):
    """An error answer of the gateway (the public error shape) or a malformed answer."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class BadRequest(TaskfleetError):
    """400/413/415: the request itself is wrong; retrying the same one cannot help."""


class AuthError(TaskfleetError):
    """401/403: missing, unknown or insufficient API key."""


class UnknownTask(TaskfleetError):
    """404: the registry has no such task."""


class Unavailable(TaskfleetError):
    """503 after all retries: no worker could take the task."""


class RateLimited(TaskfleetError):
    """429 after all retries: the API key is over its request-rate quota."""


class DeadlineExceeded(TaskfleetError):
    """504: no worker answered before the deadline."""


class ServerError(TaskfleetError):
    """Any other failure (a worker's error, a malformed answer)."""


class UnknownRequest(TaskfleetError):
    """404 on feedback: no sampled request with that id is kept (unknown, expired, not sampled)."""


class FeedbackExists(BadRequest):
    """409 on feedback: that input of the request already has feedback."""


# Codes with an error class of their own, whatever their status.
_ERRORS_BY_CODE: dict[str, type[TaskfleetError]] = {
    "UNKNOWN_REQUEST": UnknownRequest,
    "FEEDBACK_EXISTS": FeedbackExists,
}


_ERRORS_BY_STATUS: dict[int, type[TaskfleetError]] = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: UnknownTask,
    409: BadRequest,
    413: BadRequest,
    415: BadRequest,
    429: RateLimited,
    503: Unavailable,
    504: DeadlineExceeded,
}


@dataclass(frozen=True)
class Embeddings:
    """Vectors plus which placement served them."""

    vectors: np.ndarray
    model_key: str
    epoch: int
    request_id: str | None
    sampled: bool = False  # the gateway kept it: feedback about it is taken


@dataclass(frozen=True)
class Scores:
    """One relevance score per document (input order), plus which placement served them."""

    scores: np.ndarray
    model_key: str
    epoch: int
    request_id: str | None
    sampled: bool = False


@dataclass(frozen=True)
class Classification:
    """``count x len(labels)`` label probabilities, plus which placement served them."""

    labels: list[str]
    probabilities: np.ndarray
    model_key: str
    epoch: int
    request_id: str | None
    sampled: bool = False

    def predictions(self) -> list[str]:
        return [self.labels[i] for i in np.argmax(self.probabilities, axis=1)]


@dataclass(frozen=True)
class _Wait:
    seconds: float


_Step = httpx.Request | _Wait


def _task_steps(
    base_url: str,
    headers: dict[str, str],
    task: str,
    payload: dict[str, Any],
    timeout_ms: int | None,
    max_retries: int,
    parse: Callable[[httpx.Response, dict[str, Any]], R],
    epochs: dict[str, int],
) -> Generator[_Step, httpx.Response | None, R]:
    """The whole protocol of one call; yields requests to send and waits to make.

    ``epochs`` (per task, the newest placement epoch this client has had a reply from) is sent
    as ``X-Taskfleet-Min-Epoch`` and raised by the reply: whichever gateway takes the next
    call, no reply comes from an older epoch than one already seen."""
    request_headers = {**headers, "Content-Type": MSGPACK, "Accept": MSGPACK}
    if timeout_ms is not None:
        request_headers["X-Taskfleet-Timeout-Ms"] = str(timeout_ms)
    if task in epochs:
        request_headers[MIN_EPOCH_HEADER] = str(epochs[task])
    body = msgpack.packb(payload, use_bin_type=True)
    url = f"{base_url.rstrip('/')}/v1/tasks/{task}"

    def parsed(response: httpx.Response) -> R:
        result = parse(response, msgpack.unpackb(response.content, raw=False))
        epochs[task] = max(epochs.get(task, 0), getattr(result, "epoch", 0))
        return result

    request = httpx.Request("POST", url, content=body, headers=request_headers)
    return (yield from _steps(request, 200, parsed, max_retries))


def _steps(
    request: httpx.Request,
    ok: int,
    parse: Callable[[httpx.Response], R],
    max_retries: int,
) -> Generator[_Step, httpx.Response | None, R]:
    """Send ``request`` until it is answered ``ok`` (parsed) or with an error that is not
    retried (raised); retryable errors wait for their ``Retry-After`` first."""
    attempt = 0
    while True:
        response = yield request
        assert response is not None
        if response.status_code == ok:
            try:
                return parse(response)
            except Exception as exc:  # any malformation of the answer is one kind of failure
                raise ServerError(
                    response.status_code, "BAD_RESPONSE", f"malformed gateway answer: {exc}"
                ) from exc
        error = _error_of(response)
        retry = response.status_code in RETRY_STATUSES and error.retryable
        if not retry or attempt >= max_retries:
            raise error
        attempt += 1
        yield _Wait(error.retry_after_s or DEFAULT_RETRY_AFTER_S)


def _feedback_steps(
    base_url: str, headers: dict[str, str], body: dict[str, Any], max_retries: int
) -> Generator[_Step, httpx.Response | None, None]:
    url = f"{base_url.rstrip('/')}/v1/feedback"
    request = httpx.Request("POST", url, json=body, headers=headers)
    yield from _steps(request, 202, lambda _: None, max_retries)


def _feedback_body(
    request_id: str,
    label: str | None,
    relevant: list[int] | None,
    relevant_ids: list[str] | None,
    index: int,
) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": request_id, "index": index}
    for name, value in (("label", label), ("relevant", relevant), ("relevant_ids", relevant_ids)):
        if value is not None:
            body[name] = value
    return body


def _embed_payload(texts: list[str] | str, kind: TextKind) -> dict[str, Any]:
    return {"inputs": [texts] if isinstance(texts, str) else list(texts), "kind": kind}


def _rerank_payload(query: str, documents: list[str]) -> dict[str, Any]:
    return {"query": query, "documents": list(documents)}


def _classify_payload(texts: list[str] | str) -> dict[str, Any]:
    return {"inputs": [texts] if isinstance(texts, str) else list(texts)}


def _parse_embeddings(response: httpx.Response, body: dict[str, Any]) -> Embeddings:
    return Embeddings(
        vectors=embeddings_from_bytes(body["embeddings"], body["count"], body["dims"]),
        model_key=str(body["model_key"]),
        epoch=int(body["epoch"]),
        request_id=response.headers.get("X-Request-Id"),
        sampled=response.headers.get(SAMPLED_HEADER) == "1",
    )


def _parse_scores(response: httpx.Response, body: dict[str, Any]) -> Scores:
    return Scores(
        scores=floats_from_bytes(body["scores"], body["count"], 1)[:, 0],
        model_key=str(body["model_key"]),
        epoch=int(body["epoch"]),
        request_id=response.headers.get("X-Request-Id"),
        sampled=response.headers.get(SAMPLED_HEADER) == "1",
    )


def _parse_classification(response: httpx.Response, body: dict[str, Any]) -> Classification:
    labels = [str(label) for label in body["labels"]]
    return Classification(
        labels=labels,
        probabilities=floats_from_bytes(body["probabilities"], body["count"], len(labels)),
        model_key=str(body["model_key"]),
        epoch=int(body["epoch"]),
        request_id=response.headers.get("X-Request-Id"),
        sampled=response.headers.get(SAMPLED_HEADER) == "1",
    )


def _error_of(response: httpx.Response) -> TaskfleetError:
    status = response.status_code
    code, message, retryable = f"HTTP_{status}", response.text[:200], status == 503
    try:
        error = response.json()["error"]
        code, message, retryable = (
            str(error["code"]),
            str(error["message"]),
            bool(error["retryable"]),
        )
    except Exception:
        pass  # not our error shape (a proxy's page): keep the HTTP status as the code
    retry_after: float | None = None
    raw = response.headers.get("Retry-After")
    if raw is not None:
        try:
            retry_after = min(max(float(raw), 0.0), MAX_RETRY_AFTER_S)
        except ValueError:
            retry_after = None
    cls = _ERRORS_BY_CODE.get(code) or _ERRORS_BY_STATUS.get(status, ServerError)
    return cls(status, code, message, retryable=retryable, retry_after_s=retry_after)


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Blocking client. ``embed`` returns a ``count x dims`` float32 array; ``rerank`` and
    ``classify`` return :class:`Scores` and :class:`Classification`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        http: httpx.Client | None = None,
    ) -> None:
        self.base_url = base_url
        self.max_retries = max_retries
        self._headers = _auth_headers(api_key)
        self._epochs: dict[str, int] = {}  # newest epoch replied per task
        self._http = http or httpx.Client(timeout=timeout_s)

    def _run(
        self,
        task: str,
        payload: dict[str, Any],
        timeout_ms: int | None,
        parse: Callable[[httpx.Response, dict[str, Any]], R],
    ) -> R:
        steps = _task_steps(
            self.base_url,
            self._headers,
            task,
            payload,
            timeout_ms,
            self.max_retries,
            parse,
            self._epochs,
        )
        return self._drive(steps)

    def _drive(self, steps: Generator[_Step, httpx.Response | None, R]) -> R:
        reply: httpx.Response | None = None
        try:
            while True:
                step = steps.send(reply)
                if isinstance(step, _Wait):
                    time.sleep(step.seconds)
                    reply = None
                else:
                    reply = self._http.send(step)
        except StopIteration as done:
            result: R = done.value
            return result

    def feedback(
        self,
        request_id: str,
        *,
        label: str | None = None,
        relevant: list[int] | None = None,
        relevant_ids: list[str] | None = None,
        index: int = 0,
    ) -> None:
        """Say what was right about input ``index`` of a sampled request (its reply had
        ``sampled``): its label, the indexes of its relevant documents, or the ids of its
        relevant corpus documents. Recorded once; a second time raises (409)."""
        body = _feedback_body(request_id, label, relevant, relevant_ids, index)
        self._drive(_feedback_steps(self.base_url, self._headers, body, self.max_retries))

    def embed_with_info(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> Embeddings:
        return self._run(task, _embed_payload(texts, kind), timeout_ms, _parse_embeddings)

    def rerank(
        self, task: str, query: str, documents: list[str], *, timeout_ms: int | None = None
    ) -> Scores:
        """One score per document of a rerank task (higher is more relevant)."""
        return self._run(task, _rerank_payload(query, documents), timeout_ms, _parse_scores)

    def classify(
        self, task: str, texts: list[str] | str, *, timeout_ms: int | None = None
    ) -> Classification:
        """Label probabilities per text of a classification task."""
        return self._run(task, _classify_payload(texts), timeout_ms, _parse_classification)

    def embed(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> np.ndarray:
        return self.embed_with_info(task, texts, kind=kind, timeout_ms=timeout_ms).vectors

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncClient:
    """The same calls as :class:`Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url
        self.max_retries = max_retries
        self._headers = _auth_headers(api_key)
        self._epochs: dict[str, int] = {}  # newest epoch replied per task
        self._http = http or httpx.AsyncClient(timeout=timeout_s)

    async def _run(
        self,
        task: str,
        payload: dict[str, Any],
        timeout_ms: int | None,
        parse: Callable[[httpx.Response, dict[str, Any]], R],
    ) -> R:
        steps = _task_steps(
            self.base_url,
            self._headers,
            task,
            payload,
            timeout_ms,
            self.max_retries,
            parse,
            self._epochs,
        )
        return await self._drive(steps)

    async def _drive(self, steps: Generator[_Step, httpx.Response | None, R]) -> R:
        reply: httpx.Response | None = None
        try:
            while True:
                step = steps.send(reply)
                if isinstance(step, _Wait):
                    await asyncio.sleep(step.seconds)
                    reply = None
                else:
                    reply = await self._http.send(step)
        except StopIteration as done:
            result: R = done.value
            return result

    async def feedback(
        self,
        request_id: str,
        *,
        label: str | None = None,
        relevant: list[int] | None = None,
        relevant_ids: list[str] | None = None,
        index: int = 0,
    ) -> None:
        """As :meth:`Client.feedback`."""
        body = _feedback_body(request_id, label, relevant, relevant_ids, index)
        await self._drive(_feedback_steps(self.base_url, self._headers, body, self.max_retries))

    async def embed_with_info(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> Embeddings:
        return await self._run(task, _embed_payload(texts, kind), timeout_ms, _parse_embeddings)

    async def rerank(
        self, task: str, query: str, documents: list[str], *, timeout_ms: int | None = None
    ) -> Scores:
        return await self._run(task, _rerank_payload(query, documents), timeout_ms, _parse_scores)

    async def classify(
        self, task: str, texts: list[str] | str, *, timeout_ms: int | None = None
    ) -> Classification:
        payload = _classify_payload(texts)
        return await self._run(task, payload, timeout_ms, _parse_classification)

    async def embed(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> np.ndarray:
        result = await self.embed_with_info(task, texts, kind=kind, timeout_ms=timeout_ms)
        return result.vectors

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
