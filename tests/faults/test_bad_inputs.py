"""Every bad request of the catalogue (tests/faults/bad_inputs.py) gets the status and code
docs/protocol.md promises, in the one error shape; none is a 500 and none reaches the queue."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from serving.gateway import GatewaySettings
from testbed.faults.bad_inputs import catalogue, send_all, total
from tests.gateway_fixture import Stack, nats_and_gateway


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = GatewaySettings(require_auth=False, default_timeout_s=10, workers_refresh_s=0)
    with nats_and_gateway(tmp_path_factory, settings) as built:
        yield built


def test_every_bad_input_is_answered_as_documented(stack: Stack) -> None:
    task = stack.task()
    peer = stack.responder(task)  # a request that wrongly got through would be answered 200
    try:
        cases = catalogue()
        with httpx.Client(timeout=30) as http:
            counts = send_all(http, stack.url, task, cases)
        assert len(cases) >= 80
        mismatches = {f: c.mismatches for f, c in counts.items() if c.mismatches}
        assert not mismatches, mismatches
        assert total(counts)["internal_errors"] == 0
        assert peer.seen_payloads == [], "a bad request reached the queue"
    finally:
        stack.loop.run(peer.stop())
