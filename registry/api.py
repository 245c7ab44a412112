"""The control-plane REST API (FastAPI): the registry service over HTTP, with OpenAPI docs."""

# No `from __future__ import annotations` here: FastAPI must resolve the locally defined
# `Annotated` dependencies at runtime.
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header
from pydantic import BaseModel, Field

from httpapi.docs import mount_docs
from httpapi.handlers import ERROR_RESPONSES, install_error_handlers
from registry import entities as e
from registry.dashboard import mount_dashboard
from registry.dashboard.rendering import error_page
from registry.errors import PermissionDenied, Unauthenticated
from registry.keys import bearer_token
from registry.promotions import UNSET
from registry.service import Registry


class TaskIn(BaseModel):
    name: str
    suite: str | None = None
    kind: str = "retrieval"
    description: str = ""
    owner: str = ""
    margin: float = 0.0


class ModelIn(BaseModel):
    name: str
    path: str | None = None
    package: str | None = None
    query_prefix: str = ""
    passage_prefix: str = ""


class TrainingIn(BaseModel):
    data_fingerprint: str
    train_split: str
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    code_version: str = "unknown"
    suite: str | None = None
    mlflow_run_id: str | None = None


class AdapterIn(BaseModel):
    name: str
    base: str
    path: str = Field(description="Adapter folder readable by the control plane.")
    parent: str | None = None
    training: TrainingIn


class CandidateIn(BaseModel):
    name: str | None = None
    base: str | None = None
    adapter: str | None = None
    kind: str = "embedding"


class PlacementIn(BaseModel):
    candidate: str
    pinned: bool = False
    replicas: int = 1


class PromoteIn(BaseModel):
    candidate: str
    reason: str = ""
    override: bool = Field(False, description="Promote although the rule is not met (admin).")
    expected_champion: str | None = Field(
        None,
        description="The champion the caller saw (null: none). If it changed meanwhile, nothing "
        "happens and 409 CONFLICT is returned. Leave out to skip this check.",
    )


class RollbackIn(BaseModel):
    reason: str = ""
    expected_champion: str | None = Field(
        None, description="The champion the caller saw; leave out to skip the stale check."
    )


def _expected(body: PromoteIn | RollbackIn) -> str | None:
    """An absent `expected_champion` means "do not check"; an explicit null means "none"."""
    return body.expected_champion if "expected_champion" in body.model_fields_set else UNSET


def _dump(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_dump(o) for o in obj]
    return asdict(obj)


def create_app(
    registry: Registry, *, require_auth: bool = True, session_secret: str | None = None
) -> FastAPI:
    """The control plane: REST API under /api/v1 and the web dashboard on the same port.

    `session_secret` signs dashboard session cookies; without one, sessions end with the process.
    """
    app = FastAPI(
        title="taskfleet control plane",
        version="1",
        description="Tasks, models, adapters, candidates, eval runs and placements.",
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )

    def actor(
        authorization: Annotated[str | None, Header()] = None,
    ) -> tuple[Registry, list[str]]:
        if not require_auth:
            return registry.as_actor("api:anonymous"), ["admin"]
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated("send 'Authorization: Bearer <api key>'")
        key = registry.authenticate(token)
        # The service enforces role-bound rules itself (promotion overrides need admin).
        return registry.as_actor(f"key:{key.name}", key.roles), key.roles

    Actor = Annotated[tuple[Registry, list[str]], Depends(actor)]

    def writer(who: tuple[Registry, list[str]], *roles: str) -> Registry:
        reg, have = who
        if not set(have) & set(roles or ("admin",)):
            raise PermissionDenied(f"this needs one of the roles: {', '.join(roles or ('admin',))}")
        return reg

    @app.get("/api/v1/tasks")
    def list_tasks(who: Actor) -> list[dict[str, Any]]:
        return _dump(who[0].list_tasks())

    @app.post("/api/v1/tasks", status_code=201)
    def add_task(body: TaskIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "admin")
        t = reg.add_task(
            body.name,
            suite=body.suite or body.name,
            kind=body.kind,
            description=body.description,
            owner=body.owner,
            margin=body.margin,
        )
        return asdict(t)

    @app.get("/api/v1/tasks/{task}")
    def get_task(task: str, who: Actor) -> dict[str, Any]:
        reg = who[0]
        placement = reg.current_placement(task)
        return {
            **asdict(reg.get_task(task)),
            "candidates": _dump(reg.list_candidates(task)),
            "placement": asdict(placement) if placement else None,
        }

    @app.get("/api/v1/models")
    def list_models(who: Actor) -> list[dict[str, Any]]:
        return _dump(who[0].list_models())

    @app.post("/api/v1/models", status_code=201)
    def add_model(body: ModelIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "admin")
        m = reg.add_model(
            body.name,
            path=Path(body.path) if body.path else None,
            package=body.package,
            query_prefix=body.query_prefix,
            passage_prefix=body.passage_prefix,
        )
        return asdict(m)

    @app.get("/api/v1/models/{name}")
    def get_model(name: str, who: Actor) -> dict[str, Any]:
        return asdict(who[0].get_model(name))

    @app.get("/api/v1/adapters")
    def list_adapters(who: Actor, base: str | None = None) -> list[dict[str, Any]]:
        return _dump(who[0].list_adapters(base))

    @app.post("/api/v1/adapters", status_code=201)
    def register_adapter(body: AdapterIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "admin")
        a = reg.register_adapter(
            body.name,
            base=body.base,
            source_dir=Path(body.path),
            parent=body.parent,
            training=e.TrainingRecord(**body.training.model_dump()),
        )
        return asdict(a)

    @app.get("/api/v1/adapters/{name}")
    def get_adapter(name: str, who: Actor) -> dict[str, Any]:
        return asdict(who[0].get_adapter(name))

    @app.get("/api/v1/adapters/{name}/lineage")
    def lineage(name: str, who: Actor) -> list[dict[str, Any]]:
        return _dump(who[0].lineage(name))

    @app.get("/api/v1/tasks/{task}/candidates")
    def list_candidates(task: str, who: Actor) -> list[dict[str, Any]]:
        return _dump(who[0].list_candidates(task))

    @app.post("/api/v1/tasks/{task}/candidates", status_code=201)
    def add_candidate(task: str, body: CandidateIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "admin")
        c = reg.add_candidate(
            task, name=body.name, base=body.base, adapter=body.adapter, kind=body.kind
        )
        return asdict(c)

    @app.get("/api/v1/tasks/{task}/eval-runs")
    def list_eval_runs(task: str, who: Actor, candidate: str | None = None) -> list[dict[str, Any]]:
        runs = who[0].list_eval_runs(task, candidate)
        return [{k: v for k, v in asdict(r).items() if k != "per_query"} for r in runs]

    @app.get("/api/v1/placements")
    def list_placements(who: Actor) -> list[dict[str, Any]]:
        return _dump(who[0].list_placements())

    @app.post("/api/v1/tasks/{task}/placement", status_code=201)
    def set_placement(task: str, body: PlacementIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "admin", "promoter")
        p = reg.set_placement(task, body.candidate, pinned=body.pinned, replicas=body.replicas)
        return asdict(p)

    @app.get("/api/v1/tasks/{task}/promotions")
    def list_promotions(task: str, who: Actor) -> list[dict[str, Any]]:
        """The task's promotion history, newest first."""
        return _dump(who[0].list_promotions(task))

    @app.get("/api/v1/tasks/{task}/candidates/{candidate}/check")
    def check_promotion(task: str, candidate: str, who: Actor) -> dict[str, Any]:
        """The promotion rule's verdict for one challenger, with its evidence. Writes nothing."""
        return asdict(who[0].check_promotion(task, candidate))

    @app.post("/api/v1/tasks/{task}/promote", status_code=201)
    def promote(task: str, body: PromoteIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "promoter", "admin")
        p = reg.promote(
            task,
            body.candidate,
            reason=body.reason,
            override=body.override,
            expected_champion=_expected(body),
        )
        return asdict(p)

    @app.post("/api/v1/tasks/{task}/rollback", status_code=201)
    def rollback(task: str, body: RollbackIn, who: Actor) -> dict[str, Any]:
        reg = writer(who, "promoter", "admin")
        return asdict(reg.rollback(task, reason=body.reason, expected_champion=_expected(body)))

    @app.get("/api/v1/fleet")
    def fleet(who: Actor) -> dict[str, Any]:
        """Workers as last mirrored from their heartbeats, and desired vs reported epochs."""
        reg = who[0]
        return {
            "workers": _dump(reg.list_workers()),
            "placements": [
                {**asdict(p), "converged": p.converged, "converged_workers": p.converged_workers}
                for p in reg.placement_status()
            ],
        }

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    mount_dashboard(app, registry, require_auth=require_auth, session_secret=session_secret)
    mount_docs(app)
    install_error_handlers(app, html=error_page)
    return app
