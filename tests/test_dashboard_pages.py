"""Dashboard pages over a real registry (SQLite and PostgreSQL): login, roles, the task page
with leaderboard, chart and rule verdicts, lineage as a tree, and the fleet view.

`seed_fleet`, `login` and `form_token` are shared with the other dashboard tests.
"""

from __future__ import annotations

import base64
import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from registry import Registry
from registry.access import ControlPlane
from registry.api import create_app
from registry.dashboard import mount_dashboard
from registry.entities import WorkerReport
from testbed.declared_tasks import add_task
from tests.evalrun_fixture import record_run
from tests.test_registry import make_adapter_dir, make_model_dir, training

TASK = "legal"
CHAMPION = "base-a+ft-v1"
CHALLENGER = "base-a+ft-v2"  # beats the champion by the rule
WEAK = "base-b"  # better than nothing, not better than the champion


def record(
    reg: Registry, candidate: str, level: float, *, noise: float = 0.0, items_per_s: float = 100.0
) -> int:
    return record_run(reg, TASK, candidate, level, noise=noise, items_per_s=items_per_s)


def report(
    reg: Registry,
    worker: str,
    epoch: int,
    *,
    serving: str = CHAMPION,
    queue: int = 3,
) -> None:
    """A heartbeat as the fleet watcher mirrors it: `worker` serves `serving` at `epoch`."""
    reg.record_worker_report(
        WorkerReport(
            worker_id=worker,
            host=f"{worker}.local",
            reported_at=datetime.now(UTC),
            loaded=[serving],
            memory_used=3 * 2**30,
            memory_budget=8 * 2**30,
            queue_depth={TASK: queue},
            runtimes=["torch"],
            epochs={TASK: epoch},
        )
    )


def seed_fleet(reg: Registry, tmp_path: Path) -> Registry:
    """A task with base models, an adapter family ft-v1 -> ft-v2 -> ft-v3 (+ ft-v1 -> ft-alt),
    candidates with eval runs, a champion (epoch 1) and keys for each role."""
    add_task(reg, TASK, suite="legal-suite", margin=0.01, description="German legal retrieval")
    for name, payload in (("base-a", b"A"), ("base-b", b"B")):
        reg.add_model(name, path=make_model_dir(tmp_path / name, payload))
    for name, parent in (
        ("ft-v1", None),
        ("ft-v2", "ft-v1"),
        ("ft-v3", "ft-v2"),
        ("ft-alt", "ft-v1"),
    ):
        reg.register_adapter(
            name,
            base="base-a",
            parent=parent,
            source_dir=make_adapter_dir(tmp_path / f"ad-{name}", name.encode()),
            training=training(),
        )
    reg.add_candidate(TASK, base="base-a")
    for adapter in ("ft-v1", "ft-v2", "ft-v3"):
        reg.add_candidate(TASK, adapter=adapter)
    reg.add_candidate(TASK, base="base-b")
    reg.add_candidate(TASK, kind="bm25")
    record(reg, "base-a", 0.30, items_per_s=410.0)
    record(reg, CHAMPION, 0.36, items_per_s=380.0)
    record(reg, "bm25", 0.25, items_per_s=2100.0)
    reg.promote(TASK, CHAMPION, reason="first fine-tune beats the base")
    record(reg, CHALLENGER, 0.45, noise=0.03, items_per_s=375.0)
    record(reg, WEAK, 0.362, items_per_s=900.0)
    return reg


def form_token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "page has no CSRF token"
    return found.group(1)


def login(client: TestClient, api_key: str) -> None:
    page = client.get("/login")
    r = client.post(
        "/login",
        data={"csrf_token": form_token(page.text), "api_key": api_key, "next": "/tasks"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/tasks", r.text


@pytest.fixture
def seeded(registry: Registry, tmp_path: Path) -> Registry:
    return seed_fleet(registry, tmp_path)


def test_login_roles_and_logout(seeded: Registry) -> None:
    _, viewer = seeded.create_api_key("vic", roles=["viewer"])
    _, caller = seeded.create_api_key("app", roles=["caller"])
    client = TestClient(create_app(seeded))

    r = client.get(f"/tasks/{TASK}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/login?next=/tasks/{TASK}"

    page = client.get("/login")
    r = client.post(
        "/login", data={"csrf_token": form_token(page.text), "api_key": "tfk_nope_nope"}
    )
    assert r.status_code == 401 and "unknown API key" in r.text
    r = client.post("/login", data={"csrf_token": form_token(r.text), "api_key": caller})
    assert r.status_code == 403 and "needs viewer, promoter or admin" in r.text
    r = client.post(
        "/login",
        data={"csrf_token": form_token(r.text), "api_key": viewer, "next": "//evil.example"},
        follow_redirects=False,
    )
    assert r.headers["location"] == "/tasks"  # no open redirect off the site
    # The cookie is signed, readable JSON: a session token, never the key or its secret.
    cookie = client.cookies.get("taskfleet_session") or ""
    payload = base64.b64decode(cookie.split(".")[0] + "==")
    assert b'"sid": ' in payload and viewer.encode() not in payload

    tasks = client.get("/tasks")
    assert tasks.status_code == 200
    assert TASK in tasks.text and CHAMPION in tasks.text and "vic" in tasks.text

    seeded.revoke_api_key("vic")  # takes effect on the next click, not at cookie expiry
    assert client.get("/tasks", follow_redirects=False).status_code == 303

    _, admin = seeded.create_api_key("ada", roles=["admin"])
    login(client, admin)
    r = client.post(
        "/logout",
        data={"csrf_token": form_token(client.get("/tasks").text)},
        follow_redirects=False,
    )
    assert r.headers["location"] == "/login"
    assert client.get("/fleet", follow_redirects=False).status_code == 303


def test_task_page_leaderboard_verdicts_and_buttons(seeded: Registry) -> None:
    _, viewer = seeded.create_api_key("vic", roles=["viewer"])
    _, promoter = seeded.create_api_key("pat", roles=["promoter"])
    _, admin = seeded.create_api_key("ada", roles=["admin"])
    client = TestClient(create_app(seeded))

    login(client, viewer)
    page = client.get(f"/tasks/{TASK}").text
    rows = re.findall(r'<tr class="[^"]*" data-candidate="([^"]+)"', page)
    # Champion first, then challengers by score; bm25 and the never-evaluated ft-v3 last.
    assert rows == [CHAMPION, CHALLENGER, WEAK, "base-a", "bm25", "base-a+ft-v3"]
    assert "<svg" in page and "champion + margin 0.370" in page
    assert "[0.340, 0.380]" in page  # champion's CI
    assert "380.0" in page  # cost, items/s
    assert "passes" in page and "less than the task&#39;s margin" in page
    assert "first fine-tune beats the base" in page and "key:" not in page  # seeded by CLI actor
    assert "Promote…" not in page and "Roll back" not in page  # viewers only look

    login(client, promoter)
    page = client.get(f"/tasks/{TASK}").text
    promote_links = re.findall(r'href="/tasks/legal/promote/([^"]+)"', page)
    assert promote_links == ["base-a%2Bft-v2"]  # only the one that passes the rule
    assert "Roll back" not in page  # no previous champion yet

    login(client, admin)
    page = client.get(f"/tasks/{TASK}").text
    links = set(re.findall(r'href="/tasks/legal/promote/([^"]+)"', page))
    assert "base-b" in links and "bm25" not in links  # admins may override; bm25 has no model
    confirm = client.get(f"/tasks/{TASK}/promote/{WEAK}").text
    assert (
        'name="override"' in confirm and 'name="expected_champion" value="base-a+ft-v1"' in confirm
    )
    login(client, promoter)
    confirm = client.get(f"/tasks/{TASK}/promote/{CHALLENGER}").text
    assert 'name="override"' not in confirm and "Confirm promotion" in confirm
    login(client, viewer)
    r = client.get(f"/tasks/{TASK}/promote/{CHALLENGER}")
    assert r.status_code == 403 and "FORBIDDEN" in r.text


def test_lineage_tree_and_errors_as_pages(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))
    page = client.get(f"/tasks/{TASK}/candidates/{CHALLENGER}").text
    nodes = re.findall(r'class="node (\w+)( current)?" data-node="([^"]+)"', page)
    assert [(kind, name) for kind, _, name in nodes] == [
        ("base", "base-a"),
        ("adapter", "ft-v1"),
        ("adapter", "ft-v2"),
        ("adapter", "ft-v3"),
    ]
    assert [name for _, current, name in nodes if current] == ["ft-v2"]
    # Nesting: ft-v3 is inside ft-v2's list, which is inside ft-v1's.
    tree = page[page.index('<ul class="tree">') :]
    assert tree.index("ft-v1") < tree.index("<ul>", tree.index("ft-v1")) < tree.index("ft-v2")
    assert "0.3600" in page and "0.4500" in page and "not evaluated" in page  # v1, v2, v3
    assert "ft-alt" not in page  # a sibling branch, not this adapter's line

    root = client.get(f"/tasks/{TASK}/candidates/base-a").text
    assert 'data-node="ft-alt"' in root and 'data-node="ft-v3"' in root  # base: whole family
    assert "no candidate on legal" in root  # ft-alt was never paired with the task
    assert "no model, no lineage" in client.get(f"/tasks/{TASK}/candidates/bm25").text

    r = client.get(f"/tasks/{TASK}/candidates/ghost")
    assert r.status_code == 404 and "no candidate &#39;ghost&#39;" in r.text
    assert "Traceback" not in r.text
    r = client.get("/tasks/nope", headers={"Accept": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"


def test_fleet_view_desired_vs_reported(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))
    page = client.get("/fleet").text
    assert 'id="fleet-unreachable"' in page and "no worker has ever reported" in page

    report(seeded, "w1", epoch=1, queue=4)
    report(seeded, "w2", epoch=1, queue=2)
    page = client.get("/fleet").text
    assert 'id="fleet-unreachable"' not in page
    assert "3.0 GiB / 8.0 GiB" in page and f"<code>{CHAMPION}</code>" in page
    row = re.search(r'<tr data-task="legal">(.*?)</tr>', page, re.S)
    assert row and ">6<" in row.group(1) and "converged" in row.group(1)  # queue 4 + 2

    seeded.promote(TASK, CHALLENGER, reason="better")
    row = re.search(r'<tr data-task="legal">(.*?)</tr>', client.get("/fleet").text, re.S)
    assert row and "<b>2</b>" in row.group(1) and "converging 0/1" in row.group(1)
    assert "w1: 1" in row.group(1)
    report(seeded, "w1", epoch=2, serving=CHALLENGER)
    row = re.search(r'<tr data-task="legal">(.*?)</tr>', client.get("/fleet").text, re.S)
    assert row and "w1: 2" in row.group(1) and ">converged<" in row.group(1)

    # Heartbeats stop (NATS or the watcher down): the mirror goes stale and the banner says so.
    app = FastAPI()
    mount_dashboard(app, ControlPlane(seeded, require_auth=False), stale_after_s=1.0)
    time.sleep(1.2)
    page = TestClient(app).get("/fleet").text
    assert 'id="fleet-unreachable"' in page and "no worker is reachable now" in page
    assert page.count('badge no">unreachable') == 2


def test_fleet_view_shows_runtime_profiles_and_what_each_worker_applies(seeded: Registry) -> None:
    from registry.entities import ProfileCreate, RuntimeSettings

    client = TestClient(create_app(seeded, require_auth=False))
    page = client.get("/fleet").text
    assert "None: every worker runs the defaults." in page
    profile = seeded.record_profile(
        ProfileCreate(
            model="base-a", machine_class="cpu:Test CPU x2",
            settings=RuntimeSettings(engine="onnx", intra_op_threads=2), task=TASK,
            p99_bound_ms=500.0, throughput=45.0, default_throughput=30.0,
        )
    )  # fmt: skip
    seeded.record_worker_report(
        WorkerReport(
            worker_id="w1", host="w1.local", reported_at=datetime.now(UTC), loaded=[CHAMPION],
            memory_used=1, memory_budget=2, queue_depth={}, runtimes=["torch"],
            epochs={TASK: 2}, profiles={TASK: profile.id},
        )
    )  # fmt: skip
    report(seeded, "w2", epoch=2)  # another machine class: no profile applied
    page = client.get("/fleet").text
    row = re.search(rf'<tr data-profile="{profile.id}">(.*?)</tr>', page, re.S)
    assert row and "cpu:Test CPU x2" in row.group(1) and "1.50x" in row.group(1)
    assert "engine=onnx, intra_op_threads=2" in row.group(1)
    w1 = re.search(r'<tr class="[^"]*" data-worker="w1">(.*?)</tr>', page, re.S)
    w2 = re.search(r'<tr class="[^"]*" data-worker="w2">(.*?)</tr>', page, re.S)
    assert w1 and f"{TASK}: profile {profile.id}" in w1.group(1)
    assert w2 and "defaults<" in w2.group(1) and ": profile" not in w2.group(1)
