"""The one source of configuration: typed settings from `TASKFLEET_*` env vars.

CLI flags override these values; lower layers (registry, evals, serving) never read the
environment themselves, they receive what they need from the shell.

A plain dataclass, not pydantic-settings: every command reads its settings, and pydantic with
pydantic-settings took longer to import than a registry-only command takes to answer
(`tests/test_cli_imports.py`). Each field names its parser; a value the parser refuses is one
`SettingsError` line naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.connection import NatsOptions

ENV_PREFIX = "TASKFLEET_"


class SettingsError(ValueError):
    """A setting's value cannot be read (the message names the variable and the rule)."""


def _text(value: Any) -> str:
    return str(value)


def _path(value: Any) -> Path:
    return value if isinstance(value, Path) else Path(str(value))


def _positive_number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be a number") from None
    if not number > 0:  # also refuses NaN
        raise ValueError("must be above 0")
    return number


_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _about(description: str, parse: Callable[[Any], Any] = _text) -> dict[str, Any]:
    """A field's metadata: what it is for (help texts) and how its text is read."""
    return {"description": description, "parse": parse}


def _default_home() -> Path:
    return Path.home() / ".taskfleet"


@dataclass
class Settings:
    home: Path = field(default_factory=_default_home, metadata=_about("Data directory.", _path))
    database_url: str | None = field(
        default=None, metadata=_about("SQLAlchemy URL; default: SQLite file under home.")
    )
    artifact_dir: Path | None = field(
        default=None,
        metadata=_about("Content-addressed artifact store; default: home/artifacts.", _path),
    )
    mlflow_tracking_uri: str | None = field(
        default=None, metadata=_about("MLflow tracking URI; default: SQLite file under home.")
    )
    nats_url: str | None = field(
        default=None,
        metadata=_about(
            "Existing NATS server/cluster, URLs comma-separated; default: start an embedded one."
        ),
    )
    nats_user: str | None = field(default=None, metadata=_about("NATS user."))
    nats_password: str | None = field(default=None, metadata=_about("NATS password (env only)."))
    nats_creds: Path | None = field(default=None, metadata=_about("NATS credentials file.", _path))
    nats_tls_ca: Path | None = field(
        default=None, metadata=_about("CA to trust for NATS TLS.", _path)
    )
    nats_tls_cert: Path | None = field(
        default=None, metadata=_about("NATS TLS client certificate.", _path)
    )
    nats_tls_key: Path | None = field(default=None, metadata=_about("Its private key.", _path))
    actor: str | None = field(default=None, metadata=_about("Who is acting, for the audit log."))
    data_dir: Path | None = field(
        default=None,
        metadata=_about("Root of the eval suites' data; default: ../shared/data.", _path),
    )
    artifact_source: str | None = field(
        default=None,
        metadata=_about(
            "Where the control plane uploads models and adapters and workers fetch them: empty "
            "for the NATS object store `artifacts`, or an S3-compatible bucket s3://bucket/prefix "
            "(credentials and endpoint from the standard AWS_* variables)."
        ),
    )
    session_secret: str | None = field(
        default=None,
        metadata=_about("Signs dashboard session cookies; default: a secret kept under home."),
    )
    metrics_token: str | None = field(
        default=None,
        metadata=_about(
            "The bearer token a gateway's /metrics requires (Prometheus `authorization: "
            "{credentials: ...}`). Without one, /metrics answers only when the gateway runs "
            "without auth: its figures name every task and API key."
        ),
    )
    endpoint_probe_period_s: float = field(
        default=60.0,
        metadata=_about(
            "How often the leading control plane re-probes each endpoint model a candidate uses; "
            "a changed answer marks its pairings stale.",
            _positive_number,
        ),
    )
    secure_cookies: bool = field(
        default=False,
        metadata=_about(
            "Mark dashboard session cookies Secure (HTTPS only). Turn on whenever the dashboard "
            "is reached over HTTPS, directly or behind a proxy.",
            _flag,
        ),
    )
    forwarded_allow_ips: str | None = field(
        default=None,
        metadata=_about(
            "Proxies whose X-Forwarded-For/-Proto headers the HTTP servers believe: IP addresses "
            "or networks, comma-separated, or * for every peer; default none (the peer address "
            "is the client)."
        ),
    )
    allowed_hosts: str | None = field(
        default=None,
        metadata=_about(
            "Host header values the control plane answers to, comma-separated (*.example.com for "
            "subdomains, * for any); default: this machine's own names."
        ),
    )
    model_roots: str | None = field(
        default=None,
        metadata=_about(
            "Folders the control plane's REST API may register base models and adapters from, "
            "comma-separated; default none (REST registers models by package only; the CLI is "
            "not bound)."
        ),
    )

    @classmethod
    def load(
        cls, overrides: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """The settings from ``env`` (default: this process's environment; names are
        `TASKFLEET_` + the field's name, in any case), each overridden by a value in
        ``overrides`` that is not None (the CLI's flags)."""
        environ = os.environ if env is None else env
        found = {
            key.upper()[len(ENV_PREFIX) :]: value
            for key, value in environ.items()
            if key.upper().startswith(ENV_PREFIX)
        }
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in given:
                raw, source = given.pop(f.name), f"--{f.name.replace('_', '-')}"
            elif f.name.upper() in found:
                raw, source = found[f.name.upper()], ENV_PREFIX + f.name.upper()
            else:
                continue
            try:
                values[f.name] = f.metadata["parse"](raw)
            except ValueError as exc:
                raise SettingsError(f"{source}: {exc}, not {str(raw)!r}") from None
        if given:
            raise TypeError(f"unknown settings: {', '.join(sorted(given))}")
        return cls(**values)

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
