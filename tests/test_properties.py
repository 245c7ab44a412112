"""Property tests (hypothesis) on the decoders the control plane owns: the dashboard's form
bodies, the placement route's values, the bearer header, and the placement values the
publisher reads back from NATS KV. Bounded (`EXAMPLES`), derandomized for repeatable CI.

(Suite files are not decoded by the control plane yet: suites are declared in code.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from httpapi.tokens import bearer_token
from registry import Registry
from registry.api import create_app
from registry.placements import MAX_REPLICAS
from registry.throttle import LoginThrottle
from serving import protocol as p
from serving.publisher import decode_placement
from tests.test_dashboard_pages import (
    CHALLENGER,
    CHAMPION,
    TASK,
    WEAK,
    form_token,
    login,
    seed_fleet,
)

EXAMPLES = 40
bounded = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=5,
)
form_text = st.text(max_size=60) | st.sampled_from(["", "(none)", CHAMPION, CHALLENGER, "1"])


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    tmp = tmp_path_factory.mktemp("props")
    reg = Registry.open(f"sqlite:///{tmp / 'r.db'}", artifact_dir=tmp / "artifacts", actor="cli")
    seed_fleet(reg, tmp)
    try:
        yield reg
    finally:
        reg.close()


# ---- the placement route's values ----------------------------------------------------------
@pytest.fixture(scope="module")
def local_client(seeded: Registry) -> TestClient:
    return TestClient(create_app(seeded, require_auth=False))


@bounded
@given(
    pinned=st.booleans() | json_values,
    replicas=st.integers(min_value=1, max_value=4)
    | st.integers()
    | st.sampled_from([1e30, 2**31, 2**63, 1.5, -1])
    | json_values,
    candidate=st.sampled_from([None, CHAMPION, CHALLENGER, WEAK]) | json_values,
)
def test_placement_values(
    seeded: Registry, local_client: TestClient, pinned: Any, replicas: Any, candidate: Any
) -> None:
    client = local_client
    before = seeded.current_placement(TASK)
    assert before is not None
    champion = seeded.champion(TASK)
    assert champion is not None
    body = {"pinned": pinned, "replicas": replicas, "candidate": candidate}
    r = client.post(f"/api/v1/tasks/{TASK}/placement", json=body)
    after = seeded.current_placement(TASK)
    assert after is not None and r.status_code in (201, 400), r.text
    if r.status_code == 400:
        assert set(r.json()) == {"error"} and after == before  # refused: nothing written
        return
    # Accepted: only values a careful reader would accept, and never another candidate.
    assert candidate in (None, champion.name)
    assert replicas is None or (isinstance(replicas, int | float) and 1 <= replicas <= MAX_REPLICAS)
    assert after.candidate == champion.name
    changed = (after.pinned, after.replicas) != (before.pinned, before.replicas)
    assert after.epoch == before.epoch + (1 if changed else 0)
    if changed:
        assert seeded.list_promotions(TASK)[0].epoch == after.epoch  # in the history


# ---- dashboard forms ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def promoter_client(seeded: Registry) -> tuple[TestClient, str]:
    """A signed-in promoter and the session's CSRF token."""
    client = TestClient(create_app(seeded), follow_redirects=False)
    login(client, seeded.create_api_key("prop-pat", roles=["promoter"])[1])
    return client, form_token(client.get("/login").text)


@bounded
@given(expected=form_text, reason=form_text, override=form_text, which=st.booleans())
def test_promotion_forms_change_nothing_unless_they_saw_the_champion(
    seeded: Registry, promoter_client: tuple[TestClient, str], expected: str, reason: str,
    override: str, which: bool,
) -> None:  # fmt: skip
    client, token = promoter_client
    before = seeded.champion(TASK)
    assert before is not None
    target = CHALLENGER if before.name == CHAMPION else CHAMPION
    data = {"csrf_token": token, "expected_champion": expected, "reason": reason}
    if override:
        data["override"] = override
    url = f"/tasks/{TASK}/promote/{target}" if which else f"/tasks/{TASK}/rollback"
    r = client.post(url, data=data)
    assert r.status_code in (303, 400, 403), r.text[:300]
    after = seeded.champion(TASK)
    assert after is not None
    if after.name != before.name:
        assert expected == before.name  # a stale or unspecific form never changes anything
        assert after.name == target and r.status_code == 303


@pytest.fixture(scope="module")
def login_client(seeded: Registry) -> tuple[TestClient, str]:
    """A fresh session and a valid viewer key (no throttling here)."""
    app = create_app(seeded, throttle=LoginThrottle(max_per_client=10**9))
    client = TestClient(app, follow_redirects=False)
    return client, seeded.create_api_key("prop-vic", roles=["viewer"])[1]


tricky_targets = st.sampled_from(
    ["/\\evil.example", "/\t/evil.example", "//x", "https://x", "/tasks\n", "javascript:x"]
)


@bounded
@given(api_key=form_text, valid=st.booleans(), next_=st.text(max_size=40) | tricky_targets)
def test_login_form_never_redirects_off_site(
    login_client: tuple[TestClient, str], api_key: str, valid: bool, next_: str
) -> None:
    client, key = login_client
    token = form_token(client.get("/login").text)  # a successful login renews it
    data = {"csrf_token": token, "api_key": key if valid else api_key, "next": next_}
    r = client.post("/login", data=data)
    assert r.status_code in (303, 401, 403, 429), r.text[:300]
    login_page = r.text if r.status_code != 303 else ""
    for location in [r.headers.get("location", ""), *re_next(login_page)]:
        if location:
            cleaned = location.replace("\\", "/")
            assert cleaned.startswith("/") and not cleaned.startswith("//"), location
            assert not any(ord(c) < 32 for c in location), location


def re_next(page: str) -> list[str]:
    import html
    import re

    return [html.unescape(v) for v in re.findall(r'name="next" value="([^"]*)"', page)]


# ---- the bearer header and KV placement values ---------------------------------------------
@settings(max_examples=300, database=None, derandomize=True)
@given(header=st.text(max_size=40), token=st.text(min_size=1, max_size=30))
def test_bearer_header(header: str, token: str) -> None:
    parsed = bearer_token(header)
    assert parsed is None or (parsed and parsed == parsed.strip())
    for scheme in ("Bearer", "bearer", "BEARER"):
        expected = token.strip() or None
        if expected is not None and " " not in expected:
            assert bearer_token(f"{scheme} {token}") == expected


placement_values = st.builds(
    p.PlacementValue,
    task=st.text(max_size=20),
    epoch=st.integers(min_value=0, max_value=2**40),
    candidate=st.text(max_size=20),
    model_key=st.text(max_size=20),
    base=st.builds(p.Artifact, sha256=st.text(max_size=64), size=st.integers(0, 2**50)),
    adapter=st.none()
    | st.builds(p.Artifact, sha256=st.text(max_size=64), size=st.integers(0, 2**50)),
    query_prefix=st.text(max_size=10),
    passage_prefix=st.text(max_size=10),
    max_seq_length=st.none() | st.integers(min_value=0, max_value=2**20),
    pinned=st.booleans(),
    replicas=st.integers(min_value=1, max_value=MAX_REPLICAS),
    memory_bytes=st.integers(min_value=0, max_value=2**50),
)


@settings(max_examples=200, database=None, derandomize=True)
@given(value=placement_values)
def test_placement_values_round_trip(value: p.PlacementValue) -> None:
    assert decode_placement(p.pack(value)) == value


def _packs(value: object) -> bool:
    """msgpack holds integers of 64 bits at most; json_values draws any integer."""
    try:
        msgpack.packb(value)
    except OverflowError:
        return False
    return True


@settings(max_examples=300, database=None, derandomize=True)
@given(data=st.binary(max_size=64) | json_values.filter(_packs).map(lambda v: msgpack.packb(v)))
def test_garbage_under_a_placement_key_is_a_protocol_error(data: bytes) -> None:
    # The publisher treats a ProtocolError as "garbage: replace it"; anything else would crash
    # its loop.
    with contextlib.suppress(p.ProtocolError):
        decode_placement(data)
