"""The dashboard in a real browser (Debian's chromium via Playwright) against a real control
plane (uvicorn on a free port) over a real SQLite registry.

Walks what an ML lead does: log in, read the leaderboard, promote a challenger (confirm +
reason), watch the fleet converge on the new epoch, roll back; a viewer sees no Promote button
and a forged POST is refused. With TASKFLEET_SCREENSHOTS=1 the page screenshots are written
to reports/dashboard/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright
from sqlalchemy import select

from registry import Registry
from registry.api import create_app
from registry.models import CandidateRow, PlacementRow, TaskRow
from serving.embedded_nats import free_port
from serving.httpserver import allowed_hosts, http_config
from testbed.declared_tasks import add_task
from tests.conftest import REPO
from tests.evalrun_fixture import record_run
from tests.test_dashboard_pages import CHALLENGER, CHAMPION, TASK, WEAK, report, seed_fleet

CHROMIUM = "/usr/bin/chromium"
# The committed screenshots are refreshed only on request (TASKFLEET_SCREENSHOTS=1), so a
# test run leaves the working tree clean; otherwise they go to a scratch folder.
SHOTS = (
    REPO / "reports" / "dashboard"
    if os.environ.get("TASKFLEET_SCREENSHOTS") == "1"
    else Path(tempfile.mkdtemp(prefix="taskfleet-shots-"))
)

if shutil.which(CHROMIUM) is None:  # a missing browser is a set-up failure, not a pass
    raise RuntimeError(f"needs Debian's chromium at {CHROMIUM}: run `make sysdeps`")


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[tuple[str, Registry]]:
    reg = Registry.open(
        f"sqlite:///{tmp_path / 'registry.db'}", artifact_dir=tmp_path / "artifacts", actor="cli"
    )
    seed_fleet(reg, tmp_path)
    report(reg, "gpu-worker-1", epoch=1, queue=4)
    port = free_port()
    # Served as `taskfleet serve` serves it: its uvicorn config, the Host names it answers to.
    app = create_app(reg, allowed_hosts=allowed_hosts(None, "127.0.0.1"))
    server = uvicorn.Server(http_config(app, "127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "control plane did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", reg
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        reg.close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Chromium; a test fails if any page it opened reported a Content-Security-Policy
    violation (the dashboard runs with no inline script or style allowed)."""
    violations: list[str] = []

    def watch(page: Page) -> None:
        page.on(
            "console",
            lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None,
        )

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        new_page = chromium.new_page

        def watched_page(**options: Any) -> Page:
            page = new_page(**options)
            watch(page)
            return page

        chromium.new_page = watched_page  # type: ignore[method-assign]
        try:
            yield chromium
        finally:
            chromium.close()
    assert violations == [], violations


def test_promote_watch_fleet_and_roll_back(
    control_plane: tuple[str, Registry], browser: Browser
) -> None:
    base, reg = control_plane
    SHOTS.mkdir(parents=True, exist_ok=True)
    _, promoter_key = reg.create_api_key("lena", roles=["promoter"])
    _, viewer_key = reg.create_api_key("vic", roles=["viewer"])

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/tasks/{TASK}")
    expect(page).to_have_url(f"{base}/login?next=/tasks/{TASK}")
    page.screenshot(path=str(SHOTS / "login.png"))
    page.fill("#api_key", promoter_key)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{base}/tasks/{TASK}")  # back where the user was going

    page.goto(f"{base}/tasks")
    expect(page.locator("table.grid")).to_contain_text(CHAMPION)
    page.screenshot(path=str(SHOTS / "tasks.png"), full_page=True)

    page.click(f"text={TASK}")
    rows = page.locator("table.leaderboard tbody tr")
    expect(rows.first).to_contain_text("champion")
    expect(rows.nth(1)).to_contain_text(CHALLENGER)
    expect(rows.nth(1)).to_contain_text("passes")
    expect(page.locator("svg.chart")).to_be_visible()

    page.click(f"tr[data-candidate='{CHALLENGER}'] td a >> nth=0")
    expect(page.locator("ul.tree .node.current")).to_contain_text("ft-v2")
    page.screenshot(path=str(SHOTS / "candidate.png"), full_page=True)

    # Promote: the button leads to a confirmation with the rule's verdict and a reason.
    page.goto(f"{base}/tasks/{TASK}")
    page.click(f"tr[data-candidate='{CHALLENGER}'] >> text=Promote…")
    expect(page.locator("h1")).to_have_text(f"Promote {CHALLENGER}?")
    page.fill("#reason", "ft-v2 beats ft-v1 by 0.09 nDCG@10")
    page.dblclick("#confirm")  # an impatient double click still promotes once
    expect(page.locator(".flash.ok")).to_contain_text("placement epoch 2")
    expect(page.locator("table.history tbody tr").first).to_contain_text("key:lena")
    assert [p.candidate for p in reg.list_promotions(TASK)] == [CHALLENGER, CHAMPION]

    # The fleet view shows desired epoch 2, reported 1, until the worker catches up.
    page.goto(f"{base}/fleet")
    status = page.locator(f"tr[data-task='{TASK}'] td.status")
    expect(status).to_contain_text("converging 0/1")
    report(
        reg, "gpu-worker-1", epoch=2, serving=CHALLENGER, queue=1
    )  # the worker loaded the new champion
    expect(status).to_have_text("converged", timeout=10_000)  # the page refreshes itself
    page.screenshot(path=str(SHOTS / "fleet.png"), full_page=True)

    page.goto(f"{base}/tasks/{TASK}")
    page.click("#rollback")
    page.fill("#reason", "p99 latency regression")
    page.click("#confirm")
    expect(page.locator(".flash.ok")).to_contain_text(f"back to {CHAMPION} (placement epoch 3)")
    assert reg.champion(TASK).name == CHAMPION  # type: ignore[union-attr]
    page.screenshot(path=str(SHOTS / "task.png"), full_page=True)  # with the whole history

    # A viewer: no Promote or Roll back, and a forged POST from its session is refused.
    viewer = browser.new_page()
    viewer.goto(f"{base}/login")
    viewer.fill("#api_key", viewer_key)
    viewer.click("button[type=submit]")
    viewer.goto(f"{base}/tasks/{TASK}")
    expect(viewer.locator("table.leaderboard")).to_contain_text(CHALLENGER)
    expect(viewer.locator("text=Promote…")).to_have_count(0)
    expect(viewer.locator("#rollback")).to_have_count(0)
    forged = viewer.request.post(
        f"{base}/tasks/{TASK}/promote/{CHALLENGER}",
        form={"expected_champion": CHAMPION, "reason": "forged"},
    )
    assert forged.status == 403 and "CSRF_REFUSED" in forged.text()
    token = viewer.locator("input[name=csrf_token]").first.input_value()
    direct = viewer.request.post(
        f"{base}/tasks/{TASK}/promote/{CHALLENGER}",
        form={"csrf_token": token, "expected_champion": CHAMPION, "reason": "forged"},
    )
    assert direct.status == 403 and "FORBIDDEN" in direct.text()
    assert len(reg.list_promotions(TASK)) == 3


def test_first_champion_from_the_dashboard(
    control_plane: tuple[str, Registry], browser: Browser
) -> None:
    """A task nobody has promoted yet: the dashboard makes its first champion."""
    base, reg = control_plane
    add_task(reg, "fresh", suite="legal-suite", margin=0.01)
    reg.add_candidate("fresh", base="base-a")
    record_run(reg, "fresh", "base-a", 0.3)
    _, key = reg.create_api_key("lena", roles=["promoter"])

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/login?next=/tasks/fresh")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    expect(page.locator(".champion-card")).to_contain_text("none yet")
    page.click("tr[data-candidate='base-a'] >> text=Promote…")
    expect(page.locator("h1")).to_have_text("Promote base-a?")
    page.fill("#reason", "the first evaluated candidate")
    page.click("#confirm")
    expect(page.locator(".flash.ok")).to_contain_text("Promoted base-a to champion of fresh")
    expect(page.locator("#placed")).to_contain_text("serves base-a")
    expect(page.locator("table.history tbody tr").first).to_contain_text("key:lena")
    assert reg.champion("fresh").name == "base-a"  # type: ignore[union-attr]


def test_task_page_shows_the_placed_candidate_and_a_mismatch(
    control_plane: tuple[str, Registry], browser: Browser
) -> None:
    base, reg = control_plane
    _, key = reg.create_api_key("vic", roles=["viewer"])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/login?next=/tasks/{TASK}")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    expect(page.locator("#placed")).to_contain_text(f"serves {CHAMPION}")
    expect(page.locator("#placement-mismatch")).to_have_count(0)

    # A placement from before every placement needed a promotion: the page says so.
    with reg.tx.write() as s:
        task = s.scalar(select(TaskRow).where(TaskRow.name == TASK))
        weak = s.scalar(select(CandidateRow).where(CandidateRow.name == WEAK))
        assert task is not None and weak is not None
        s.add(PlacementRow(task_id=task.id, candidate_id=weak.id, epoch=2, pinned=True, replicas=1))
    page.reload()
    expect(page.locator("#placed")).to_contain_text(f"serves {WEAK}")
    banner = page.locator("#placement-mismatch")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text(f"the champion is {CHAMPION}")
    page.screenshot(path=str(SHOTS / "task-mismatch.png"), full_page=True)

    reg.update_placement(TASK, replicas=2)  # puts the champion back, in the history
    page.reload()
    expect(page.locator("#placement-mismatch")).to_have_count(0)
    expect(page.locator("#placed")).to_contain_text(f"serves {CHAMPION}")
    expect(page.locator("table.history tbody tr").first).to_contain_text("placement")


def test_pages_render_under_their_policy_and_refuse_framing(
    control_plane: tuple[str, Registry], browser: Browser
) -> None:
    """Every dashboard page (SVG chart and memory meters included) and the API docs render
    with the Content-Security-Policy on (the fixture fails on any violation); another site can
    neither frame the dashboard nor reach it by another name."""
    base, reg = control_plane
    _, key = reg.create_api_key("ada", roles=["admin"])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/login?next=/tasks/{TASK}")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    expect(page.locator("svg.chart")).to_be_visible()
    expect(page.locator("svg.chart .row").first).to_contain_text(CHAMPION)
    page.goto(f"{base}/fleet")
    meter = page.locator("tr[data-worker='gpu-worker-1'] svg.meter rect.used")
    expect(meter).to_have_attribute("width", "37.5")  # 3 of 8 GiB
    assert meter.evaluate("e => getComputedStyle(e).fill") != "rgb(0, 0, 0)"  # styled by CSS
    for path in (f"/tasks/{TASK}/candidates/{CHALLENGER}", f"/tasks/{TASK}/promote/{CHALLENGER}"):
        page.goto(base + path)
        expect(page.locator("main h1")).to_be_visible()
    # The API docs run under their own policy (inline script and style allowed, nothing from
    # elsewhere: ReDoc's "powered by" logo from its CDN is the one thing it blocks).
    docs = browser.new_context().new_page()
    blocked: list[str] = []
    docs.on("console", lambda m: blocked.append(m.text) if "Security Policy" in m.text else None)
    docs.goto(f"{base}/docs")
    expect(docs.locator(".opblock").first).to_be_visible(timeout=15_000)  # Swagger UI ran
    docs.goto(f"{base}/redoc")
    expect(docs.locator("text=taskfleet control plane").first).to_be_visible(timeout=15_000)
    assert all("https://cdn.redoc.ly/" in message for message in blocked), blocked

    # Framed by another page: the browser refuses to show the dashboard inside it.
    framer = browser.new_context().new_page()
    framer.set_content(f'<iframe id="f" src="{base}/login" width="600" height="400"></iframe>')
    framer.wait_for_timeout(1500)
    frame = framer.frame_locator("#f")
    expect(frame.locator("#api_key")).to_have_count(0)
    # The same server by a name it does not answer to (a rebinding attack's view of it).
    refused = page.request.get(f"{base}/tasks", headers={"Host": "attacker.example"})
    assert refused.status == 400 and "--allowed-host" in refused.text()


def test_production_page_shows_agreement_drift_and_starts_and_stops_a_shadow(
    control_plane: tuple[str, Registry], browser: Browser
) -> None:
    """The production view under the dashboard's policy: the agreement chart, the drift flag,
    the shadow's reason as text (never markup), and the start/stop forms with their CSRF token."""
    from datetime import UTC, datetime, timedelta

    from registry import entities as e

    base, reg = control_plane
    reg.start_shadow(TASK, CHALLENGER, sample_rate=0.5, reason="<img src=x onerror=alert(1)>")
    start = datetime.now(UTC) - timedelta(minutes=30)
    for n in range(12):
        request_id = f"r{n:04d}"
        reg.record_sample(
            e.SampleCreate(
                task=TASK, request_id=request_id, received_at=start + timedelta(minutes=n),
                inputs=1, champion=CHAMPION, champion_model_key="k", champion_epoch=1,
                champion_ms=8.0, shadow=CHALLENGER, lengths=[9],
            )
        )  # fmt: skip
        reg.record_shadow_outcome(
            e.ShadowOutcome(request_id, "ok", shadow_ms=12.0, agreement=[float(n % 4 != 0)])
        )
    signals = [{"name": "length", "statistic": 0.9, "p_value": 0.0005}]
    reg.record_drift_window(
        e.DriftWindowCreate(TASK, 1, 12, 12, CHAMPION, 1, signals, 0.0005, 0.01, True)
    )
    _, key = reg.create_api_key("lead", roles=["promoter"])
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    page.goto(f"{base}/login?next=/tasks/{TASK}/production")
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    expect(page.locator("#shadow")).to_have_text(CHALLENGER)
    expect(page.locator("#shadow-reason")).to_have_text("<img src=x onerror=alert(1)>")
    expect(page.locator("#agreement")).to_contain_text("0.750")
    expect(page.locator("svg.chart circle")).to_have_count(12)
    expect(page.locator("#drift-flag")).to_contain_text("length p=0.0005")
    page.screenshot(path=str(SHOTS / "production.png"), full_page=True)
    page.fill("#stop-shadow input[name=reason]", "enough evidence")
    page.click("#stop-shadow button")
    expect(page.locator(".flash.ok")).to_contain_text(
        f"The shadow {CHALLENGER} of {TASK} is stopped"
    )
    expect(page.locator("#shadow")).to_have_text("none")
    assert reg.shadow_history(TASK)[0].reason == "enough evidence"
    page.select_option("#start-shadow select[name=candidate]", CHALLENGER)
    page.fill("#start-shadow input[name=sample_rate]", "0.25")
    page.click("#start-shadow button")
    expect(page.locator(".flash.ok")).to_contain_text("on 0.25 of its requests")
    # A form without this session's CSRF token is refused.
    forged = page.request.post(
        f"{base}/tasks/{TASK}/shadow/stop", form={"csrf_token": "forged", "reason": "x"}
    )
    assert forged.status == 403
    assert reg.current_shadow(TASK) is not None
