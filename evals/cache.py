"""On-disk embedding cache: one SQLite file, keyed by (model, adapter, text).

The key is a *namespace* (sha256 of the base model fingerprint, the adapter fingerprint and
the max sequence length, since all three change the vectors) plus the sha256 of the exact text
the model reads (prefix included). Re-running an unchanged candidate encodes nothing; a new
adapter gets a new namespace and encodes everything once. Entries are content-keyed, so a run
interrupted half-way leaves only correct entries behind.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    namespace TEXT NOT NULL,
    text_sha256 TEXT NOT NULL,
    dims INTEGER NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (namespace, text_sha256)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS encode_cost (
    namespace TEXT PRIMARY KEY,
    items INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    seconds REAL NOT NULL,
    latency_p50_ms REAL NOT NULL,
    latency_p95_ms REAL NOT NULL,
    recorded_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS encode_resources (
    namespace TEXT PRIMARY KEY,
    items INTEGER NOT NULL,
    cpu_seconds REAL NOT NULL,
    peak_bytes INTEGER NOT NULL,
    recorded_at REAL NOT NULL
);
"""


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def namespace(
    model_fingerprint: str,
    adapter_fingerprint: str | None,
    max_seq_length: int,
    runtime: str = "torch",
) -> str:
    """Vectors differ by model, adapter, truncation and the runtime that computed them; torch
    keys keep their original form so caches made before runtimes existed stay valid."""
    raw = f"{model_fingerprint}\0{adapter_fingerprint or ''}\0{max_seq_length}"
    if runtime != "torch":
        raw += f"\0{runtime}"
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class CachedCost:
    """The cost measured when a namespace was last encoded (reported when a run encodes nothing)."""

    items: int
    tokens: int
    seconds: float
    latency_p50_ms: float
    latency_p95_ms: float


class EmbeddingCache:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def in_dir(cls, cache_dir: Path) -> EmbeddingCache:
        return cls(cache_dir / "embeddings.sqlite")

    def close(self) -> None:
        self._db.close()

    def get_many(self, ns: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), 500):  # stay under SQLite's variable limit
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT text_sha256, dims, vector FROM embeddings "
                f"WHERE namespace = ? AND text_sha256 IN ({marks})",
                [ns, *chunk],
            )
            for key, dims, blob in rows:
                found[key] = np.frombuffer(blob, dtype=np.float32, count=dims)
        return found

    def put_many(self, ns: str, items: Iterable[tuple[str, np.ndarray]]) -> None:
        rows = [
            (ns, key, int(vec.shape[0]), np.ascontiguousarray(vec, dtype=np.float32).tobytes())
            for key, vec in items
        ]
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?)", rows)

    def count(self, ns: str | None = None) -> int:
        if ns is None:
            return int(self._db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])
        query = "SELECT COUNT(*) FROM embeddings WHERE namespace = ?"
        return int(self._db.execute(query, (ns,)).fetchone()[0])

    def record_cost(self, ns: str, cost: CachedCost) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO encode_cost VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    ns,
                    cost.items,
                    cost.tokens,
                    cost.seconds,
                    cost.latency_p50_ms,
                    cost.latency_p95_ms,
                    time.time(),
                ),
            )

    def last_cost(self, ns: str) -> CachedCost | None:
        row = self._db.execute(
            "SELECT items, tokens, seconds, latency_p50_ms, latency_p95_ms "
            "FROM encode_cost WHERE namespace = ?",
            (ns,),
        ).fetchone()
        return CachedCost(*row) if row else None

    def record_resources(self, ns: str, items: int, cpu_seconds: float, peak_bytes: int) -> None:
        """CPU and peak memory of the run that last encoded ``items`` texts of ``ns``
        (evals/cost.py), reported again by runs that find everything cached."""
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO encode_resources VALUES (?, ?, ?, ?, ?)",
                (ns, items, cpu_seconds, peak_bytes, time.time()),
            )

    def last_resources(self, ns: str) -> tuple[int, float, int] | None:
        row = self._db.execute(
            "SELECT items, cpu_seconds, peak_bytes FROM encode_resources WHERE namespace = ?",
            (ns,),
        ).fetchone()
        return (int(row[0]), float(row[1]), int(row[2])) if row else None
