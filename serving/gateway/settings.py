"""The settings of one gateway process (``taskfleet gateway`` flags and ``TASKFLEET_*``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GatewaySettings:
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
