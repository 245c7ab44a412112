"""`taskfleet artifacts gc`: the artifact source keeps what candidates use and loses the rest
(real nats-server of its own, since gc empties what nothing references; real registry)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import nats

from registry import Registry
from serving.artifact_source import (
    NatsBucket,
    build_manifest,
    collect_garbage,
    file_object,
    manifest_object,
    upload,
)
from serving.nats_layout import ensure_layout
from testbed.declared_tasks import add_task
from testbed.tiny_model import build_tiny_model
from tests.nats_fixture import running_nats
from tests.test_cli_fleet import run_cli


async def _with_bucket(url: str, action):  # type: ignore[no-untyped-def]
    nc = await nats.connect(servers=[url])
    try:
        return await action(NatsBucket((await ensure_layout(nc.jetstream())).artifacts))
    finally:
        await nc.close()


def test_gc_removes_what_no_candidate_uses_and_keeps_shared_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    used = build_tiny_model(tmp_path / "used", seed=1)
    orphan = build_tiny_model(tmp_path / "orphan", seed=2)  # same config/tokenizer, new weights
    add_task(reg, "legal", suite="s")
    reg.add_model("used", path=used)
    reg.add_model("orphan", path=orphan)  # registered, but no candidate uses it
    reg.add_candidate("legal", base="used")
    used_sha, orphan_sha = reg.get_model("used").sha256, reg.get_model("orphan").sha256
    assert reg.artifact_digests() == {used_sha}
    reg.close()

    with running_nats(tmp_path / "nats") as server:

        async def scenario(bucket: NatsBucket) -> None:
            await upload(bucket, used, used_sha)
            await upload(bucket, orphan, orphan_sha)
            before = await bucket.list_objects()
            # Young objects stay: an upload may be in flight.
            young = await collect_garbage(bucket, {used_sha})
            assert young.manifests == [] and young.files == [] and young.too_young > 0
            dry = await collect_garbage(bucket, {used_sha}, min_age=timedelta(0), dry_run=True)
            assert dry.manifests == [manifest_object(orphan_sha)] and dry.files
            assert await bucket.list_objects() == before, "a dry run removed something"

            done = await collect_garbage(bucket, {used_sha}, min_age=timedelta(0))
            after = await bucket.list_objects()
            assert done.kept == [used_sha] and set(after) == set(before) - {
                *done.manifests,
                *done.files,
            }
            assert manifest_object(orphan_sha) not in after
            # Files the orphan shared with the kept model (config, tokenizer) stay; the kept
            # model is whole: uploading it again sends nothing.
            used_files = {file_object(f.sha256) for f in build_manifest(used, used_sha).files}
            orphan_files = {file_object(f.sha256) for f in build_manifest(orphan, orphan_sha).files}
            assert used_files & orphan_files, "the two tiny models should share files"
            assert set(done.files) == orphan_files - used_files
            assert used_files <= set(after)
            assert (await upload(bucket, used, used_sha)).files_sent == 0
            # The orphan comes back whole when a candidate needs it again.
            assert (await upload(bucket, orphan, orphan_sha)).files_sent == len(done.files)

        asyncio.run(_with_bucket(server.url, scenario))

        # The CLI: a dry run says what it would remove and removes nothing.
        r = run_cli(home, "artifacts", "gc", "--dry-run", "--min-age-min", "0", nats_url=server.url)
        assert r.returncode == 0, r.stderr
        assert "kept 1 artifact(s)" in r.stdout and "would remove 1 artifact(s)" in r.stdout
        r = run_cli(home, "artifacts", "gc", "--min-age-min", "0", nats_url=server.url)
        assert r.returncode == 0 and "removed 1 artifact(s)" in r.stdout, r.stdout + r.stderr
        r = run_cli(home, "artifacts", "gc", "--min-age-min", "0", nats_url=server.url)
        assert "removed 0 artifact(s) and 0 file(s)" in r.stdout, r.stdout + r.stderr


def test_gc_without_nats_is_a_clear_error(tmp_path: Path) -> None:
    from serving.embedded_nats import free_port

    home = tmp_path / "home"
    Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts").close()
    r = run_cli(home, "artifacts", "gc", nats_url=f"nats://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "error:" in r.stderr
