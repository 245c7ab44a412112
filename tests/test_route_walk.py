"""Every route of both apps x every kind of caller: the expected status, and the one error shape.

The routes come from the apps' own route tables, and the test fails when the table and the
expectations below disagree, so a new route cannot go unwalked. Callers: no key, a viewer, a
caller (applications), a promoter scoped to the task, a promoter scoped to another task, and
an admin. The control plane is walked through its REST door (bearer key) and its dashboard
door (a session of the same key); every request asks for JSON, so refusals must be the shape,
and every control-plane answer carries the framing and content-security headers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.routing import Mount

from httpapi.errors import ErrorCode
from registry import Registry
from registry.api import create_app
from taskfleet.suite_registration import rest_suite_reader
from testbed.declared_tasks import add_task
from tests.gateway_fixture import Stack
from tests.kinds_fixture import build_classification
from tests.test_dashboard_pages import CHALLENGER, CHAMPION, TASK, seed_fleet
from tests.test_registry import make_adapter_dir, make_model_dir

IDENTITIES = ("none", "viewer", "caller", "promoter@task", "promoter@other", "admin")
ROLES = {
    "viewer": (["viewer"], None),
    "caller": (["caller"], None),
    "promoter@task": (["promoter"], [TASK]),
    "promoter@other": (["promoter"], ["other-task"]),
    "admin": (["admin"], None),
}


def route_table(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route the app answers, included routers and mounts too."""
    try:  # FastAPI >= 0.120 resolves included routers lazily
        from fastapi.routing import iter_route_contexts

        routes: list[Any] = list(iter_route_contexts(app.routes))
    except ImportError:
        routes = list(app.routes)
    table = set()
    for route in routes:
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount):
            table.add(("GET", f"{route.path}/*"))
            continue
        for method in route.methods or ():
            if method != "HEAD":
                table.add((method, route.path))
    return table


def expect(*, ok: int, none: int = 401, refused: dict[str, int] | None = None) -> dict[str, int]:
    statuses = dict.fromkeys(IDENTITIES, ok)
    statuses["none"] = none
    statuses.update(refused or {})
    return statuses


PUBLIC = expect(ok=200, none=200)
READ = expect(ok=200, refused={"caller": 403})
TASK_READ = expect(ok=200, refused={"caller": 403, "promoter@other": 403})
ADMIN_WRITE = expect(
    ok=201,
    refused={"viewer": 403, "caller": 403, "promoter@task": 403, "promoter@other": 403},
)
ADMIN_CHANGE = expect(
    ok=200,
    refused={"viewer": 403, "caller": 403, "promoter@task": 403, "promoter@other": 403},
)
PROMOTER_WRITE = expect(ok=201, refused={"viewer": 403, "caller": 403, "promoter@other": 403})
# Dashboard pages: a caller key cannot sign in, so it has no session, like no key at all.
PAGE = expect(ok=200, refused={"caller": 401})
TASK_PAGE = expect(ok=200, refused={"caller": 401, "promoter@other": 403})
CONFIRM_PAGE = expect(ok=200, refused={"caller": 401, "viewer": 403, "promoter@other": 403})
FORM = expect(ok=303, refused={"caller": 401, "viewer": 403, "promoter@other": 403})


@dataclass
class Call:
    method: str
    route: str
    url: str
    expected: dict[str, int]
    json: Any = None
    form: dict[str, str] | None = None  # a dashboard form; the CSRF token is added
    notes: list[str] = field(default_factory=list)


def control_plane_calls(tmp: Path) -> list[Call]:
    """In walking order: reads first, then writes in an order where each one can succeed."""
    model = make_model_dir(tmp / "walk-model", b"W")
    suite = build_classification(tmp / "walk-suite")  # seeded: the same folder each time
    adapter = make_adapter_dir(tmp / "walk-adapter", b"W")
    training = {"data_fingerprint": "f" * 64, "train_split": "dev", "seed": 1}
    t = f"/api/v1/tasks/{TASK}"
    return [
        Call("GET", "/openapi.json", "/openapi.json", PUBLIC),
        Call("GET", "/docs", "/docs", PUBLIC),
        Call("GET", "/redoc", "/redoc", PUBLIC),
        Call("GET", "/docs-assets/*", "/docs-assets/swagger-ui.css", PUBLIC),
        Call("GET", "/static/*", "/static/dashboard.css", PUBLIC),
        Call("GET", "/healthz", "/healthz", PUBLIC),
        Call("GET", "/metrics", "/metrics", expect(ok=403, none=403)),
        Call("GET", "/login", "/login", PUBLIC),
        Call("GET", "/", "/", expect(ok=303, none=303)),
        Call("GET", "/api/v1/tasks", "/api/v1/tasks", READ),
        Call("GET", "/api/v1/tasks/{task}", t, TASK_READ),
        Call("GET", "/api/v1/models", "/api/v1/models", READ),
        Call("GET", "/api/v1/models/{name}", "/api/v1/models/base-a", READ),
        Call("GET", "/api/v1/adapters", "/api/v1/adapters", READ),
        Call("GET", "/api/v1/adapters/{name}", "/api/v1/adapters/ft-v1", READ),
        Call("GET", "/api/v1/adapters/{name}/lineage", "/api/v1/adapters/ft-v2/lineage", READ),
        Call("GET", "/api/v1/tasks/{task}/candidates", f"{t}/candidates", TASK_READ),
        Call("GET", "/api/v1/tasks/{task}/eval-runs", f"{t}/eval-runs", TASK_READ),
        Call("GET", "/api/v1/placements", "/api/v1/placements", READ),
        Call("GET", "/api/v1/tasks/{task}/promotions", f"{t}/promotions", TASK_READ),
        Call(
            "GET",
            "/api/v1/tasks/{task}/candidates/{candidate}/check",
            f"{t}/candidates/{CHALLENGER}/check",
            TASK_READ,
        ),
        Call("GET", "/api/v1/fleet", "/api/v1/fleet", READ),
        # Suites are shared by every task: any control-plane key reads them.
        Call("GET", "/api/v1/suites", "/api/v1/suites", READ),
        Call("GET", "/api/v1/suites/{name}", "/api/v1/suites/legal-suite", READ),
        Call("GET", "/suites", "/suites", PAGE),
        Call("GET", "/suites/{name}", "/suites/legal-suite", PAGE),
        Call("GET", "/tasks", "/tasks", PAGE),
        Call("GET", "/fleet", "/fleet", PAGE),
        Call("GET", "/tasks/{task}", f"/tasks/{TASK}", TASK_PAGE),
        Call(
            "GET",
            "/tasks/{task}/candidates/{candidate}",
            f"/tasks/{TASK}/candidates/{CHALLENGER}",
            TASK_PAGE,
        ),
        Call(
            "GET",
            "/tasks/{task}/promote/{candidate}",
            f"/tasks/{TASK}/promote/{CHALLENGER}",
            CONFIRM_PAGE,
        ),
        Call("GET", "/tasks/{task}/rollback", f"/tasks/{TASK}/rollback", CONFIRM_PAGE),
        # writes
        Call(
            "POST",
            "/api/v1/suites",
            "/api/v1/suites",
            ADMIN_WRITE,
            json={"name": "walk-suite", "kind": "classification", "path": str(suite)},
        ),
        Call(
            "POST",
            "/api/v1/tasks",
            "/api/v1/tasks",
            ADMIN_WRITE,
            json={"name": "walk-task", "suite": "legal-suite"},
        ),
        Call(
            "PATCH",
            "/api/v1/tasks/{task}",
            t,
            ADMIN_CHANGE,
            json={"max_text_chars": 4096, "max_query_chars": 512},
        ),
        Call("GET", "/api/v1/keys", "/api/v1/keys", ADMIN_CHANGE),
        Call(
            "PUT",
            "/api/v1/keys/{name}/quota",
            "/api/v1/keys/admin/quota",
            ADMIN_CHANGE,
            json={"rate_limit_per_s": 50, "token_rate_per_s": 20_000, "token_burst": 40_000},
        ),
        Call(
            "POST",
            "/api/v1/models",
            "/api/v1/models",
            ADMIN_WRITE,
            json={"name": "walk-model", "path": str(model)},
        ),
        Call(
            "POST",
            "/api/v1/adapters",
            "/api/v1/adapters",
            ADMIN_WRITE,
            json={"name": "walk-ad", "base": "base-a", "path": str(adapter), "training": training},
        ),
        Call(
            "POST",
            "/api/v1/tasks/{task}/candidates",
            f"{t}/candidates",
            ADMIN_WRITE,
            json={"base": "base-a", "adapter": "ft-alt"},
        ),
        Call(
            "POST",
            "/api/v1/tasks/{task}/placement",
            f"{t}/placement",
            PROMOTER_WRITE,
            json={"replicas": 2},
        ),
        Call(
            "POST",
            "/api/v1/tasks/{task}/promote",
            f"{t}/promote",
            PROMOTER_WRITE,
            json={"candidate": CHALLENGER, "reason": "walk"},
        ),
        Call(
            "POST",
            "/api/v1/tasks/{task}/rollback",
            f"{t}/rollback",
            PROMOTER_WRITE,
            json={"reason": "walk"},
        ),
        Call(
            "POST",
            "/tasks/{task}/promote/{candidate}",
            f"/tasks/{TASK}/promote/{CHALLENGER}",
            FORM,
            form={"expected_champion": CHAMPION, "reason": "walk"},
        ),
        Call(
            "POST",
            "/tasks/{task}/rollback",
            f"/tasks/{TASK}/rollback",
            FORM,
            form={"expected_champion": CHALLENGER, "reason": "walk"},
        ),
        Call(
            "POST",
            "/login",
            "/login",
            expect(ok=303, refused={"caller": 403}),
            form={"api_key": "<key>"},
        ),
        Call("POST", "/logout", "/logout", expect(ok=303, none=303), form={}),
    ]


def assert_shape(response: httpx.Response, where: str) -> None:
    if response.status_code < 400:
        return
    body = response.json()
    assert set(body) == {"error"}, where
    error = body["error"]
    assert set(error) == {"code", "message", "retryable"}, where
    assert error["code"] in ErrorCode.__members__ and isinstance(error["message"], str), where
    assert isinstance(error["retryable"], bool), where


def csrf_of(client: TestClient) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text)
    assert found
    return found.group(1)


def walk_control_plane(tmp: Path, identity: str) -> dict[tuple[str, str], int]:
    reg = Registry.open(f"sqlite:///{tmp / 'r.db'}", artifact_dir=tmp / "artifacts", actor="cli")
    try:
        seed_fleet(reg, tmp)
        add_task(reg, "other-task", suite="s")
        key = ""
        if identity in ROLES:
            roles, tasks = ROLES[identity]
            key = reg.create_api_key(identity.replace("@", "-at-"), roles=roles, tasks=tasks)[1]
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        reader = rest_suite_reader(data_root=None, mteb_dir=tmp / "mteb")
        client = TestClient(
            create_app(reg, read_suite=reader, model_roots=[tmp]),
            headers=headers,
            follow_redirects=False,
        )
        if key:  # the dashboard door: a session of the same key (refused for callers)
            client.post("/login", data={"csrf_token": csrf_of(client), "api_key": key})
        seen = {}
        for call in control_plane_calls(tmp):
            if call.form is not None:
                form = {k: (key if v == "<key>" else v) for k, v in call.form.items()}
                r = client.request(
                    call.method, call.url, data={**form, "csrf_token": csrf_of(client)}
                )
            else:
                r = client.request(call.method, call.url, json=call.json)
            where = f"{identity} {call.method} {call.url}: {r.status_code} {r.text[:300]}"
            assert r.status_code == call.expected[identity], where
            assert_shape(r, where)
            # Every answer, refusals and redirects too, may not be framed and carries a CSP.
            assert r.headers.get("x-frame-options") == "DENY", where
            assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", ""), where
            seen[(call.method, call.route)] = r.status_code
        return seen
    finally:
        reg.close()


def test_every_control_plane_route_for_every_caller(tmp_path: Path) -> None:
    app_routes = route_table(
        create_app(Registry.open(f"sqlite:///{tmp_path / 'x.db'}", artifact_dir=tmp_path / "x"))
    )
    walked = {(c.method, c.route) for c in control_plane_calls(tmp_path)}
    assert walked == app_routes, f"unwalked: {app_routes - walked}; gone: {walked - app_routes}"
    table = {}
    for identity in IDENTITIES:
        table[identity] = walk_control_plane(tmp_path / identity, identity)
    print_table("control plane", table)


def print_table(title: str, table: dict[str, dict[tuple[str, str], int]]) -> None:
    routes = sorted(next(iter(table.values())))
    print(f"\n{title}: {len(routes)} routes x {len(table)} callers")
    print(f"{'route':58} " + " ".join(f"{i[:10]:>10}" for i in table))
    for route in routes:
        print(f"{route[0]:5} {route[1]:52} " + " ".join(f"{table[i][route]:>10}" for i in table))


# ---- the gateway ------------------------------------------------------------------------
def test_every_gateway_route_for_every_caller(auth_gateway: Stack) -> None:
    from serving.gateway import create_gateway

    served = auth_gateway
    task = served.task(worker=True)
    peer = served.responder(task)
    try:
        keys = {}
        for identity, (roles, tasks) in ROLES.items():
            scope = [task] if tasks == [TASK] else tasks
            keys[identity] = served.registry.create_api_key(
                identity.replace("@", "-at-"), roles=roles, tasks=scope
            )[1]
        served.sync()
        refused = {"viewer": 403, "promoter@task": 403, "promoter@other": 403}
        call = expect(ok=200, refused=refused)
        other_kind = expect(ok=400, refused=refused)
        rerank = {"model": task, "query": "frage", "documents": ["hallo"]}
        calls = [
            ("GET", "/openapi.json", "/openapi.json", None, PUBLIC),
            ("GET", "/docs", "/docs", None, PUBLIC),
            ("GET", "/redoc", "/redoc", None, PUBLIC),
            ("GET", "/docs-assets/*", "/docs-assets/redoc.standalone.js", None, PUBLIC),
            ("GET", "/healthz", "/healthz", None, PUBLIC),
            ("GET", "/readyz", "/readyz", None, PUBLIC),
            # The figures name every task and key: off without a metrics token, and no API
            # key is one (tests/test_gateway_quotas.py scrapes with the token).
            ("GET", "/metrics", "/metrics", None, expect(ok=403, none=403)),
            ("POST", "/v1/tasks/{task}", f"/v1/tasks/{task}", {"inputs": ["hallo"]}, call),
            ("POST", "/v1/embeddings", "/v1/embeddings", {"model": task, "input": "hallo"}, call),
            # The task is a retrieval task: the other kinds' endpoints refuse it with one clear
            # 400 once the key may call it, and answer the same 401/403 as the rest before that.
            ("POST", "/v1/rerank", "/v1/rerank", rerank, other_kind),
            ("POST", "/v2/rerank", "/v2/rerank", rerank, other_kind),
            ("POST", "/v1/classify", "/v1/classify", {"model": task, "input": "hallo"}, other_kind),
        ]
        app = create_gateway(served.nats_url)
        assert {(m, r) for m, r, *_ in calls} == route_table(app)
        table: dict[str, dict[tuple[str, str], int]] = {}
        for identity in IDENTITIES:
            headers = {"Accept": "application/json"}
            if identity in keys:
                headers["Authorization"] = f"Bearer {keys[identity]}"
            table[identity] = {}
            for method, route, url, body, expected in calls:
                r = httpx.request(method, served.url + url, json=body, headers=headers, timeout=30)
                where = f"{identity} {method} {url}: {r.status_code} {r.text[:300]}"
                assert r.status_code == expected[identity], where
                assert_shape(r, where)
                table[identity][(method, route)] = r.status_code
        print_table("gateway", table)
    finally:
        served.loop.run(peer.stop())
