"""The public HTTP gateway: every call is checked whole (caller, headers, each field of the body
for the task's kind and each text's length, placement, live workers, quotas) before it is
published to JetStream; then it waits for the worker's reply. ``app.py`` lists the checks."""

from serving.gateway.app import GatewaySettings, create_gateway

__all__ = ["GatewaySettings", "create_gateway"]
