"""contract/shared.toml: the one declared file of rules Python and the sidecar share, and what
the Python roles build from it (the task-name rule of registry and fleet, the JetStream objects,
the headers, the error codes with their retryability)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import contract
from contract import ERROR_CODES, HEADERS, NATS, TASK_NAME, ContractError
from httpapi.errors import CODES, ErrorCode
from registry.errors import InvalidInput
from registry.kinds import check_name
from serving import nats_layout as layout
from serving import protocol
from taskfleet import stack
from taskfleet.stack import find_sidecar_binary
from tests.conftest import REPO


@pytest.mark.parametrize("name", TASK_NAME.examples_valid)
def test_the_registry_and_the_fleet_accept_the_same_task_names(name: str) -> None:
    assert check_name("task", name) == name
    assert layout.check_task_name(name) == name
    assert layout.task_subject(name) == f"tasks.{name}"


@pytest.mark.parametrize("name", TASK_NAME.examples_invalid)
def test_the_registry_and_the_fleet_refuse_the_same_task_names(name: str) -> None:
    """The fleet's rule was "any case, any length" while the registry's was lowercase and at
    most 128 characters: one rule now, the registry's."""
    with pytest.raises(InvalidInput):
        check_name("task", name)
    with pytest.raises(layout.InvalidTaskName, match="lowercase letters, digits and '_', '-'"):
        layout.check_task_name(name)


def test_the_task_name_examples_cover_both_edges() -> None:
    longest = "a" * TASK_NAME.max_chars
    assert TASK_NAME.allows(longest) and not TASK_NAME.allows(longest + "a")
    assert longest + "a" in TASK_NAME.examples_invalid
    assert any(n != n.lower() for n in TASK_NAME.examples_invalid)


def test_the_error_codes_are_the_declared_ones_with_their_retryability() -> None:
    assert {c.value: (i.status, i.retryable, i.meaning) for c, i in CODES.items()} == {
        code: (rule.status, rule.retryable, rule.meaning) for code, rule in ERROR_CODES.items()
    }
    # The socket protocol's codes are the declared socket codes, retryable as declared.
    assert {c.value for c in protocol.SocketErrorCode} == contract.SOCKET_CODES
    for code in protocol.SocketErrorCode:
        info = protocol.ErrorInfo.of(code, "m")
        assert info.retryable is ErrorCode(code.value).retryable is ERROR_CODES[code].retryable
    assert ErrorCode.INTERNAL.retryable is False


def test_the_jetstream_objects_are_built_from_the_declared_settings() -> None:
    tasks = layout.tasks_stream_config()
    rule = NATS.streams.tasks
    assert (tasks.name, tasks.subjects, tasks.max_age, tasks.duplicate_window) == (
        rule.name,
        [rule.subject_prefix + ">"],
        rule.max_age_s,
        rule.duplicate_window_s,
    )
    assert (tasks.retention, tasks.storage) == (rule.retention, rule.storage)
    dlq = layout.dlq_stream_config()
    assert (dlq.name, dlq.subjects, dlq.max_age, dlq.retention) == (
        NATS.streams.dlq.name,
        [NATS.streams.dlq.subject_prefix + ">"],
        NATS.streams.dlq.max_age_s,
        NATS.streams.dlq.retention,
    )
    consumer = layout.task_consumer_config("alpha")
    assert consumer.durable_name == NATS.task_consumer.name_prefix + "alpha"
    assert (consumer.ack_policy, consumer.ack_wait, consumer.max_deliver) == (
        NATS.task_consumer.ack_policy,
        NATS.task_consumer.ack_wait_s,
        NATS.task_consumer.max_deliver,
    )
    streams = NATS.streams
    for config, rule in (
        (layout.shadow_stream_config(), streams.shadow),
        (layout.samples_stream_config(), streams.samples),
        (layout.feedback_stream_config(), streams.feedback),
    ):
        assert (config.name, config.subjects, config.max_age, config.retention, config.storage) == (
            rule.name,
            [rule.subject_prefix + ">"],
            rule.max_age_s,
            rule.retention,
            rule.storage,
        )
        assert (config.discard, config.max_msgs_per_subject) == (
            rule.discard or "old",
            -1 if rule.max_msgs_per_subject is None else rule.max_msgs_per_subject,
        )
        assert (config.discard_new_per_subject, bool(config.allow_msg_ttl)) == (
            rule.discard_new_per_subject,
            rule.allow_msg_ttl,
        )
    # Sampled requests and feedback carry per-message TTLs; a shadow backlog is dropped.
    assert streams.samples.allow_msg_ttl and streams.feedback.allow_msg_ttl
    assert streams.shadow.max_msgs_per_subject and streams.shadow.storage == "memory"
    assert layout.shadow_key("alpha") == "alpha" + NATS.shadow_key_suffix
    assert layout.shadow_consumer_name("alpha") == NATS.shadow_consumer.name_prefix + "alpha"
    control = layout.production_consumer_config(
        layout.SAMPLES_CONSUMER, layout.SAMPLES_SUBJECT_PREFIX
    )
    rule_c = NATS.production_consumers
    assert (control.durable_name, control.ack_wait, control.max_ack_pending) == (
        rule_c.samples,
        rule_c.ack_wait_s,
        rule_c.max_ack_pending,
    )
    for bucket in (NATS.kv.placements, NATS.kv.workers, NATS.kv.leader, NATS.kv.directory):
        kv = layout.kv_config(bucket)
        assert (kv.bucket, kv.history, kv.ttl) == (bucket.bucket, bucket.history, bucket.ttl_s)
    assert NATS.reply_subject_prefix == layout.REPLY_SUBJECT_PREFIX


def test_no_python_module_writes_a_declared_header_or_subject_by_hand() -> None:
    """Headers, subjects and bucket names have one home; a literal copy is how they drifted."""
    literals = {
        *(f'"{h}"' for h in vars(HEADERS).values()),
        *(f'"{rule.subject_prefix}"' for rule in vars(NATS.streams).values()),
        *(f'"{rule.name}"' for rule in vars(NATS.streams).values()),
        f'"{NATS.reply_subject_prefix}"',
        f'"{NATS.task_consumer.name_prefix}"',
        f'"{NATS.shadow_consumer.name_prefix}"',
        f'"{NATS.shadow_key_suffix}"',
        f'"{NATS.production_consumers.samples}"',
        f'"{NATS.production_consumers.feedback}"',
    }
    found = []
    for package in ("serving", "taskfleet", "registry", "httpapi"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            found += [f"{path.relative_to(REPO)}: {lit}" for lit in literals if lit in text]
    assert not found, found


def _product_code(path: Path) -> str:
    """A Rust file without its tests (`#[cfg(test)]` onwards) and comments."""
    code = path.read_text().split("#[cfg(test)]")[0]
    return "\n".join(line.split("//")[0] for line in code.splitlines())


def test_no_sidecar_module_writes_a_declared_header_or_subject_by_hand() -> None:
    """The same rule for the Rust side: sidecar/src reads them from contract.rs."""
    literals = {
        *(f'"{h}"' for h in vars(HEADERS).values()),
        *(f'"{rule.subject_prefix}"' for rule in vars(NATS.streams).values()),
        *(f'"{rule.name}"' for rule in vars(NATS.streams).values()),
        f'"{NATS.task_consumer.name_prefix}"',
        f'"{NATS.shadow_consumer.name_prefix}"',
        f'"{NATS.shadow_key_suffix}"',
    }
    found = []
    for path in (REPO / "sidecar" / "src").rglob("*.rs"):
        if path.name.endswith("_test.rs"):
            continue
        code = _product_code(path)
        found += [f"{path.relative_to(REPO)}: {lit}" for lit in literals if lit in code]
    assert not found, found


@cache
def _sidecar_reading() -> dict[str, Any]:
    """What the real sidecar binary read from the file and builds from it."""
    binary = find_sidecar_binary()
    done = subprocess.run(
        [str(binary), "--print-contract"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    reading: dict[str, Any] = json.loads(done.stdout)
    return reading


def _plain(value: Any) -> Any:
    """A nats-py value as JSON writes it (enums by their value)."""
    return value.value if isinstance(value, Enum) else value


def test_the_sidecar_reads_the_declared_file_as_python_does() -> None:
    """Both languages load the one file; a key either side reads differently (a type, a
    default, a name) shows up here."""
    python = json.loads(json.dumps(dataclasses.asdict(contract.DECLARED)))
    assert _sidecar_reading()["contract"] == python


def test_up_waits_for_runtimes_as_long_as_the_sidecar_does() -> None:
    """`taskfleet up` says it is ready after every runtime is up, or after the time a sidecar
    gives its runtime to start: the flag's default is the declared value, as is up's wait."""
    binary = find_sidecar_binary()
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    flag = done.stdout[done.stdout.index("--runtime-start-timeout-ms") :]
    default = re.search(r"\[default: (\d+)\]", flag.split("\n  -", 1)[0])
    assert default, flag[:400]
    declared_s = contract.WORKER.runtime_start_timeout_s
    assert int(default[1]) == round(declared_s * 1000)
    assert declared_s == stack.RUNTIMES_UP_TIMEOUT_S  # what `up` waits


def test_the_sidecar_builds_the_jetstream_objects_python_builds() -> None:
    """The configurations each side sends the server, in the JetStream API's units
    (nanoseconds); a key the sidecar leaves at its zero default is written by neither."""
    rust = _sidecar_reading()
    keys = ("name", "subjects", "retention", "storage", "max_age", "duplicate_window")
    keys += ("discard", "max_msgs_per_subject", "discard_new_per_subject")
    for name, config in (
        ("tasks_stream", layout.tasks_stream_config()),
        ("dlq_stream", layout.dlq_stream_config()),
        ("shadow_stream", layout.shadow_stream_config()),
    ):
        python = config.as_dict()
        assert {k: rust[name].get(k, 0) for k in keys} == {
            k: _plain(python.get(k, 0)) for k in keys
        }, name
    consumer = layout.task_consumer_config("alpha").as_dict()
    keys = ("durable_name", "filter_subject", "ack_policy", "ack_wait", "max_deliver")
    assert {k: rust["task_consumer_alpha"][k] for k in keys} == {
        k: _plain(consumer[k]) for k in keys
    }
    # The shadow's consumer: Python never creates it; what the sidecar does is the declaration.
    shadow = rust["shadow_consumer_alpha"]
    rule = NATS.shadow_consumer
    assert (shadow["durable_name"], shadow["filter_subject"], shadow["max_deliver"]) == (
        layout.shadow_consumer_name("alpha"),
        layout.shadow_subject("alpha"),
        rule.max_deliver,
    )
    assert (shadow["ack_policy"], shadow["ack_wait"]) == (
        rule.ack_policy,
        round(rule.ack_wait_s * 1e9),
    )
    for bucket in ("placements", "workers"):
        kv = layout.kv_config(getattr(NATS.kv, bucket))
        assert rust["kv"][bucket] == {
            "bucket": kv.bucket,
            "history": kv.history,
            "max_age": round((kv.ttl or 0) * 1e9),
        }
    payloads = NATS.object_stores.payloads
    assert (rust["payloads"]["bucket"], rust["payloads"]["max_age"]) == (
        payloads.bucket,
        round((payloads.ttl_s or 0) * 1e9),
    )


def test_the_sidecar_answers_with_declared_codes_retryable_as_declared() -> None:
    """INTERNAL was retryable in sidecar/src/error.rs and not in httpapi/errors.py."""
    emitted = _sidecar_reading()["codes"]
    assert set(emitted) <= set(ERROR_CODES)
    assert {c: e["retryable"] for c, e in emitted.items()} == {
        c: ERROR_CODES[c].retryable for c in emitted
    }
    assert emitted["INTERNAL"]["retryable"] is False
    # The codes its runtimes answer with on the socket are Python's socket codes.
    socket = {c for c, e in emitted.items() if e["socket"]}
    assert socket == contract.SOCKET_CODES == {c.value for c in protocol.SocketErrorCode}


def test_the_sidecar_applies_the_registrys_task_name_rule() -> None:
    """The sidecar accepted any case and any length ("German-legal", 129 characters)."""
    names = _sidecar_reading()["task_names"]
    assert names["allowed"] == {
        n: TASK_NAME.allows(n) for n in (*TASK_NAME.examples_valid, *TASK_NAME.examples_invalid)
    }
    assert names["rule"] == TASK_NAME.describe()


def _declared_with(old: str, new: str) -> str:
    text = contract.declared_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("max_deliver = 5", "max_deliver = 5\nmax_delivery = 5", "unknown key.*max_delivery"),
        ("max_deliver = 5", "", "lacks 'max_deliver'"),
        ("max_deliver = 5", 'max_deliver = "5"', "max_deliver must be int"),
        ("history = 5", "history = true", "history must be int"),
        ('msg_id = "Nats-Msg-Id"', "", "lacks 'msg_id'"),
        ("[headers]", "[header]", "sections"),
    ],
)
def test_a_file_that_does_not_hold_the_expected_is_refused_whole(
    old: str, new: str, says: str
) -> None:
    with pytest.raises(ContractError, match=says):
        contract.read(_declared_with(old, new))


def test_docs_name_the_declared_file() -> None:
    for doc in ("architecture.md", "protocol.md"):
        assert "contract/shared.toml" in (REPO / "docs" / doc).read_text(), doc
    assert re.search(r"COPY contract contract", (REPO / "deploy/docker/Dockerfile").read_text())
