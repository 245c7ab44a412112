"""Endpoint models: models behind an external API, registered by their record and probe.

``add_endpoint_model`` stores the record folder the shell wrote after probing the API
(serving/endpoints.py: URL, model ids per side, input types, the *name* of the key variable,
the probe fingerprint) content-addressed, and records a base model of format ``endpoint``,
served by the http runtime only. Its sha256 covers URL, model ids and probe: the identity of an
endpoint model. The key never reaches the registry: only the variable's name does.

``record_probe`` keeps the endpoint watcher's latest probe (serving/endpoint_watch.py); a
fingerprint other than the registered one makes the model ``stale``, and with it every pairing
on it: the promotion rule refuses a stale challenger, the dashboard flags it, the control
plane's ``/metrics`` counts it.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from registry import entities as e
from registry.artifacts import ArtifactStore
from registry.errors import AlreadyExists, InvalidInput
from registry.kinds import check_name
from registry.models import BaseModelRow, CandidateRow
from registry.rows import get_model_row, model_entity
from registry.runtimes import ENDPOINT, ENDPOINT_RUNTIMES, ENDPOINT_TASK_KINDS
from registry.transactions import Transactions

RECORD = "taskfleet_endpoint.json"
# What the registry keeps of a record (the probe texts stay in the stored folder).
_API_FIELDS = ("kind", "url", "model", "query", "document", "api_key_env")


def read_record(folder: Path) -> dict[str, Any]:
    path = folder / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read the endpoint record {path}: {exc}") from None
    probe = record.get("probe") if isinstance(record, dict) else None
    if not isinstance(probe, dict) or not isinstance(probe.get("fingerprint"), str):
        raise InvalidInput(f"{path} is not an endpoint record with a probe fingerprint")
    if record.get("kind") not in ENDPOINT_TASK_KINDS:
        raise InvalidInput(f"{path}: kind must be one of {', '.join(ENDPOINT_TASK_KINDS)}")
    return record


class EndpointModelRepository:
    def __init__(self, tx: Transactions, artifacts: ArtifactStore) -> None:
        self.tx = tx
        self.artifacts = artifacts  # the record folder travels by sha256 like any model

    def add_endpoint_model(
        self, name: str, *, record_dir: Path, price_per_million: float | None = None
    ) -> e.BaseModel:
        check_name("model", name)
        if price_per_million is not None and (
            not math.isfinite(price_per_million) or price_per_million < 0
        ):
            raise InvalidInput("--price-per-million must be a finite number >= 0")
        record = read_record(record_dir)
        with self.tx.read() as s:
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == name)):
                raise AlreadyExists(f"model {name!r} already exists")
        digest = self.artifacts.put_dir(record_dir)
        stored = self.artifacts.path_for(digest.sha256)
        probe = record["probe"]
        with self.tx.write() as s:
            if s.scalar(select(BaseModelRow).where(BaseModelRow.name == name)):
                raise AlreadyExists(f"model {name!r} already exists")
            row = BaseModelRow(
                name=name,
                path=str(stored.resolve()),
                package=None,
                sha256=digest.sha256,
                dims=probe.get("dims"),
                max_seq_length=None,
                size_bytes=digest.size_bytes,
                runtime_kinds=list(ENDPOINT_RUNTIMES),
                query_prefix="",
                passage_prefix="",
                format=ENDPOINT,
                endpoint={k: record.get(k) for k in _API_FIELDS},
                probe_fingerprint=probe["fingerprint"],
                price_per_million=price_per_million,
            )
            s.add(row)
            s.flush()
            self.tx.audit(
                s,
                "model.add_endpoint",
                "base_model",
                name,
                {"sha256": digest.sha256, "url": record["url"], "probe": probe["fingerprint"]},
            )
            return model_entity(s, row)

    def record_probe(self, name: str, *, fingerprint: str | None, error: str | None) -> e.BaseModel:
        """The watcher's latest probe of an endpoint model (a failed one keeps the last
        fingerprint seen: an endpoint that is down has not changed)."""
        with self.tx.write() as s:
            row = get_model_row(s, name)
            if row.format != ENDPOINT:
                raise InvalidInput(f"model {name!r} is not an endpoint model")
            was_stale = model_entity(s, row).stale
            if fingerprint is not None:
                row.probed_fingerprint = fingerprint
            row.probed_at = datetime.now(UTC)
            row.probe_error = error[:2000] if error else None
            now = model_entity(s, row)
            if now.stale != was_stale:
                self.tx.audit(
                    s,
                    "model.stale" if now.stale else "model.fresh",
                    "base_model",
                    name,
                    {"probed": fingerprint, "registered": row.probe_fingerprint},
                )
            return now

    def endpoint_models_in_use(self) -> list[e.BaseModel]:
        """Every endpoint model some candidate competes with (placed or not)."""
        with self.tx.read() as s:
            rows = s.scalars(
                select(BaseModelRow)
                .where(BaseModelRow.format == ENDPOINT)
                .where(
                    BaseModelRow.id.in_(
                        select(CandidateRow.base_model_id).where(
                            CandidateRow.base_model_id.is_not(None)
                        )
                    )
                )
                .order_by(BaseModelRow.name)
            )
            return [model_entity(s, r) for r in rows]
