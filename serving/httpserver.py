"""How taskfleet's HTTP servers (gateway, control plane) run under uvicorn."""

from __future__ import annotations

from typing import Any

import uvicorn

# How long the HTTP servers keep an idle connection open. Above the clients' own idle expiry
# (httpx, which the openai and cohere packages use too: 5 s; load balancers: 60 s) so that a
# client never sends on a connection the server is closing at that moment - with uvicorn's
# default of 5 s that race failed requests with a connection reset under load.
KEEP_ALIVE_S = 75


def http_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
