"""Issue 9's findings, each as a test: the promotion rule has no side door, scopes hold on the
control plane, one error shape, artifacts never follow links, sessions end at logout, login is
throttled, docs work offline, and the history names every epoch. Issue 18's: the throttle never
locks a key out and believes forwarded headers only from configured proxies, `--no-auth` needs
`--insecure` where others reach it, framing/CSP headers and the Host check, 413 for chunked
bodies, bounded messages, the dashboard's forms checked as REST bodies, model folders' links
and roots."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from httpx import Response
from markupsafe import escape
from sqlalchemy import select

from registry import InvalidInput, Registry
from registry.api import create_app
from registry.fingerprint import tree_sha256
from registry.models import CandidateRow, PlacementRow, TaskRow
from registry.throttle import LoginThrottle, RateLimited
from serving.artifact_source import build_manifest
from serving.embedded_nats import free_port
from serving.httpserver import BindRefused, allowed_hosts, check_bind, http_config
from testbed.declared_tasks import add_task, declare_suite
from testbed.fleet import HTTP_TIMEOUT_S
from tests.conftest import REPO
from tests.evalrun_fixture import record_run
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
    with reg.tx.write() as s:
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
    # As a word: the page's random CSRF token may hold the letters "w1" (it once did).
    assert not re.search(r"(?<![\w-])w1(?![\w-])", web.get("/fleet").text)


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


def test_login_is_throttled_per_client_and_never_locks_a_key_out(seeded: Registry) -> None:
    app = create_app(seeded)  # the default throttle: 10 failures a minute per client
    _, good = seeded.create_api_key("ada", roles=["admin"])
    prefix = good.split("_")[1]
    right = {"Authorization": f"Bearer {good}"}

    # Guessing one key's secret from many addresses (its prefix is public) used to lock that
    # key out for everybody after 20 failures: now only the guessers count their failures.
    for i in range(25):
        guesser = TestClient(app, client=(f"10.0.1.{i}", 1))
        wrong = {"Authorization": f"Bearer tfk_{prefix}_guess{i}"}
        assert guesser.get("/api/v1/tasks", headers=wrong).status_code == 401
    owner = TestClient(app, client=("10.0.2.1", 1))
    assert owner.get("/api/v1/tasks", headers=right).status_code == 200
    page = owner.get("/login")
    r = owner.post("/login", data={"csrf_token": form_token(page.text), "api_key": good})
    assert r.status_code == 200 and "Tasks" in r.text  # the dashboard door as well

    # One client with wrong keys is throttled: then every attempt from it, even the right key.
    client = TestClient(app, client=("10.0.0.1", 1))
    page = client.get("/login")
    for _ in range(10):
        data = {"csrf_token": form_token(page.text), "api_key": f"tfk_{prefix}_wrong"}
        page = client.post("/login", data=data)
        assert page.status_code == 401
    r = client.post("/login", data={"csrf_token": form_token(page.text), "api_key": good})
    assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
    r = client.get("/api/v1/tasks", headers=right)
    assert r.status_code == 429 and error_of(r)["code"] == "RATE_LIMITED"
    assert int(r.headers["retry-after"]) > 0
    # ... and nobody else: the key keeps working from everywhere else.
    assert owner.get("/api/v1/tasks", headers=right).status_code == 200


def test_throttle_counts_an_ipv6_client_by_its_network() -> None:
    throttle = LoginThrottle(max_per_client=2, window_s=60)
    throttle.failed("2001:db8:1:2::1")
    throttle.failed("2001:db8:1:2:ffff::7")  # the same /64: the same client
    with pytest.raises(RateLimited):
        throttle.check("2001:db8:1:2::99")
    throttle.check("2001:db8:1:3::1")  # another network
    throttle.check("10.0.0.1")


def test_throttle_forgets_after_the_window() -> None:
    now = [0.0]
    throttle = LoginThrottle(max_per_client=2, window_s=10, clock=lambda: now[0])
    throttle.failed("c")
    throttle.failed("c")
    with pytest.raises(Exception, match="try again in 10 s"):
        throttle.check("c")
    now[0] = 10.5
    throttle.check("c")


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


# ---- issue 18: the control plane's edges -------------------------------------------------
@contextlib.contextmanager
def served(app: object, **options: object) -> Iterator[str]:
    """The app under a real uvicorn, configured as every taskfleet server is."""
    port = free_port()
    server = uvicorn.Server(http_config(app, "127.0.0.1", port, "warning", **options))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_forwarded_headers_are_believed_only_from_configured_proxies(seeded: Registry) -> None:
    _, good = seeded.create_api_key("ada", roles=["admin"])
    prefix = good.split("_")[1]
    wrong = {"Authorization": f"Bearer tfk_{prefix}_wrong"}
    right = {"Authorization": f"Bearer {good}"}

    def tasks(url: str, headers: dict[str, str]) -> httpx.Response:
        return httpx.get(f"{url}/api/v1/tasks", headers=headers, timeout=HTTP_TIMEOUT_S)

    # No proxy configured: a local client naming another X-Forwarded-For on each attempt is
    # still one client (uvicorn's default believed loopback peers, so it stepped around).
    with served(create_app(seeded)) as url:
        for i in range(10):
            forged = {**wrong, "X-Forwarded-For": f"203.0.113.{i}"}
            assert tasks(url, forged).status_code == 401
        r = tasks(url, {**right, "X-Forwarded-For": "198.51.100.1"})
        assert r.status_code == 429, r.text

    # Behind a configured proxy (here: loopback), the forwarded client is the one counted.
    with served(create_app(seeded), forwarded_allow_ips="127.0.0.1") as url:
        for _ in range(10):
            forged = {**wrong, "X-Forwarded-For": "203.0.113.7"}
            assert tasks(url, forged).status_code == 401
        r = tasks(url, {**right, "X-Forwarded-For": "203.0.113.7"})
        assert r.status_code == 429
        r = tasks(url, {**right, "X-Forwarded-For": "203.0.113.8"})
        assert r.status_code == 200, r.text


def test_server_options_refuse_no_auth_where_others_reach_and_bad_proxies(tmp_path: Path) -> None:
    """`--no-auth` on a non-loopback address needs `--insecure`: one line, nothing starts."""
    env = {**os.environ, "TASKFLEET_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    port = str(free_port())
    commands = {
        "serve": ["serve", "--no-auth", "--host", "0.0.0.0", "--port", port, "--no-publish"],
        "gateway": ["gateway", "--no-auth", "--host", "10.1.2.3", "--nats-url", "nats://x:1"],
        "up": ["up", "--no-auth", "--host", "::", "--workers", "0"],
        "proxies": ["serve", "--forwarded-allow-ips", "10.0.0.0/8,proxy.example", "--port", port],
    }
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "taskfleet", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    try:
        results = {name: p.communicate(timeout=120) for name, p in running.items()}
    finally:
        for p in running.values():
            p.kill()
    for name, (stdout, stderr) in results.items():
        lines = stderr.strip().splitlines()
        assert running[name].returncode == 1 and len(lines) == 1, (name, stdout, stderr)
        if name == "proxies":
            assert "'proxy.example' is not an IP address or network" in lines[0]
        else:
            assert "--no-auth on --host" in lines[0] and "--insecure" in lines[0], lines
    assert not (tmp_path / "home" / "registry.db").exists()  # refused before anything opened
    check_bind("127.0.0.1", require_auth=False, insecure=False)
    check_bind("localhost", require_auth=False, insecure=False)
    check_bind("::1", require_auth=False, insecure=False)
    check_bind("0.0.0.0", require_auth=False, insecure=True)
    check_bind("0.0.0.0", require_auth=True, insecure=False)
    with pytest.raises(BindRefused):
        check_bind("my-host.example", require_auth=False, insecure=False)


def test_dashboard_refuses_framing_and_inline_code_and_foreign_hosts(seeded: Registry) -> None:
    app = create_app(seeded, allowed_hosts=["localhost", "cp.example.com", "*.corp.example"])
    for base in ("http://localhost:8600", "http://cp.example.com", "http://a.b.corp.example"):
        client = TestClient(app, base_url=base)
        page = client.get("/login")
        assert page.status_code == 200, (base, page.text)
        assert page.headers["x-frame-options"] == "DENY"
        policy = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self';" in policy
        assert "unsafe-inline" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"
    docs = TestClient(app, base_url="http://localhost").get("/docs")
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]
    # A page on another site, rebound to this address, is refused; so is a missing Host.
    for host in ("evil.example", "cp.example.com.evil.example", "corp.example", ""):
        r = TestClient(app).get("/api/v1/tasks", headers={"Host": host, "Accept": "text/html"})
        assert r.status_code == 400 and error_of(r)["code"] == "BAD_REQUEST", host
        assert "--allowed-host" in error_of(r)["message"] and r.headers["x-frame-options"]
    long_host = "x" * 5000
    r = TestClient(app).get("/tasks", headers={"Host": long_host})
    assert r.status_code == 400 and len(r.text) < 500
    # Probes name no host (a kubelet sends the pod IP): /healthz answers any.
    probe = TestClient(app, base_url="http://10.244.0.7:8600").get("/healthz")
    assert probe.status_code == 200

    # The shell's default: this machine's names and the bind address, never "any".
    assert {"localhost", "127.0.0.1", "::1"} <= set(allowed_hosts(None, "127.0.0.1"))
    assert "10.0.0.5" in allowed_hosts(None, "10.0.0.5")
    assert "0.0.0.0" not in allowed_hosts(None, "0.0.0.0") and "*" not in allowed_hosts(None, "::")
    assert allowed_hosts("cp.example.com, *.corp.example", "0.0.0.0") == [
        "cp.example.com",
        "*.corp.example",
    ]


def test_chunked_body_over_the_limit_is_413(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))

    def chunks(start: bytes, end: bytes) -> Iterator[bytes]:  # no Content-Length: chunked
        yield start
        for _ in range(12):
            yield b"a" * 100_000
        yield end

    r = client.post(
        "/api/v1/tasks",
        content=chunks(b'{"name": "', b'"}'),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and error_of(r)["code"] == "PAYLOAD_TOO_LARGE", r.text
    r = client.post(  # a dashboard form
        f"/tasks/{TASK}/rollback",
        content=chunks(b"csrf_token=x&reason=", b""),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "text/html"},
    )
    assert r.status_code == 413 and "PAYLOAD_TOO_LARGE" in r.text, r.text[:300]


def test_error_messages_are_bounded(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))
    key = "k" * 900_000
    r = client.post("/api/v1/tasks", json={"name": "x", key: 1})
    message = str(error_of(r)["message"])
    assert r.status_code == 400 and len(r.content) < 1000, len(r.content)
    assert message.startswith("body.kkkk") and "Extra inputs are not permitted" in message
    # Any message, whatever a registry error quotes, is cut at the bound.
    error = InvalidInput("x" * 100_000)
    assert len(error.message) < 2100 and "more characters left out" in error.message


@pytest.mark.parametrize(
    ("field", "value"), [("reason", "why\x00not"), ("reason", "r" * 10_001), ("nul", "")]
)
def test_dashboard_forms_are_checked_like_rest(seeded: Registry, field: str, value: str) -> None:
    """The dashboard's promote and rollback forms go through the REST API's bodies."""
    client = TestClient(create_app(seeded))
    login(client, seeded.create_api_key("ada", roles=["admin"])[1])
    promote = f"/tasks/{TASK}/promote/{CHALLENGER}"
    token = form_token(client.get(promote).text)
    data = {"csrf_token": token, "expected_champion": CHAMPION, "reason": "fine"}
    if field == "nul":  # the champion the form saw: a name, checked as REST checks names
        data["expected_champion"] = "base-a\x00+ft-v1"
    else:
        data[field] = value
    r = client.post(promote, data=data)
    assert r.status_code == 200 and "Not promoted:" in r.text, r.text[:500]
    rest = TestClient(create_app(seeded)).post(
        f"/api/v1/tasks/{TASK}/promote",
        json={"candidate": CHALLENGER, **{k: v for k, v in data.items() if k != "csrf_token"}},
        headers=bearer(seeded, "ada2", ["admin"]),
    )
    assert rest.status_code == 400
    shown = str(error_of(rest)["message"]).replace("body.", "")
    assert str(escape(shown)) in r.text  # the same one line through both doors
    assert seeded.champion(TASK).name == CHAMPION  # type: ignore[union-attr]

    data = {"csrf_token": form_token(r.text), "expected_champion": CHAMPION, "reason": "fine"}
    data.update({field: value} if field != "nul" else {"expected_champion": "x\x00"})
    r = client.post(f"/tasks/{TASK}/rollback", data=data)
    assert "Nothing rolled back:" in r.text and seeded.champion(TASK).name == CHAMPION  # type: ignore[union-attr]
    assert [p.epoch for p in seeded.list_promotions(TASK)] == [1]


@pytest.mark.parametrize("key", ["tfk_ab%00cd_x", "tfk_ab_" + "x" * 300, "tfk_ab_%ED%B2%80"])
def test_login_form_refuses_what_no_header_carries(registry: Registry, key: str) -> None:
    """A form field can carry NUL and any length (a header cannot): 401, on PostgreSQL too."""
    registry.create_api_key("vic", roles=["viewer"])
    client = TestClient(create_app(registry))
    page = client.get("/login")
    r = client.post(
        "/login",
        content=f"csrf_token={form_token(page.text)}&api_key={key}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 401, r.text[:300]


def _hf_snapshot(cache: Path, payload: bytes) -> Path:
    """A Hugging Face cache repo: the snapshot's files are links into ../../blobs/."""
    repo = cache / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abcd"
    (snapshot / "1_Pooling").mkdir(parents=True)
    blobs.mkdir()
    files = {
        "config.json": b'{"hidden_size": 8}',
        "model.safetensors": payload,
        "1_Pooling/config.json": b"{}",
    }
    for name, data in files.items():
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_base_model_links_may_not_leave_the_folder(seeded: Registry, tmp_path: Path) -> None:
    secret = tmp_path / "control-plane-secret.txt"
    secret.write_text("session-secret=hunter2")
    leaky = make_model_dir(tmp_path / "leaky", b"L")
    (leaky / "tokenizer.json").symlink_to(secret)
    up_dir = make_model_dir(tmp_path / "dir-link", b"D")
    (up_dir / "extra").symlink_to(tmp_path)
    for folder in (leaky, up_dir):
        with pytest.raises(InvalidInput, match="outside") as refused:
            seeded.add_model(f"m-{folder.name}", path=folder)
        assert str(folder) in str(refused.value)
    assert {m.name for m in seeded.list_models()} == {"base-a", "base-b"}

    # Links inside the folder are content; a loop of folders is walked once.
    inside = make_model_dir(tmp_path / "inside", b"I")
    (inside / "weights.bin").symlink_to("model.safetensors")
    (inside / "sub").mkdir()
    (inside / "sub" / "again").symlink_to("..")
    model = seeded.add_model("m-inside", path=inside)
    assert model.sha256 == tree_sha256(inside).sha256

    # A Hugging Face cache snapshot stays usable: its links stay inside its cache repo, and it
    # hashes (and uploads) as a plain folder with the same files would.
    snapshot = _hf_snapshot(tmp_path / "hub", b"H")
    plain = shutil.copytree(snapshot, tmp_path / "plain-copy")  # follows the links
    registered = seeded.add_model("m-hf", path=snapshot)
    assert registered.sha256 == tree_sha256(plain).sha256
    assert len(build_manifest(snapshot, registered.sha256).files) == 3
    (snapshot / "vocab.txt").symlink_to(os.path.relpath(secret, snapshot))
    with pytest.raises(InvalidInput, match="outside"):
        seeded.add_model("m-hf-leaky", path=snapshot)
    # A link added after registration never reaches the object store either.
    with pytest.raises(InvalidInput, match="outside"):
        build_manifest(snapshot, registered.sha256)


def test_rest_model_paths_are_limited_to_model_roots(seeded: Registry, tmp_path: Path) -> None:
    root = tmp_path / "models"
    inside = make_model_dir(root / "inside", b"R")
    outside = make_model_dir(tmp_path / "elsewhere", b"O")
    (root / "link-out").symlink_to(outside)
    adapter_in = make_adapter_dir(root / "ad-in", b"a")
    adapter_out = make_adapter_dir(tmp_path / "ad-out", b"b")
    admin = bearer(seeded, "ada", ["admin"])
    client = TestClient(create_app(seeded, model_roots=[root]))

    def post(kind: str, name: str, path: Path | str) -> Response:
        body: dict[str, object] = {"name": name, "path": str(path)}
        if kind == "adapters":
            body.update(base="base-a", training={"data_fingerprint": "f" * 64, "train_split": "d"})
        return client.post(f"/api/v1/{kind}", json=body, headers=admin)

    for path in (outside, root / "link-out", root / ".." / "elsewhere", tmp_path / "nope"):
        r = post("models", "m-out", path)
        assert r.status_code == 403 and "outside the model roots" in error_of(r)["message"], r.text
    assert post("adapters", "ad-out", adapter_out).status_code == 403
    assert post("models", "m-in", inside).status_code == 201
    assert post("adapters", "ad-in", adapter_in).status_code == 201
    # A cache snapshot whose blobs lie above the root: one line naming where they are.
    snapshot = _hf_snapshot(tmp_path / "hub", b"S")
    snap_root = TestClient(create_app(seeded, model_roots=[snapshot])).post(
        "/api/v1/models", json={"name": "m-snap", "path": str(snapshot)}, headers=admin
    )
    assert snap_root.status_code == 403 and "models--org--tiny" in error_of(snap_root)["message"]
    hub_root = TestClient(create_app(seeded, model_roots=[tmp_path / "hub"])).post(
        "/api/v1/models", json={"name": "m-snap", "path": str(snapshot)}, headers=admin
    )
    assert hub_root.status_code == 201, hub_root.text
    # No roots configured: REST registers models by package only.
    r = TestClient(create_app(seeded)).post(
        "/api/v1/models", json={"name": "m-none", "path": str(inside)}, headers=admin
    )
    assert r.status_code == 403 and "TASKFLEET_MODEL_ROOTS" in error_of(r)["message"]
    # The CLI acts as a local admin: the registry itself takes any folder.
    assert seeded.add_model("m-cli", path=outside).name == "m-cli"
