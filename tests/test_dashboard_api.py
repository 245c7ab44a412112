"""REST endpoints for promotion and the fleet (registry/api.py) on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from registry import Registry
from registry.api import create_app
from tests.test_dashboard_pages import CHALLENGER, CHAMPION, TASK, WEAK, report, seed_fleet


def test_promote_rollback_history_check_and_fleet(registry: Registry, tmp_path: Path) -> None:
    seed_fleet(registry, tmp_path)
    keys = {
        role: registry.create_api_key(role, roles=[role])[1]
        for role in ("viewer", "promoter", "admin")
    }
    client = TestClient(create_app(registry))

    def as_(role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[role]}"}

    r = client.get(f"/api/v1/tasks/{TASK}/candidates/{CHALLENGER}/check", headers=as_("viewer"))
    assert r.status_code == 200
    check = r.json()
    assert check["passes"] and check["champion"] == CHAMPION and check["ci_low"] > 0

    url = f"/api/v1/tasks/{TASK}/promote"
    r = client.post(url, json={"candidate": CHALLENGER}, headers=as_("viewer"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    r = client.post(url, json={"candidate": WEAK}, headers=as_("promoter"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "PROMOTION_RULE_NOT_MET"
    # The key's roles reach the service: a promoter cannot override, whatever it asks for.
    r = client.post(
        url, json={"candidate": WEAK, "override": True, "reason": "x"}, headers=as_("promoter")
    )
    assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
    stale = {"candidate": CHALLENGER, "expected_champion": None}  # "I saw no champion"
    r = client.post(url, json=stale, headers=as_("promoter"))
    assert r.status_code == 409 and r.json()["error"] == {
        "code": "CONFLICT",
        "message": f"the champion of '{TASK}' changed meanwhile (now {CHAMPION}); "
        "reload and try again",
        "retryable": True,
    }

    body = {"candidate": CHALLENGER, "reason": "better", "expected_champion": CHAMPION}
    r = client.post(url, json=body, headers=as_("promoter"))
    assert r.status_code == 201
    assert (r.json()["epoch"], r.json()["actor"], r.json()["previous_candidate"]) == (
        2,
        "key:promoter",
        CHAMPION,
    )
    r = client.post(url, json=body, headers=as_("promoter"))  # the same request again
    assert r.status_code == 409

    r = client.get("/api/v1/fleet", headers=as_("viewer"))
    placement = r.json()["placements"][0]
    assert (placement["desired_epoch"], placement["converged"], r.json()["workers"]) == (
        2,
        False,
        [],
    )
    report(registry, "w1", epoch=2, queue=5)
    r = client.get("/api/v1/fleet", headers=as_("viewer")).json()
    assert r["placements"][0]["reported"] == {"w1": 2} and r["placements"][0]["converged"]
    assert r["workers"][0]["queue_depth"] == {TASK: 5}

    r = client.post(f"/api/v1/tasks/{TASK}/rollback", json={"reason": "oops"}, headers=as_("admin"))
    assert r.status_code == 201 and r.json()["candidate"] == CHAMPION and r.json()["epoch"] == 3
    r = client.post(
        f"/api/v1/tasks/{TASK}/rollback",
        json={"expected_champion": CHALLENGER},
        headers=as_("admin"),
    )
    assert r.status_code == 409  # already rolled back: that champion is gone
    history = client.get(f"/api/v1/tasks/{TASK}/promotions", headers=as_("viewer")).json()
    assert [(p["kind"], p["candidate"], p["actor"]) for p in history] == [
        ("rollback", CHAMPION, "key:admin"),
        ("promote", CHALLENGER, "key:promoter"),
        ("promote", CHAMPION, "test"),
    ]
    r = client.get("/api/v1/tasks/nope/promotions", headers=as_("viewer"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
