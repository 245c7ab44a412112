"""The promotion CLI verbs (taskfleet/cli_promote.py) on a real SQLite/PostgreSQL registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from registry import Registry
from registry.promotions import PromotionRuleNotMet
from taskfleet import cli_promote
from taskfleet.context import state
from tests.test_dashboard_pages import CHALLENGER, CHAMPION, TASK, WEAK, seed_fleet

app = typer.Typer()
app.command("promote")(cli_promote.promote)
app.command("rollback")(cli_promote.rollback)
app.command("promotions")(cli_promote.promotions)


@pytest.fixture
def cli(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    # The commands open the registry through the shared CLI state; hand them the test's one.
    monkeypatch.setattr(state, "_registry", seed_fleet(registry, tmp_path))
    return registry


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


def test_promote_rollback_and_history(cli: Registry) -> None:
    output = invoke("promote", TASK, CHALLENGER, "--reason", "wins on eval")
    assert "rule: passes" in output
    assert f"promoted {CHALLENGER} to champion of {TASK} (was {CHAMPION}); placement epoch 2" in (
        output.replace("\n", " ")
    )
    assert cli.current_placement(TASK).candidate == CHALLENGER  # type: ignore[union-attr]

    output = invoke("rollback", TASK, "--reason", "latency")
    assert f"rolled {TASK} back from {CHALLENGER} to {CHAMPION}; placement epoch 3" in output
    history = invoke("promotions", TASK)
    lines = [line for line in history.splitlines() if "promote" in line or "rollback" in line]
    assert ["rollback" in lines[0], "wins on eval" in lines[1]] == [True, True]
    assert len(lines) == 3


def test_rule_refusal_and_override(cli: Registry) -> None:
    with pytest.raises(PromotionRuleNotMet, match="less than the task's margin"):
        invoke("promote", TASK, WEAK)
    assert cli.champion(TASK).name == CHAMPION  # type: ignore[union-attr]
    output = invoke("promote", TASK, WEAK, "--override", "--reason", "cheaper")
    assert "rule: not met" in output and f"promoted {WEAK}" in output
    assert cli.list_promotions(TASK)[0].reason == "cheaper"
