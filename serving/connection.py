"""NATS connections: where and how (:class:`NatsOptions`), and how long to keep trying.

Every role reaches NATS the same way: one or more server URLs (the nodes of a cluster; clients
also learn the other nodes from the server), optionally a user and password or a credentials
file (JWT + nkey), and TLS (a CA to trust, a client certificate). A plain URL string is
accepted wherever options are.

The long-running control loops must outlive NATS outages: the first connect keeps trying until
the server is up, and an established connection reconnects forever. Short-lived tools
(`taskfleet placement set`) use :func:`connect_once` instead, which fails fast so the user
hears at once that NATS is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

log = logging.getLogger("taskfleet.nats")

SCHEMES = ("nats", "tls", "ws", "wss")


class NatsOptionsError(ValueError):
    """A NATS URL list or option that cannot be used (bad scheme, missing file)."""


@dataclass(frozen=True)
class NatsOptions:
    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    creds_file: Path | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @classmethod
    def parse(
        cls,
        urls: str | Sequence[str],
        *,
        user: str | None = None,
        password: str | None = None,
        creds_file: Path | str | None = None,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
    ) -> NatsOptions:
        """``urls``: one URL, a comma-separated list, or a sequence of them."""
        parts = [urls] if isinstance(urls, str) else list(urls)
        servers = tuple(u.strip() for part in parts for u in part.split(",") if u.strip())
        if not servers:
            raise NatsOptionsError("no NATS server URL given")
        for url in servers:
            scheme = urlsplit(url).scheme
            if scheme not in SCHEMES or not urlsplit(url).hostname:
                raise NatsOptionsError(
                    f"{redact(url)!r} is not a NATS URL (want e.g. nats://host:4222; schemes "
                    f"{', '.join(SCHEMES)})"
                )
        made = cls(
            servers,
            user=user,
            password=password,
            creds_file=_path(creds_file),
            tls_ca=_path(tls_ca),
            tls_cert=_path(tls_cert),
            tls_key=_path(tls_key),
        )
        made.check()
        return made

    def check(self) -> None:
        for name in _PATHS:
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                flag = "--nats-" + name.replace("_file", "").replace("_", "-")
                raise NatsOptionsError(f"{flag}: no such file {str(path)!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise NatsOptionsError("a TLS client certificate needs both --nats-tls-cert and key")
        if self.password is not None and self.user is None:
            raise NatsOptionsError("a NATS password needs a user (--nats-user)")
        if self.creds_file is not None and self.user is not None:
            raise NatsOptionsError("give a NATS user/password or a credentials file, not both")

    @property
    def url(self) -> str:
        """The servers as one comma-separated string (credentials in URLs kept)."""
        return ",".join(self.servers)

    def __str__(self) -> str:
        """For messages and logs: the servers without any password."""
        return ",".join(redact(u) for u in self.servers)

    @property
    def tls(self) -> bool:
        return (
            self.tls_ca is not None
            or self.tls_cert is not None
            or any(urlsplit(u).scheme in ("tls", "wss") for u in self.servers)
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        context = ssl.create_default_context(
            cafile=str(self.tls_ca) if self.tls_ca is not None else None
        )
        if self.tls_cert is not None and self.tls_key is not None:
            context.load_cert_chain(str(self.tls_cert), str(self.tls_key))
        return context

    def connect_kwargs(self) -> dict[str, Any]:
        """What nats-py's ``connect`` takes for these options."""
        kwargs: dict[str, Any] = {"servers": list(self.servers)}
        if self.user is not None:
            kwargs["user"] = self.user
            kwargs["password"] = self.password
        if self.creds_file is not None:
            kwargs["user_credentials"] = str(self.creds_file)
        context = self.ssl_context()
        if context is not None:
            kwargs["tls"] = context
        return kwargs

    def sidecar_args(self) -> list[str]:
        """The same options as the Rust sidecar's flags (the password goes by environment:
        see :meth:`sidecar_env`, so it is not visible in the process list)."""
        args = ["--nats-url", self.url]
        for flag, value in (
            ("--nats-user", self.user),
            ("--nats-creds", self.creds_file),
            ("--nats-tls-ca", self.tls_ca),
            ("--nats-tls-cert", self.tls_cert),
            ("--nats-tls-key", self.tls_key),
        ):
            if value is not None:
                args += [flag, str(value)]
        if self.tls:
            args.append("--nats-tls")
        return args

    def sidecar_env(self) -> dict[str, str]:
        return {"TASKFLEET_NATS_PASSWORD": self.password} if self.password is not None else {}


_PATHS = ("creds_file", "tls_ca", "tls_cert", "tls_key")


def _path(value: Path | str | None) -> Path | None:
    return Path(value).expanduser() if value is not None and str(value) else None


# Where a NATS connection may be given as a URL string or as options.
NatsTarget = str | NatsOptions


def nats_options(target: NatsTarget) -> NatsOptions:
    return target if isinstance(target, NatsOptions) else NatsOptions.parse(target)


def redact(url: str) -> str:
    """``url`` without the password of its user part."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


async def connect_forever(target: NatsTarget, stop: asyncio.Event, *, name: str) -> NATS | None:
    """Connect, retrying until NATS answers; None when ``stop`` is set first."""
    nc = NATS()
    attempt = asyncio.ensure_future(
        nc.connect(
            **nats_options(target).connect_kwargs(),
            name=name,
            connect_timeout=2,
            allow_reconnect=True,
            max_reconnect_attempts=-1,  # also makes the *first* connect retry forever
            reconnect_time_wait=1,
            error_cb=_log_error(name),
            disconnected_cb=_log_event(name, "disconnected from NATS"),
            reconnected_cb=_log_event(name, "reconnected to NATS"),
        )
    )
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({attempt, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if attempt.done():
        attempt.result()  # re-raise a non-retryable error (bad URL)
        return nc
    attempt.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await attempt
    with contextlib.suppress(Exception):
        await nc.close()
    return None


async def connect_once(target: NatsTarget, *, name: str, timeout_s: int = 2) -> NATS:
    """One attempt; raises ConnectionError when NATS is not reachable."""
    options = nats_options(target)
    nc = NATS()
    try:
        # nats-py keeps retrying the first connect even without allow_reconnect unless the
        # attempts are bounded (0 means unbounded there); the outer timeout is a safety net.
        await asyncio.wait_for(
            nc.connect(
                **options.connect_kwargs(),
                name=name,
                connect_timeout=timeout_s,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=_log_error(name),
            ),
            timeout_s * 3,
        )
    except (TimeoutError, OSError, NatsError) as exc:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), timeout_s)
        raise ConnectionError(
            f"NATS at {options} is not reachable ({type(exc).__name__}: {exc})"
        ) from None
    return nc


def _log_error(name: str) -> Callable[[Exception], Awaitable[None]]:
    async def callback(exc: Exception) -> None:
        log.debug("%s: nats error: %s", name, exc)

    return callback


def _log_event(name: str, what: str) -> Callable[[], Awaitable[None]]:
    async def callback() -> None:
        log.info("%s: %s", name, what)

    return callback
