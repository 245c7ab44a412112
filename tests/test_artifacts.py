"""Artifacts travel by content: the control plane uploads a placement's base model and adapter
into the NATS object store `artifacts` before publishing it; a worker with its own cache fetches
them, verifies every file and the folder's sha256, reuses its cache across restarts, and never
loads bytes that do not hash to the placement's digest (real nats-server, sidecar, runtime)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import nats

from serving.artifact_source import build_manifest, file_object, manifest_object, upload
from serving.nats_layout import ensure_layout
from testbed.fleet import COLD_START_S, LocalFleet, register_served_task, unique_task, wait_until
from testbed.tiny_model import build_tiny_adapter, build_tiny_model

TEXTS = ["Der Mieter kündigt.", "Wer haftet?"]


def _call(fleet: LocalFleet, task: str) -> httpx.Response:
    return httpx.post(
        f"{fleet.gateway_url}/v1/tasks/{task}",
        json={"inputs": TEXTS},
        headers={"X-Taskfleet-Timeout-Ms": "20000"},
        timeout=30,
    )


async def _with_store(url: str, action):  # type: ignore[no-untyped-def]
    nc = await nats.connect(servers=url.split(","))
    try:
        return await action((await ensure_layout(nc.jetstream())).artifacts)
    finally:
        await nc.close()


def _store(fleet: LocalFleet, action):  # type: ignore[no-untyped-def]
    assert fleet.nats is not None
    return asyncio.run(_with_store(fleet.nats.url, action))


def test_worker_fetches_verifies_and_reuses_its_cache(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=3)
    adapter_dir = build_tiny_adapter(model, tmp_path / "adapter")
    fleet = LocalFleet(tmp_path / "fleet", workers=1, separate_caches=True).start()
    try:
        task = unique_task("art")
        placement = register_served_task(
            fleet.reg, task, model, adapter_dir=adapter_dir, pinned=True
        )
        base = fleet.reg.get_model(f"m-{task}")
        adapter = fleet.reg.get_adapter(f"a-{task}")
        fleet.serving(task, placement.epoch)
        first = _call(fleet, task)
        assert first.status_code == 200, first.text
        cache = tmp_path / "fleet" / "cache0" / "sha256"
        assert sorted(d.name for d in cache.iterdir()) == sorted([base.sha256, adapter.sha256])
        # What the worker holds is what the registry fingerprinted, file for file.
        assert build_manifest(cache / adapter.sha256, adapter.sha256).sha256 == adapter.sha256
        assert build_manifest(cache / base.sha256, base.sha256).sha256 == base.sha256
        sidecar = fleet.sidecars[0]
        log = sidecar.log_path.read_text()
        assert log.count("artifact fetched and verified") == 2, fleet.logs()

        # A cache file changed behind the worker's back: found on the next start, fetched
        # again, and the task serves the right bytes.
        weights = next(f for f in (cache / adapter.sha256).iterdir() if f.suffix == ".safetensors")
        weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
        sidecar.stop()
        sidecar.start()
        wait_until(lambda: _call(fleet, task).status_code == 200, timeout_s=COLD_START_S)
        log = sidecar.log_path.read_text()
        assert "does not hash to its name" in log, fleet.logs()
        assert log.count("artifact fetched and verified") == 3, fleet.logs()
        assert build_manifest(cache / adapter.sha256, adapter.sha256)

        # With the manifests gone from the object store, a restarted worker serves from its
        # cache alone: nothing is fetched again.
        async def delete_all(store):  # type: ignore[no-untyped-def]
            for sha in (base.sha256, adapter.sha256):
                await store.delete(manifest_object(sha))

        _store(fleet, delete_all)
        sidecar.stop()
        sidecar.start()
        wait_until(lambda: _call(fleet, task).status_code == 200, timeout_s=COLD_START_S)
        log = sidecar.log_path.read_text()
        assert log.count("artifact found in the cache and verified") >= 2, fleet.logs()
        assert log.count("artifact fetched and verified") == 3, fleet.logs()
    finally:
        fleet.stop()


def test_bytes_that_do_not_hash_to_the_placement_are_never_loaded(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=4)
    fleet = LocalFleet(tmp_path / "fleet", workers=1, separate_caches=True).start()
    try:
        task = unique_task("bad")
        fleet.reg.add_model("m-bad", path=model)
        sha = fleet.reg.get_model("m-bad").sha256
        manifest = build_manifest(model, sha)
        biggest = max(manifest.files, key=lambda f: f.size)

        async def tamper(store):  # type: ignore[no-untyped-def]
            # Upload the genuine folder, then swap one file's object for other bytes: the
            # publisher finds the manifest there and sends nothing again.
            await upload(store, model, sha)
            await store.put(file_object(biggest.sha256), b"\0" * biggest.size)

        _store(fleet, tamper)
        placement = register_served_task(fleet.reg, task, model, model_name="m-bad", pinned=True)
        wait_until(
            lambda: "hashing to" in fleet.sidecars[0].log_path.read_text(), timeout_s=COLD_START_S
        )
        # (the gateway learns from heartbeats that the worker took the task: NO_WORKER first)
        answer = wait_until(
            lambda: (a := _call(fleet, task)).status_code != 503 and a, timeout_s=30
        )
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "LOAD_FAILED"
        assert biggest.sha256 in answer.json()["error"]["message"]
        assert not (tmp_path / "fleet" / "cache0" / "sha256" / sha).exists()
        assert placement.epoch == 1
    finally:
        fleet.stop()


def test_a_placement_whose_weights_changed_is_not_published(tmp_path: Path) -> None:
    """The control plane uploads only a folder that still hashes to its registered digest;
    otherwise the placement stays unpublished (the outbox reports why), never half-served."""
    from registry import Registry
    from serving.embedded_nats import EmbeddedNats
    from serving.publisher import publish_pending

    model = build_tiny_model(tmp_path / "model", seed=5)
    server = EmbeddedNats(tmp_path / "nats").start()
    reg = Registry.open(f"sqlite:///{tmp_path / 'r.db'}", artifact_dir=tmp_path / "artifacts")
    try:
        task = unique_task("changed")
        register_served_task(reg, task, model, pinned=True)
        (model / "config.json").write_text((model / "config.json").read_text() + " ")

        async def scenario() -> tuple[list[tuple[str, int, str]], list[str]]:
            nc = await nats.connect(server.url)
            try:
                layout = await ensure_layout(nc.jetstream())
                result = await publish_pending(reg, layout.placements, layout.artifacts)
                return result.failed, [k async for k in _keys(layout.placements)]
            finally:
                await nc.close()

        failed, keys = asyncio.run(scenario())
        assert [(t, e) for t, e, _ in failed] == [(task, 1)]
        assert "changed since it was registered" in failed[0][2]
        assert task not in keys
        assert reg.unpublished_placements()[0].task == task
    finally:
        reg.close()
        server.cleanup()


async def _keys(kv):  # type: ignore[no-untyped-def]
    from nats.js.errors import NoKeysError

    try:
        for key in await kv.keys():
            yield key
    except NoKeysError:
        return
