"""A task that prefers the cheapest: a cheaper challenger non-inferior within the margin passes
the rule and is recommended, with the line that says why; one outside the margin never is, and
a task that prefers the best keeps asking for a better one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry import InvalidInput, Registry
from registry.promotions import PromotionRuleNotMet
from testbed.declared_tasks import add_task
from tests.evalrun_fixture import record_run as record
from tests.test_registry import make_model_dir


@pytest.fixture
def search(registry: Registry, tmp_path: Path) -> Registry:
    add_task(registry, "search", suite="suite", margin=0.002, prefer="cheapest")
    for name in ("minilm", "int8", "tiny"):
        registry.add_model(name, path=make_model_dir(tmp_path / name, name.encode()))
        registry.add_candidate("search", base=name)
    record(registry, "search", "minilm", 0.036, cpu_ms=9.2)
    registry.promote("search", "minilm", reason="first champion")
    return registry


def test_a_cheaper_non_inferior_challenger_passes_and_is_recommended(search: Registry) -> None:
    record(search, "search", "int8", 0.0353, noise=0.0005, cpu_ms=4.0)
    check = search.check_promotion("search", "int8")
    assert check.passes, check.reason
    assert check.reason.startswith("int8: ndcg_at_10 -0.0007 [")
    assert "vs minilm, margin 0.002; 2.3x cheaper" in check.reason
    rec = search.recommend("search")
    assert (rec.prefer, rec.candidate, rec.champion) == ("cheapest", "int8", "minilm")
    assert "2.3x cheaper" in rec.reason
    done = search.promote("search", "int8", reason="as good, cheaper")
    assert done.kind == "promote"  # by the rule, no override

    # The same evidence under "best": not better by the margin, so the champion stays.
    search.set_task_preference("search", "best")
    record(search, "search", "minilm", 0.036, cpu_ms=9.2)
    assert search.recommend("search").candidate == "minilm"


def test_a_cheaper_candidate_outside_the_margin_is_never_recommended(search: Registry) -> None:
    record(search, "search", "int8", 0.0353, noise=0.0005, cpu_ms=4.0)
    record(search, "search", "tiny", 0.030, noise=0.0005, cpu_ms=0.4)
    check = search.check_promotion("search", "tiny")
    assert not check.passes
    assert "not non-inferior either (CI lower bound below -0.002)" in check.reason
    with pytest.raises(PromotionRuleNotMet):
        search.promote("search", "tiny")
    rec = search.recommend("search")
    assert rec.candidate == "int8"
    assert any(
        line.startswith("tiny: ndcg_at_10 -0.0060") and "outside the margin" in line
        for line in rec.considered
    ), rec.considered


def test_best_is_the_default_and_a_preference_is_checked(registry: Registry) -> None:
    add_task(registry, "plain", suite="suite")
    assert registry.get_task("plain").prefer == "best"
    with pytest.raises(InvalidInput, match="prefer must be one of best, cheapest"):
        registry.set_task_preference("plain", "fastest")


def test_the_reasoning_is_on_the_dashboard_and_in_taskfleet_recommend(
    search: Registry, db_url: str, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from registry.api import create_app

    record(search, "search", "int8", 0.0353, noise=0.0005, cpu_ms=4.0)
    page = TestClient(create_app(search, require_auth=False)).get("/tasks/search").text
    assert 'id="recommendation"' in page and 'id="prefer">cheapest' in page
    assert "vs minilm, margin 0.002; 2.3x cheaper" in page
    assert "$/1M items" in page and "CPU ms/item" in page

    env = {**os.environ, "TASKFLEET_HOME": str(tmp_path / "home")}
    env.pop("TASKFLEET_NATS_URL", None)
    shown = subprocess.run(
        [sys.executable, "-m", "taskfleet", "--database-url", db_url, "recommend", "search"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "search: prefer cheapest, margin 0.002; champion minilm" in text
    assert "recommend int8 on torch: int8: ndcg_at_10 -0.0007 [" in text
    assert "2.3x cheaper" in text and "promote it: taskfleet promote search int8" in text
