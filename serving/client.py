"""Python client of the gateway: ``Client(base_url).embed(task, texts)`` -> numpy array.

The sync and the async client share one implementation: :func:`_embed_steps` builds the
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
from collections.abc import Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import httpx
import msgpack
import numpy as np

from serving.protocol import embeddings_from_bytes

TextKind = Literal["query", "passage"]
MSGPACK = "application/msgpack"
DEFAULT_RETRY_AFTER_S = 1.0
# Statuses retried when the error says retryable.
RETRY_STATUSES = frozenset({429, 503, 504})
MAX_RETRY_AFTER_S = 60.0


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


_ERRORS_BY_STATUS: dict[int, type[TaskfleetError]] = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: UnknownTask,
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


@dataclass(frozen=True)
class _Wait:
    seconds: float


_Step = httpx.Request | _Wait


def _embed_steps(
    base_url: str,
    headers: dict[str, str],
    task: str,
    texts: list[str] | str,
    kind: TextKind,
    timeout_ms: int | None,
    max_retries: int,
) -> Generator[_Step, httpx.Response | None, Embeddings]:
    """The whole protocol of one call; yields requests to send and waits to make."""
    inputs = [texts] if isinstance(texts, str) else list(texts)
    request_headers = {**headers, "Content-Type": MSGPACK, "Accept": MSGPACK}
    if timeout_ms is not None:
        request_headers["X-Taskfleet-Timeout-Ms"] = str(timeout_ms)
    body = msgpack.packb({"inputs": inputs, "kind": kind}, use_bin_type=True)
    url = f"{base_url.rstrip('/')}/v1/tasks/{task}"
    attempt = 0
    while True:
        response = yield httpx.Request("POST", url, content=body, headers=request_headers)
        assert response is not None
        if response.status_code == 200:
            return _parse_embeddings(response)
        error = _error_of(response)
        retry = response.status_code in RETRY_STATUSES and error.retryable
        if not retry or attempt >= max_retries:
            raise error
        attempt += 1
        yield _Wait(error.retry_after_s or DEFAULT_RETRY_AFTER_S)


def _parse_embeddings(response: httpx.Response) -> Embeddings:
    try:
        body = msgpack.unpackb(response.content, raw=False)
        vectors = embeddings_from_bytes(body["embeddings"], body["count"], body["dims"])
        return Embeddings(
            vectors=vectors,
            model_key=str(body["model_key"]),
            epoch=int(body["epoch"]),
            request_id=response.headers.get("X-Request-Id"),
        )
    except Exception as exc:  # any malformation of the answer is one kind of failure
        raise ServerError(
            response.status_code, "BAD_RESPONSE", f"malformed gateway answer: {exc}"
        ) from exc


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
    cls = _ERRORS_BY_STATUS.get(status, ServerError)
    return cls(status, code, message, retryable=retryable, retry_after_s=retry_after)


def _auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    """Blocking client. ``embed`` returns a ``count x dims`` float32 array."""

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
        self._http = http or httpx.Client(timeout=timeout_s)

    def embed_with_info(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> Embeddings:
        steps = _embed_steps(
            self.base_url, self._headers, task, texts, kind, timeout_ms, self.max_retries
        )
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
            result: Embeddings = done.value
            return result

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
        self._http = http or httpx.AsyncClient(timeout=timeout_s)

    async def embed_with_info(
        self,
        task: str,
        texts: list[str] | str,
        *,
        kind: TextKind = "query",
        timeout_ms: int | None = None,
    ) -> Embeddings:
        steps = _embed_steps(
            self.base_url, self._headers, task, texts, kind, timeout_ms, self.max_retries
        )
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
            result: Embeddings = done.value
            return result

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
