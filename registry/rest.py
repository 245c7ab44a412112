"""The control-plane REST API under /api/v1: plain handler functions on one router.

Every route depends on `acting`: the bearer key is authenticated (throttled, 401 when wrong),
caller-only keys are refused (403: they reach the gateway only), and a `{task}` in the path is
checked against the key's task list before any handler runs, so no route can forget it.
"""

# No `from __future__ import annotations` here: FastAPI must resolve the `Annotated`
# dependencies at runtime.
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from httpapi.tokens import bearer_token
from registry import entities as e
from registry.access import (
    LOCAL_ADMIN,
    ControlPlane,
    Principal,
    authenticate,
    client_of,
    visible_workers,
)
from registry.errors import InvalidInput, NotImplementedHere, Unauthenticated
from registry.rest_bodies import (
    AdapterIn,
    CandidateIn,
    KeyQuotaIn,
    ModelIn,
    PlacementIn,
    PromoteIn,
    RollbackIn,
    SuiteIn,
    TaskIn,
    TaskLimitsIn,
)
from registry.service import Registry
from registry.store import UNSET


@dataclass(frozen=True)
class Acting:
    who: Principal
    reg: Registry  # the registry acting as `who` (the service enforces role-bound rules)


# Documents the scheme in OpenAPI (Swagger's "Authorize"); the header is read by `bearer_token`,
# the one parser the gateway uses too.
_BEARER = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer tfk_...`")


def acting(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)]
) -> Acting:
    control: ControlPlane = request.app.state.control
    if control.require_auth:
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise Unauthenticated("send 'Authorization: Bearer <api key>'")
        key = authenticate(control.registry, control.throttle, token, client_of(request))
        who = Principal.of_key(key)
    else:
        who = LOCAL_ADMIN
    if "task" in request.path_params:
        who.task(request.path_params["task"])
    _refuse_unknown_query(request)
    return Acting(who, control.registry.as_actor(who.actor, who.roles))


def _refuse_unknown_query(request: Request) -> None:
    """`?candidat=x` must not silently answer for every candidate."""
    route = request.scope.get("route")
    known = {p.alias for p in getattr(getattr(route, "dependant", None), "query_params", [])}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        allowed = ", ".join(sorted(known)) or "none"
        raise InvalidInput(f"unknown query parameter {unknown[0]!r} (this route takes: {allowed})")


Act = Annotated[Acting, Depends(acting)]
router = APIRouter(prefix="/api/v1")


def _dump(items: list[Any]) -> list[dict[str, Any]]:
    return [asdict(i) for i in items]


def _model(model: e.BaseModel, who: Principal) -> dict[str, Any]:
    """Filesystem paths are for admins only."""
    out = asdict(model)
    if not who.is_admin:
        out.pop("path")
    return out


def _suite(suite: e.Suite, who: Principal) -> dict[str, Any]:
    """A suite's location is a filesystem path: for admins only, as a model's."""
    out = asdict(suite)
    if not who.is_admin:
        out.pop("location")
    return out


@router.get("/suites")
def list_suites(a: Act) -> list[dict[str, Any]]:
    """The newest version of every suite (suites are shared by every task)."""
    return [_suite(s, a.who) for s in a.reg.list_suites()]


@router.post("/suites", status_code=201)
def add_suite(body: SuiteIn, request: Request, a: Act) -> JSONResponse:
    """Read, fingerprint and register a suite; 200 when that content is already a version."""
    a.who.need("admin")
    a.who.need_every_task("a suite")
    read_suite = request.app.state.control.read_suite
    if read_suite is None:
        raise NotImplementedHere("this control plane cannot read suite folders")
    suite, created = a.reg.add_suite(read_suite(body))
    return JSONResponse(
        jsonable_encoder({**_suite(suite, a.who), "created": created}),
        status_code=201 if created else 200,
    )


@router.get("/suites/{name}")
def get_suite(name: str, a: Act, version: int | None = None) -> dict[str, Any]:
    """One version of a suite (default: the newest) and the list of its versions."""
    return {
        **_suite(a.reg.get_suite(name, version), a.who),
        "versions": [v.version for v in a.reg.suite_versions(name)],
    }


@router.get("/tasks")
def list_tasks(a: Act) -> list[dict[str, Any]]:
    return _dump([t for t in a.reg.list_tasks() if a.who.allows(t.name)])


@router.post("/tasks", status_code=201)
def add_task(body: TaskIn, a: Act) -> dict[str, Any]:
    a.who.need("admin")
    a.who.task(body.name)
    task = a.reg.add_task(
        body.name,
        suite=body.suite or body.name,
        kind=body.kind,
        description=body.description,
        owner=body.owner,
        margin=body.margin,
        max_text_chars=body.max_text_chars,
        max_query_chars=body.max_query_chars,
        max_document_chars=body.max_document_chars,
    )
    return asdict(task)


@router.patch("/tasks/{task}")
def set_task_limits(task: str, body: TaskLimitsIn, a: Act) -> dict[str, Any]:
    """Change the task's per-text limits (characters); the gateways apply them once the
    control plane has published them (its next pass)."""
    a.who.need("admin")
    return asdict(
        a.reg.set_task_limits(
            task,
            max_text_chars=body.max_text_chars,
            max_query_chars=body.max_query_chars,
            max_document_chars=body.max_document_chars,
        )
    )


@router.get("/tasks/{task}")
def get_task(task: str, a: Act) -> dict[str, Any]:
    placement = a.reg.current_placement(task)
    return {
        **asdict(a.reg.get_task(task)),
        "candidates": _dump(a.reg.list_candidates(task)),
        "placement": asdict(placement) if placement else None,
    }


@router.get("/models")
def list_models(a: Act) -> list[dict[str, Any]]:
    return [_model(m, a.who) for m in a.reg.list_models()]


@router.post("/models", status_code=201)
def add_model(body: ModelIn, request: Request, a: Act) -> dict[str, Any]:
    """Register a base model from a folder inside the control plane's model roots
    (TASKFLEET_MODEL_ROOTS), or from an installed package that ships one."""
    a.who.need("admin")
    a.who.need_every_task("a base model")
    control: ControlPlane = request.app.state.control
    model = a.reg.add_model(
        body.name,
        path=control.model_path(body.path, "model") if body.path else None,
        package=body.package,
        query_prefix=body.query_prefix,
        passage_prefix=body.passage_prefix,
    )
    return _model(model, a.who)


@router.get("/models/{name}")
def get_model(name: str, a: Act) -> dict[str, Any]:
    return _model(a.reg.get_model(name), a.who)


@router.get("/adapters")
def list_adapters(a: Act, base: str | None = None) -> list[dict[str, Any]]:
    return _dump(a.reg.list_adapters(base))


@router.post("/adapters", status_code=201)
def register_adapter(body: AdapterIn, request: Request, a: Act) -> dict[str, Any]:
    """Copy an adapter folder from inside the control plane's model roots into its store."""
    a.who.need("admin")
    a.who.need_every_task("an adapter")
    control: ControlPlane = request.app.state.control
    adapter = a.reg.register_adapter(
        body.name,
        base=body.base,
        source_dir=control.model_path(body.path, "adapter"),
        parent=body.parent,
        training=e.TrainingRecord(**body.training.model_dump()),
    )
    return asdict(adapter)


@router.get("/adapters/{name}")
def get_adapter(name: str, a: Act) -> dict[str, Any]:
    return asdict(a.reg.get_adapter(name))


@router.get("/adapters/{name}/lineage")
def lineage(name: str, a: Act) -> list[dict[str, Any]]:
    return _dump(a.reg.lineage(name))


@router.get("/tasks/{task}/candidates")
def list_candidates(task: str, a: Act) -> list[dict[str, Any]]:
    return _dump(a.reg.list_candidates(task))


@router.post("/tasks/{task}/candidates", status_code=201)
def add_candidate(task: str, body: CandidateIn, request: Request, a: Act) -> dict[str, Any]:
    a.who.need("admin")
    build_variant = request.app.state.control.build_variant
    if body.variant is not None and build_variant is None:
        raise NotImplementedHere("this control plane cannot build variants")
    candidate = a.reg.add_candidate(
        task,
        name=body.name,
        base=body.base,
        adapter=body.adapter,
        kind=body.kind,
        variant=body.variant,
        build_variant=build_variant,
        fit_baseline=request.app.state.control.fit_baseline,
    )
    return asdict(candidate)


@router.get("/tasks/{task}/eval-runs")
def list_eval_runs(task: str, a: Act, candidate: str | None = None) -> list[dict[str, Any]]:
    runs = a.reg.list_eval_runs(task, candidate)
    return [{k: v for k, v in asdict(r).items() if k != "per_query"} for r in runs]


@router.get("/placements")
def list_placements(a: Act) -> list[dict[str, Any]]:
    return _dump([p for p in a.reg.list_placements() if a.who.allows(p.task)])


@router.post("/tasks/{task}/placement", status_code=201)
def update_placement(task: str, body: PlacementIn, a: Act) -> dict[str, Any]:
    """Change pinned/replicas of the champion's placement (a new epoch, in the history).

    What a task serves changes only by promote, rollback or an admin override: naming another
    candidate than the champion answers 400 PROMOTION_REQUIRED."""
    a.who.need("promoter", "admin")
    placement = a.reg.update_placement(
        task,
        pinned=body.pinned,
        replicas=body.replicas,
        candidate=body.candidate,
        reason=body.reason,
    )
    return asdict(placement)


@router.get("/tasks/{task}/promotions")
def list_promotions(task: str, a: Act) -> list[dict[str, Any]]:
    """The task's promotion history, newest first: one row per placement epoch."""
    return _dump(a.reg.list_promotions(task))


@router.get("/tasks/{task}/candidates/{candidate}/check")
def check_promotion(task: str, candidate: str, a: Act) -> dict[str, Any]:
    """The promotion rule's verdict for one challenger, with its evidence. Writes nothing."""
    return asdict(a.reg.check_promotion(task, candidate))


def _expected(body: PromoteIn | RollbackIn) -> str | None:
    """An absent `expected_champion` means "do not check"; an explicit null means "none"."""
    return body.expected_champion if "expected_champion" in body.model_fields_set else UNSET


@router.post("/tasks/{task}/promote", status_code=201)
def promote(task: str, body: PromoteIn, a: Act) -> dict[str, Any]:
    a.who.need("promoter", "admin")
    done = a.reg.promote(
        task,
        body.candidate,
        reason=body.reason,
        override=body.override,
        expected_champion=_expected(body),
        pinned=body.pinned,
        replicas=body.replicas,
    )
    return asdict(done)


@router.post("/tasks/{task}/rollback", status_code=201)
def rollback(task: str, body: RollbackIn, a: Act) -> dict[str, Any]:
    a.who.need("promoter", "admin")
    return asdict(a.reg.rollback(task, reason=body.reason, expected_champion=_expected(body)))


@router.get("/keys")
def list_keys(a: Act) -> list[dict[str, Any]]:
    """API keys with their roles, tasks and quotas (never a secret or its digest)."""
    a.who.need("admin")
    a.who.need_every_task("API keys")
    return _dump(a.reg.list_api_keys())


@router.put("/keys/{name}/quota")
def set_key_quota(name: str, body: KeyQuotaIn, a: Act) -> dict[str, Any]:
    """Set a key's whole gateway quota: requests/s and estimated tokens/s with their bursts
    (a rate left out removes that limit)."""
    a.who.need("admin")
    a.who.need_every_task("API keys")
    key = a.reg.set_api_key_quota(
        name,
        rate_limit_per_s=body.rate_limit_per_s,
        rate_burst=body.rate_burst,
        token_rate_per_s=body.token_rate_per_s,
        token_burst=body.token_burst,
    )
    return asdict(key)


@router.get("/fleet")
def fleet(a: Act) -> dict[str, Any]:
    """Workers as last mirrored from their heartbeats, and desired vs reported epochs."""
    placements = [p for p in a.reg.placement_status() if a.who.allows(p.task)]
    return {
        "workers": _dump(visible_workers(a.reg.list_workers(), a.who)),
        "placements": [
            {**asdict(p), "converged": p.converged, "converged_workers": p.converged_workers}
            for p in placements
        ],
    }
