"""The endpoint watcher: re-probes every endpoint model a task serves, on a period.

Hosted APIs change the model behind a name without notice and self-hosted engines get
redeployed. An endpoint model is registered with a probe fingerprint (serving/endpoints.py:
sha256 of its rounded replies to fixed probe texts); this loop, run by the leading control plane
beside the placement publisher (serving/control.py), asks each one in use again every
``period_s`` and records what it found. A fingerprint other than the registered one makes every
pairing on that model stale (``BaseModel.stale``): the dashboard flags it and the control
plane's ``/metrics`` counts it (``taskfleet_pairing_stale``). An endpoint that does not answer is
recorded as a probe error, not as a change. The key, when the model has one, is read from the
variable it names in this process's environment, as on a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from registry import RegistryError
from registry import entities as e
from serving.endpoints import EndpointError, Probe, probe, spec_from_record

log = logging.getLogger("taskfleet.endpoints")
DEFAULT_PROBE_PERIOD_S = 60.0


class EndpointProbeStore(Protocol):
    def endpoint_models_in_use(self) -> list[e.BaseModel]: ...

    def record_probe(
        self, model: str, *, fingerprint: str | None, error: str | None
    ) -> e.BaseModel: ...


class EndpointWatcher:
    def __init__(
        self,
        registry: EndpointProbeStore,
        *,
        period_s: float = DEFAULT_PROBE_PERIOD_S,
        prober: Callable[[Any], Probe] = probe,
    ) -> None:
        self.registry = registry
        self.period_s = period_s
        self.prober = prober
        self._stop = asyncio.Event()

    def check_once(self) -> list[e.BaseModel]:
        """Probe every endpoint model in use once and record each result; returns the records
        as they now stand (blocking: run it in a thread)."""
        recorded: list[e.BaseModel] = []
        for model in self.registry.endpoint_models_in_use():
            if model.endpoint is None:
                continue
            fingerprint: str | None = None
            error: str | None = None
            try:
                fingerprint = self.prober(spec_from_record(model.endpoint)).fingerprint
            except (EndpointError, ValueError, KeyError, TypeError) as exc:
                error = str(exc)
            try:
                now = self.registry.record_probe(model.name, fingerprint=fingerprint, error=error)
            except RegistryError as exc:
                log.warning("could not record the probe of %s: %s", model.name, exc)
                continue
            if now.stale and not model.stale:
                log.warning(
                    "endpoint model %s answers differently from when it was registered "
                    "(probe %s, registered %s): its pairings are stale",
                    model.name,
                    (now.probed_fingerprint or "")[:12],
                    (now.probe_fingerprint or "")[:12],
                )
            recorded.append(now)
        return recorded

    async def run(self, nc: object | None = None) -> None:
        """Until :meth:`stop`: one pass per period (the connection is not needed)."""
        while not self._stop.is_set():
            try:
                await asyncio.to_thread(self.check_once)
            except RegistryError as exc:  # the database away: try again next period
                log.warning("endpoint watcher: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.period_s)

    def stop(self) -> None:
        self._stop.set()
