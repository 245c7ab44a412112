"""The public HTTP gateway: envelope checks, then JetStream publish and reply wait."""

from serving.gateway.app import GatewaySettings, create_gateway

__all__ = ["GatewaySettings", "create_gateway"]
