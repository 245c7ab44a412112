"""A catalogue of bad requests, by family, each with the status and code docs/protocol.md
promises for it. ``send_all`` posts them to a gateway and reports, per family, how many got
exactly the promised answer; nothing may ever get a 500 or reach a worker.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import httpx
import msgpack

from registry.limits import DEFAULT_MAX_TEXT_CHARS

JSON = "application/json"
MSGPACK = "application/msgpack"


@dataclass(frozen=True)
class BadInput:
    family: str
    name: str
    body: bytes
    status: int
    code: str
    content_type: str | None = MSGPACK
    route: str = "task"  # "task": POST /v1/tasks/{task}; "openai": POST /v1/embeddings
    headers: tuple[tuple[str, str], ...] = ()
    task: str | None = None  # another task name than the served one
    method: str = "POST"


@dataclass
class FamilyCount:
    sent: int = 0
    as_documented: int = 0
    internal_errors: int = 0
    mismatches: list[str] = field(default_factory=list)


def _mp(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _js(obj: object) -> bytes:
    return json.dumps(obj).encode()


def catalogue(max_inputs: int = 2048, max_body_bytes: int = 32 * 1024 * 1024) -> list[BadInput]:
    bad: list[BadInput] = []

    def both(family: str, name: str, obj: object, status: int = 400, code: str = "BAD_REQUEST"):
        bad.append(BadInput(family, f"{name} (msgpack)", _mp(obj), status, code))
        bad.append(BadInput(family, f"{name} (json)", _js(obj), status, code, JSON))

    # ---- bodies that are not msgpack/JSON at all
    family = "not decodable"
    for name, body in [
        ("empty body", b""),
        ("random bytes", bytes(range(256))[::7]),
        ("truncated map", _mp({"inputs": ["abc"]})[:-2]),
        ("two documents", _mp({"inputs": ["a"]}) * 2),
    ]:
        bad.append(BadInput(family, f"{name} (msgpack)", body, 400, "BAD_REQUEST"))
    for name, body in [
        ("empty body", b""),
        ("not json", b"inputs=a"),
        ("trailing garbage", b'{"inputs": ["a"]} x'),
        ("single quotes", b"{'inputs': ['a']}"),
        ("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000),
        ("NaN literal as input", b'{"inputs": [NaN]}'),
    ]:
        bad.append(BadInput(family, f"{name} (json)", body, 400, "BAD_REQUEST", JSON))

    # ---- decodable, wrong shape
    family = "wrong shape"
    for name, obj in [
        ("a list, not a map", ["a"]),
        ("a string", "a"),
        ("a number", 5),
        ("null", None),
        ("unknown field", {"inputs": ["a"], "model": "x"}),
        ("inputs missing", {"kind": "query"}),
        ("inputs empty", {"inputs": []}),
        ("inputs null", {"inputs": None}),
        ("inputs a number", {"inputs": 3}),
        ("inputs a map", {"inputs": {"a": 1}}),
        ("an input is a number", {"inputs": ["a", 1]}),
        ("an input is a list", {"inputs": [["a"]]}),
        ("an input is empty", {"inputs": ["a", ""]}),
        ("kind unknown", {"inputs": ["a"], "kind": "document"}),
        ("kind a number", {"inputs": ["a"], "kind": 1}),
    ]:
        both(family, name, obj)
    bad.append(
        BadInput(family, "an input is bytes (msgpack)", _mp({"inputs": [b"a"]}), 400, "BAD_REQUEST")
    )
    bad.append(BadInput(family, "map with int keys (msgpack)", _mp({1: ["a"]}), 400, "BAD_REQUEST"))

    # ---- text that is not Unicode
    family = "bad text"
    for name, raw in [
        ("lone high surrogate", b'{"inputs": ["a\\ud800b"]}'),
        ("lone low surrogate", b'{"inputs": "\\udfff"}'),
        ("surrogate in a later input", b'{"inputs": ["ok", "x\\udc80"]}'),
        ("reversed surrogate pair", b'{"inputs": ["\\udc00\\ud800"]}'),
        ("surrogate in kind", b'{"inputs": ["ok"], "kind": "\\ud800"}'),
        ("surrogate in a key", b'{"inputs": ["ok"], "\\ud800": 1}'),
        ("invalid UTF-8 byte", b'{"inputs": ["a\xffb"]}'),
        ("overlong UTF-8", b'{"inputs": ["\xc0\xaf"]}'),
    ]:
        bad.append(BadInput(family, f"{name} (json)", raw, 400, "BAD_REQUEST", JSON))
    for name, raw in [
        ("invalid UTF-8 in str", b"\x81\xa6inputs\x91\xa3a\xffb"),
        ("CESU-8 surrogate in str", b"\x81\xa6inputs\x91\xa3\xed\xa0\x80"),
        ("truncated UTF-8 sequence", b"\x81\xa6inputs\x91\xa2a\xe2"),
    ]:
        bad.append(BadInput(family, f"{name} (msgpack)", raw, 400, "BAD_REQUEST"))

    # ---- limits
    family = "limits"
    both(family, f"{max_inputs + 1} inputs", {"inputs": ["x"] * (max_inputs + 1)})
    bad.append(
        BadInput(
            family, "body above the limit", b"\x90" * (max_body_bytes + 1), 413, "PAYLOAD_TOO_LARGE"
        )
    )
    # One text above the task's per-text limit (the default), well inside the body limit.
    long_text = "x" * (DEFAULT_MAX_TEXT_CHARS + 1)
    both(
        family,
        "a text above the task's limit",
        {"inputs": ["a", long_text]},
        413,
        "PAYLOAD_TOO_LARGE",
    )

    # ---- headers
    family = "headers"
    ok = _mp({"inputs": ["a"]})
    for name, header in [
        ("timeout 0", ("X-Taskfleet-Timeout-Ms", "0")),
        ("timeout negative", ("X-Taskfleet-Timeout-Ms", "-5")),
        ("timeout not a number", ("X-Taskfleet-Timeout-Ms", "soon")),
        ("timeout a float", ("X-Taskfleet-Timeout-Ms", "1e3")),
        ("priority not a number", ("X-Taskfleet-Priority", "high")),
        ("timeout of 401 digits", ("X-Taskfleet-Timeout-Ms", "9" * 401)),
        ("timeout with a sign", ("X-Taskfleet-Timeout-Ms", "+5")),
        ("priority of 401 digits", ("X-Taskfleet-Priority", "9" * 401)),
        ("min epoch negative", ("X-Taskfleet-Min-Epoch", "-1")),
        ("min epoch above int64", ("X-Taskfleet-Min-Epoch", str(2**63))),
    ]:
        bad.append(BadInput(family, name, ok, 400, "BAD_REQUEST", headers=(header,)))
    for media in ("text/plain", "application/xml", "multipart/form-data"):
        bad.append(
            BadInput(family, f"Content-Type {media}", ok, 415, "UNSUPPORTED_MEDIA_TYPE", media)
        )

    # ---- the OpenAI route
    family = "openai body"
    for name, obj in [
        ("model missing", {"input": "a"}),
        ("model empty", {"model": "", "input": "a"}),
        ("model a number", {"model": 3, "input": "a"}),
        ("input missing", {"model": "@task"}),
        ("input empty list", {"model": "@task", "input": []}),
        ("token arrays", {"model": "@task", "input": [[1, 2, 3]]}),
        ("encoding_format unknown", {"model": "@task", "input": "a", "encoding_format": "int8"}),
        ("dimensions set", {"model": "@task", "input": "a", "dimensions": 8}),
        ("input with an empty string", {"model": "@task", "input": ["a", ""]}),
        ("kind unknown", {"model": "@task", "input": "a", "kind": "x"}),
    ]:
        bad.append(BadInput(family, name, _js(obj), 400, "BAD_REQUEST", JSON, route="openai"))
    bad.append(
        BadInput(
            family,
            "surrogate in input",
            b'{"model": "@task", "input": ["\\ud800"]}',
            400,
            "BAD_REQUEST",
            JSON,
            route="openai",
        )
    )
    bad.append(
        BadInput(family, "not JSON", _mp({"model": "x"}), 400, "BAD_REQUEST", JSON, route="openai")
    )

    # ---- routes and tasks
    family = "routes and tasks"
    bad.append(BadInput(family, "unknown task", ok, 404, "NOT_FOUND", task="no-such-task"))
    bad.append(BadInput(family, "task name with a dot", ok, 404, "NOT_FOUND", task="a.b"))
    bad.append(
        BadInput(
            family,
            "unknown task (openai)",
            _js({"model": "no-such-task", "input": "a"}),
            404,
            "NOT_FOUND",
            JSON,
            route="openai",
        )
    )
    bad.append(
        BadInput(family, "GET on the task route", b"", 405, "METHOD_NOT_ALLOWED", method="GET")
    )
    return bad


def send_all(
    http: httpx.Client, gateway_url: str, task: str, cases: list[BadInput]
) -> dict[str, FamilyCount]:
    """Post every case; per family, how many got exactly the documented status and code."""
    counts: dict[str, FamilyCount] = {}
    for case in cases:
        count = counts.setdefault(case.family, FamilyCount())
        count.sent += 1
        target = case.task or task
        url = (
            f"{gateway_url}/v1/embeddings"
            if case.route == "openai"
            else f"{gateway_url}/v1/tasks/{target}"
        )
        body = case.body.replace(b"@task", task.encode())
        headers = dict(case.headers)
        if case.content_type:
            headers["Content-Type"] = case.content_type
        response = http.request(case.method, url, content=body, headers=headers)
        if response.status_code == 500:
            count.internal_errors += 1
        try:
            error = response.json()["error"]
            code, shaped = error["code"], set(error) == {"code", "message", "retryable"}
        except Exception:
            code, shaped = f"HTTP_{response.status_code}", False
        if response.status_code == case.status and code == case.code and shaped:
            count.as_documented += 1
        else:
            count.mismatches.append(f"{case.name}: {response.status_code} {code}")
    return counts


def total(counts: dict[str, FamilyCount]) -> Counter[str]:
    summary: Counter[str] = Counter()
    for count in counts.values():
        summary["sent"] += count.sent
        summary["as_documented"] += count.as_documented
        summary["internal_errors"] += count.internal_errors
    return summary
