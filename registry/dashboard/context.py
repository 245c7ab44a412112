"""What every dashboard route shares: the registry, the auth mode, who is signed in."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from registry.dashboard.session import LOCAL_USER, LoginRequired, User, session_user
from registry.service import Registry

# A worker heartbeat older than this no longer counts as "the fleet is reachable". Workers beat
# every few seconds and their KV entries expire after 15 s, so 30 s means several missed beats.
DEFAULT_STALE_AFTER_S = 30.0


@dataclass(frozen=True)
class Dashboard:
    registry: Registry
    require_auth: bool = True
    stale_after_s: float = DEFAULT_STALE_AFTER_S

    def user(self, request: Request) -> User:
        """Dependency of every signed-in page; remembers the user for the templates."""
        user = session_user(request, self.registry) if self.require_auth else LOCAL_USER
        if user is None:
            raise LoginRequired()
        request.state.user = user
        return user

    def acting(self, user: User) -> Registry:
        """The registry acting for this user: the service enforces the roles."""
        return self.registry.as_actor(user.actor, user.roles)
