"""Tasks, base models, adapters (with lineage) and candidates."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.base import ServiceBase
from registry.errors import AlreadyExists, InvalidInput, LineageError, NotFound
from registry.fingerprint import (
    HEAD_MANIFEST,
    LORA_CONFIG,
    read_head_kind,
    read_sentence_transformer_info,
    sequence_classifier_labels,
    tree_sha256,
)
from registry.kinds import BASELINE_KINDS, CANDIDATE_KINDS, TASK_KINDS
from registry.models import AdapterRow, AuditRow, BaseModelRow, CandidateRow, TaskRow
from registry.rows import (
    adapter_entity,
    candidate_entity,
    get_adapter_row,
    get_candidate_row,
    get_model_row,
    get_task_row,
    model_entity,
    task_entity,
)
from registry.runtimes import DEFAULT_RUNTIME, VARIANT_RUNTIMES, check_runtime_kinds
from registry.suite_versions import newest_suite_row

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
# Candidates are often "<base>+<adapter>", so they may also contain '+'.
CANDIDATE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,127}$")
# A task name is a NATS subject token (tasks.<task>) and a consumer name, so no '.'.
TASK_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}$")
_PATTERNS = {
    "candidate": (CANDIDATE_NAME_RE, "'.', '_', '+' or '-'"),
    "task": (TASK_NAME_RE, "'_' or '-'"),
}
# The task head a model candidate needs: in its adapter artifact, or a transformers
# sequence-classification base (a Hugging Face cross-encoder or classifier) without adapter.
_HEAD_OF_KIND = {"cross-encoder": "score", "classifier": "classify", "embedding": None}


def check_name(kind: str, name: str) -> str:
    pattern, allowed = _PATTERNS.get(kind, (NAME_RE, "'.', '_' or '-'"))
    if not pattern.fullmatch(name):
        raise InvalidInput(
            f"invalid {kind} name {name!r}: use lowercase letters, digits, {allowed} "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return name


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


class CatalogMixin(ServiceBase):
    # ---- tasks -------------------------------------------------------------------------
    def add_task(
        self,
        name: str,
        *,
        suite: str,
        kind: str | None = None,
        description: str = "",
        owner: str = "",
        margin: float = 0.0,
        auto_promote: bool = False,
    ) -> e.Task:
        """Bind a new task to a registered suite; the task has the suite's kind."""
        check_name("task", name)
        if kind is not None and kind not in TASK_KINDS:
            raise InvalidInput(f"unknown task kind {kind!r}; known: {', '.join(TASK_KINDS)}")
        if margin < 0:
            raise InvalidInput("margin must be >= 0")
        with self._write() as s:
            if s.scalar(select(TaskRow).where(TaskRow.name == name)):
                raise AlreadyExists(f"task {name!r} already exists")
            suite_row = newest_suite_row(s, suite)
            if suite_row is None:
                raise NotFound(
                    f"unknown suite {suite!r}; register it first with `taskfleet suite add "
                    f"{suite} --kind KIND --path DIR`"
                )
            if kind is not None and kind != suite_row.kind:
                raise InvalidInput(
                    f"suite {suite!r} is a {suite_row.kind} suite; task {name!r} cannot be {kind}"
                )
            kind = suite_row.kind
            row = TaskRow(
                name=name,
                kind=kind,
                suite=suite,
                description=description,
                owner=owner,
                margin=margin,
                auto_promote=auto_promote,
            )
            s.add(row)
            s.flush()
            self._audit(s, "task.add", "task", name, {"suite": suite, "kind": kind})
            return task_entity(row)

    def get_task(self, name: str) -> e.Task:
        with self._read() as s:
            return task_entity(get_task_row(s, name))

    def list_tasks(self) -> list[e.Task]:
        with self._read() as s:
            return [task_entity(r) for r in s.scalars(select(TaskRow).order_by(TaskRow.name))]

    # ---- base models -------------------------------------------------------------------
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
        with self._read() as s:  # fail fast before hashing hundreds of MB
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == name)):
                raise AlreadyExists(f"model {name!r} already exists")
        digest = tree_sha256(folder)
        info = read_sentence_transformer_info(folder)
        with self._write() as s:
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
            self._audit(s, "model.add", "base_model", name, {"sha256": digest.sha256})
            return model_entity(s, row)

    def set_model_runtimes(self, name: str, runtime_kinds: list[str]) -> e.BaseModel:
        """Which runtimes may serve the model (a placement on one still needs its eval run)."""
        kinds = check_runtime_kinds(runtime_kinds)
        with self._write() as s:
            row = get_model_row(s, name)
            if row.variant is not None and set(kinds) - set(VARIANT_RUNTIMES):
                raise InvalidInput(
                    f"model {name!r} is an {row.variant} variant: only the Python runtime "
                    f"({', '.join(VARIANT_RUNTIMES)}) runs it"
                )
            previous = list(row.runtime_kinds)
            row.runtime_kinds = kinds
            self._audit(
                s, "model.runtimes", "base_model", name, {"runtimes": kinds, "previous": previous}
            )
            return model_entity(s, row)

    def get_model(self, name: str) -> e.BaseModel:
        with self._read() as s:
            row = get_model_row(s, name)
            return model_entity(s, row)

    def list_models(self) -> list[e.BaseModel]:
        with self._read() as s:
            rows = s.scalars(select(BaseModelRow).order_by(BaseModelRow.name))
            return [model_entity(s, r) for r in rows]

    def model_path(self, name: str) -> Path:
        model = self.get_model(name)
        folder = resolve_package_model(model.package) if model.package else Path(model.path or "")
        if not folder.is_dir():
            raise NotFound(f"weights of model {name!r} are no longer at {folder}")
        return folder

    # ---- adapters ----------------------------------------------------------------------
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
        with self._read() as s:
            if s.scalar(select(AdapterRow).where(AdapterRow.name == name)):
                raise AlreadyExists(f"adapter {name!r} already exists")
            base_row = get_model_row(s, base)
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
        with self._write() as s:
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
            self._audit(
                s, "adapter.register", "adapter", name, {"sha256": digest.sha256, "parent": parent}
            )
            return adapter_entity(s, row)

    def get_adapter(self, name: str) -> e.Adapter:
        with self._read() as s:
            return adapter_entity(s, get_adapter_row(s, name))

    def list_adapters(self, base: str | None = None) -> list[e.Adapter]:
        with self._read() as s:
            query = select(AdapterRow).order_by(AdapterRow.created_at, AdapterRow.id)
            if base is not None:
                query = query.where(AdapterRow.base_model_id == get_model_row(s, base).id)
            return [adapter_entity(s, r) for r in s.scalars(query)]

    def adapter_path(self, name: str) -> Path:
        """The stored adapter folder, verified against its sha256."""
        return self.artifacts.verify(self.get_adapter(name).sha256)

    def lineage(self, name: str) -> list[e.Adapter]:
        """The adapter and its ancestors, root first."""
        with self._read() as s:
            chain: list[e.Adapter] = []
            row: AdapterRow | None = get_adapter_row(s, name)
            while row is not None:
                chain.append(adapter_entity(s, row))
                row = s.get(AdapterRow, row.parent_id) if row.parent_id else None
            return list(reversed(chain))

    def children(self, name: str) -> list[e.Adapter]:
        with self._read() as s:
            parent = get_adapter_row(s, name)
            rows = s.scalars(select(AdapterRow).where(AdapterRow.parent_id == parent.id))
            return [adapter_entity(s, r) for r in rows]

    # ---- candidates --------------------------------------------------------------------
    def add_candidate(
        self,
        task: str,
        *,
        name: str | None = None,
        base: str | None = None,
        adapter: str | None = None,
        kind: str | None = None,
    ) -> e.Candidate:
        """Add a candidate; ``kind`` defaults to the task kind's model candidate."""
        with self._read() as s:
            task_kind = get_task_row(s, task).kind
        allowed = CANDIDATE_KINDS.get(task_kind, ())
        kind = kind or allowed[0]
        if kind not in allowed:
            known = sorted({k for kinds in CANDIDATE_KINDS.values() for k in kinds})
            hint = f"; a {task_kind} task takes {', '.join(allowed)}" if kind in known else ""
            raise InvalidInput(
                f"candidate kind {kind!r} does not fit task {task!r}{hint}"
                if hint
                else f"unknown candidate kind {kind!r}; known: {', '.join(known)}"
            )
        if kind not in BASELINE_KINDS:
            self._check_model_candidate(task, kind, base, adapter)
        with self._write() as s:
            task_row = get_task_row(s, task)
            base_row = adapter_row = None
            if kind in BASELINE_KINDS:
                if base or adapter:
                    raise InvalidInput(f"a {kind} candidate takes no base model or adapter")
                signature = kind
            else:
                if adapter is not None:
                    adapter_row = get_adapter_row(s, adapter)
                    adapter_base = s.get(BaseModelRow, adapter_row.base_model_id)
                    assert adapter_base is not None
                    if base is not None and base != adapter_base.name:
                        raise LineageError(
                            f"adapter {adapter!r} was trained on {adapter_base.name!r}, "
                            f"not on {base!r}"
                        )
                    base_row = adapter_base
                elif base is not None:
                    base_row = get_model_row(s, base)
                else:
                    raise InvalidInput(f"a {kind} candidate needs --base or --adapter")
                signature = f"model:{base_row.id}:adapter:{adapter_row.id if adapter_row else '-'}"
            cand_name = check_name(
                "candidate", name or _default_candidate_name(kind, base_row, adapter_row)
            )
            existing = s.scalar(
                select(CandidateRow).where(
                    CandidateRow.task_id == task_row.id,
                    (CandidateRow.name == cand_name) | (CandidateRow.signature == signature),
                )
            )
            if existing is not None:
                raise AlreadyExists(
                    f"task {task!r} already has candidate {existing.name!r} for this pairing"
                    if existing.signature == signature
                    else f"task {task!r} already has a candidate named {cand_name!r}"
                )
            row = CandidateRow(
                task_id=task_row.id,
                name=cand_name,
                kind=kind,
                base_model_id=base_row.id if base_row else None,
                adapter_id=adapter_row.id if adapter_row else None,
                signature=signature,
            )
            s.add(row)
            s.flush()
            self._audit(s, "candidate.add", "candidate", f"{task}/{cand_name}", {"kind": kind})
            return candidate_entity(s, row)

    def _check_model_candidate(
        self, task: str, kind: str, base: str | None, adapter: str | None
    ) -> None:
        """The artifact must carry the head the kind needs (read from the stored files)."""
        need = _HEAD_OF_KIND[kind]
        if adapter is not None:
            head = read_head_kind(self.adapter_path(adapter))
            if head != need:
                has = f"a {head!r} head" if head else "no task head (a LoRA only)"
                wants = f"a {need!r} head" if need else "no task head"
                raise InvalidInput(
                    f"adapter {adapter!r} has {has}; a {kind} candidate of task {task!r} "
                    f"needs {wants}"
                )
            return
        if base is None or need is None:
            return
        labels = sequence_classifier_labels(self.model_path(base))
        if labels is None or (need == "score" and labels != 1):
            raise InvalidInput(
                f"base model {base!r} is not a "
                + ("one-logit cross-encoder" if need == "score" else "sequence classifier")
                + f"; a {kind} candidate needs an adapter with a {need!r} head "
                f"(`taskfleet finetune lora {task} --base {base}`) or such a base model"
            )

    def get_candidate(self, task: str, name: str) -> e.Candidate:
        with self._read() as s:
            return candidate_entity(s, get_candidate_row(s, task, name))

    def list_candidates(self, task: str) -> list[e.Candidate]:
        with self._read() as s:
            task_row = get_task_row(s, task)
            rows = s.scalars(
                select(CandidateRow)
                .where(CandidateRow.task_id == task_row.id)
                .order_by(CandidateRow.id)
            )
            return [candidate_entity(s, r) for r in rows]

    def artifact_digests(self) -> set[str]:
        """The sha256 of every base model and adapter a candidate uses: what the artifact
        source must keep (every placement, past or present, serves a candidate)."""
        with self._read() as s:
            bases = s.scalars(
                select(BaseModelRow.sha256).join(
                    CandidateRow, CandidateRow.base_model_id == BaseModelRow.id
                )
            )
            adapters = s.scalars(
                select(AdapterRow.sha256).join(
                    CandidateRow, CandidateRow.adapter_id == AdapterRow.id
                )
            )
            return set(bases) | set(adapters)

    # ---- audit -------------------------------------------------------------------------
    def audit_log(self, limit: int = 100) -> list[e.AuditEntry]:
        with self._read() as s:
            rows = s.scalars(select(AuditRow).order_by(AuditRow.id.desc()).limit(limit))
            return [
                e.AuditEntry(r.id, r.actor, r.action, r.entity, r.entity_id, r.detail, r.created_at)
                for r in rows
            ]


def _default_candidate_name(
    kind: str, base: BaseModelRow | None, adapter: AdapterRow | None
) -> str:
    if kind in BASELINE_KINDS:
        return kind
    assert base is not None
    return f"{base.name}+{adapter.name}" if adapter else base.name


def _check_acyclic(s: Session, row: AdapterRow) -> None:
    seen = {row.id}
    parent_id = row.parent_id
    while parent_id is not None:
        if parent_id in seen:
            raise LineageError(f"adapter {row.name!r} would create a lineage cycle")
        seen.add(parent_id)
        parent = s.get(AdapterRow, parent_id)
        parent_id = parent.parent_id if parent else None
