"""The one error shape and the one list of codes (httpapi): docs, every app's classes, the
sidecar's codes, and the framework's own answers mapped into the shape."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import registry.errors as registry_errors
import serving.gateway.errors as gateway_errors
from httpapi.errors import CODES, ApiError, ErrorCode, code_for_status
from httpapi.handlers import install_error_handlers
from registry.dashboard.session import CsrfRefused
from registry.promotions import PromotionRuleNotMet
from serving import protocol
from tests.conftest import REPO


def error_of(body: dict[str, object]) -> dict[str, object]:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message", "retryable"}, body
    assert isinstance(error["message"], str) and isinstance(error["retryable"], bool)
    assert error["code"] in ErrorCode.__members__, error["code"]
    return error


def test_docs_list_exactly_the_codes_of_the_module() -> None:
    text = (REPO / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \| (yes|no) \| (.+) \|$", text, re.M)
    documented = {
        code: (int(status), retry == "yes", meaning) for code, status, retry, meaning in rows
    }
    assert documented == {
        code.value: (info.status, info.retryable, info.meaning) for code, info in CODES.items()
    }


def test_every_app_and_the_sidecar_use_codes_of_the_list() -> None:
    classes = [
        *(c for c in vars(registry_errors).values() if isinstance(c, type)),
        *(c for c in vars(gateway_errors).values() if isinstance(c, type)),
        CsrfRefused,
        PromotionRuleNotMet,
    ]
    for cls in classes:
        if issubclass(cls, ApiError):
            assert cls.code in ErrorCode.__members__, cls
    assert {c.value for c in protocol.SocketErrorCode} <= set(ErrorCode.__members__)
    rust = "".join(p.read_text() for p in (REPO / "sidecar" / "src").rglob("*.rs"))
    # The sidecar names every code it emits in its typed Code (sidecar/src/protocol/codes.rs).
    sidecar_codes = set(re.findall(r'Code::\w+ => "([A-Z_]+)"', rust))
    assert sidecar_codes and sidecar_codes <= set(ErrorCode.__members__), sidecar_codes


def test_merged_codes_are_gone() -> None:
    # UNKNOWN_TASK became NOT_FOUND and INVALID_INPUT became BAD_REQUEST: one code per meaning.
    assert "UNKNOWN_TASK" not in ErrorCode.__members__
    assert "INVALID_INPUT" not in ErrorCode.__members__
    assert registry_errors.InvalidInput("x").code == gateway_errors.BadRequest("x").code
    assert registry_errors.NotFound("x").code == gateway_errors.UnknownTask("x").code


def test_statuses_follow_the_codes() -> None:
    assert registry_errors.Unauthenticated("x").status == 401
    assert registry_errors.PermissionDenied("x").status == 403
    assert CsrfRefused("x").status == 403 and CsrfRefused("x").code == "CSRF_REFUSED"
    assert registry_errors.Conflict("x").retryable is True
    assert gateway_errors.Unavailable("x", code="NO_WORKER").status == 503
    assert code_for_status(405) is ErrorCode.METHOD_NOT_ALLOWED
    assert code_for_status(418) is ErrorCode.BAD_REQUEST
    assert code_for_status(502) is ErrorCode.INTERNAL


@pytest.fixture
def tiny_app() -> TestClient:
    """A bare app with the shared handlers: what any app gets from `install_error_handlers`."""
    app = FastAPI()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret detail that must not leak")

    @app.get("/items/{n}")
    def item(n: int) -> dict[str, int]:
        return {"n": n}

    install_error_handlers(app)
    return TestClient(app, raise_server_exceptions=False)


def test_framework_answers_and_unexpected_exceptions_use_the_shape(tiny_app: TestClient) -> None:
    r = tiny_app.get("/boom")
    assert r.status_code == 500 and error_of(r.json())["code"] == "INTERNAL"
    assert "secret detail" not in r.text
    r = tiny_app.get("/nowhere")
    assert r.status_code == 404 and error_of(r.json())["code"] == "NOT_FOUND"
    r = tiny_app.post("/boom")
    assert r.status_code == 405 and error_of(r.json())["code"] == "METHOD_NOT_ALLOWED"
    assert r.headers["allow"] == "GET"
    r = tiny_app.get("/items/not-a-number")
    assert r.status_code == 400 and error_of(r.json())["code"] == "BAD_REQUEST"
    assert r.json()["error"]["message"].startswith("path.n:")
