"""What every dashboard route shares: the control plane, who is signed in, their task scope."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from registry.access import LOCAL_ADMIN, ControlPlane, Principal
from registry.dashboard.session import LoginRequired, session_user
from registry.service import Registry

# A worker heartbeat older than this no longer counts as "the fleet is reachable". Workers beat
# every few seconds and their KV entries expire after 15 s, so 30 s means several missed beats.
DEFAULT_STALE_AFTER_S = 30.0


@dataclass(frozen=True)
class Dashboard:
    control: ControlPlane
    stale_after_s: float = DEFAULT_STALE_AFTER_S

    @property
    def registry(self) -> Registry:
        return self.control.registry

    @property
    def require_auth(self) -> bool:
        return self.control.require_auth

    def user(self, request: Request) -> Principal:
        """Dependency of every signed-in page: who it is (remembered for the templates), and
        a `{task}` in the path checked against the key's task list."""
        user = session_user(request, self.registry) if self.require_auth else LOCAL_ADMIN
        if user is None:
            raise LoginRequired()
        request.state.user = user
        if "task" in request.path_params:
            user.task(request.path_params["task"])
        return user

    def acting(self, user: Principal) -> Registry:
        """The registry acting for this user: the service enforces the roles."""
        return self.registry.as_actor(user.actor, user.roles)
