"""What every gateway route is given, and who is calling.

:class:`Gateway` holds the parts of one gateway app (settings, metrics, quotas, the NATS
dispatcher and the view it serves from); routes receive it as a dependency (``GatewayDep``).
:func:`authenticate` finds the caller's API key in the published directory (never the
database) and charges its request quota.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from httpapi.tokens import bearer_token, key_prefix, token_matches
from serving.directory import KeyRecord
from serving.gateway.admission import Admission
from serving.gateway.dispatch import Dispatcher
from serving.gateway.errors import Forbidden, Unauthenticated, Unavailable
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.settings import GatewaySettings
from serving.gateway.view import FleetView

# Roles whose keys may call tasks: `caller` keys exist for applications; `admin` can do anything.
CALL_ROLES = frozenset({"caller", "admin"})


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


def find_key(gateway: Gateway, token: str) -> KeyRecord:
    """The published record of ``token``'s key (digest, roles, tasks), or 401."""
    prefix = key_prefix(token)
    if prefix is None:
        raise Unauthenticated("malformed API key")
    view = gateway.view
    if not view.directory_published:
        raise gateway.not_ready("API keys")
    record = view.keys.get(prefix)
    if record is None:
        raise Unauthenticated("unknown API key")
    if record.revoked or record.secret_hash is None:
        raise Unauthenticated(f"API key {record.name!r} was revoked")
    if not token_matches(token, record.secret_hash):
        raise Unauthenticated("unknown API key")
    return record


def authenticate(gateway: Gateway, request: Request) -> KeyRecord | None:
    """The caller's key, within its request quota; None when auth is off."""
    if not gateway.settings.require_auth:
        return None
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise Unauthenticated("send 'Authorization: Bearer <api key>'")
    key = find_key(gateway, token)
    if not CALL_ROLES & set(key.roles):
        raise Forbidden(f"API key {key.name!r} has none of the roles caller, admin")
    gateway.admission.charge_request(key)
    return key
