"""Request bodies of the control-plane REST API, bounded so that bad input is a 400 up front.

Every string has a length limit that fits its column, no body accepts unknown fields (a typo
must not be ignored silently), and numbers are finite and within range (`replicas: 1e30` once
overflowed the database into a plain-text 500). The dashboard's forms are checked by the same
bodies (`checked`), so no door accepts what another refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from httpapi.handlers import validation_message
from registry import entities as e
from registry.errors import InvalidInput
from registry.key_rules import MAX_QUOTA_BURST, MAX_QUOTA_RATE
from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
    MAX_TEXT_LIMIT_CHARS,
)
from registry.placements import MAX_REPLICAS

# PostgreSQL text cannot hold NUL; nothing we store needs it.
_NO_NUL = r"^[^\x00]*$"
Name = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NO_NUL)]
Short = Annotated[str, StringConstraints(max_length=128, pattern=_NO_NUL)]
Text = Annotated[str, StringConstraints(max_length=10_000, pattern=_NO_NUL)]
Fingerprint = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_NO_NUL)]
Path = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=_NO_NUL)]
Replicas = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
# Seeds are stored in a 32-bit integer column on PostgreSQL.
Seed = Annotated[int, Field(ge=0, le=2**31 - 1)]
# Strict: JSON true is not a number of characters, requests or tokens.
TextLimit = Annotated[int, Field(ge=1, le=MAX_TEXT_LIMIT_CHARS, strict=True)]
QuotaRate = Annotated[float, Field(gt=0, le=MAX_QUOTA_RATE, allow_inf_nan=False, strict=True)]
QuotaBurst = Annotated[int, Field(ge=1, le=MAX_QUOTA_BURST, strict=True)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


B = TypeVar("B", bound=Body)


def checked(body: type[B], **fields: Any) -> B:
    """A body from another door (the dashboard's forms), checked exactly as REST checks its
    JSON: one set of rules for every way in, and the same one-line message when refused."""
    try:
        return body.model_validate(fields)
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


class SuiteIn(Body):
    """A suite declaration; the control plane reads ``path`` (or the MTEB task) itself."""

    name: Name
    kind: Short | None = Field(None, description="retrieval, rerank or classification.")
    path: Path | None = Field(None, description="Suite folder readable by the control plane.")
    mteb_task: Short | None = None
    test_split: Short | None = None
    train_split: Short | None = None
    main_metric: Short | None = None
    description: Text = ""


# Reads and fingerprints a declaration (the shell wires the eval harness in: the registry must
# not import it). Returns the record to register; bad data raises InvalidInput.
SuiteReader = Callable[[SuiteIn], e.SuiteCreate]


class TaskLimitsIn(Body):
    """Per-text limits in characters that gateways enforce (413 above them); null or left
    out: unchanged (the default for a new task)."""

    max_text_chars: TextLimit | None = Field(
        None,
        description=f"Each input (retrieval, classification); default {DEFAULT_MAX_TEXT_CHARS}.",
    )
    max_query_chars: TextLimit | None = Field(
        None, description=f"A rerank query; default {DEFAULT_MAX_QUERY_CHARS}."
    )
    max_document_chars: TextLimit | None = Field(
        None, description=f"Each rerank document; default {DEFAULT_MAX_DOCUMENT_CHARS}."
    )


class TaskIn(TaskLimitsIn):
    name: Name
    suite: Name | None = None
    kind: Short | None = Field(None, description="Leave out: the suite's kind.")
    description: Text = ""
    owner: Short = ""
    margin: float = Field(0.0, ge=0, le=1_000_000, allow_inf_nan=False)


class KeyQuotaIn(Body):
    """A key's whole gateway quota (token buckets per gateway process); a rate left out or
    null removes that limit, a burst left out is one second of its rate."""

    rate_limit_per_s: QuotaRate | None = Field(None, description="Requests per second.")
    rate_burst: QuotaBurst | None = Field(None, description="Requests at once.")
    token_rate_per_s: QuotaRate | None = Field(
        None, description="Estimated model tokens per second (characters / 4 per text)."
    )
    token_burst: QuotaBurst | None = Field(
        None,
        description="Estimated tokens at once; a request costing more is refused with 413.",
    )


class ModelIn(Body):
    name: Name
    path: Path | None = Field(
        None,
        description="Weights folder inside the control plane's model roots "
        "(TASKFLEET_MODEL_ROOTS); outside them, or with none set, 403.",
    )
    package: Short | None = Field(None, description="An installed package that ships weights.")
    query_prefix: Text = ""
    passage_prefix: Text = ""


class TrainingIn(Body):
    data_fingerprint: Fingerprint
    train_split: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_NO_NUL)]
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    seed: Seed = 0
    code_version: Short = "unknown"
    suite: Name | None = None
    mlflow_run_id: Fingerprint | None = None


class AdapterIn(Body):
    name: Name
    base: Name
    path: Path = Field(
        description="Adapter folder inside the control plane's model roots "
        "(TASKFLEET_MODEL_ROOTS); outside them, or with none set, 403."
    )
    parent: Name | None = None
    training: TrainingIn


class CandidateIn(Body):
    name: Name | None = None
    base: Name | None = None
    adapter: Name | None = None
    kind: Short | None = Field(None, description="Leave out: what the task's kind implies.")
    variant: Short | None = Field(
        None,
        description="onnx or onnx-int8: an optimised build of `base`, derived and registered "
        "with lineage to it (embedding bases of retrieval tasks; takes tens of seconds).",
    )


class PlacementIn(Body):
    """How the champion is served. The candidate is not chosen here: promote or roll back."""

    candidate: Name | None = Field(
        None,
        description="Leave out, or name the champion: another candidate is refused with 400 "
        "PROMOTION_REQUIRED.",
    )
    pinned: bool | None = Field(None, description="Keep loaded; null: unchanged.")
    replicas: Replicas | None = Field(None, description="Workers to serve it; null: unchanged.")
    reason: Text = ""


class PromoteIn(Body):
    candidate: Name
    reason: Text = ""
    override: bool = Field(False, description="Promote although the rule is not met (admin).")
    expected_champion: Name | None = Field(
        None,
        description="The champion the caller saw (null: none). If it changed meanwhile, nothing "
        "happens and 409 CONFLICT is returned. Leave out to skip this check.",
    )
    pinned: bool | None = Field(None, description="The new epoch's pinning; null: as before.")
    replicas: Replicas | None = Field(
        None, description="The new epoch's replicas; null: as before."
    )


class RollbackIn(Body):
    reason: Text = ""
    expected_champion: Name | None = Field(
        None, description="The champion the caller saw; leave out to skip the stale check."
    )


class ShadowIn(Body):
    """Start (or replace) the task's shadow: a challenger answering a sampled copy of live
    requests, never a caller."""

    candidate: Name
    sample_rate: float = Field(ge=0, le=1, allow_inf_nan=False, description="Share sampled.")
    runtime: Short | None = Field(None, description="Default: the runtime of its newest run.")
    reason: Text = ""


class ShadowStopIn(Body):
    reason: Text = ""


class ProductionIn(Body):
    """Production settings of a task; a field left out keeps its value."""

    sample_rate: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    retention_days: float | None = Field(None, gt=0, le=90, allow_inf_nan=False)
    evidence: Short | None = Field(None, description="offline, live or both.")
    drift_alpha: float | None = Field(None, gt=0, lt=1, allow_inf_nan=False)
    drift_window: int | None = Field(None, ge=1, le=100_000, strict=True)
    live_every: int | None = Field(None, ge=1, le=100_000, strict=True)
