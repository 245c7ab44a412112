"""Dashboard forms against a real registry: CSRF, roles, stale forms, double submits, rollback."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from registry import Registry
from registry.api import create_app
from tests.test_dashboard_pages import (
    CHALLENGER,
    CHAMPION,
    TASK,
    WEAK,
    form_token,
    login,
    seed_fleet,
)

PROMOTE_URL = f"/tasks/{TASK}/promote/{CHALLENGER}"


@pytest.fixture
def seeded(registry: Registry, tmp_path: Path) -> Registry:
    return seed_fleet(registry, tmp_path)


def signed_in(reg: Registry, name: str, role: str) -> TestClient:
    _, key = reg.create_api_key(name, roles=[role])
    client = TestClient(create_app(reg))
    login(client, key)
    return client


def promote_form(client: TestClient, url: str = PROMOTE_URL) -> dict[str, str]:
    page = client.get(url)
    assert page.status_code == 200, page.text
    return {"csrf_token": form_token(page.text), "expected_champion": CHAMPION, "reason": "why"}


def champions(reg: Registry) -> list[str]:
    return [p.candidate for p in reg.list_promotions(TASK)]


def test_promote_with_confirmation_then_roll_back(seeded: Registry) -> None:
    client = signed_in(seeded, "pat", "promoter")
    form = {**promote_form(client), "reason": "ft-v2 wins by 0.09"}
    r = client.post(PROMOTE_URL, data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/tasks/{TASK}"
    page = client.get(r.headers["location"]).text
    assert f"Promoted {CHALLENGER} to champion of {TASK} (placement epoch 2)" in page
    latest = seeded.list_promotions(TASK)[0]
    assert (latest.candidate, latest.actor, latest.reason, latest.epoch) == (
        CHALLENGER,
        "key:pat",
        "ft-v2 wins by 0.09",
        2,
    )
    assert "key:pat" in page and "ft-v2 wins by 0.09" in page  # the history shows who and why

    confirm = client.get(f"/tasks/{TASK}/rollback").text
    assert f'name="expected_champion" value="{CHALLENGER}"' in confirm
    r = client.post(
        f"/tasks/{TASK}/rollback",
        data={
            "csrf_token": form_token(confirm),
            "expected_champion": CHALLENGER,
            "reason": "p99 latency doubled",
        },
    )
    assert f"Rolled {TASK} back to {CHAMPION} (placement epoch 3)" in r.text
    assert champions(seeded) == [CHAMPION, CHALLENGER, CHAMPION]
    assert seeded.list_promotions(TASK)[0].kind == "rollback"


def test_forged_posts_are_refused_without_changes(seeded: Registry) -> None:
    client = signed_in(seeded, "ada", "admin")
    form = promote_form(client)
    for forged in ({**form, "csrf_token": ""}, {**form, "csrf_token": "x" * 43}):
        r = client.post(PROMOTE_URL, data=forged)
        assert r.status_code == 403 and "CSRF_REFUSED" in r.text and "Traceback" not in r.text
    no_field = {k: v for k, v in form.items() if k != "csrf_token"}
    r = client.post(PROMOTE_URL, data=no_field, headers={"Accept": "application/json"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "CSRF_REFUSED"

    # A token from another session does not work in this one.
    other = signed_in(seeded, "eve", "admin")
    r = client.post(PROMOTE_URL, data={**form, "csrf_token": promote_form(other)["csrf_token"]})
    assert r.status_code == 403
    # A cross-site form has no session cookie at all: redirected to log in, nothing done.
    r = TestClient(create_app(seeded)).post(PROMOTE_URL, data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    r = client.post(f"/tasks/{TASK}/rollback", data={"expected_champion": CHAMPION})
    assert r.status_code == 403
    assert champions(seeded) == [CHAMPION]


def test_viewer_posting_directly_is_forbidden(seeded: Registry) -> None:
    client = signed_in(seeded, "vic", "viewer")
    token = form_token(client.get(f"/tasks/{TASK}").text)  # logout form: a valid session token
    data = {"csrf_token": token, "expected_champion": CHAMPION, "reason": "sneaky"}
    r = client.post(PROMOTE_URL, data=data)
    assert r.status_code == 403 and "FORBIDDEN" in r.text and "promoter or admin" in r.text
    r = client.post(f"/tasks/{TASK}/rollback", data=data)
    assert r.status_code == 403
    assert champions(seeded) == [CHAMPION]


def test_stale_form_changes_nothing(seeded: Registry) -> None:
    client = signed_in(seeded, "pat", "promoter")
    form = promote_form(client)  # the user opens the confirmation and walks away...
    seeded.as_actor("ada", ["admin"]).promote(TASK, WEAK, override=True, reason="cheaper")
    r = client.post(PROMOTE_URL, data=form)  # ...and comes back
    assert r.status_code == 200
    assert f"the champion of &#39;{TASK}&#39; changed meanwhile (now {WEAK})" in r.text
    assert champions(seeded) == [WEAK, CHAMPION]

    missing = {k: v for k, v in promote_form(client).items() if k != "expected_champion"}
    r = client.post(PROMOTE_URL, data=missing)
    assert r.status_code == 400 and "does not say which champion it saw" in r.text
    assert champions(seeded) == [WEAK, CHAMPION]


def test_double_submit_promotes_once(seeded: Registry) -> None:
    client = signed_in(seeded, "pat", "promoter")
    form = promote_form(client)
    first = client.post(PROMOTE_URL, data=form)
    second = client.post(PROMOTE_URL, data=form)
    assert "placement epoch 2" in first.text
    assert f"{CHALLENGER} is already the champion; nothing more was changed" in second.text
    assert champions(seeded) == [CHALLENGER, CHAMPION]
    assert seeded.current_placement(TASK).epoch == 2  # type: ignore[union-attr]


def test_rule_and_override_need_admin_and_reason(seeded: Registry) -> None:
    promoter = signed_in(seeded, "pat", "promoter")
    weak_url = f"/tasks/{TASK}/promote/{WEAK}"
    r = promoter.post(weak_url, data=promote_form(promoter, weak_url))
    assert "Not promoted: cannot promote &#39;base-b&#39;" in r.text and "margin" in r.text
    r = promoter.post(weak_url, data={**promote_form(promoter, weak_url), "override": "1"})
    assert r.status_code == 403 and "needs the admin role" in r.text

    admin = signed_in(seeded, "ada", "admin")
    r = admin.post(weak_url, data={**promote_form(admin, weak_url), "override": "1", "reason": ""})
    assert "overriding the promotion rule needs a reason" in r.text
    assert champions(seeded) == [CHAMPION]
    form = {**promote_form(admin, weak_url), "override": "1", "reason": "3x cheaper to serve"}
    r = admin.post(weak_url, data=form)
    assert "Promoted base-b" in r.text
    assert seeded.list_promotions(TASK)[0].reason == "3x cheaper to serve"


def test_without_auth_the_local_user_acts_as_admin_but_still_needs_csrf(seeded: Registry) -> None:
    client = TestClient(create_app(seeded, require_auth=False))
    assert client.get("/login", follow_redirects=False).headers["location"] == "/tasks"
    assert "Log out" not in client.get("/tasks").text  # nobody to log out
    form = promote_form(client)
    r = client.post(PROMOTE_URL, data={**form, "csrf_token": ""})
    assert r.status_code == 403 and champions(seeded) == [CHAMPION]
    r = client.post(PROMOTE_URL, data=form)
    assert "placement epoch 2" in r.text
    assert seeded.list_promotions(TASK)[0].actor == "dashboard:anonymous"
