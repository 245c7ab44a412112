"""The registry's boundaries, checked on the code itself (no database, no NATS).

- One abstract store (``registry/store.py``) and one SQLAlchemy implementation of it
  (``registry.Registry``), which holds one repository per entity and inherits nothing but the
  interface; every public method of the implementation is declared by the interface.
- No mixins in ``registry/``: no ``*Mixin`` class, and multiple inheritance only of pure
  interfaces, so what a method does never depends on the order of base classes.
- No module imports another's private (``_name``) helpers, nor reaches for a ``_name`` of
  another module or object: shared code has a public home.
- The promotion rule is judged without a database.
- Gateways and workers load nothing of the registry's database layer: not in the process the
  ``taskfleet gateway``/``taskfleet worker`` commands start, and not anywhere in the import
  graph of the gateway and runtime packages (lazy imports inside functions included).
- The runtime package has no import circle (lazy imports included).
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("registry", "serving", "evals", "finetune", "taskfleet", "httpapi", "migrations")
# What a role without a database may load of the registry: exceptions, plain entities, hashing
# and rules, and the abstract store. Everything else is the database layer.
DATABASE_FREE = {
    "registry",
    "registry.bootstrap",
    "registry.costs",
    "registry.entities",
    "registry.errors",
    "registry.fingerprint",
    "registry.kinds",
    "registry.limits",
    "registry.promotion_rule",
    "registry.recommendation",
    "registry.runtimes",
    "registry.store",
}
ENTITY_MODULES = (
    "suite_versions",
    "tasks",
    "base_models",
    "adapters",
    "candidates",
    "variants",
    "fitted_baselines",
    "endpoint_models",
    "evalruns",
    "placements",
    "promotion_history",
    "promotions",
    "keys",
    "sessions",
    "fleet",
)


def _sources(*roots: str) -> list[Path]:
    return sorted(f for root in roots for f in (REPO / root).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) for every import in the file, at any depth (lazy ones too)."""
    found: list[tuple[str, list[str], int]] = []
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    for node in _walk_run_time(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            names = [a.name for a in node.names]
            found.append((module, names, node.lineno))
            found.extend((LAZY[module, n], [], node.lineno) for n in names if (module, n) in LAZY)
    return found


# Names a package loads on first use (module ``__getattr__``), and the module each loads.
LAZY = {("registry", "Registry"): "registry.service"}


def _walk_run_time(tree: ast.AST) -> list[ast.AST]:
    """Every node that can run: not under ``if TYPE_CHECKING:`` and not in a module
    ``__getattr__`` (its imports are counted where the name is imported, see LAZY)."""
    nodes: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue
        nodes.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return nodes


def test_the_registry_is_one_implementation_of_the_abstract_store(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    from registry import Registry
    from registry import store as s
    from registry.artifacts import ArtifactStore
    from registry.transactions import Transactions

    assert issubclass(Registry, s.AbstractStore)
    assert not Registry.__abstractmethods__, "the implementation leaves methods abstract"
    for view in (s.PublisherStore, s.ControlLoopStore, s.EvalStore):
        assert issubclass(s.AbstractStore, view)
    declared = set(s.AbstractStore.__abstractmethods__)
    facade = {n for n, v in vars(Registry).items() if inspect.isfunction(v) and n[0] != "_"}
    assert facade <= declared, f"Registry: not in AbstractStore: {sorted(facade - declared)}"
    # Nothing connects until a repository opens a transaction.
    held = vars(Registry(Transactions(create_engine("sqlite://")), ArtifactStore(tmp_path)))
    for name in ENTITY_MODULES:
        module = __import__(f"registry.{name}", fromlist=["_"])
        stores = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__ and c.__name__.endswith("Repository")
        ]
        assert len(stores) == 1, f"registry/{name}.py should hold one entity repository"
        assert stores[0].__bases__ == (object,), f"{stores[0].__name__} inherits behaviour"
        assert any(isinstance(v, stores[0]) for v in held.values()), f"Registry holds no {name}"


def _registry_classes() -> list[type]:
    classes = []
    for path in _sources("registry"):
        module = __import__(_module_name(path), fromlist=["_"])
        classes += [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__
        ]
    return classes


def _is_interface(cls: type) -> bool:
    """An abstract class that implements nothing itself: every method it defines is abstract."""
    from abc import ABC

    own = [v for v in vars(cls).values() if inspect.isfunction(v)]
    return issubclass(cls, ABC) and all(getattr(f, "__isabstractmethod__", False) for f in own)


def test_the_registry_has_no_mixins() -> None:
    """Behaviour is composed by holding parts, never by stacking base classes: no ``*Mixin``,
    and a class with several bases (the interfaces of ``registry/store.py``) inherits only
    pure interfaces; ``Registry`` itself inherits nothing concrete."""
    from abc import ABC

    from registry import Registry

    classes = _registry_classes()
    assert len(classes) > 50, "the walk found too few classes (did the layout change?)"
    offences = [c.__qualname__ for c in classes if c.__name__.endswith("Mixin")]
    offences += [
        f"{c.__module__}.{c.__qualname__}({', '.join(b.__name__ for b in c.__bases__)})"
        for c in classes
        if len(c.__bases__) > 1 and not all(_is_interface(b) for b in c.__bases__)
    ]
    assert not offences, offences
    inherited = [c for c in Registry.__mro__[1:] if c not in (object, ABC)]
    assert inherited and all(c.__module__ == "registry.store" for c in inherited), inherited
    assert all(_is_interface(c) for c in inherited), [
        c.__name__ for c in inherited if not _is_interface(c)
    ]


def test_the_narrow_views_are_what_their_callers_use() -> None:
    """The publisher and the fleet watcher call only what their view declares."""
    from registry import store as s

    callers = {
        "serving/publisher.py": s.PublisherStore,
        "serving/directory.py": s.PublisherStore,
        "serving/fleet_watcher.py": s.WorkerReportSink,
        "evals/runner.py": s.EvalStore,
    }
    for rel, view in callers.items():
        tree = ast.parse((REPO / rel).read_text())
        called = {
            node.attr
            for node in ast.walk(tree)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name | ast.Attribute)
                and (getattr(node.value, "id", None) in ("registry", "reg"))
            )
            or (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "registry"
            )
        }
        assert called, f"{rel}: found no calls on the registry (did the name change?)"
        assert called <= set(view.__abstractmethods__), f"{rel}: {sorted(called)}"


def test_no_module_imports_another_modules_private_names() -> None:
    offences = []
    own = set(PACKAGES)
    for path in _sources(*PACKAGES, "benchmarks", "testbed"):
        for module, names, line in _imports(path):
            if module.split(".")[0] not in own:
                continue
            private_module = any(p.startswith("_") and p != "__init__" for p in module.split("."))
            private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private_module or private_names:
                offences.append(f"{path.relative_to(REPO)}:{line} {module} {private_names}")
    assert not offences, "\n".join(offences)


# Methods of the standard library whose names start with "_" but are public API.
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make"}


def test_no_code_reaches_for_another_objects_private_names() -> None:
    """A ``_name`` is read only on ``self`` or ``cls``: not on another module
    (``module._helper``), nor on another object (``registry._sessions``, ``self.tx._engine``)."""
    offences = []
    for path in _sources(*PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in PUBLIC_UNDERSCORE:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            offences.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not offences, "\n".join(offences)


def _import_closure(start: list[str]) -> set[str]:
    """Every project module reachable from ``start`` through imports at any depth."""
    files = {_module_name(p): p for p in _sources(*PACKAGES)}
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent packages
        for module, names, _ in _imports(files[name]):
            todo.append(module)
            todo.extend(f"{module}.{n}" for n in names)  # `from pkg import submodule`
    return seen


@pytest.mark.parametrize("package", ["serving/gateway", "serving/runtime"])
def test_gateway_and_runtime_reach_no_database_layer_in_the_import_graph(package: str) -> None:
    start = [_module_name(p) for p in _sources(package)]
    reached = _import_closure(start)
    registry_modules = {m for m in reached if m.split(".")[0] == "registry"}
    assert registry_modules <= DATABASE_FREE, sorted(registry_modules - DATABASE_FREE)


def _project_imports(name: str, path: Path, files: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports at any depth (lazy ones too), not counting its own
    parent packages (every submodule runs those first; that is no circle)."""
    parents = {".".join(name.split(".")[:i]) for i in range(1, len(name.split(".")))}
    found: set[str] = set()
    for module, names, _ in _imports(path):
        found.update(m for m in (module, *(f"{module}.{n}" for n in names)) if m in files)
    return found - parents - {name}


def _import_circles(package: str) -> list[list[str]]:
    """The import circles among the modules of ``package``: each strongly connected group of
    modules that reach each other through imports (Tarjan's algorithm)."""
    files = {_module_name(p): p for p in _sources(package)}
    edges = {name: _project_imports(name, path, files) for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(files):
        if name not in index:
            visit(name)
    return circles


def test_the_runtime_package_has_no_import_circle() -> None:
    """Each module of ``serving/runtime`` can be read bottom-up: none imports (inside a
    function too) a module that imports it back, directly or through others. The encoder and
    ``onnx_variant.py`` once did: the loader imported the variant's model inside a function,
    the variant the manifest's name from the encoder."""
    files = {_module_name(p): p for p in _sources("serving/runtime")}
    assert len(files) > 10, "the walk found too few modules (did the layout change?)"
    circles = _import_circles("serving/runtime")
    assert not circles, circles
    # The walk sees imports inside functions, where the old circle hid.
    loader = "serving.runtime.model_loading"
    assert "serving.runtime.onnx_variant" in _project_imports(loader, files[loader], files)


def _lazy_imports_of(command: str) -> list[str]:
    """The modules a CLI command function imports in its body."""
    for path in _sources("taskfleet"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == command:
                return [
                    n.module
                    for n in ast.walk(node)
                    if isinstance(n, ast.ImportFrom) and n.module is not None
                ]
    raise AssertionError(f"no CLI command {command!r}")


def _database_modules_after(code: str) -> set[str]:
    """The registry, SQLAlchemy and Alembic modules a fresh interpreter holds after ``code``."""
    script = (
        "import importlib, json, sys\n" + code + "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('registry', 'sqlalchemy', 'alembic'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_gateway_and_worker_commands_load_no_database_layer() -> None:
    """What `taskfleet gateway` and `taskfleet worker` load before they run: the CLI itself,
    what the two commands import, and the runtime server a worker's sidecar starts."""
    modules = ["taskfleet.cli", "serving.runtime.server"]
    modules += _lazy_imports_of("gateway") + _lazy_imports_of("worker")
    assert "serving.gateway" in modules and "taskfleet.stack" in modules
    loaded = _database_modules_after(f"for m in {modules!r}: importlib.import_module(m)\n")
    assert not {m for m in loaded if not m.startswith("registry")}, "SQLAlchemy/Alembic loaded"
    assert loaded <= DATABASE_FREE, sorted(loaded - DATABASE_FREE)


def test_the_promotion_rule_is_judged_without_a_database() -> None:
    """The rule is a pure function of its evidence: importing and judging it loads neither
    SQLAlchemy nor any module of the registry's database layer."""
    reached = _import_closure(["registry.promotion_rule"])
    assert {m for m in reached if m.split(".")[0] == "registry"} <= DATABASE_FREE
    loaded = _database_modules_after(
        "from registry.promotion_rule import Contender, Evidence, judge\n"
        "judge(Evidence('t', 'retrieval', 0.0, None, Contender('a', 'bm25', None, None, None),"
        " None))\n"
    )
    assert loaded <= DATABASE_FREE, sorted(loaded - DATABASE_FREE)


def test_the_check_sees_the_database_layer() -> None:
    """The closure walk is not blind: from the CLI it does reach the SQLAlchemy modules."""
    reached = _import_closure(["taskfleet.cli_registry"])
    assert {"registry.service", "registry.models", "registry.db"} <= reached
