"""Adapters: immutable, content-addressed artifacts on a base model (a peft LoRA, a task head,
or both), recorded with their lineage (base, parent adapter, training data, split, suite,
hyperparameters, seed, code version, MLflow run). Lineage is a DAG, never a cycle.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.artifacts import ArtifactStore
from registry.errors import AlreadyExists, InvalidInput, LineageError
from registry.fingerprint import HEAD_MANIFEST, LORA_CONFIG
from registry.kinds import check_name
from registry.models import AdapterRow, BaseModelRow
from registry.rows import adapter_entity, get_adapter_row, get_model_row
from registry.transactions import Transactions


class AdapterRepository:
    def __init__(self, tx: Transactions, artifacts: ArtifactStore) -> None:
        self.tx = tx
        self.artifacts = artifacts  # where the folders are stored, by sha256

    def register_adapter(
        self,
        name: str,
        *,
        base: str,
        source_dir: Path,
        training: e.TrainingRecord,
        parent: str | None = None,
    ) -> e.Adapter:
        """Store the adapter folder content-addressed and record it with its lineage."""
        check_name("adapter", name)
        if parent == name:
            raise LineageError(f"adapter {name!r} cannot be its own parent (lineage cycle)")
        with self.tx.read() as s:
            if s.scalar(select(AdapterRow).where(AdapterRow.name == name)):
                raise AlreadyExists(f"adapter {name!r} already exists")
            base_row = get_model_row(s, base)
            refuse_derived_work(base_row.name, base_row.format, "adapters")
            if parent is not None:
                parent_row = get_adapter_row(s, parent)
                if parent_row.base_model_id != base_row.id:
                    parent_base = s.get(BaseModelRow, parent_row.base_model_id)
                    raise LineageError(
                        f"adapter {name!r} is on base {base!r} but its parent {parent!r} is on "
                        f"base {parent_base.name if parent_base else '?'!r}"
                    )
        if not (source_dir / LORA_CONFIG).is_file() and not (source_dir / HEAD_MANIFEST).is_file():
            raise InvalidInput(
                f"not an adapter folder (neither a peft {LORA_CONFIG} nor a task head "
                f"{HEAD_MANIFEST}): {source_dir}"
            )
        digest = self.artifacts.put_dir(source_dir)
        with self.tx.write() as s:
            base_row = get_model_row(s, base)
            parent_id = get_adapter_row(s, parent).id if parent else None
            row = AdapterRow(
                name=name,
                base_model_id=base_row.id,
                parent_id=parent_id,
                sha256=digest.sha256,
                size_bytes=digest.size_bytes,
                data_fingerprint=training.data_fingerprint,
                train_split=training.train_split,
                suite=training.suite,
                hyperparameters=dict(training.hyperparameters),
                seed=training.seed,
                code_version=training.code_version,
                mlflow_run_id=training.mlflow_run_id,
            )
            s.add(row)
            s.flush()
            _check_acyclic(s, row)
            self.tx.audit(
                s, "adapter.register", "adapter", name, {"sha256": digest.sha256, "parent": parent}
            )
            return adapter_entity(s, row)

    def get_adapter(self, name: str) -> e.Adapter:
        with self.tx.read() as s:
            return adapter_entity(s, get_adapter_row(s, name))

    def list_adapters(self, base: str | None = None) -> list[e.Adapter]:
        with self.tx.read() as s:
            query = select(AdapterRow).order_by(AdapterRow.created_at, AdapterRow.id)
            if base is not None:
                query = query.where(AdapterRow.base_model_id == get_model_row(s, base).id)
            return [adapter_entity(s, r) for r in s.scalars(query)]

    def adapter_path(self, name: str) -> Path:
        """The stored adapter folder, verified against its sha256."""
        return self.artifacts.verify(self.get_adapter(name).sha256)

    def lineage(self, name: str) -> list[e.Adapter]:
        """The adapter and its ancestors, root first."""
        with self.tx.read() as s:
            chain: list[e.Adapter] = []
            row: AdapterRow | None = get_adapter_row(s, name)
            while row is not None:
                chain.append(adapter_entity(s, row))
                row = s.get(AdapterRow, row.parent_id) if row.parent_id else None
            return list(reversed(chain))

    def children(self, name: str) -> list[e.Adapter]:
        with self.tx.read() as s:
            parent = get_adapter_row(s, name)
            rows = s.scalars(select(AdapterRow).where(AdapterRow.parent_id == parent.id))
            return [adapter_entity(s, r) for r in rows]


def _check_acyclic(s: Session, row: AdapterRow) -> None:
    seen = {row.id}
    parent_id = row.parent_id
    while parent_id is not None:
        if parent_id in seen:
            raise LineageError(f"adapter {row.name!r} would create a lineage cycle")
        seen.add(parent_id)
        parent = s.get(AdapterRow, parent_id)
        parent_id = parent.parent_id if parent else None


def refuse_derived_work(model: str, model_format: str | None, what: str) -> None:
    """LoRA adapters, task heads and variants need weights: an endpoint model (behind an API)
    or a fitted lexical baseline has none to train or export."""
    if model_format == "endpoint":
        raise InvalidInput(
            f"model {model!r} is an endpoint model: {what} (LoRA, heads, variants) cannot be put "
            "on a model behind an API"
        )
    if model_format is not None:
        raise InvalidInput(
            f"model {model!r} is a fitted {model_format} baseline: it takes no {what}"
        )
