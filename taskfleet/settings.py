"""The one source of configuration: typed settings from `TASKFLEET_*` env vars.

CLI flags override these values; lower layers (registry, evals, serving) never read the
environment themselves, they receive what they need from the shell.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from serving.connection import NatsOptions


def _default_home() -> Path:
    return Path.home() / ".taskfleet"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TASKFLEET_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="Data directory.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: SQLite file under home."
    )
    artifact_dir: Path | None = Field(
        default=None, description="Content-addressed artifact store; default: home/artifacts."
    )
    mlflow_tracking_uri: str | None = Field(
        default=None, description="MLflow tracking URI; default: SQLite file under home."
    )
    nats_url: str | None = Field(
        default=None,
        description="Existing NATS server/cluster, URLs comma-separated; default: start an "
        "embedded one.",
    )
    nats_user: str | None = Field(default=None, description="NATS user.")
    nats_password: str | None = Field(default=None, description="NATS password (env only).")
    nats_creds: Path | None = Field(default=None, description="NATS credentials file.")
    nats_tls_ca: Path | None = Field(default=None, description="CA to trust for NATS TLS.")
    nats_tls_cert: Path | None = Field(default=None, description="NATS TLS client certificate.")
    nats_tls_key: Path | None = Field(default=None, description="Its private key.")
    actor: str | None = Field(default=None, description="Who is acting, for the audit log.")
    data_dir: Path | None = Field(
        default=None, description="Root of the eval suites' data; default: ../shared/data."
    )
    artifact_source: str | None = Field(
        default=None,
        description="Where the control plane uploads models and adapters and workers fetch "
        "them: empty for the NATS object store `artifacts`, or an S3-compatible bucket "
        "s3://bucket/prefix (credentials and endpoint from the standard AWS_* variables).",
    )
    session_secret: str | None = Field(
        default=None,
        description="Signs dashboard session cookies; default: a secret kept under home.",
    )
    metrics_token: str | None = Field(
        default=None,
        description="The bearer token a gateway's /metrics requires (Prometheus "
        "`authorization: {credentials: ...}`). Without one, /metrics answers only when the "
        "gateway runs without auth: its figures name every task and API key.",
    )
    endpoint_probe_period_s: float = Field(
        default=60.0,
        gt=0,
        description="How often the leading control plane re-probes each endpoint model a "
        "candidate uses; a changed answer marks its pairings stale.",
    )
    secure_cookies: bool = Field(
        default=False,
        description="Mark dashboard session cookies Secure (HTTPS only). Turn on whenever the "
        "dashboard is reached over HTTPS, directly or behind a proxy.",
    )

    forwarded_allow_ips: str | None = Field(
        default=None,
        description="Proxies whose X-Forwarded-For/-Proto headers the HTTP servers believe: "
        "IP addresses or networks, comma-separated, or * for every peer; default none (the "
        "peer address is the client).",
    )
    allowed_hosts: str | None = Field(
        default=None,
        description="Host header values the control plane answers to, comma-separated "
        "(*.example.com for subdomains, * for any); default: this machine's own names.",
    )
    model_roots: str | None = Field(
        default=None,
        description="Folders the control plane's REST API may register base models and "
        "adapters from, comma-separated; default none (REST registers models by package only; "
        "the CLI is not bound).",
    )

    @cached_property
    def resolved_home(self) -> Path:
        return self.home.expanduser()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_home / 'registry.db'}"

    @property
    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or self.resolved_home / "artifacts").expanduser()

    @property
    def resolved_mlflow_uri(self) -> str:
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return f"sqlite:///{self.resolved_home / 'mlflow.db'}"

    @property
    def cache_dir(self) -> Path:
        return self.resolved_home / "cache"

    def nats_options(self, url: str | None = None) -> NatsOptions | None:
        """How to reach NATS: ``url`` (else TASKFLEET_NATS_URL) with the credentials and TLS
        settings; None when no URL is known."""
        from serving.connection import NatsOptions

        url = url or self.nats_url
        if not url:
            return None
        return NatsOptions.parse(
            url,
            user=self.nats_user,
            password=self.nats_password,
            creds_file=self.nats_creds,
            tls_ca=self.nats_tls_ca,
            tls_cert=self.nats_tls_cert,
            tls_key=self.nats_tls_key,
        )

    def resolved_model_roots(self, flags: list[Path] | None = None) -> list[Path]:
        """`--model-root` flags, else TASKFLEET_MODEL_ROOTS."""
        if flags:
            return list(flags)
        return [Path(p.strip()) for p in (self.model_roots or "").split(",") if p.strip()]

    def resolved_session_secret(self) -> str:
        """A stable secret so dashboard sessions survive a restart of the control plane."""
        if self.session_secret:
            return self.session_secret
        path = self.resolved_home / "session-secret"
        if not path.is_file():
            import secrets

            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_text(secrets.token_urlsafe(32))
        return path.read_text().strip()

    def resolved_actor(self) -> str:
        if self.actor:
            return self.actor
        import getpass

        try:
            return f"cli:{getpass.getuser()}"
        except Exception:  # no user name in some containers
            return "cli:unknown"


def get_settings() -> Settings:
    return Settings()
