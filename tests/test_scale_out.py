"""Scale-out (issue 12, slice 2) on real parts: replicas chosen by rendezvous hashing over live
workers, epoch fencing after a promotion, and a seconds-long "three-machine" smoke (3 NATS
nodes, 2 gateways, 3 workers with their own caches: A -> B (with adapter) -> rollback under a
steady stream, no failure, epochs monotone, B's adapter fetched and verified)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.client import Client
from testbed.declared_tasks import add_task
from testbed.fleet import (
    HTTP_TIMEOUT_S,
    LocalFleet,
    register_served_task,
    register_test_adapter,
    stable,
    unique_task,
    wait_until,
)
from testbed.tiny_model import build_tiny_adapter, build_tiny_model

# The epoch-fencing test keeps the sidecar's own hand-back schedule (--nak-delay-ms 1000 by
# default: naks after 1, 2, 3 and 4 s, then a retryable EPOCH_BEHIND). With 200 ms the five
# deliveries spanned 2 s, less than the worker's switch to the newer model can take on two busy
# cores: a fresh clone's make test saw the last one answered EPOCH_BEHIND before the model loaded.
FENCE_SIDECAR_ARGS = [
    "--heartbeat-ms", "300",
    "--ack-wait-ms", "5000",
    "--max-batch-wait-ms", "2",
]  # fmt: skip
# The other tests nak sooner (a model still loading, a retryable failure): shorter runs.
SIDECAR_ARGS = [*FENCE_SIDECAR_ARGS, "--nak-delay-ms", "200"]


def holders(fleet: LocalFleet, task: str) -> list[str]:
    """Workers whose heartbeat lists the task (a task loop runs for it)."""
    beats = fleet.heartbeats()
    return sorted(w for w, b in beats.items() if task in b.queue_depth)


def batches_for(fleet: LocalFleet, index: int, task: str) -> int:
    text = fleet.sidecar_metrics(index)
    found = re.search(rf'taskfleet_sidecar_batches_total\{{task="{task}"\}} (\d+)', text)
    return int(found.group(1)) if found else 0


def test_replicas_two_of_three_and_a_dead_holder_is_replaced(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    with LocalFleet(tmp_path, workers=3, sidecar_args=SIDECAR_ARGS, separate_caches=True) as fleet:
        task = unique_task("rep")
        placement = register_served_task(fleet.reg, task, tiny_model_path, pinned=True, replicas=2)
        fleet.serving(task, placement.epoch, workers=2)
        held = stable(lambda: holders(fleet, task), 2.0)
        assert len(held) == 2, held
        ids = [s.worker_id for s in fleet.sidecars]
        third = next(i for i, w in enumerate(ids) if w not in held)
        with Client(fleet.gateway_url) as client:
            for i in range(30):
                client.embed(task, [f"Anfrage {i}"])
        per_worker = [batches_for(fleet, i, task) for i in range(3)]
        assert per_worker[third] == 0, per_worker
        assert sum(per_worker) >= 1
        # The third never loaded the model nor fetched its weights.
        assert not (tmp_path / f"cache{third}" / "sha256").exists() or not any(
            (tmp_path / f"cache{third}" / "sha256").iterdir()
        )

        # kill -9 one holder: within the heartbeat TTL the third takes its replica.
        victim = next(i for i, w in enumerate(ids) if w in held)
        fleet.sidecars[victim].kill()
        survivors = {ids[i] for i in range(3) if i != victim}
        started = time.monotonic()
        wait_until(lambda: set(holders(fleet, task)) == survivors, timeout_s=45)
        moved_s = time.monotonic() - started
        print(f"replica moved {moved_s:.1f} s after kill -9")
        with Client(fleet.gateway_url) as client:
            for i in range(10):
                client.embed(task, [f"danach {i}"])


def test_a_request_stamped_with_a_newer_epoch_waits_for_it(tmp_path: Path) -> None:
    """A caller that has seen the next epoch (through another gateway, say) waits at this
    gateway while the promotion reaches it (2 s at most: the gateway's `min_epoch_wait_s`,
    then 503 NOT_READY, retryable: tests/test_gateway_limits.py) and is answered from that
    epoch, never from the older one."""
    model_a = build_tiny_model(tmp_path / "a", seed=11)
    model_b = build_tiny_model(tmp_path / "b", seed=12)
    with LocalFleet(tmp_path / "fleet", workers=1, sidecar_args=FENCE_SIDECAR_ARGS) as fleet:
        reg = fleet.reg
        task = unique_task("fence")
        add_task(reg, task)
        reg.add_model("ma", path=model_a)
        reg.add_model("mb", path=model_b)
        reg.add_candidate(task, base="ma")
        reg.add_candidate(task, base="mb")
        first = reg.promote(task, "ma", override=True, reason="first", pinned=True)
        fleet.serving(task, first.epoch)
        answers: list[httpx.Response] = []
        not_yet: list[str] = []

        def call() -> None:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                response = httpx.post(
                    f"{fleet.gateway_url}/v1/tasks/{task}",
                    json={"inputs": ["x"]},
                    headers={
                        "X-Taskfleet-Min-Epoch": str(first.epoch + 1),
                        "X-Taskfleet-Timeout-Ms": "30000",
                    },
                    timeout=40,
                )
                if response.status_code == 503:  # the epoch has not reached the gateway yet
                    not_yet.append(response.json()["error"]["code"])
                    time.sleep(float(response.headers["Retry-After"]))
                    continue
                answers.append(response)
                return

        caller = threading.Thread(target=call)
        caller.start()
        caller.join(timeout=0.5)
        assert not answers, "answered from an epoch older than the caller had seen"
        second = reg.promote(task, "mb", override=True, reason="newer", pinned=True)
        caller.join(timeout=35)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        assert int(answers[0].headers["X-Taskfleet-Epoch"]) == second.epoch
        assert set(not_yet) <= {"NOT_READY"}, not_yet
        # A plain request after that is stamped by the gateway itself (it has answered from
        # epoch 2): never epoch 1 again.
        answer = httpx.post(
            f"{fleet.gateway_url}/v1/tasks/{task}", json={"inputs": ["y"]}, timeout=HTTP_TIMEOUT_S
        )
        assert int(answer.headers["X-Taskfleet-Epoch"]) == second.epoch
        bad = httpx.post(
            f"{fleet.gateway_url}/v1/tasks/{task}",
            json={"inputs": ["y"]},
            headers={"X-Taskfleet-Min-Epoch": "soon"},
            timeout=HTTP_TIMEOUT_S,
        )
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "BAD_REQUEST"


@pytest.mark.timeout(300)
def test_smoke_of_three_machines(tmp_path: Path) -> None:
    """3 clustered NATS nodes, 2 gateways, 3 workers each with its own cache (no shared
    files: weights come from the object store), replicas 2: promote A -> B (an adapter) ->
    rollback while one client per gateway sends a steady stream."""
    model_a = build_tiny_model(tmp_path / "a", seed=21)
    model_b = build_tiny_model(tmp_path / "b", seed=22)
    adapter_b = build_tiny_adapter(model_b, tmp_path / "adapter-b")
    fleet = LocalFleet(
        tmp_path / "fleet",
        workers=3,
        sidecar_args=SIDECAR_ARGS,
        separate_caches=True,
        nats_nodes=3,
        gateways=2,
    ).start()
    stop = threading.Event()
    seen: list[list[int]] = [[], []]
    failures: list[str] = []

    def stream(index: int) -> None:
        # One client per gateway; each client alternates gateways too, so epochs it has seen
        # travel with it (X-Taskfleet-Min-Epoch) from one gateway to the other.
        urls = fleet.gateway_urls[index:] + fleet.gateway_urls[:index]
        clients = [Client(u, timeout_s=30) for u in urls]
        epochs: dict[str, int] = {}
        for c in clients:
            c._epochs = epochs  # one caller, two gateways: one memory of what it has seen
        n = 0
        while not stop.is_set():
            try:
                got = clients[n % 2].embed_with_info(task, [f"Text {index} {n}"])
                seen[index].append(got.epoch)
            except Exception as exc:  # every failure is a finding
                failures.append(f"{type(exc).__name__}: {exc}")
            n += 1
        for c in clients:
            c.close()

    try:
        reg = fleet.reg
        task = unique_task("three")
        add_task(reg, task)
        reg.add_model("ma", path=model_a)
        reg.add_model("mb", path=model_b)
        register_test_adapter(reg, "lora-b", "mb", adapter_b)
        reg.add_candidate(task, base="ma")
        cand_b = reg.add_candidate(task, base="mb", adapter="lora-b")
        first = reg.promote(task, "ma", override=True, reason="A", pinned=True, replicas=2)
        fleet.serving(task, first.epoch, workers=2)
        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in (0, 1)]
        for t in threads:
            t.start()
        wait_until(lambda: all(len(s) >= 5 for s in seen), timeout_s=60)
        second = reg.promote(task, cand_b.name, override=True, reason="B", pinned=True)
        wait_until(lambda: all(s.count(second.epoch) >= 5 for s in seen), timeout_s=90)
        third = reg.rollback(task, reason="back to A")
        wait_until(lambda: all(s.count(third.epoch) >= 5 for s in seen), timeout_s=90)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert failures == [], failures[:5]
        for s in seen:
            assert s == sorted(s), f"epoch went back: {s}"
            assert {first.epoch, second.epoch, third.epoch} <= set(s)
        # B's adapter reached the workers that hold B only through the object store, verified.
        adapter_sha = reg.get_adapter("lora-b").sha256
        fetched = [
            i
            for i in range(3)
            if (tmp_path / "fleet" / f"cache{i}" / "sha256" / adapter_sha).is_dir()
        ]
        assert len(fetched) >= 2, fleet.logs()
        for i in fetched:
            log = fleet.sidecars[i].log_path.read_text()
            line = next(x for x in log.splitlines() if adapter_sha in x and "verified" in x)
            assert "artifact fetched and verified" in line
        counts = [len(s) for s in seen]
        print(f"three-machine smoke: {counts} replies, epochs {sorted(set(seen[0]))}")
    finally:
        stop.set()
        fleet.stop()
