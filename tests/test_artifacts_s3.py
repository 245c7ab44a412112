"""An S3-compatible bucket as the artifact source, against moto's S3 server (authentication
on, so every request the sidecar signs is checked): the control plane uploads a placement's base
and adapter under ``s3://bucket/prefix`` before publishing it; a worker with an empty cache
fetches them from the bucket (nothing from the NATS object store), verifies them and serves; a
worker whose signature is wrong gets a clear LOAD_FAILED and loads nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.errors import NotFoundError

from serving.artifact_source import manifest_object
from serving.artifact_source_s3 import ArtifactSourceError, S3Location, check_source
from serving.embedded_nats import free_port
from serving.nats_layout import ensure_layout
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until
from testbed.tiny_model import build_tiny_adapter, build_tiny_model

boto3 = pytest.importorskip("boto3")
MOTO_SERVER = Path(sys.executable).with_name("moto_server")
BUCKET = "taskfleet-artifacts"
PREFIX = "fleet/a"
# Requests moto answers before it checks credentials: the set-up below (an IAM user with a
# policy and an access key, and the bucket). Every later request is authenticated.
SETUP_REQUESTS = 4


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key_id: str
    secret_access_key: str


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    if not MOTO_SERVER.exists():
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_REQUESTS)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"moto_server did not start: {log.read_text()}")
            time.sleep(0.2)
        setup = {
            "endpoint_url": endpoint,
            "region_name": "us-east-1",
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="taskfleet")
        iam.put_user_policy(
            UserName="taskfleet",
            PolicyName="artifacts",
            PolicyDocument='{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", '
            '"Action": "s3:*", "Resource": "*"}]}',
        )
        key = iam.create_access_key(UserName="taskfleet")["AccessKey"]
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The standard AWS variables, for the control plane (this process) and its sidecars."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_access_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return s3_server


def _call(fleet: LocalFleet, task: str) -> httpx.Response:
    return httpx.post(
        f"{fleet.gateway_url}/v1/tasks/{task}",
        json={"inputs": ["Der Mieter kündigt.", "Wer haftet?"]},
        headers={"X-Taskfleet-Timeout-Ms": "20000"},
        timeout=30,
    )


def _in_nats(fleet: LocalFleet, sha256: str) -> bool:
    async def look() -> bool:
        assert fleet.nats is not None
        nc = await nats.connect(servers=fleet.nats.url.split(","))
        try:
            store = (await ensure_layout(nc.jetstream())).artifacts
            try:
                await store.get_info(manifest_object(sha256))
            except NotFoundError:
                return False
            return True
        finally:
            await nc.close()

    return asyncio.run(look())


def test_a_worker_fetches_from_s3_verifies_and_serves(s3_env: S3Server, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model", seed=5)
    adapter_dir = build_tiny_adapter(model, tmp_path / "adapter")
    source = f"s3://{BUCKET}/{PREFIX}"
    fleet = LocalFleet(
        tmp_path / "fleet", workers=1, separate_caches=True, artifact_source=source
    ).start()
    try:
        task = unique_task("s3")
        placement = register_served_task(
            fleet.reg, task, model, adapter_dir=adapter_dir, pinned=True
        )
        base = fleet.reg.get_model(f"m-{task}")
        adapter = fleet.reg.get_adapter(f"a-{task}")
        fleet.serving(task, placement.epoch)
        response = _call(fleet, task)
        assert response.status_code == 200, response.text + fleet.logs()

        # Uploaded to the bucket under the prefix (manifests and files), not to NATS.
        s3 = boto3.client("s3")
        keys = {
            o["Key"]
            for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/").get("Contents", [])
        }
        for sha in (base.sha256, adapter.sha256):
            assert f"{PREFIX}/tree.{sha}" in keys
            assert not _in_nats(fleet, sha)
        assert any(k.startswith(f"{PREFIX}/file.") for k in keys)

        # The worker started with an empty cache: both came from S3, hashed and verified.
        cache = tmp_path / "fleet" / "cache0" / "sha256"
        assert sorted(d.name for d in cache.iterdir()) == sorted([base.sha256, adapter.sha256])
        log = fleet.sidecars[0].log_path.read_text()
        assert f"s3://{BUCKET}/{PREFIX}" in log, log
        assert log.count("artifact fetched and verified") == 2, fleet.logs()
    finally:
        fleet.stop()


def test_a_wrong_signature_is_refused_and_nothing_is_loaded(
    s3_env: S3Server, tmp_path: Path
) -> None:
    """moto checks every signature: a worker with the wrong secret fetches nothing, and the
    caller gets the LOAD_FAILED that names the bucket and S3's answer."""
    model = build_tiny_model(tmp_path / "model", seed=6)
    source = f"s3://{BUCKET}/{PREFIX}"
    fleet = LocalFleet(tmp_path / "fleet", workers=1, separate_caches=True, artifact_source=source)
    fleet.start()
    try:
        sidecar = fleet.sidecars[0]
        sidecar.stop()
        sidecar.env = {**sidecar.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        sidecar.start()
        task = unique_task("s3bad")
        register_served_task(fleet.reg, task, model, pinned=False)
        fleet.ready_for([task])

        def failed() -> httpx.Response | None:
            r = _call(fleet, task)
            return r if r.status_code >= 500 and "LOAD_FAILED" in r.text else None

        response = wait_until(failed, timeout_s=60, every_s=0.5)
        assert "403" in response.text and source in response.text, response.text
        assert "SignatureDoesNotMatch" in sidecar.log_path.read_text(), fleet.logs()
        cache = tmp_path / "fleet" / "cache0" / "sha256"
        assert not cache.exists() or not any(cache.iterdir())
    finally:
        fleet.stop()


def test_source_urls_and_missing_credentials_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert S3Location.parse("s3://my-bucket/a/b/") == S3Location("my-bucket", "a/b")
    assert S3Location.parse("s3://my-bucket").key("tree.x") == "tree.x"
    for bad in ("http://x/y", "s3://", "s3://Upper/x", "s3://ab"):
        with pytest.raises(ArtifactSourceError):
            S3Location.parse(bad)
    assert check_source(None) is None and check_source("nats") is None
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    with pytest.raises(ArtifactSourceError, match="AWS_ACCESS_KEY_ID"):
        check_source("s3://my-bucket/x")
