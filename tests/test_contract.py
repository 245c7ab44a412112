"""contract/shared.toml: the one declared file of rules Python and the sidecar share, and what
the Python roles build from it (the task-name rule of registry and fleet, the JetStream objects,
the headers, the error codes with their retryability)."""

from __future__ import annotations

import re

import pytest

import contract
from contract import ERROR_CODES, HEADERS, NATS, TASK_NAME, ContractError
from httpapi.errors import CODES, ErrorCode
from registry.errors import InvalidInput
from registry.kinds import check_name
from serving import nats_layout as layout
from serving import protocol
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
    for bucket in (NATS.kv.placements, NATS.kv.workers, NATS.kv.leader, NATS.kv.directory):
        kv = layout.kv_config(bucket)
        assert (kv.bucket, kv.history, kv.ttl) == (bucket.bucket, bucket.history, bucket.ttl_s)
    assert NATS.reply_subject_prefix == layout.REPLY_SUBJECT_PREFIX


def test_no_python_module_writes_a_declared_header_or_subject_by_hand() -> None:
    """Headers, subjects and bucket names have one home; a literal copy is how they drifted."""
    literals = {
        *(f'"{h}"' for h in vars(HEADERS).values()),
        f'"{NATS.streams.tasks.subject_prefix}"',
        f'"{NATS.streams.dlq.subject_prefix}"',
        f'"{NATS.reply_subject_prefix}"',
        f'"{NATS.task_consumer.name_prefix}"',
    }
    found = []
    for package in ("serving", "taskfleet", "registry", "httpapi"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            found += [f"{path.relative_to(REPO)}: {lit}" for lit in literals if lit in text]
    assert not found, found


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
