"""The settings behind the gateway's limits, wherever they are set: a task's per-text limits
and a key's token quota in the registry (SQLite and PostgreSQL), over REST, by the CLI, and as
the directory publishes them to gateways."""

from __future__ import annotations

import msgpack
import pytest
from fastapi.testclient import TestClient

from registry import InvalidInput, NotFound, Registry
from registry.api import create_app
from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
    MAX_TEXT_LIMIT_CHARS,
)
from serving.directory import KeyRecord, TaskRecord, desired_entries
from testbed.declared_tasks import add_task, declare_suite
from tests.test_cli_registry import run_cli


def test_task_limits_default_change_and_refuse_nonsense(registry: Registry) -> None:
    declare_suite(registry, "pairs", kind="rerank")
    task = add_task(registry, "rank", suite="pairs")
    assert (task.max_text_chars, task.max_query_chars, task.max_document_chars) == (
        DEFAULT_MAX_TEXT_CHARS,
        DEFAULT_MAX_QUERY_CHARS,
        DEFAULT_MAX_DOCUMENT_CHARS,
    )
    changed = registry.set_task_limits("rank", max_query_chars=500)
    assert (changed.max_query_chars, changed.max_document_chars) == (500, 32_768)
    assert registry.get_task("rank").max_query_chars == 500
    assert registry.audit_log()[0].action == "task.limits"
    for bad in (0, -1, MAX_TEXT_LIMIT_CHARS + 1):
        with pytest.raises(InvalidInput, match="max_text_chars must be between 1 and"):
            registry.set_task_limits("rank", max_text_chars=bad)
    with pytest.raises(InvalidInput, match="give at least one"):
        registry.set_task_limits("rank")
    with pytest.raises(NotFound):
        registry.set_task_limits("nope", max_text_chars=10)
    small = add_task(registry, "small", suite="pairs", max_document_chars=100)
    assert small.max_document_chars == 100


def test_token_quota_is_stored_and_checked(registry: Registry) -> None:
    key, _ = registry.create_api_key(
        "app", roles=["caller"], token_rate_per_s=1000, token_burst=4000
    )
    assert (key.token_rate_per_s, key.token_burst, key.rate_limit_per_s) == (1000, 4000, None)
    # `quota` sets the whole quota: what is left out is removed.
    key = registry.set_api_key_quota("app", rate_limit_per_s=5, token_rate_per_s=200)
    assert (key.rate_limit_per_s, key.token_rate_per_s, key.token_burst) == (5, 200, None)
    for rate, burst, match in (
        (0, None, "token rate limit must be above 0"),
        (float("nan"), None, "token rate limit must be above 0"),
        (10, 0, "token burst must be between 1"),
        (None, 10, "a token burst needs a token rate limit"),
    ):
        with pytest.raises(InvalidInput, match=match):
            registry.set_api_key_quota(
                "app", rate_limit_per_s=None, token_rate_per_s=rate, token_burst=burst
            )


def test_the_directory_publishes_limits_and_token_quotas(registry: Registry) -> None:
    declare_suite(registry, "s")
    add_task(registry, "t", suite="s", max_text_chars=1234)
    registry.create_api_key("k", roles=["caller"], token_rate_per_s=50.5, token_burst=99)
    entries = desired_entries(registry)
    task = TaskRecord.unpack(entries["task.t"])
    assert (task.kind, task.max_text_chars, task.max_query_chars) == ("retrieval", 1234, 8_192)
    key = KeyRecord.unpack(next(v for k, v in entries.items() if k.startswith("key.")))
    assert (key.token_rate_per_s, key.token_burst) == (50.5, 99)
    # Records of a control plane older than these settings: the defaults, no token quota.
    old_task = TaskRecord.unpack(msgpack.packb({"name": "t", "kind": "rerank"}))
    assert old_task.max_document_chars == DEFAULT_MAX_DOCUMENT_CHARS
    old = msgpack.unpackb(entries[next(k for k in entries if k.startswith("key."))])
    del old["token_rate"], old["token_burst"]
    assert KeyRecord.unpack(msgpack.packb(old)).token_rate_per_s is None


def test_rest_sets_task_limits_and_key_quotas(registry: Registry) -> None:
    _, admin = registry.create_api_key("boss", roles=["admin"])
    _, promoter = registry.create_api_key("lead", roles=["promoter"])
    client = TestClient(create_app(registry))
    as_admin = {"Authorization": f"Bearer {admin}"}
    declare_suite(registry, "legal")
    body = {"name": "legal", "max_text_chars": 2000}
    r = client.post("/api/v1/tasks", json=body, headers=as_admin)
    assert r.status_code == 201 and r.json()["max_text_chars"] == 2000, r.text
    r = client.patch("/api/v1/tasks/legal", json={"max_query_chars": 300}, headers=as_admin)
    assert r.status_code == 200, r.text
    assert (r.json()["max_text_chars"], r.json()["max_query_chars"]) == (2000, 300)
    for bad in ({"max_text_chars": 0}, {"max_text_chars": True}, {"max_chars": 5}):
        r = client.patch("/api/v1/tasks/legal", json=bad, headers=as_admin)
        assert r.status_code == 400 and r.json()["error"]["code"] == "BAD_REQUEST", r.text
    r = client.patch(
        "/api/v1/tasks/legal",
        json={"max_text_chars": 10},
        headers={"Authorization": f"Bearer {promoter}"},
    )
    assert r.status_code == 403

    quota = {"rate_limit_per_s": 20, "token_rate_per_s": 5000, "token_burst": 20_000}
    r = client.put("/api/v1/keys/lead/quota", json=quota, headers=as_admin)
    assert r.status_code == 200 and r.json()["token_burst"] == 20_000, r.text
    listed = {k["name"]: k for k in client.get("/api/v1/keys", headers=as_admin).json()}
    assert listed["lead"]["token_rate_per_s"] == 5000
    assert not any("hash" in field for k in listed.values() for field in k)
    for bad in ({"token_burst": -1}, {"token_rate_per_s": True}, {"rate_limit_per_s": "1e400"}):
        r = client.put("/api/v1/keys/lead/quota", json=bad, headers=as_admin)
        assert r.status_code == 400, r.text
    r = client.put("/api/v1/keys/ghost/quota", json={}, headers=as_admin)
    assert r.status_code == 404


def test_cli_task_set_and_key_quota(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("cli-limits")
    db = f"sqlite:///{home / 'r.db'}"
    reg = Registry.open(db, artifact_dir=home / "a")
    declare_suite(reg, "s")
    reg.close()
    done = run_cli(home, db, "task", "add", "t", "--suite", "s", "--max-text-chars", "900")
    assert done.returncode == 0, done.stderr
    done = run_cli(home, db, "task", "set", "t", "--max-document-chars", "700")
    assert done.returncode == 0, done.stderr
    assert "text 900, query 8192, document 700 characters" in done.stdout
    assert "text 900, query 8192, document 700" in run_cli(home, db, "task", "show", "t").stdout
    refused = run_cli(home, db, "task", "set", "t", "--max-text-chars", "0")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "max_text_chars must be between 1 and" in refused.stdout + refused.stderr

    created = run_cli(home, db, "key", "create", "app", "--role", "caller", "--token-rate", "300")
    assert created.returncode == 0, created.stderr
    assert "quota=300 tokens/s" in created.stdout
    done = run_cli(
        home,
        db,
        "key",
        "quota",
        "app",
        "--rate",
        "2",
        "--token-rate",
        "100",
        "--token-burst",
        "800",
    )
    assert "quota=2 req/s, 100 tokens/s burst 800" in done.stdout, done.stdout + done.stderr
    listed = run_cli(home, db, "key", "ls").stdout
    assert "100 tokens/s burst 800" in listed
