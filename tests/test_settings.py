"""The settings every command reads: `TASKFLEET_*` variables in any case, CLI flags over them,
and a value that cannot be read is one line naming the variable (never a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from taskfleet.settings import Settings, SettingsError


def test_the_environment_is_read_in_any_case_and_typed() -> None:
    s = Settings.load(
        env={
            "TASKFLEET_HOME": "/srv/tf",
            "taskfleet_database_url": "postgresql://db/tf",
            "TASKFLEET_ENDPOINT_PROBE_PERIOD_S": "2.5",
            "TASKFLEET_SECURE_COOKIES": "Yes",
            "TASKFLEET_NATS_CREDS": "/etc/tf.creds",
            "OTHER_HOME": "/nope",
        }
    )
    assert s.home == Path("/srv/tf")
    assert s.resolved_database_url == "postgresql://db/tf"
    assert s.endpoint_probe_period_s == 2.5
    assert s.secure_cookies is True
    assert s.nats_creds == Path("/etc/tf.creds")
    assert s.resolved_artifact_dir == Path("/srv/tf/artifacts")


def test_defaults_without_an_environment() -> None:
    s = Settings.load(env={})
    assert s.home == Path.home() / ".taskfleet"
    assert s.resolved_database_url == f"sqlite:///{Path.home() / '.taskfleet' / 'registry.db'}"
    assert s.endpoint_probe_period_s == 60.0
    assert s.secure_cookies is False
    assert s.nats_options() is None


def test_a_flag_overrides_the_environment_and_none_does_not() -> None:
    env = {"TASKFLEET_HOME": "/from-env", "TASKFLEET_ACTOR": "env-actor"}
    s = Settings.load({"home": Path("/from-flag"), "actor": None}, env=env)
    assert s.home == Path("/from-flag")
    assert s.actor == "env-actor"
    assert Settings.load({"home": "/as-text"}, env={}).home == Path("/as-text")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("TASKFLEET_ENDPOINT_PROBE_PERIOD_S", "soon", "must be a number"),
        ("TASKFLEET_ENDPOINT_PROBE_PERIOD_S", "0", "must be above 0"),
        ("TASKFLEET_ENDPOINT_PROBE_PERIOD_S", "nan", "must be above 0"),
        ("TASKFLEET_SECURE_COOKIES", "maybe", "must be one of"),
    ],
)
def test_a_value_that_cannot_be_read_names_its_variable(name: str, value: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load(env={name: value})
    assert str(caught.value).startswith(f"{name}: {says}")
    assert str(caught.value).endswith(f", not {value!r}")


def test_an_unknown_override_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="homes"):
        Settings.load({"homes": "/x"}, env={})


def test_every_setting_says_what_it_is_for() -> None:
    for f in fields(Settings):
        assert f.metadata["description"].strip(), f.name
        assert callable(f.metadata["parse"]), f.name


def test_the_cli_says_one_line_for_a_bad_variable(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TASKFLEET_HOME": str(tmp_path),
        "TASKFLEET_SECURE_COOKIES": "sometimes",
    }
    done = subprocess.run(
        [sys.executable, "-m", "taskfleet", "task", "ls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert done.stderr.strip() == (
        "error: TASKFLEET_SECURE_COOKIES: must be one of 1/0, true/false, yes/no, on/off, "
        "not 'sometimes'"
    )
    assert not (tmp_path / "registry.db").exists()
