"""`benchmarks` is a package run as ``python -m benchmarks.NAME``; what it shares with the tests
lives in `testbed`. Checked on the code itself: neither imports `tests` (lazy imports inside
functions included), neither edits ``sys.path``, and every command the Makefile's bench target
runs names a module that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = ("benchmarks", "testbed")


def _sources() -> list[Path]:
    return sorted(f for root in SHARED for f in (REPO / root).rglob("*.py"))


def _imported(tree: ast.AST) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, node.lineno))
    return found


def _edits_sys_path(node: ast.AST) -> bool:
    """``sys.path.insert(...)``/``append``/``extend`` or an assignment to ``sys.path``."""

    def is_sys_path(n: ast.AST) -> bool:
        return (
            isinstance(n, ast.Attribute)
            and n.attr == "path"
            and isinstance(n.value, ast.Name)
            and n.value.id == "sys"
        )

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return is_sys_path(node.func.value)
    if isinstance(node, ast.Assign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t) for t in targets)
    return False


def test_benchmarks_and_testbed_import_nothing_from_tests() -> None:
    offences = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _sources()
        for module, line in _imported(ast.parse(path.read_text(), str(path)))
        if module == "tests" or module.startswith("tests.")
    ]
    assert not offences, "\n".join(offences)


def test_no_sys_path_edits() -> None:
    offences = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if _edits_sys_path(node)
    ]
    assert not offences, "sys.path edited (run as python -m benchmarks.NAME):\n" + "\n".join(
        offences
    )


def test_the_check_sees_a_sys_path_edit_and_a_tests_import() -> None:
    """Not blind: the two checks catch what the benchmarks did before they were a package."""
    tree = ast.parse(
        "import sys\nsys.path.insert(0, '.')\nfrom tests.fleet_fixture import LocalFleet\n"
    )
    assert any(_edits_sys_path(n) for n in ast.walk(tree))
    assert ("tests.fleet_fixture", 3) in _imported(tree)


def test_every_bench_command_names_a_module_of_the_package() -> None:
    makefile = (REPO / "Makefile").read_text()
    modules = re.findall(r"-m benchmarks\.(\w+)", makefile)
    assert len(modules) >= 10, "the bench target runs the benchmarks as modules"
    missing = [m for m in modules if not (REPO / "benchmarks" / f"{m}.py").is_file()]
    assert not missing, missing
    as_files = re.findall(r"\$\(PY\) benchmarks/\S+", makefile)
    assert not as_files, f"run as files, not modules: {as_files}"
