"""Optimised variants of a base model as registry records: derived, fingerprinted, with lineage.

``derive_model`` has an embedding base model built as ONNX (``onnx``) or as ONNX with int8
weights (``onnx-int8``), stores the folder content-addressed like an adapter, and records it as
a base model whose ``source`` is the model it came from. The build is the caller's
``VariantBuilder`` (the shell passes ``taskfleet.variant_builder.build_variant``, which runs
serving/runtime/onnx_variant.py): the registry imports no serving code, as it reads no suite
folders. ``add_variant_candidate`` then adds it to a task as an ordinary embedding
candidate: it is evaluated like any other, and only a promotion puts it on the fleet
(registry/promotion_rule.py: a variant of the champion's model may replace it when its score
stays within the task's margin).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sqlalchemy import select

from registry import entities as e
from registry.adapters import refuse_derived_work
from registry.artifacts import ArtifactStore
from registry.base_models import BaseModelRepository
from registry.candidates import CandidateRepository
from registry.errors import AlreadyExists, InvalidInput, NotImplementedHere
from registry.fingerprint import sequence_classifier_labels
from registry.models import BaseModelRow
from registry.rows import get_model_row, get_task_row, model_entity
from registry.runtimes import MODEL_VARIANTS, VARIANT_RUNTIMES
from registry.store import VariantBuilder
from registry.transactions import Transactions


def check_variant(variant: str) -> str:
    if variant not in MODEL_VARIANTS:
        raise InvalidInput(f"unknown variant {variant!r}; known: {', '.join(MODEL_VARIANTS)}")
    return variant


class VariantRepository:
    def __init__(
        self,
        tx: Transactions,
        artifacts: ArtifactStore,
        models: BaseModelRepository,
        candidates: CandidateRepository,
    ) -> None:
        self.tx = tx
        self.artifacts = artifacts  # a built variant is stored like an adapter, by sha256
        self.models = models  # the source model, and the derived one's record
        self.candidates = candidates  # a variant competes as an ordinary embedding candidate

    def derive_model(
        self, base: str, variant: str, *, build: VariantBuilder | None, name: str | None = None
    ) -> e.BaseModel:
        """The ``variant`` of base model ``base`` (built by ``build`` and registered on first
        use; the same variant of the same source is reused, no builder needed)."""
        check_variant(variant)
        source = self.models.get_model(base)
        refuse_derived_work(base, source.format, "variants")
        if source.variant is not None:
            raise InvalidInput(
                f"model {base!r} is already an {source.variant} variant of {source.source!r}; "
                f"derive from {source.source!r}"
            )
        folder = self.models.model_path(base)
        if sequence_classifier_labels(folder) is not None:
            raise InvalidInput(
                f"model {base!r} is a sequence classifier (a cross-encoder or classifier); "
                "variants are built of embedding models only"
            )
        if not (folder / "modules.json").is_file():
            raise InvalidInput(
                f"model {base!r} is not a sentence-transformers embedding model (no modules.json);"
                " variants are built of embedding models only"
            )
        derived_name = name or f"{base}-{variant}"
        with self.tx.read() as s:
            row = s.scalar(select(BaseModelRow).where(BaseModelRow.name == derived_name))
            if row is not None:
                if row.source_model_id == source.id and row.variant == variant:
                    return model_entity(s, row)
                raise AlreadyExists(
                    f"model {derived_name!r} already exists and is not the {variant} variant of "
                    f"{base!r}; choose another --name"
                )
        if build is None:
            raise NotImplementedHere(
                f"no variant builder here: the {variant} variant of {base!r} cannot be built"
            )
        with tempfile.TemporaryDirectory(prefix="taskfleet-variant-") as tmp:
            built = Path(tmp) / "variant"
            manifest = build(folder, built, variant, source.sha256)
            digest = self.artifacts.put_dir(built)
        stored = self.artifacts.path_for(digest.sha256)
        with self.tx.write() as s:
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == derived_name)):
                raise AlreadyExists(f"model {derived_name!r} already exists")
            source_row = get_model_row(s, base)
            row = BaseModelRow(
                name=derived_name,
                path=str(stored.resolve()),
                package=None,
                sha256=digest.sha256,
                dims=manifest.get("dims", source_row.dims),
                max_seq_length=manifest.get("max_seq_length", source_row.max_seq_length),
                size_bytes=digest.size_bytes,
                runtime_kinds=list(VARIANT_RUNTIMES),
                query_prefix=source_row.query_prefix,
                passage_prefix=source_row.passage_prefix,
                source_model_id=source_row.id,
                variant=variant,
            )
            s.add(row)
            s.flush()
            self.tx.audit(
                s,
                "model.derive",
                "base_model",
                derived_name,
                {"sha256": digest.sha256, "source": base, "variant": variant},
            )
            return model_entity(s, row)

    def add_variant_candidate(
        self,
        task: str,
        *,
        base: str | None,
        variant: str,
        build: VariantBuilder | None,
        name: str | None = None,
        adapter: str | None = None,
        kind: str | None = None,
    ) -> e.Candidate:
        """Derive ``variant`` of ``base`` (built by ``build``) and add it to ``task`` as an
        embedding candidate. Everything a variant cannot be is refused before the (slow)
        export."""
        check_variant(variant)
        if base is None:
            raise InvalidInput(f"an {variant} variant needs the base model it is derived from")
        if adapter is not None:
            raise InvalidInput(
                f"an {variant} variant cannot carry a LoRA adapter ({adapter!r}); variants are "
                "built of base models only"
            )
        if kind not in (None, "embedding"):
            raise InvalidInput(f"an {variant} variant is an embedding candidate, not {kind!r}")
        with self.tx.read() as s:
            task_kind = get_task_row(s, task).kind
        if task_kind != "retrieval":
            raise InvalidInput(
                f"task {task!r} is a {task_kind} task; an {variant} variant embeds only and serves "
                "retrieval tasks"
            )
        derived = self.derive_model(base, variant, build=build)
        return self.candidates.add_candidate(task, name=name, base=derived.name, kind="embedding")
