"""Declaring suites from the shell: read a folder (or a built-in declaration, or an MTEB task)
through the eval harness, then register the version in the registry.

The CLI and the control plane's REST API both declare suites through here; the registry itself
never reads suite data (it must not import the eval harness).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.entities import Suite, SuiteCreate

if TYPE_CHECKING:
    from registry import Registry


@dataclass(frozen=True)
class SuiteDeclaration:
    """What a user declares (CLI flags or the REST body)."""

    name: str
    kind: str | None = None
    path: Path | None = None
    mteb_task: str | None = None
    test_split: str | None = None
    train_split: str | None = None
    main_metric: str | None = None
    description: str = ""


@dataclass(frozen=True)
class Registered:
    suite: Suite
    created: bool
    split_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    builtin: bool = False


def read_declaration(
    declaration: SuiteDeclaration, *, data_root: Path | None, mteb_dir: Path
) -> tuple[SuiteCreate, dict[str, dict[str, int]], bool]:
    """Read and fingerprint a declaration; nothing is registered. Returns (record, counts,
    whether it is the built-in declaration)."""
    from evals.errors import SuiteDataError
    from evals.suites import builtin_declarations, declare, declare_builtin

    d = declaration
    if d.path is not None and d.mteb_task is not None:
        raise SuiteDataError("give either --path or --mteb, not both")
    if d.mteb_task is not None:
        from evals.mteb_suites import declare_mteb

        create, counts = declare_mteb(
            d.name, d.mteb_task, mteb_dir / d.name, main_metric=d.main_metric
        )
        return create, counts, False
    if d.path is None:
        if d.name in builtin_declarations() and d.kind is None:
            create, counts = declare_builtin(d.name, data_root)
            return create, counts, True
        raise SuiteDataError(f"suite {d.name!r}: give --kind and --path DIR (or --mteb TASK_NAME)")
    if d.kind is None:
        raise SuiteDataError("--kind is required with --path (retrieval, rerank or classification)")
    create, counts = declare(
        d.name,
        d.kind,
        d.path.expanduser().resolve(),
        test_split=d.test_split,
        train_split=d.train_split,
        main_metric=d.main_metric,
        description=d.description,
        data_root=data_root,
    )
    return create, counts, False


def register_suite(
    reg: Registry, declaration: SuiteDeclaration, *, data_root: Path | None, mteb_dir: Path
) -> Registered:
    create, counts, builtin = read_declaration(declaration, data_root=data_root, mteb_dir=mteb_dir)
    suite, created = reg.add_suite(create)
    return Registered(suite, created, counts, builtin)


def ensure_suite(
    reg: Registry, name: str, *, data_root: Path | None, mteb_dir: Path
) -> Registered | None:
    """The first time a task names a built-in suite, register its declaration; a suite that is
    already registered (or unknown) is left to the registry to resolve."""
    from evals.suites import builtin_declarations
    from registry.errors import NotFound

    try:
        reg.get_suite(name)
        return None
    except NotFound:
        if name not in builtin_declarations():
            return None
    return register_suite(reg, SuiteDeclaration(name), data_root=data_root, mteb_dir=mteb_dir)


def rest_suite_reader(*, data_root: Path | None, mteb_dir: Path) -> Callable[[Any], SuiteCreate]:
    """The control plane's `POST /api/v1/suites` reader: a refused declaration becomes the
    registry's InvalidInput (400 in the one error shape)."""
    from evals.errors import EvalError
    from registry.errors import InvalidInput

    def read(body: Any) -> SuiteCreate:
        declaration = SuiteDeclaration(
            name=body.name,
            kind=body.kind,
            path=Path(body.path) if body.path else None,
            mteb_task=body.mteb_task,
            test_split=body.test_split,
            train_split=body.train_split,
            main_metric=body.main_metric,
            description=body.description,
        )
        try:
            create, _, _ = read_declaration(declaration, data_root=data_root, mteb_dir=mteb_dir)
        except EvalError as exc:
            raise InvalidInput(str(exc)) from None
        return create

    return read
