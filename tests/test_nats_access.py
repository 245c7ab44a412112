"""Every role reaches NATS through the same options: URL lists, user/password, TLS.

A real nats-server that requires TLS with a client certificate *and* a user/password: the
control loops lead, the gateway becomes ready, and a real sidecar (with its runtime) heartbeats
through it; without the password nobody gets in. Credentials files (JWT + nkey) are passed
through the same way (`--nats-creds`) but need an operator-mode server, not set up here.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from serving import nats_layout
from serving.connection import NatsOptions, NatsOptionsError, connect_once, redact
from serving.control import STATUS_LEADER, ControlLoops
from serving.embedded_nats import EmbeddedNats
from serving.gateway import GatewaySettings, create_gateway
from taskfleet.stack import SidecarProcess, find_sidecar_binary
from testbed.fleet import HTTP_TIMEOUT_S
from tests.gateway_fixture import BackgroundLoop, open_registry, serve_app, wait_ready
from tests.nats_fixture import nats_available


def test_url_lists_and_options_are_checked(tmp_path: Path) -> None:
    options = NatsOptions.parse("nats://a:4222, tls://b:4222,,nats://u:secret@c:4222")
    assert options.servers == ("nats://a:4222", "tls://b:4222", "nats://u:secret@c:4222")
    assert options.tls and str(options) == "nats://a:4222,tls://b:4222,nats://u:***@c:4222"
    assert options.connect_kwargs()["servers"] == list(options.servers)
    assert NatsOptions.parse(["nats://a:1", "nats://b:2"]).url == "nats://a:1,nats://b:2"
    assert redact("nats://x:4222") == "nats://x:4222"
    for bad, why in [
        ("", "no NATS server URL"),
        ("http://a:4222", "not a NATS URL"),
        ("a:4222", "not a NATS URL"),
    ]:
        with pytest.raises(NatsOptionsError, match=why):
            NatsOptions.parse(bad)
    with pytest.raises(NatsOptionsError, match="no such file"):
        NatsOptions.parse("nats://a:1", creds_file=tmp_path / "missing.creds")
    with pytest.raises(NatsOptionsError, match="needs both"):
        NatsOptions.parse("nats://a:1", tls_cert=__file__)
    with pytest.raises(NatsOptionsError, match="needs a user"):
        NatsOptions.parse("nats://a:1", password="p")
    sidecar = NatsOptions.parse("nats://a:1", user="u", password="p", tls_ca=__file__)
    assert "p" not in sidecar.sidecar_args()  # the password goes by environment
    assert sidecar.sidecar_env() == {"TASKFLEET_NATS_PASSWORD": "p"}
    assert sidecar.sidecar_args()[-1] == "--nats-tls"


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return key


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    signer: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = _write_key(folder / "ca-key.pem")
    ca = _certificate("taskfleet test CA", ca_key, None, ca_key, ca=True)
    pki = Pki(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server-key.pem",
        folder / "client.pem",
        folder / "client-key.pem",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for cert_path, key_path, subject, server in (
        (pki.server_cert, pki.server_key, "127.0.0.1", True),
        (pki.client_cert, pki.client_key, "taskfleet client", False),
    ):
        key = _write_key(key_path)
        cert = _certificate(subject, key, ca.subject, ca_key, server=server)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedNats, Pki]]:
    if not nats_available():
        pytest.skip("nats-server binary not installed")
    root = tmp_path_factory.mktemp("secured-nats")
    pki = make_pki(root / "pki")
    server = EmbeddedNats(
        root / "store",
        extra_args=[
            "--tls", "--tlscert", str(pki.server_cert), "--tlskey", str(pki.server_key),
            "--tlsverify", "--tlscacert", str(pki.ca),
            "--user", "fleet", "--pass", "s3cret",
        ],
    )  # fmt: skip
    server.start()
    try:
        yield server, pki
    finally:
        server.cleanup()


def _options(server: EmbeddedNats, pki: Pki, password: str = "s3cret") -> NatsOptions:
    return NatsOptions.parse(
        server.url,
        user="fleet",
        password=password,
        tls_ca=pki.ca,
        tls_cert=pki.client_cert,
        tls_key=pki.client_key,
    )


def test_only_the_right_credentials_get_in(secured: tuple[EmbeddedNats, Pki]) -> None:
    server, pki = secured

    async def attempt(options: NatsOptions | str) -> bool:
        try:
            nc = await connect_once(options, name="test")
        except ConnectionError:
            return False
        await nc.close()
        return True

    assert asyncio.run(attempt(_options(server, pki)))
    assert not asyncio.run(attempt(_options(server, pki, password="wrong")))
    assert not asyncio.run(attempt(server.url))  # neither TLS nor a user


def test_control_loops_gateway_and_sidecar_pass_credentials_and_tls(
    secured: tuple[EmbeddedNats, Pki], tmp_path: Path
) -> None:
    server, pki = secured
    options = _options(server, pki)
    registry = open_registry(tmp_path)
    loop = BackgroundLoop()
    loops = ControlLoops(registry, options)
    running = asyncio.run_coroutine_threadsafe(loops.run(), loop.loop)
    sidecar = SidecarProcess(
        binary=find_sidecar_binary(),
        nats_url=options,
        worker_id="tls-worker",
        run_dir=tmp_path / "run",
        extra_args=["--heartbeat-ms", "300"],
    )
    try:
        deadline = time.monotonic() + 30
        while loops.status != STATUS_LEADER:
            assert time.monotonic() < deadline, loops.describe()
            time.sleep(0.1)
        assert "s3cret" not in str(loops.describe())
        settings = GatewaySettings(require_auth=False, workers_refresh_s=0)
        with serve_app(create_gateway(options, settings)) as url:
            wait_ready(url)
            assert httpx.get(f"{url}/readyz", timeout=HTTP_TIMEOUT_S).json()["view"][
                "directory_published"
            ]
        sidecar.start()

        async def beats() -> set[str]:
            nc = await connect_once(options, name="test")
            try:
                return set(await nats_layout.kv_values(nc.jetstream(), "workers"))
            finally:
                await nc.close()

        deadline = time.monotonic() + 60
        while "tls-worker" not in loop.run(beats()):
            assert sidecar.running(), sidecar.log_tail()
            assert time.monotonic() < deadline, sidecar.log_tail()
            time.sleep(0.3)
    finally:
        sidecar.stop()
        loops.stop()
        running.result(timeout=30)
        loop.close()
        registry.close()
