"""NATS connections for the long-running control loops (publisher, fleet watcher).

They must outlive NATS outages: the first connect keeps trying until the server is up, and an
established connection reconnects forever. Short-lived tools (`taskfleet placement set`) use
:func:`connect_once` instead, which fails fast so the user hears at once that NATS is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

log = logging.getLogger("taskfleet.nats")


async def connect_forever(url: str, stop: asyncio.Event, *, name: str) -> NATS | None:
    """Connect, retrying until NATS answers; None when ``stop`` is set first."""
    nc = NATS()
    attempt = asyncio.ensure_future(
        nc.connect(
            url,
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


async def connect_once(url: str, *, name: str, timeout_s: int = 2) -> NATS:
    """One attempt; raises ConnectionError when NATS is not reachable."""
    nc = NATS()
    try:
        # nats-py keeps retrying the first connect even without allow_reconnect unless the
        # attempts are bounded (0 means unbounded there); the outer timeout is a safety net.
        await asyncio.wait_for(
            nc.connect(
                url,
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
            await nc.close()
        raise ConnectionError(f"NATS at {url} is not reachable ({type(exc).__name__})") from None
    return nc


def _log_error(name: str) -> Callable[[Exception], Awaitable[None]]:
    async def callback(exc: Exception) -> None:
        log.debug("%s: nats error: %s", name, exc)

    return callback


def _log_event(name: str, what: str) -> Callable[[], Awaitable[None]]:
    async def callback() -> None:
        log.info("%s: %s", name, what)

    return callback
