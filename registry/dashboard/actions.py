"""The dashboard's forms (POST): log in and out, promote, roll back, start and stop a shadow.

Every POST checks the session's CSRF token first, and its fields by the REST API's own bodies
(`registry/rest_bodies.py`). Promotion forms carry the champion the user saw, so a form that
went stale while open changes nothing; outcomes are flashed and the browser is redirected
(post/redirect/get), so a reload never submits twice.
"""

# No `from __future__ import annotations`: FastAPI resolves the `Annotated` parameters below
# at runtime.
from typing import Annotated
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from starlette.responses import RedirectResponse, Response

from httpapi.handlers import error_response as json_error
from registry.access import Principal, authenticate, client_of
from registry.dashboard.context import Dashboard
from registry.dashboard.rendering import DashboardRoute, render, wants_json
from registry.dashboard.session import check_csrf, end_session, flash, sign_in
from registry.errors import Conflict, InvalidInput, PermissionDenied, Unauthenticated
from registry.rest_bodies import PromoteIn, RollbackIn, ShadowIn, ShadowStopIn, checked
from registry.throttle import RateLimited

FormField = Annotated[str, Form()]
OptionalField = Annotated[str | None, Form()]


def action_router(dash: Dashboard) -> APIRouter:
    router = APIRouter(route_class=DashboardRoute, include_in_schema=False)
    SignedIn = Annotated[Principal, Depends(dash.user)]
    reg = dash.registry

    @router.get("/login")
    def login_form(request: Request, next: str = "/tasks") -> Response:
        if not dash.require_auth:
            return _redirect(_local(next))
        return render(request, "login.html", next=_local(next), error=None)

    @router.post("/login")
    def login(
        request: Request, csrf_token: FormField = "", api_key: FormField = "", next: FormField = ""
    ) -> Response:
        check_csrf(request, csrf_token)
        throttle, client = dash.control.throttle, client_of(request)
        try:
            key = authenticate(reg, throttle, api_key.strip(), client)
            sign_in(request, reg, key)
        except (Unauthenticated, RateLimited, PermissionDenied) as exc:
            # Unknown, malformed or revoked (401); throttled (429); a real key, but not one
            # for people (403, caller only).
            if wants_json(request):
                return json_error(exc)
            page = render(request, "login.html", exc.status, next=_local(next), error=exc.message)
            if exc.retry_after_s is not None:
                page.headers["Retry-After"] = str(exc.retry_after_s)
            return page
        return _redirect(_local(next))

    @router.post("/logout")
    def logout(request: Request, csrf_token: FormField = "") -> Response:
        check_csrf(request, csrf_token)
        end_session(request, reg)  # server-side: a copy of the cookie is worthless now
        return _redirect("/login")

    @router.post("/tasks/{task}/promote/{candidate}")
    def promote(
        request: Request,
        task: str,
        candidate: str,
        user: SignedIn,
        csrf_token: FormField = "",
        expected_champion: OptionalField = None,
        reason: FormField = "",
        override: FormField = "",
    ) -> Response:
        check_csrf(request, csrf_token)
        expected = _expected(expected_champion)
        try:
            body = checked(
                PromoteIn,
                candidate=candidate,
                reason=reason.strip(),
                override=bool(override),
                expected_champion=expected,
            )
            done = dash.acting(user).promote(
                task,
                body.candidate,
                reason=body.reason,
                override=body.override,
                expected_champion=body.expected_champion,
            )
        except Conflict as exc:
            return _after_conflict(request, task, candidate, exc)
        except InvalidInput as exc:  # a bad field, the rule not met, an override without reason
            flash(request, "error", f"Not promoted: {exc}")
            return _redirect(f"/tasks/{_q(task)}/promote/{_q(candidate)}")
        flash(
            request,
            "ok",
            f"Promoted {done.candidate} to champion of {task} (placement epoch {done.epoch}). "
            "The task page shows when the epoch is published and the workers report it.",
        )
        return _redirect(f"/tasks/{_q(task)}")

    @router.post("/tasks/{task}/rollback")
    def rollback(
        request: Request,
        task: str,
        user: SignedIn,
        csrf_token: FormField = "",
        expected_champion: OptionalField = None,
        reason: FormField = "",
    ) -> Response:
        check_csrf(request, csrf_token)
        expected = _expected(expected_champion)
        try:
            body = checked(RollbackIn, reason=reason.strip(), expected_champion=expected)
            done = dash.acting(user).rollback(
                task, reason=body.reason, expected_champion=body.expected_champion
            )
        except (Conflict, InvalidInput) as exc:  # a bad field, stale form, no previous champion
            flash(request, "error", f"Nothing rolled back: {exc}")
            return _redirect(f"/tasks/{_q(task)}")
        flash(
            request,
            "ok",
            f"Rolled {task} back to {done.candidate} (placement epoch {done.epoch}).",
        )
        return _redirect(f"/tasks/{_q(task)}")

    @router.post("/tasks/{task}/shadow")
    def start_shadow(
        request: Request,
        task: str,
        user: SignedIn,
        csrf_token: FormField = "",
        candidate: FormField = "",
        sample_rate: FormField = "",
        reason: FormField = "",
    ) -> Response:
        check_csrf(request, csrf_token)
        back = f"/tasks/{_q(task)}/production"
        try:
            body = checked(
                ShadowIn, candidate=candidate, sample_rate=sample_rate, reason=reason.strip()
            )
            done = dash.acting(user).start_shadow(
                task, body.candidate, sample_rate=body.sample_rate, reason=body.reason
            )
        except (Conflict, InvalidInput) as exc:
            flash(request, "error", f"No shadow started: {exc}")
            return _redirect(back)
        flash(
            request,
            "ok",
            f"{done.candidate} shadows {task} now, on {done.sample_rate:g} of its requests "
            f"(shadow epoch {done.epoch}).",
        )
        return _redirect(back)

    @router.post("/tasks/{task}/shadow/stop")
    def stop_shadow(
        request: Request,
        task: str,
        user: SignedIn,
        csrf_token: FormField = "",
        reason: FormField = "",
    ) -> Response:
        check_csrf(request, csrf_token)
        back = f"/tasks/{_q(task)}/production"
        try:
            body = checked(ShadowStopIn, reason=reason.strip())
            done = dash.acting(user).stop_shadow(task, reason=body.reason)
        except InvalidInput as exc:
            flash(request, "error", f"Nothing stopped: {exc}")
            return _redirect(back)
        flash(request, "ok", f"The shadow {done.candidate} of {task} is stopped.")
        return _redirect(back)

    def _after_conflict(request: Request, task: str, candidate: str, exc: Conflict) -> Response:
        now = reg.champion(task)
        if now is not None and now.name == candidate:
            # Typically a double click: the first submit promoted it, the second found it done.
            flash(
                request, "info", f"{candidate} is already the champion; nothing more was changed."
            )
        else:
            flash(request, "error", f"Not promoted: {exc}")
        return _redirect(f"/tasks/{_q(task)}")

    return router


# What a confirmation form sends when it saw no champion (a first promotion). Not a possible
# candidate name; an empty field cannot say it, because the form parser turns it into "absent".
NO_CHAMPION = "(none)"


def _expected(field: str | None) -> str | None:
    """The champion the form saw (NO_CHAMPION: none). A form without the field is refused: it
    cannot prove it is not stale."""
    if field is None:
        raise InvalidInput("this form does not say which champion it saw; reload the page")
    return None if field == NO_CHAMPION else field


def _local(target: str) -> str:
    """Only same-site paths: an attacker must not turn the login page into an open redirect.
    Browsers read `/\\host` as `//host` and drop tabs and newlines, so those are refused too."""
    cleaned = target.replace("\\", "/")
    if any(ord(c) < 32 or ord(c) == 127 for c in target):
        return "/tasks"
    parts = urlsplit(cleaned)
    if not cleaned.startswith("/") or cleaned.startswith("//") or parts.scheme or parts.netloc:
        return "/tasks"
    return target


def _q(value: str) -> str:
    return quote(value, safe="")


def _redirect(url: str) -> Response:
    return RedirectResponse(url, status_code=303)
