"""The dashboard's pages (GET): tasks, one task and its production view, one candidate,
confirmations, the fleet."""

# No `from __future__ import annotations`: FastAPI resolves the `Annotated` dependencies below
# at runtime.
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import RedirectResponse, Response

from registry.access import Principal
from registry.dashboard.actions import NO_CHAMPION
from registry.dashboard.charts import agreement_chart, leaderboard_chart
from registry.dashboard.context import Dashboard
from registry.dashboard.production_page import production_page
from registry.dashboard.rendering import DashboardRoute, render
from registry.dashboard.views import (
    fleet_page,
    lineage_tree,
    suite_page,
    suites_page,
    task_page,
    task_summaries,
)
from registry.errors import PermissionDenied


def page_router(dash: Dashboard) -> APIRouter:
    router = APIRouter(route_class=DashboardRoute, include_in_schema=False)
    SignedIn = Annotated[Principal, Depends(dash.user)]
    reg = dash.registry

    @router.get("/")
    def home() -> Response:
        return RedirectResponse("/tasks", status_code=303)

    @router.get("/tasks")
    def tasks(request: Request, user: SignedIn) -> Response:
        return render(request, "tasks.html", summaries=task_summaries(reg, user))

    @router.get("/tasks/{task}")
    def task(request: Request, task: str, user: SignedIn) -> Response:
        page = task_page(reg, task)
        chart = leaderboard_chart(page.standings, metric=page.main_metric, margin=page.task.margin)
        return render(request, "task.html", page=page, chart=chart)

    @router.get("/tasks/{task}/production")
    def production(request: Request, task: str, user: SignedIn) -> Response:
        page = production_page(reg, task)
        return render(request, "production.html", page=page, chart=agreement_chart(page.agreement))

    @router.get("/tasks/{task}/candidates/{candidate}")
    def candidate(request: Request, task: str, candidate: str, user: SignedIn) -> Response:
        cand = reg.get_candidate(task, candidate)
        champ = reg.champion(task)
        is_champion = champ is not None and champ.id == cand.id
        return render(
            request,
            "candidate.html",
            task=reg.get_task(task),
            cand=cand,
            champion=champ,
            is_champion=is_champion,
            check=None if is_champion else reg.check_promotion(task, candidate),
            runs=reg.list_eval_runs(task, candidate),
            ranking=reg.ranking_run(task, candidate),
            adapter=reg.get_adapter(cand.adapter) if cand.adapter else None,
            tree=lineage_tree(reg, cand),
        )

    @router.get("/tasks/{task}/promote/{candidate}")
    def confirm_promote(request: Request, task: str, candidate: str, user: SignedIn) -> Response:
        _require_promoter(user)
        champ = reg.champion(task)
        return render(
            request,
            "confirm_promote.html",
            task=reg.get_task(task),
            cand=reg.get_candidate(task, candidate),
            champion=champ,
            check=reg.check_promotion(task, candidate),
            run=reg.ranking_run(task, candidate),
            champion_run=reg.ranking_run(task, champ.name) if champ else None,
            no_champion=NO_CHAMPION,
        )

    @router.get("/tasks/{task}/rollback")
    def confirm_rollback(request: Request, task: str, user: SignedIn) -> Response:
        _require_promoter(user)
        history = reg.list_promotions(task)
        return render(
            request,
            "confirm_rollback.html",
            task=reg.get_task(task),
            last=history[0] if history else None,
        )

    @router.get("/suites")
    def suites(request: Request, user: SignedIn) -> Response:
        return render(request, "suites.html", rows=suites_page(reg, user))

    @router.get("/suites/{name}")
    def suite(request: Request, name: str, user: SignedIn) -> Response:
        return render(request, "suite.html", page=suite_page(reg, user, name))

    @router.get("/fleet")
    def fleet(request: Request, user: SignedIn) -> Response:
        return render(
            request, "fleet.html", fleet=fleet_page(reg, user, stale_after_s=dash.stale_after_s)
        )

    return router


def _require_promoter(user: Principal) -> None:
    if not user.can_promote:
        raise PermissionDenied("promoting and rolling back need the promoter or admin role")
