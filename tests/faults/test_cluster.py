"""The fleet on a 3-node NATS cluster (`taskfleet up --nats-cluster 3` runs the same): every
stream, KV bucket and object store has 3 replicas, and a kill -9 of the node the gateway is
connected to, under a short counted stream, loses nothing, answers nothing twice and nothing
wrong; the node starts again and rejoins."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from serving import nats_layout
from testbed.faults import scenarios as sc
from testbed.faults.reference import Reference
from testbed.fleet import LocalFleet

SIDECAR_ARGS = ["--heartbeat-ms", "300", "--nak-delay-ms", "200", "--max-batch-wait-ms", "2"]
LOAD = sc.Load(calls=90, concurrency=12)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    root = tmp_path_factory.mktemp("cluster")
    with LocalFleet(root, workers=2, sidecar_args=SIDECAR_ARGS, nats_nodes=3) as built:
        yield built


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> Reference:
    ref = Reference(tiny_model_path)
    ref.prepare(LOAD.texts())
    return ref


async def _replicas(url: str) -> dict[str, int]:
    nc = await nats.connect(servers=url.split(","))
    try:
        js = nc.jetstream()
        names = [
            nats_layout.TASKS_STREAM,
            nats_layout.DLQ_STREAM,
            f"KV_{nats_layout.PLACEMENTS_BUCKET}",
            f"KV_{nats_layout.WORKERS_BUCKET}",
            f"KV_{nats_layout.LEADER_BUCKET}",
            f"KV_{nats_layout.DIRECTORY_BUCKET}",
            f"OBJ_{nats_layout.PAYLOADS_BUCKET}",
        ]
        return {n: (await js.stream_info(n)).config.num_replicas or 1 for n in names}
    finally:
        await nc.close()


def test_the_layout_is_replicated_on_three_nodes(fleet: LocalFleet) -> None:
    assert fleet.nats is not None
    replicas = asyncio.run(_replicas(fleet.nats.url))
    assert set(replicas.values()) == {3}, replicas


def test_kill_a_nats_node_under_load(
    fleet: LocalFleet, tiny_model_path: Path, reference: Reference
) -> None:
    task = sc.serve(fleet, tiny_model_path)
    run = sc.kill_nats_node_under_load(fleet, task, reference, LOAD)
    row = run.row()
    print(row)
    problems = run.tally.problems()
    assert not problems, (problems, row)
    assert run.tally.answered == LOAD.calls, row


def test_a_sidecar_that_starts_first_creates_its_buckets_at_r3(tmp_path: Path) -> None:
    """The Rust side counts the cluster's nodes as the Python side does."""
    from serving.embedded_nats import EmbeddedNatsCluster
    from taskfleet.stack import SidecarProcess, find_sidecar_binary
    from testbed.fleet import wait_until

    cluster = EmbeddedNatsCluster(tmp_path / "nats", 3).start()
    sidecar = SidecarProcess(
        binary=find_sidecar_binary(),
        nats_url=cluster.url,
        worker_id="first",
        run_dir=tmp_path / "run",
        extra_args=["--heartbeat-ms", "300"],
    )
    try:
        sidecar.start()

        # A cluster that has just started answers JetStream requests only once it has elected
        # its meta leader, later under load: until then a request times out or is refused,
        # which is "not yet" here as a missing bucket is, not a failure.
        not_ready = (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.js.errors.ServiceUnavailableError,
        )

        async def buckets() -> dict[str, int]:
            nc = await nats.connect(servers=cluster.url.split(","))
            try:
                js = nc.jetstream()
                found = {}
                for name in ("KV_placements", "KV_workers"):
                    with contextlib.suppress(nats.js.errors.NotFoundError, *not_ready):
                        found[name] = (await js.stream_info(name)).config.num_replicas or 1
                return found
            finally:
                await nc.close()

        def both() -> dict[str, int] | None:
            found = asyncio.run(buckets())
            return found if len(found) == 2 else None

        made = wait_until(both, timeout_s=60)
        assert made == {"KV_placements": 3, "KV_workers": 3}, sidecar.log_tail()
    finally:
        sidecar.stop()
        cluster.stop()
