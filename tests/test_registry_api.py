"""The control-plane REST API: real app, real database, the single error shape."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from registry import Registry
from registry.api import create_app
from testbed.declared_tasks import declare_suite
from tests.test_registry import make_model_dir


def test_rest_crud_auth_and_error_shape(registry: Registry, tmp_path: Path) -> None:
    _, admin = registry.create_api_key("admin", roles=["admin"])
    _, viewer = registry.create_api_key("viewer", roles=["viewer"])
    client = TestClient(create_app(registry, model_roots=[tmp_path]))
    as_admin = {"Authorization": f"Bearer {admin}"}
    as_viewer = {"Authorization": f"Bearer {viewer}"}

    r = client.get("/api/v1/tasks")
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"

    r = client.post("/api/v1/tasks", json={"name": "legal"}, headers=as_admin)
    assert r.status_code == 404 and "unknown suite 'legal'" in r.json()["error"]["message"]
    declare_suite(registry, "legal")
    r = client.post("/api/v1/tasks", json={"name": "legal"}, headers=as_admin)
    assert r.status_code == 201 and r.json()["suite"] == "legal"
    r = client.post("/api/v1/tasks", json={"name": "legal"}, headers=as_admin)
    assert r.status_code == 409
    assert r.json() == {
        "error": {
            "code": "ALREADY_EXISTS",
            "message": "task 'legal' already exists",
            "retryable": False,
        }
    }
    r = client.post("/api/v1/tasks", json={"name": "other"}, headers=as_viewer)
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    r = client.post("/api/v1/tasks", json={"nom": "x"}, headers=as_admin)
    assert r.status_code == 400 and r.json()["error"]["code"] == "BAD_REQUEST"

    model_dir = make_model_dir(tmp_path / "m")
    r = client.post("/api/v1/models", json={"name": "m", "path": str(model_dir)}, headers=as_admin)
    assert r.status_code == 201 and len(r.json()["sha256"]) == 64
    r = client.post(
        "/api/v1/models", json={"name": "ghost", "path": str(tmp_path / "nope")}, headers=as_admin
    )
    assert r.status_code == 400 and "does not exist" in r.json()["error"]["message"]
    r = client.post("/api/v1/tasks/legal/candidates", json={"base": "m"}, headers=as_admin)
    assert r.status_code == 201
    r = client.get("/api/v1/tasks/legal", headers=as_viewer)
    assert [c["name"] for c in r.json()["candidates"]] == ["m"]
    r = client.get("/api/v1/tasks/nope", headers=as_viewer)
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    assert client.get("/openapi.json").status_code == 200
    assert [a.actor for a in registry.audit_log()][:2] == ["key:admin", "key:admin"]
