"""The parts of one gateway app that every route is given: its settings, metrics, quotas, the
NATS dispatcher and the view it serves from. Routes receive them as a FastAPI dependency
(``gateway_of``), as the control plane's routes receive ``ControlPlane``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from fastapi import Request

from serving.gateway.admission import Admission
from serving.gateway.dispatch import Dispatcher
from serving.gateway.errors import Unavailable
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.view import FleetView


@dataclass(frozen=True)
class GatewaySettings:
    """One gateway process's settings (``taskfleet gateway`` flags, ``TASKFLEET_*``)."""

    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    require_auth: bool = True
    max_body_bytes: int = 32 * 1024 * 1024
    max_inputs: int = 2048
    default_timeout_s: float = 30.0
    max_timeout_s: float = 300.0
    inline_limit_bytes: int = 1_000_000
    workers_refresh_s: float = 1.0
    retry_after_s: int = 2
    # How long a caller's X-Taskfleet-Min-Epoch ahead of this gateway's placement may wait for
    # the placement to arrive (dispatch.Dispatcher.await_epoch).
    min_epoch_wait_s: float = 2.0
    # The bearer token /metrics requires; None: /metrics is open only when auth is off.
    metrics_token: str | None = None


@dataclass(frozen=True)
class Gateway:
    """The parts of one gateway app, made by ``create_gateway``."""

    settings: GatewaySettings
    metrics: GatewayMetrics
    admission: Admission
    dispatcher: Dispatcher

    @property
    def view(self) -> FleetView:
        """Tasks, keys and placements as the control plane published them."""
        return self.dispatcher.view

    def not_ready(self, what: str) -> Unavailable:
        return Unavailable(
            f"the gateway has not received the control plane's {what} yet (is a `taskfleet "
            "serve` or `taskfleet up` connected to this NATS?)",
            code="NOT_READY",
            retry_after_s=self.settings.retry_after_s,
        )


def gateway_of(request: Request) -> Gateway:
    """The route dependency: the gateway of the app serving ``request``."""
    gateway: Gateway = request.app.state.gateway
    return gateway
