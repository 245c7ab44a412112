"""A client that keeps count of what happened to every request it sent.

One *call* is one logical request (a list of texts, sent by msgpack, JSON or the OpenAI route).
A call may take several HTTP *attempts*: a retryable error (503, 429, or a 504 that says
``retryable``) is retried after its ``Retry-After`` until the call's retry budget is spent.
Every call ends in exactly one outcome:

- ``answered`` - a 200 whose rows are, row by row, the in-process vectors of its texts;
- ``wrong``    - a 200 with any other vectors (or shape);
- ``expected`` - the error the call was meant to get (poison input, bad input);
- ``gave_up``  - still retryable errors when the retry budget ran out (the fleet said "later");
- ``lost``     - anything else: a non-retryable error that was not expected (a 504 that says
  ``retryable: false``, a 500), or no HTTP answer at all.

Besides outcomes the tally counts ``duplicated`` answers (one request id answering two calls)
and every 500 (``internal_errors``: "no 500" means this stays 0; documented failures are other
statuses - 502 for a worker's own error such as INFER_FAILED, 503/504 when retryable), and
``epoch_regressions``: answers from an older placement epoch than one the client had already
been answered from before the call began.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import msgpack
import numpy as np

from testbed.faults.reference import Reference

Protocol = Literal["msgpack", "json", "openai"]
PROTOCOLS: tuple[Protocol, ...] = ("msgpack", "json", "openai")
OUTCOMES = ("answered", "wrong", "expected", "gave_up", "lost")
MAX_RETRY_WAIT_S = 5.0


@dataclass(frozen=True)
class Call:
    texts: list[str]
    kind: str = "query"
    protocol: Protocol = "msgpack"
    timeout_ms: int | None = None
    # The error code this call must end with (poison or bad input); None: it must be answered.
    expect_error: str | None = None
    family: str = "normal"
    # Another task than the client's (a stream over several tasks).
    task: str | None = None


@dataclass
class Record:
    """What happened to one call."""

    call: Call
    started: float
    ended: float = 0.0
    outcome: str = "lost"
    attempts: int = 0
    retryable_errors: int = 0
    statuses: list[int] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    last_message: str = ""
    epoch: int = 0  # the placement epoch that answered (X-Taskfleet-Epoch), 0 when none

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def __repr__(self) -> str:
        call = self.call
        return (
            f"Record({call.family}/{call.protocol} x{len(call.texts)} -> {self.outcome} "
            f"after {self.seconds:.1f}s, statuses={self.statuses}, codes={self.codes})"
        )


@dataclass
class Tally:
    records: list[Record] = field(default_factory=list)
    duplicated: int = 0
    _seen_ids: set[str] = field(default_factory=set)

    # ---- counts
    @property
    def sent(self) -> int:
        return len(self.records)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.records if r.outcome == outcome)

    @property
    def answered(self) -> int:
        return self.count("answered")

    @property
    def lost(self) -> int:
        return self.count("lost")

    @property
    def wrong(self) -> int:
        return self.count("wrong")

    @property
    def retryable_errors(self) -> int:
        return sum(r.retryable_errors for r in self.records)

    @property
    def internal_errors(self) -> int:
        """500 answers: an unforeseen failure somewhere (never expected)."""
        return sum(1 for r in self.records for s in r.statuses if s == 500)

    def codes(self) -> Counter[str]:
        return Counter(code for r in self.records for code in r.codes)

    def epoch_regressions(self) -> int:
        """Answers from an older epoch than one answered before the call was sent."""
        answered = sorted((r for r in self.records if r.epoch), key=lambda r: r.ended)
        ends = [r.ended for r in answered]
        highest = list(itertools.accumulate((r.epoch for r in answered), max))
        back = 0
        for r in answered:
            before = bisect.bisect_left(ends, r.started)
            if before and r.epoch < highest[before - 1]:
                back += 1
        return back

    def epochs(self) -> Counter[int]:
        return Counter(r.epoch for r in self.records if r.epoch)

    def note_request_id(self, request_id: str | None) -> bool:
        """Remember an answer's request id; True when another call was answered with it."""
        if not request_id:
            return False
        if request_id in self._seen_ids:
            self.duplicated += 1
            return True
        self._seen_ids.add(request_id)
        return False

    # ---- latency
    def latencies(self, since: float = 0.0, until: float = float("inf")) -> list[float]:
        """Seconds of answered calls that were in flight at some time in [since, until]."""
        return [
            r.seconds
            for r in self.records
            if r.outcome == "answered" and r.started <= until and r.ended >= since
        ]

    def p99(self, since: float = 0.0, until: float = float("inf")) -> float:
        values = self.latencies(since, until)
        return float(np.quantile(values, 0.99)) if values else float("nan")

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
        return {
            "sent": self.sent,
            **{o: self.count(o) for o in OUTCOMES},
            "retryable_errors": self.retryable_errors,
            "duplicated": self.duplicated,
            "internal_errors": self.internal_errors,
            "p99_s": round(self.p99(since, until), 3),
            "codes": dict(sorted(self.codes().items())),
        }

    def problems(self) -> list[str]:
        """What breaks the promise: lost, wrong, duplicated or 500 answers (empty when none)."""
        found = []
        for name, value in (
            ("lost", self.lost),
            ("wrong", self.wrong),
            ("duplicated", self.duplicated),
            ("internal_errors", self.internal_errors),
        ):
            if value:
                found.append(f"{name}={value}")
        examples = [r for r in self.records if r.outcome in ("lost", "wrong")][:3]
        found += [
            f"{r.outcome}: {r.call.family}/{r.call.protocol} x{len(r.call.texts)} "
            f"statuses={r.statuses} codes={r.codes} last={r.last_message!r}"
            for r in examples
        ]
        return found


class CountingClient:
    """Sends calls to one gateway and records each one's outcome in ``tally``.

    Answers are checked against ``reference``; when several models may answer (a promotion
    under way, several tasks), ``by_model`` maps (task, the ``X-Taskfleet-Model`` an answer
    names) to the reference of that model. A model the call's task does not map is checked
    against ``reference`` (for the client's own task) and so counts as wrong.
    """

    def __init__(
        self,
        base_url: str,
        task: str,
        reference: Reference,
        *,
        by_model: dict[tuple[str, str], Reference] | None = None,
        api_key: str | None = None,
        retry_budget_s: float = 60.0,
        http_timeout_s: float = 120.0,
        tally: Tally | None = None,
        gateways: list[str] | None = None,
        follow_epochs: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._bases = itertools.cycle([self.base_url, *(g.rstrip("/") for g in gateways or [])])
        self.follow_epochs = follow_epochs
        self.highest_epoch = 0
        self.task = task
        self.reference = reference
        self.by_model = by_model or {}
        self.retry_budget_s = retry_budget_s
        self.tally = tally if tally is not None else Tally()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            timeout=http_timeout_s, headers=headers, limits=httpx.Limits(max_connections=256)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> CountingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- one call
    async def call(self, call: Call) -> Record:
        record = Record(call=call, started=time.monotonic())
        self.tally.records.append(record)
        give_up_at = record.started + self.retry_budget_s
        while True:
            record.attempts += 1
            try:
                response = await self._http.send(self._request(call))
            except httpx.HTTPError as exc:
                record.codes.append(f"TRANSPORT:{type(exc).__name__}")
                if time.monotonic() + 1.0 < give_up_at:
                    await asyncio.sleep(1.0)
                    continue
                record.outcome = "lost"
                break
            record.statuses.append(response.status_code)
            if response.status_code == 200:
                record.outcome = self._check_answer(call, response, record)
                break
            code, retryable, message = _error_of(response)
            record.codes.append(code)
            record.last_message = message
            if call.expect_error is not None and code == call.expect_error:
                record.outcome = "expected"
                break
            if not retryable:
                record.outcome = "lost"
                break
            record.retryable_errors += 1
            wait = _retry_after(response)
            if time.monotonic() + wait >= give_up_at:
                record.outcome = "gave_up"
                break
            await asyncio.sleep(wait)
        record.ended = time.monotonic()
        return record

    def _request(self, call: Call) -> httpx.Request:
        headers: dict[str, str] = {}
        if call.timeout_ms is not None:
            headers["X-Taskfleet-Timeout-Ms"] = str(call.timeout_ms)
        if self.follow_epochs and self.highest_epoch:
            headers["X-Taskfleet-Min-Epoch"] = str(self.highest_epoch)
        task = call.task or self.task
        base = next(self._bases)
        if call.protocol == "openai":
            body: dict[str, Any] = {
                "model": task,
                "input": call.texts,
                "encoding_format": "base64",
                "kind": call.kind,
            }
            return self._http.build_request(
                "POST",
                f"{base}/v1/embeddings",
                content=json.dumps(body).encode(),
                headers={**headers, "Content-Type": "application/json"},
            )
        body = {"inputs": call.texts, "kind": call.kind}
        if call.protocol == "json":
            content = json.dumps(body).encode()
            media = "application/json"
        else:
            content = msgpack.packb(body, use_bin_type=True)
            media = "application/msgpack"
        return self._http.build_request(
            "POST",
            f"{base}/v1/tasks/{task}",
            content=content,
            headers={**headers, "Content-Type": media, "Accept": media},
        )

    def _check_answer(self, call: Call, response: httpx.Response, record: Record) -> str:
        request_id = response.headers.get("X-Request-Id")
        if request_id:
            record.request_ids.append(request_id)
        with contextlib.suppress(ValueError):
            record.epoch = int(response.headers.get("X-Taskfleet-Epoch", "0"))
            self.highest_epoch = max(self.highest_epoch, record.epoch)
        self.tally.note_request_id(request_id)
        try:
            vectors = decode_vectors(call.protocol, response)
        except Exception as exc:  # a malformed 200 is a wrong answer
            record.codes.append(f"MALFORMED:{type(exc).__name__}")
            return "wrong"
        if call.expect_error is not None:
            return "wrong"  # poison must not produce vectors
        task = call.task or self.task
        model = response.headers.get("X-Taskfleet-Model", "")
        reference = self.by_model.get((task, model))
        if reference is None and task != self.task:
            return "wrong"
        reference = reference or self.reference
        return "answered" if reference.matches(call.texts, vectors, call.kind) else "wrong"

    # ---- a stream of calls
    async def stream(
        self,
        next_call: Callable[[int], Call | None],
        *,
        concurrency: int,
        stop: asyncio.Event | None = None,
    ) -> Tally:
        """Keep ``concurrency`` calls in flight; ``next_call(i)`` returns None to end the stream."""
        counter = iter(range(1 << 62))
        stop = stop or asyncio.Event()

        async def lane() -> None:
            while not stop.is_set():
                call = next_call(next(counter))
                if call is None:
                    return
                await self.call(call)

        await asyncio.gather(*(lane() for _ in range(concurrency)))
        return self.tally

    async def run_all(self, calls: Iterable[Call], *, concurrency: int) -> Tally:
        todo = list(calls)

        def take(i: int) -> Call | None:
            return todo[i] if i < len(todo) else None

        return await self.stream(take, concurrency=concurrency)


def decode_vectors(protocol: Protocol, response: httpx.Response) -> np.ndarray:
    """The ``count x dims`` float32 matrix of a 200 answer in any of the three formats."""
    if protocol == "openai":
        data = sorted(response.json()["data"], key=lambda d: d["index"])
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
        return np.stack(rows).astype(np.float32)
    if protocol == "json":
        return np.asarray(response.json()["embeddings"], dtype=np.float32)
    body = msgpack.unpackb(response.content, raw=False)
    matrix = np.frombuffer(body["embeddings"], dtype="<f4")
    return matrix.reshape(int(body["count"]), int(body["dims"])).astype(np.float32)


def _error_of(response: httpx.Response) -> tuple[str, bool, str]:
    try:
        error = response.json()["error"]
        return str(error["code"]), bool(error["retryable"]), str(error["message"])
    except Exception:
        return f"HTTP_{response.status_code}", False, response.text[:200]


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", "1")), 0.1), MAX_RETRY_WAIT_S)
    except ValueError:
        return 1.0
