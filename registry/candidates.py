"""Candidates: (task, base model, adapter-or-none) pairings of a kind that fits the task,
or a lexical baseline (bm25, random, tfidf-lr, majority).

A model candidate's artifact must carry the head its kind needs (read from the stored files);
an optimised variant of a base model is added through ``registry/variants.py``. A baseline is
model-free (never placed), unless it names its own fitted artifact, a base model of its kind's
format (``registry/fitted_baselines.py`` fits and registers one: tfidf-lr, and bm25 for rerank).
"""

from __future__ import annotations

from sqlalchemy import select

from registry import entities as e
from registry.adapters import AdapterRepository
from registry.base_models import BaseModelRepository
from registry.errors import AlreadyExists, InvalidInput, LineageError
from registry.fingerprint import read_head_kind, sequence_classifier_labels
from registry.kinds import BASELINE_KINDS, CANDIDATE_KINDS, check_name
from registry.models import AdapterRow, BaseModelRow, CandidateRow
from registry.rows import (
    candidate_entity,
    get_adapter_row,
    get_candidate_row,
    get_model_row,
    get_task_row,
)
from registry.runtimes import ENDPOINT
from registry.transactions import Transactions

# The task head a model candidate needs: in its adapter artifact, or a transformers
# sequence-classification base (a Hugging Face cross-encoder or classifier) without adapter.
_HEAD_OF_KIND = {"cross-encoder": "score", "classifier": "classify", "embedding": None}


class CandidateRepository:
    def __init__(
        self, tx: Transactions, models: BaseModelRepository, adapters: AdapterRepository
    ) -> None:
        self.tx = tx
        # A model candidate's head is read from its stored artifact before it is added.
        self.models = models
        self.adapters = adapters

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
        with self.tx.read() as s:
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
        if kind not in BASELINE_KINDS and not self._check_model_format(task, kind, base, adapter):
            self._check_model_candidate(task, kind, base, adapter)
        with self.tx.write() as s:
            task_row = get_task_row(s, task)
            base_row = adapter_row = None
            if kind in BASELINE_KINDS:
                if adapter:
                    raise InvalidInput(f"a {kind} candidate takes no adapter")
                if base is not None:
                    base_row = get_model_row(s, base)
                    if base_row.format != kind:
                        raise InvalidInput(
                            f"a {kind} candidate takes no base model but its own fitted {kind} "
                            f"artifact, and {base!r} is not one"
                        )
                    signature = f"model:{base_row.id}:adapter:-"
                else:
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
            self.tx.audit(s, "candidate.add", "candidate", f"{task}/{cand_name}", {"kind": kind})
            return candidate_entity(s, row)

    def _check_model_candidate(
        self, task: str, kind: str, base: str | None, adapter: str | None
    ) -> None:
        """The artifact must carry the head the kind needs (read from the stored files)."""
        need = _HEAD_OF_KIND[kind]
        if adapter is not None:
            head = read_head_kind(self.adapters.adapter_path(adapter))
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
        labels = sequence_classifier_labels(self.models.model_path(base))
        if labels is None or (need == "score" and labels != 1):
            raise InvalidInput(
                f"base model {base!r} is not a "
                + ("one-logit cross-encoder" if need == "score" else "sequence classifier")
                + f"; a {kind} candidate needs an adapter with a {need!r} head "
                f"(`taskfleet finetune lora {task} --base {base}`) or such a base model"
            )

    def _check_model_format(
        self, task: str, kind: str, base: str | None, adapter: str | None
    ) -> bool:
        """A fitted baseline is its own candidate kind; an endpoint model takes no adapter and
        competes as what its API does (embedding, or cross-encoder for a rerank API). True for
        an endpoint model (its API is its head: no folder to read one from)."""
        if base is None:
            return False
        model = self.models.get_model(base)
        if model.format is None:
            return False
        if model.format != ENDPOINT:
            raise InvalidInput(
                f"model {base!r} is a fitted {model.format} baseline: add it as a "
                f"{model.format} candidate, not {kind}"
            )
        endpoint_kind = (model.endpoint or {}).get("kind")
        if adapter is not None:
            raise InvalidInput(
                f"model {base!r} is an endpoint model: LoRA adapters, variants and heads cannot "
                "be put on a model behind an API"
            )
        fits = "cross-encoder" if endpoint_kind == "rerank" else "embedding"
        if kind != fits:
            raise InvalidInput(
                f"model {base!r} is an endpoint model ({endpoint_kind} API): it competes as a "
                f"{fits} candidate, not {kind}"
            )
        return True

    def get_candidate(self, task: str, name: str) -> e.Candidate:
        with self.tx.read() as s:
            return candidate_entity(s, get_candidate_row(s, task, name))

    def list_candidates(self, task: str) -> list[e.Candidate]:
        with self.tx.read() as s:
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
        with self.tx.read() as s:
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


def _default_candidate_name(
    kind: str, base: BaseModelRow | None, adapter: AdapterRow | None
) -> str:
    if kind in BASELINE_KINDS:
        return kind
    assert base is not None
    return f"{base.name}+{adapter.name}" if adapter else base.name
