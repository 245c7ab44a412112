"""Issue 9's findings, each as a test: the promotion rule has no side door, scopes hold on the
control plane, one error shape, artifacts never follow links, sessions end at logout, login is
throttled, docs work offline, and the history names every epoch."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from registry import InvalidInput, Registry
from registry.api import create_app
from registry.models import CandidateRow, PlacementRow, TaskRow
from registry.throttle import LoginThrottle
from tests.evalrun_fixture import record_run
from tests.suite_fixture import add_task, declare_suite
from tests.test_dashboard_pages import (
    CHALLENGER,
    CHAMPION,
    TASK,
    WEAK,
    form_token,
    login,
    record,
    report,
    seed_fleet,
)
from tests.test_registry import make_adapter_dir, make_model_dir, training

OTHER = "other-task"


@pytest.fixture
def seeded(tmp_path: Path) -> Registry:
    reg = Registry.open(
        f"sqlite:///{tmp_path / 'r.db'}", artifact_dir=tmp_path / "artifacts", actor="cli"
    )
    seed_fleet(reg, tmp_path)
    add_task(reg, OTHER, suite="other-suite")
    return reg


def bearer(reg: Registry, name: str, roles: list[str], tasks: list[str] | None = None) -> dict:
    return {"Authorization": f"Bearer {reg.create_api_key(name, roles=roles, tasks=tasks)[1]}"}


def error_of(response: object) -> dict[str, object]:
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "retryable"}
    return dict(body["error"])


# ---- the promotion rule has no side door ----------------------------------------------------
def test_placement_route_cannot_change_the_candidate(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    promoter = bearer(seeded, "pat", ["promoter"])
    url = f"/api/v1/tasks/{TASK}/placement"
    before = seeded.current_placement(TASK)
    assert before is not None

    r = client.post(url, json={"candidate": WEAK}, headers=promoter)  # the rule says "not met"
    assert r.status_code == 400 and error_of(r)["code"] == "PROMOTION_REQUIRED"
    assert seeded.current_placement(TASK) == before and len(seeded.list_promotions(TASK)) == 1

    # pinned/replicas of the champion's placement: allowed, a new epoch with its history row.
    r = client.post(url, json={"replicas": 2, "pinned": False}, headers=promoter)
    assert r.status_code == 201, r.text
    assert (r.json()["candidate"], r.json()["epoch"], r.json()["replicas"]) == (CHAMPION, 2, 2)
    latest = seeded.list_promotions(TASK)[0]
    assert (latest.kind, latest.candidate, latest.actor, latest.epoch) == (
        "placement",
        CHAMPION,
        "key:pat",
        2,
    )
    assert "replicas 1 -> 2" in latest.reason and "lazy" in latest.reason
    r = client.post(url, json={"candidate": CHAMPION, "replicas": 2}, headers=promoter)
    assert r.status_code == 201 and r.json()["epoch"] == 2  # nothing changed: no new epoch
    r = client.post(url, json={"replicas": 3}, headers=bearer(seeded, "vic", ["viewer"]))
    assert r.status_code == 403
    # The champion is unchanged and a rollback still knows nothing before it.
    assert seeded.champion(TASK).name == CHAMPION  # type: ignore[union-attr]
    r = client.post(f"/api/v1/tasks/{TASK}/rollback", json={}, headers=promoter)
    assert r.status_code == 400 and "no previous champion" in error_of(r)["message"]


def test_first_placement_needs_a_promotion(seeded: Registry) -> None:
    with pytest.raises(InvalidInput, match="no champion yet"):
        seeded.update_placement(OTHER, pinned=True)


def test_history_names_every_epoch(seeded: Registry) -> None:
    seeded.update_placement(TASK, replicas=2)
    seeded.promote(TASK, CHALLENGER, reason="better")
    seeded.update_placement(TASK, pinned=False)
    seeded.rollback(TASK, reason="latency")
    history = seeded.list_promotions(TASK)
    assert [p.epoch for p in history] == [5, 4, 3, 2, 1]
    assert [p.kind for p in history] == ["rollback", "placement", "promote", "placement", "promote"]
    assert history[0].candidate == CHAMPION and history[0].previous_candidate == CHALLENGER
    assert (history[0].pinned, history[0].replicas) == (False, 2)  # settings carried over


def _legacy_placement(reg: Registry, candidate: str) -> None:
    """A placement written by the old placement route: a new epoch, no promotion row."""
    with reg._write() as s:
        task = s.scalar(select(TaskRow).where(TaskRow.name == TASK))
        cand = s.scalar(
            select(CandidateRow).where(
                CandidateRow.task_id == task.id, CandidateRow.name == candidate
            )  # type: ignore[union-attr]
        )
        s.add(PlacementRow(task_id=task.id, candidate_id=cand.id, epoch=2, pinned=True, replicas=1))  # type: ignore[union-attr]


def test_task_page_names_the_placed_candidate_and_flags_a_mismatch(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))
    page = client.get(f"/tasks/{TASK}").text
    assert re.search(rf'id="placed">serves <code>{re.escape(CHAMPION)}</code>', page)
    assert "placement-mismatch" not in page

    _legacy_placement(seeded, WEAK)
    page = client.get(f"/tasks/{TASK}").text
    assert re.search(rf'id="placed">serves <code>{WEAK}</code>', page)
    assert 'id="placement-mismatch"' in page and f"the champion is\n  <code>{CHAMPION}" in page
    # Changing only pinned/replicas puts the champion back, in the history.
    seeded.update_placement(TASK, replicas=2)
    page = client.get(f"/tasks/{TASK}").text
    assert "placement-mismatch" not in page
    latest = seeded.list_promotions(TASK)[0]
    assert (latest.kind, latest.previous_candidate, latest.candidate) == (
        "placement",
        WEAK,
        CHAMPION,
    )


def test_dashboard_makes_a_first_champion(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    login(client, seeded.create_api_key("pat", roles=["promoter"])[1])
    seeded.add_candidate(OTHER, base="base-a")
    record_run(seeded, OTHER, "base-a", 0.3)
    url = f"/tasks/{OTHER}/promote/base-a"
    confirm = client.get(url).text
    data = {"csrf_token": form_token(confirm), "reason": "first one"}
    found = re.search(r'name="expected_champion" value="([^"]*)"', confirm)
    assert found
    r = client.post(url, data={**data, "expected_champion": found.group(1)})
    assert r.status_code == 200 and "Promoted base-a to champion" in r.text, r.text
    assert seeded.champion(OTHER).name == "base-a"  # type: ignore[union-attr]
    # No claim about a fleet that may not be there; the task page says what is known.
    assert "within seconds" not in r.text and "not yet published" in r.text


# ---- scopes -----------------------------------------------------------------------------
def test_task_scoped_keys_act_on_their_tasks_only(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    scoped = bearer(seeded, "legal-lead", ["promoter"], tasks=[OTHER])
    r = client.get(f"/api/v1/tasks/{TASK}", headers=scoped)
    assert r.status_code == 403 and error_of(r)["code"] == "FORBIDDEN"
    for path in ("promotions", f"candidates/{CHALLENGER}/check", "eval-runs", "candidates"):
        assert client.get(f"/api/v1/tasks/{TASK}/{path}", headers=scoped).status_code == 403
    r = client.post(f"/api/v1/tasks/{TASK}/promote", json={"candidate": CHALLENGER}, headers=scoped)
    assert r.status_code == 403 and seeded.champion(TASK).name == CHAMPION  # type: ignore[union-attr]
    assert [t["name"] for t in client.get("/api/v1/tasks", headers=scoped).json()] == [OTHER]
    assert client.get("/api/v1/placements", headers=scoped).json() == []
    report(seeded, "w1", epoch=1)
    fleet = client.get("/api/v1/fleet", headers=scoped).json()
    assert fleet == {"workers": [], "placements": []}  # w1 serves only the other task
    assert client.get(f"/api/v1/tasks/{OTHER}", headers=scoped).status_code == 200

    # The dashboard applies the same scope.
    web = TestClient(create_app(seeded))
    login(web, seeded.create_api_key("vic-other", roles=["viewer"], tasks=[OTHER])[1])
    assert web.get(f"/tasks/{TASK}").status_code == 403
    assert TASK not in re.findall(r'href="/tasks/([^"/]+)"', web.get("/tasks").text)
    assert "w1" not in web.get("/fleet").text


def test_caller_keys_reach_only_the_gateway_and_paths_are_for_admins(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    caller = bearer(seeded, "app", ["caller"])
    for path in ("/api/v1/tasks", "/api/v1/models", f"/api/v1/tasks/{TASK}", "/api/v1/fleet"):
        r = client.get(path, headers=caller)
        assert r.status_code == 403 and "gateway only" in error_of(r)["message"]
    viewer = client.get("/api/v1/models/base-a", headers=bearer(seeded, "vic", ["viewer"]))
    assert viewer.status_code == 200 and "path" not in viewer.json()
    admin = client.get("/api/v1/models/base-a", headers=bearer(seeded, "ada", ["admin"]))
    assert admin.json()["path"].endswith("base-a")


# ---- one error shape --------------------------------------------------------------------
def test_framework_answers_are_in_the_shape(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    admin = bearer(seeded, "ada", ["admin"])
    json_only = {"Accept": "application/json"}
    for path in ("/nowhere", "/static/nope.css", "/api/v1/nothing"):
        r = client.get(path, headers=json_only)
        assert r.status_code == 404 and error_of(r)["code"] == "NOT_FOUND", path
    r = client.get("/nowhere", headers={"Accept": "text/html"})  # a browser gets a page
    assert r.status_code == 404 and "<h1>404 · NOT_FOUND</h1>" in r.text
    r = client.delete("/api/v1/tasks", headers=admin)
    assert r.status_code == 405 and error_of(r)["code"] == "METHOD_NOT_ALLOWED"
    r = client.post(f"/api/v1/tasks/{TASK}/placement", json={"replicas": 1e30}, headers=admin)
    assert r.status_code == 400 and error_of(r)["code"] == "BAD_REQUEST"
    r = client.post("/api/v1/tasks", json={"name": "x", "margin": "NaN"}, headers=admin)
    assert r.status_code == 400 and error_of(r)["code"] == "BAD_REQUEST"
    r = client.get(f"/api/v1/tasks/{TASK}/eval-runs?candidat=x", headers=admin)  # a typo
    assert r.status_code == 400 and "unknown query parameter 'candidat'" in error_of(r)["message"]
    r = client.get("/api/v1/tasks", headers={"Authorization": "Bearer tfk_nope_nope"})
    assert r.status_code == 401 and error_of(r)["code"] == "UNAUTHENTICATED"
    lower = {"Authorization": admin["Authorization"].replace("Bearer", "bearer")}
    assert client.get("/api/v1/tasks", headers=lower).status_code == 200


@pytest.mark.parametrize("value", ["\x00", "a" * 300])
def test_values_the_database_cannot_hold_are_bad_requests(registry: Registry, value: str) -> None:
    client = TestClient(create_app(registry, require_auth=False))
    r = client.get(f"/api/v1/tasks/{quote(value, safe='')}")
    assert r.status_code in (400, 404) and error_of(r)["code"] in ("BAD_REQUEST", "NOT_FOUND")
    declare_suite(registry, "t")
    r = client.post("/api/v1/tasks", json={"name": "t", "description": value, "owner": value})
    assert r.status_code == 400 and error_of(r)["code"] == "BAD_REQUEST"


# ---- artifacts --------------------------------------------------------------------------
def test_artifact_store_refuses_links_and_special_files(seeded: Registry, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    cases = {}
    for kind in ("file-link", "dir-link", "fifo"):
        folder = make_adapter_dir(tmp_path / f"ad-{kind}", kind.encode())
        if kind == "file-link":
            (folder / "passwd").symlink_to(secret)
        elif kind == "dir-link":
            (folder / "sub").symlink_to(tmp_path)
        else:
            os.mkfifo(folder / "pipe")
        cases[kind] = folder
    for kind, folder in cases.items():
        with pytest.raises(InvalidInput) as refused:
            seeded.register_adapter(
                f"x-{kind}", base="base-a", source_dir=folder, training=training()
            )
        message = str(refused.value)
        assert str(folder) in message and ("symbolic link" in message or "regular file" in message)
    stored = list((tmp_path / "artifacts" / "sha256").iterdir())
    assert all(b"root:x" not in p.read_bytes() for d in stored for p in d.rglob("*") if p.is_file())


# ---- sessions, login, docs ----------------------------------------------------------------
def test_logout_ends_the_session_server_side(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    login(client, seeded.create_api_key("vic", roles=["viewer"])[1])
    copied = dict(client.cookies)
    token = form_token(client.get("/tasks").text)
    client.post("/logout", data={"csrf_token": token})
    thief = TestClient(client.app, cookies=copied)
    r = thief.get("/tasks", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_login_is_throttled_per_client_and_per_key_prefix(seeded: Registry) -> None:
    throttle = LoginThrottle(max_per_client=5, max_per_prefix=8, window_s=60)
    app = create_app(seeded, throttle=throttle)
    _, good = seeded.create_api_key("ada", roles=["admin"])
    prefix = good.split("_")[1]
    client = TestClient(app, client=("10.0.0.1", 1))
    page = client.get("/login")
    for _ in range(5):
        data = {"csrf_token": form_token(page.text), "api_key": "tfk_zzzz_wrong"}
        page = client.post("/login", data=data)
        assert page.status_code == 401
    r = client.post("/login", data={"csrf_token": form_token(page.text), "api_key": good})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0  # even the right key
    r = client.get("/api/v1/tasks", headers={"Authorization": f"Bearer {good}"})
    assert r.status_code == 429 and error_of(r)["code"] == "RATE_LIMITED"
    assert int(r.headers["retry-after"]) > 0

    # Guessing one key's secret from many addresses: throttled per prefix.
    for i in range(8):
        other = TestClient(app, client=(f"10.0.1.{i}", 1))
        wrong = {"Authorization": f"Bearer tfk_{prefix}_guess{i}"}
        assert other.get("/api/v1/tasks", headers=wrong).status_code == 401
    fresh = TestClient(app, client=("10.0.2.1", 1))
    r = fresh.get("/api/v1/tasks", headers={"Authorization": f"Bearer {good}"})
    assert r.status_code == 429
    # Another key from a fresh address is not affected.
    _, vic = seeded.create_api_key("vic", roles=["viewer"])
    assert fresh.get("/api/v1/tasks", headers={"Authorization": f"Bearer {vic}"}).status_code == 200


def test_throttle_forgets_after_the_window() -> None:
    now = [0.0]
    throttle = LoginThrottle(
        max_per_client=2, max_per_prefix=100, window_s=10, clock=lambda: now[0]
    )
    throttle.failed("c", None)
    throttle.failed("c", None)
    with pytest.raises(Exception, match="try again in 10 s"):
        throttle.check("c", None)
    now[0] = 10.5
    throttle.check("c", None)


def test_secure_cookie_setting(seeded: Registry) -> None:
    _, key = seeded.create_api_key("vic", roles=["viewer"])
    for secure in (False, True):
        client = TestClient(create_app(seeded, secure_cookies=secure), base_url="https://cp")
        page = client.get("/login")
        r = client.post(
            "/login",
            data={"csrf_token": form_token(page.text), "api_key": key},
            follow_redirects=False,
        )
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("taskfleet_session=") and ("secure" in cookie.lower()) is secure


def test_api_docs_are_served_without_a_cdn(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assert not re.search(r"(src|href)=\"https?://", html), html
        for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', html):
            r = client.get(asset)
            assert r.status_code == 200 and len(r.content) > 1000, asset
    assert client.get("/openapi.json").json()["info"]["title"] == "taskfleet control plane"


# ---- smaller findings -----------------------------------------------------------------------
def test_fleet_banner_agrees_with_the_worker_rows(seeded: Registry) -> None:
    report(seeded, "w1", epoch=1)
    seen = datetime.now(UTC) - timedelta(seconds=25)
    from registry.entities import WorkerReport

    seeded.record_worker_report(
        WorkerReport("w2", "h", seen, [], 0, 1, {TASK: 0}, [], {TASK: 1}), seen_at=seen
    )
    seeded.mark_workers_unreachable(worker_ids=["w1", "w2"])  # both shut down cleanly
    page = TestClient(create_app(seeded, require_auth=False)).get("/fleet").text
    assert 'id="fleet-unreachable"' in page
    assert "no worker heartbeat in the last 30 s" not in page
    assert re.search(r"newest heartbeat came \d s ago", page)  # w1, a moment ago


def test_a_weak_candidate_cannot_be_made_champion_by_a_promoter(seeded: Registry) -> None:
    # The REST promote route itself still holds the rule (what the placement route bypassed).
    record(seeded, WEAK, 0.30)
    client = TestClient(create_app(seeded))
    r = client.post(
        f"/api/v1/tasks/{TASK}/promote",
        json={"candidate": WEAK},
        headers=bearer(seeded, "pat", ["promoter"]),
    )
    assert r.status_code == 400 and error_of(r)["code"] == "PROMOTION_RULE_NOT_MET"


# ---- what must keep holding -------------------------------------------------------------
XSS = '<script>alert(1)</script>"><img src=x onerror=alert(1)>'


def test_pages_escape_stored_and_reflected_values(seeded: Registry, tmp_path: Path) -> None:
    """Whatever users and workers put into the registry, or into a URL, is text on every page."""
    declare_suite(seeded, "xss-suite", description=XSS, location=f"/data/{XSS}")
    seeded.add_task("xss", suite="xss-suite", description=XSS, owner=XSS, margin=0.0)
    seeded.add_model("base-x", path=make_model_dir(tmp_path / "bx", b"X"), query_prefix=XSS)
    seeded.add_candidate("xss", base="base-x")
    record_run(seeded, "xss", "base-x", 0.3)
    seeded.promote("xss", "base-x", reason=XSS)
    seeded.update_placement("xss", replicas=2, reason=XSS)
    from registry.entities import WorkerReport

    now = datetime.now(UTC)
    seeded.record_worker_report(
        WorkerReport(XSS, XSS, now, [XSS], 1, 2, {XSS: 1, "xss": 2}, [XSS], {XSS: 1, "xss": 1})
    )
    client = TestClient(create_app(seeded))
    login(client, seeded.create_api_key("ada", roles=["admin"])[1])
    quoted = quote(XSS, safe="")
    pages = [
        "/tasks",
        "/tasks/xss",
        "/tasks/xss/candidates/base-x",
        f"/tasks/{TASK}/promote/{CHALLENGER}",
        "/tasks/xss/rollback",
        "/fleet",
        "/suites",
        "/suites/xss-suite",
        f"/suites/{quoted}",
        f"/login?next={quoted}",
        f"/login?next=/{quoted}",
        f"/tasks/{quoted}",
        f"/tasks/xss/candidates/{quoted}",
        f"/nowhere/{quoted}",
    ]
    for url in pages:
        r = client.get(url, headers={"Accept": "text/html"})
        assert r.status_code in (200, 403, 404), (url, r.status_code)
        assert "<script>alert" not in r.text and "<img src=x" not in r.text, url
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/tasks/xss").text


def test_control_plane_refuses_huge_bodies_unread(seeded: Registry) -> None:
    client = TestClient(create_app(seeded))
    r = client.post("/api/v1/tasks", content=b"{" + b" " * (2 << 20) + b"}")  # no key at all
    assert r.status_code == 413 and error_of(r)["code"] == "PAYLOAD_TOO_LARGE"
