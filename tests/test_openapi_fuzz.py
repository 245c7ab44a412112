"""Bad input found by a machine: schemathesis against both OpenAPI documents.

For every operation, schemathesis generates requests that follow the schema (positive) and
requests that break it (negative); each answer must not be a 500, must conform to the
document (status, content type, response schema: errors in the one shape), negative requests
must be refused, and every error body must be the one shape. Bounded by `EXAMPLES` per
operation and mode, so the pair of tests takes well under a minute here; the number of cases
is printed (run with -s).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from httpapi.errors import ErrorCode
from registry import Registry
from registry.api import create_app
from tests.gateway_fixture import Stack
from tests.test_dashboard_pages import seed_fleet

EXAMPLES = 15  # per operation and generation mode
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def check_shape(response: Any) -> None:
    assert response.status_code != 500, response.text[:500]
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"code", "message", "retryable"}, body
        assert body["error"]["code"] in ErrorCode.__members__, body


def fuzz(
    schema: Any, call: Callable[[Any], Any], known: dict[str, str] | None = None
) -> dict[str, int]:
    # Every call carries a valid key (the route walk covers missing and wrong ones), so
    # "a request without the Authorization header" is not one of the negative cases.
    schema.config.generation.update(with_security_parameters=False)
    """Run every operation in both modes; returns cases per operation and mode.

    `known` path parameters (an existing task) get a third run with random everything else,
    so valid requests also reach the deep end (a worker's answer), not only 404s."""
    counts: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        runs = [(m.value, {"generation_mode": m}) for m in GenerationMode]
        names = {p.name for p in operation.iter_parameters() if p.location == "path"}
        fixed = {k: v for k, v in (known or {}).items() if k in names}
        if fixed:
            runs.append((f"positive {fixed}", {"path_parameters": fixed}))
        for mode, options in runs:
            counts[f"{mode} {operation.label}"] = run_cases(operation.as_strategy(**options), call)
    return counts


STATUSES: Counter[int] = Counter()  # over the whole session, for the printed report


def run_cases(strategy: Any, call: Callable[[Any], Any]) -> int:
    ran = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        nonlocal ran
        ran += 1
        response = call(case)
        STATUSES[response.status_code] += 1
        check_shape(response)
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    except Unsatisfiable:  # nothing to break: an operation without parameters or body
        assert ran == 0
    return ran


def report(title: str, counts: dict[str, int]) -> None:
    print(f"\n{title}: {sum(counts.values())} generated cases over {len(counts)} operation/modes")
    print(f"  statuses: {dict(sorted(STATUSES.items()))}")
    STATUSES.clear()
    for label, n in sorted(counts.items()):
        print(f"  {n:4}  {label}")


def test_control_plane_openapi(tmp_path: Path) -> None:
    reg = Registry.open(f"sqlite:///{tmp_path / 'r.db'}", artifact_dir=tmp_path / "a", actor="cli")
    try:
        seed_fleet(reg, tmp_path)
        _, admin = reg.create_api_key("fuzz-admin", roles=["admin"])
        app = create_app(reg)
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        auth = {"Authorization": f"Bearer {admin}"}
        counts = fuzz(schema, lambda case: case.call(headers=auth))
        report("control plane", counts)
        assert sum(counts.values()) > 200
    finally:
        reg.close()


def test_gateway_openapi(auth_gateway: Stack) -> None:
    gateway = auth_gateway
    task = gateway.task(worker=True)
    peer = gateway.responder(task)
    try:
        _, key = gateway.registry.create_api_key("fuzz-caller", roles=["caller"])
        gateway.sync()
        schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
        auth = {"Authorization": f"Bearer {key}", "X-Taskfleet-Timeout-Ms": "5000"}

        counts = fuzz(
            schema, lambda case: case.call(base_url=gateway.url, headers=auth), {"task": task}
        )
        report("gateway", counts)
        assert sum(counts.values()) > 50
    finally:
        gateway.loop.run(peer.stop())
