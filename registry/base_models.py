"""Base models: weights registered by folder or by a Python package that ships them,
identified by the sha256 over their files (``registry/fingerprint.py``), with the runtimes that
may serve them. Optimised variants of a model are base models too (``registry/variants.py``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from sqlalchemy import select

from registry import entities as e
from registry.errors import AlreadyExists, InvalidInput, NotFound
from registry.fingerprint import read_sentence_transformer_info, tree_sha256
from registry.kinds import check_name
from registry.models import BaseModelRow
from registry.rows import get_model_row, model_entity
from registry.runtimes import DEFAULT_RUNTIME, VARIANT_RUNTIMES, check_runtime_kinds
from registry.transactions import Transactions


def resolve_package_model(package: str) -> Path:
    """A base model shipped inside a Python package exposes `get_model_path()`."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise InvalidInput(f"model package {package!r} is not installed") from None
    getter = getattr(module, "get_model_path", None)
    if getter is None:
        raise InvalidInput(f"package {package!r} has no get_model_path()")
    return Path(getter())


class BaseModelRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def add_model(
        self,
        name: str,
        *,
        path: Path | None = None,
        package: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        runtime_kinds: list[str] | None = None,
    ) -> e.BaseModel:
        check_name("model", name)
        kinds = check_runtime_kinds(runtime_kinds or [DEFAULT_RUNTIME])
        if (path is None) == (package is None):
            raise InvalidInput("give exactly one of a weights path or a package reference")
        folder = resolve_package_model(package) if package else Path(path or "").expanduser()
        if not folder.exists():
            raise InvalidInput(f"weights path does not exist: {folder}")
        if not folder.is_dir():
            raise InvalidInput(f"weights path is not a folder: {folder}")
        if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
            raise InvalidInput(f"not a sentence-transformers/transformers model folder: {folder}")
        with self.tx.read() as s:  # fail fast before hashing hundreds of MB
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == name)):
                raise AlreadyExists(f"model {name!r} already exists")
        digest = tree_sha256(folder)
        info = read_sentence_transformer_info(folder)
        with self.tx.write() as s:
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == name)):
                raise AlreadyExists(f"model {name!r} already exists")
            row = BaseModelRow(
                name=name,
                path=None if package else str(folder.resolve()),
                package=package,
                sha256=digest.sha256,
                dims=info.dims,
                max_seq_length=info.max_seq_length,
                size_bytes=digest.size_bytes,
                runtime_kinds=kinds,
                query_prefix=query_prefix,
                passage_prefix=passage_prefix,
            )
            s.add(row)
            s.flush()
            self.tx.audit(s, "model.add", "base_model", name, {"sha256": digest.sha256})
            return model_entity(s, row)

    def set_model_runtimes(self, name: str, runtime_kinds: list[str]) -> e.BaseModel:
        """Which runtimes may serve the model (a placement on one still needs its eval run)."""
        kinds = check_runtime_kinds(runtime_kinds)
        with self.tx.write() as s:
            row = get_model_row(s, name)
            if row.variant is not None and set(kinds) - set(VARIANT_RUNTIMES):
                raise InvalidInput(
                    f"model {name!r} is an {row.variant} variant: only the Python runtime "
                    f"({', '.join(VARIANT_RUNTIMES)}) runs it"
                )
            previous = list(row.runtime_kinds)
            row.runtime_kinds = kinds
            self.tx.audit(
                s, "model.runtimes", "base_model", name, {"runtimes": kinds, "previous": previous}
            )
            return model_entity(s, row)

    def get_model(self, name: str) -> e.BaseModel:
        with self.tx.read() as s:
            row = get_model_row(s, name)
            return model_entity(s, row)

    def list_models(self) -> list[e.BaseModel]:
        with self.tx.read() as s:
            rows = s.scalars(select(BaseModelRow).order_by(BaseModelRow.name))
            return [model_entity(s, r) for r in rows]

    def model_path(self, name: str) -> Path:
        model = self.get_model(name)
        folder = resolve_package_model(model.package) if model.package else Path(model.path or "")
        if not folder.is_dir():
            raise NotFound(f"weights of model {name!r} are no longer at {folder}")
        return folder
