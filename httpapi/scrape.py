"""Who may read an app's ``GET /metrics``: the rule the gateway and the control plane share.

The figures name tasks, models and API keys, so ``/metrics`` is for the scraper only: with a
metrics token (``TASKFLEET_METRICS_TOKEN``) it needs that bearer token; without one it is open
only when the app runs without auth (nothing is private then).
"""

from __future__ import annotations

import hmac

from httpapi.errors import ApiError, ErrorCode
from httpapi.tokens import bearer_token


def check_scraper(authorization: str | None, *, token: str | None, require_auth: bool) -> None:
    """401 without the metrics token, 403 when auth is on and no token is configured."""
    if token is None:
        if require_auth:
            raise ApiError(
                "/metrics is off: its figures name tasks, models and API keys. Start with "
                "--metrics-token (or TASKFLEET_METRICS_TOKEN) and scrape it with "
                "'Authorization: Bearer <that token>'",
                code=ErrorCode.FORBIDDEN,
            )
        return
    sent = bearer_token(authorization)
    if sent is None or not hmac.compare_digest(sent.encode(), token.encode()):
        raise ApiError(
            "/metrics needs 'Authorization: Bearer <the metrics token>'",
            code=ErrorCode.UNAUTHENTICATED,
        )
