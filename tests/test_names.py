"""Distinct names for distinct things: a newcomer who greps a module or class name lands in one
place. Two `placements.py` (the registry's epochs and the KV publisher), two `fleet.py`, two
`artifacts.py`, two `metrics.py`, two `ErrorCode`s and two `ClassifyRequest`s once sent a search
to two rooms."""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.conftest import REPO

SOURCE = ("contract", "taskfleet", "httpapi", "registry", "evals", "finetune", "serving")
# The same role in each package, by convention: its exceptions, and what every command (CLI)
# or route (dashboard) of one interface shares.
SAME_ROLE = {"__init__.py", "errors.py", "context.py"}


def _modules() -> list[str]:
    return [
        str(path.relative_to(REPO))
        for package in SOURCE
        for path in sorted((REPO / package).rglob("*.py"))
        if "versions" not in path.parts
    ]


def test_no_two_source_modules_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in _modules():
        by_name[module.rsplit("/", 1)[-1]].append(module)
    doubled = {n: paths for n, paths in by_name.items() if len(paths) > 1 and n not in SAME_ROLE}
    assert not doubled, doubled


def test_the_wire_and_the_public_api_name_their_types_apart() -> None:
    """Classes of serving/protocol (the wire) and of httpapi and the gateway (the public API)
    never share a name."""
    classes: dict[str, list[str]] = defaultdict(list)
    for module in _modules():
        if not module.startswith(("serving/protocol", "serving/gateway/", "httpapi/")):
            continue
        for node in ast.parse((REPO / module).read_text()).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name].append(module)
    doubled = {name: where for name, where in classes.items() if len(where) > 1}
    assert not doubled, doubled
