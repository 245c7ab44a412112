"""One reader per suite kind, chosen by the kind: which files a split needs, which splits a
folder has, and loading a split (errors name the file and line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals import beir, classification_data, rerank_data
from evals.beir import RetrievalSplit
from evals.classification_data import ClassificationSplit
from evals.errors import SuiteDataError
from evals.rerank_data import RerankSplit

SuiteData = RetrievalSplit | RerankSplit | ClassificationSplit
_READERS: dict[str, Any] = {
    "retrieval": beir,
    "rerank": rerank_data,
    "classification": classification_data,
}


def _reader(kind: str) -> Any:
    try:
        return _READERS[kind]
    except KeyError:
        raise SuiteDataError(f"unknown suite kind {kind!r}; known: {', '.join(_READERS)}") from None


def split_files(kind: str, folder: Path, split: str) -> list[Path]:
    return list(_reader(kind).split_files(folder, split))


def available_splits(kind: str, folder: Path) -> list[str]:
    return list(_reader(kind).available_splits(folder))


def load(kind: str, folder: Path, split: str) -> SuiteData:
    data: SuiteData = _reader(kind).load_split(folder, split)
    return data


def describe(data: SuiteData) -> dict[str, int]:
    """Counts shown by `suite show` and stored with the suite version."""
    if isinstance(data, RetrievalSplit):
        return {"queries": len(data.queries), "documents": len(data.corpus)}
    if isinstance(data, RerankSplit):
        return {"queries": len(data.queries), "pairs": data.pairs, "documents": len(data.corpus)}
    return {"items": len(data.ids), "labels": len(data.label_names)}
