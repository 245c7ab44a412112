"""Who is acting on the control plane, and what their key allows: roles and task scope.

One `Principal` per request, whichever door it came through (REST bearer key or dashboard
session). Roles: `viewer` reads, `promoter` also promotes, rolls back and changes placements,
`admin` may do anything; `caller` keys are for applications and reach only the gateway. A key
with a task list acts on those tasks only, on the control plane as on the gateway: other
tasks answer 403 (whether they exist or not), and lists leave them out. Filesystem paths are
shown to admins only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from starlette.requests import Request

from registry.entities import ApiKey, Worker
from registry.errors import PermissionDenied, Unauthenticated
from registry.fingerprint import link_fence
from registry.promotions import PROMOTE_ROLES
from registry.rest_bodies import SuiteReader
from registry.service import Registry
from registry.store import BaselineBuilder, VariantBuilder
from registry.throttle import LoginThrottle

CONTROL_ROLES = ("viewer", "promoter", "admin")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...]
    tasks: frozenset[str] = field(default_factory=frozenset)  # empty: every task
    signed_in: bool = True  # False for the implicit local user (no auth, no logout)

    @classmethod
    def of_key(cls, key: ApiKey) -> Principal:
        """The key's principal; refused when the key has no control-plane role (callers)."""
        if not set(key.roles) & set(CONTROL_ROLES):
            raise PermissionDenied(
                f"API key {key.name!r} has only the roles {', '.join(key.roles)}: caller keys "
                "reach the gateway only; the control plane needs viewer, promoter or admin"
            )
        return cls(key.name, tuple(key.roles), frozenset(key.tasks))

    @property
    def actor(self) -> str:
        # The same form through REST and dashboard, so the history reads alike.
        return f"key:{self.name}" if self.signed_in else "dashboard:anonymous"

    @property
    def can_promote(self) -> bool:
        return bool(set(self.roles) & set(PROMOTE_ROLES))

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    @property
    def scoped(self) -> bool:
        return bool(self.tasks)

    def allows(self, task: str) -> bool:
        return not self.tasks or task in self.tasks

    def task(self, task: str) -> str:
        """The task, if this key may act on it."""
        if not self.allows(task):
            raise PermissionDenied(f"this API key may not act on task {task!r}")
        return task

    def need(self, *roles: str) -> None:
        if not set(self.roles) & set(roles):
            raise PermissionDenied(f"this needs one of the roles: {', '.join(roles)}")

    def need_every_task(self, what: str) -> None:
        """Writes shared by every task (models, adapters) need a key without a task list."""
        if self.tasks:
            raise PermissionDenied(
                f"{what} is shared by every task; this key is limited to "
                f"{', '.join(sorted(self.tasks))}"
            )


@dataclass(frozen=True)
class ControlPlane:
    """What both doors of the control plane (REST, dashboard) share."""

    registry: Registry
    require_auth: bool = True
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    read_suite: SuiteReader | None = None  # reads suite folders for POST /api/v1/suites
    build_variant: VariantBuilder | None = None  # builds `variant` candidates (POST candidates)
    fit_baseline: BaselineBuilder | None = None  # fits servable tfidf-lr / bm25 candidates
    # Folders REST may register base models and adapters from (TASKFLEET_MODEL_ROOTS); none:
    # REST registers models by package only. The CLI acts as a local admin and is not bound.
    model_roots: tuple[Path, ...] = ()

    def model_path(self, given: str, what: str) -> Path:
        """A REST caller's model or adapter folder, resolved, if it lies inside a model root
        (links followed first, so a link cannot lead out of the roots)."""
        if not self.model_roots:
            raise PermissionDenied(
                f"this control plane registers no {what} folders over REST: set "
                "TASKFLEET_MODEL_ROOTS (or --model-root) to the folders it may read, or use "
                "the CLI on the control plane's machine"
            )
        folder = Path(given).expanduser().resolve()
        roots = [root.expanduser().resolve() for root in self.model_roots]
        inside = [root for root in roots if folder.is_relative_to(root)]
        if not inside:
            raise PermissionDenied(
                f"{what} folder {folder} is outside the model roots "
                f"({', '.join(str(r) for r in roots)}) this control plane may read"
            )
        if what == "model":  # a Hugging Face snapshot's files link into its cache repo
            fence = link_fence(folder)
            if not any(fence.is_relative_to(root) for root in inside):
                raise PermissionDenied(
                    f"model folder {folder} is a Hugging Face cache snapshot whose files link "
                    f"into {fence}, outside the model roots; make a root of {fence} or above"
                )
        return folder


def visible_workers(workers: list[Worker], who: Principal) -> list[Worker]:
    """A task-scoped key sees the workers that serve its tasks, with their figures for those
    tasks only (not which models they hold for others)."""
    if not who.scoped:
        return workers
    shown = []
    for w in workers:
        depth = {t: d for t, d in w.queue_depth.items() if who.allows(t)}
        epochs = {t: n for t, n in w.epochs.items() if who.allows(t)}
        if depth or epochs:
            shown.append(replace(w, queue_depth=depth, epochs=epochs, loaded=[]))
    return shown


# With `--no-auth` (a trusted laptop) there is no login; the single local user is admin.
LOCAL_ADMIN = Principal("local", ("admin",), signed_in=False)


def client_of(request: Request) -> str:
    """Who is asking, for throttling: the peer address, or the client a configured proxy
    forwards (uvicorn rewrites the peer only for `--forwarded-allow-ips`)."""
    return request.client.host if request.client else "unknown"


def authenticate(registry: Registry, throttle: LoginThrottle, token: str, client: str) -> ApiKey:
    """The key of a bearer token or a login form, throttled per client: a throttled client's
    attempt answers 429 before the key is even looked at. Failures count against the client
    only, never against the key, so nobody can lock another's key out."""
    throttle.check(client)
    try:
        return registry.authenticate(token)
    except Unauthenticated:
        throttle.failed(client)
        raise
