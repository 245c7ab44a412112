"""A fitted lexical baseline as an artifact folder: written, verified and loaded safely.

A baseline (``tfidf-lr`` or ``bm25``, serving/runtime/lexical.py) travels like any model: a
folder stored content-addressed, placed by its sha256, fetched and verified by the worker. It
holds data only, in formats whose readers cannot run code (JSON and safetensors; never pickle or
joblib), and the loader refuses anything else:

- ``taskfleet_baseline.json``: ``{"format": 1, "kind": "tfidf-lr"|"bm25", "files": {name:
  sha256}, "params": {...}, "fitted_on": {...}}``;
- ``vocabulary.json``: ``{"terms": [str]}`` (the feature column / statistics row of each term),
  plus ``"stopwords": [str]`` for bm25;
- ``arrays.safetensors``: tfidf-lr ``idf`` (features), ``weights`` (labels x features), ``bias``
  (labels), float64; bm25 ``document_frequency`` (terms), int64.

``load_baseline`` checks, in order: no file but those three; the manifest's shape; each file's
sha256 against the manifest (so an edited vocabulary or a file swapped for a pickle is a
"sha256 mismatch" before any byte of it is parsed); then every array's name, dtype and shape.
Each refusal is one ``BaselineError`` line naming the folder.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from serving.runtime.lexical import Bm25, TfidfLogReg, lucene_idf

MANIFEST = "taskfleet_baseline.json"
VOCABULARY = "vocabulary.json"
ARRAYS = "arrays.safetensors"
FORMAT = 1
TFIDF_LR = "tfidf-lr"
BM25 = "bm25"
KINDS = (TFIDF_LR, BM25)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ARRAYS: dict[str, dict[str, str]] = {
    TFIDF_LR: {"idf": "float64", "weights": "float64", "bias": "float64"},
    BM25: {"document_frequency": "int64"},
}
Baseline = TfidfLogReg | Bm25


class BaselineError(ValueError):
    """A baseline folder that is not exactly what this module writes."""


def is_baseline(folder: Path | None) -> bool:
    return folder is not None and (folder / MANIFEST).is_file()


def baseline_kind(model: object) -> str:
    return TFIDF_LR if isinstance(model, TfidfLogReg) else BM25


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write(
    target: Path,
    kind: str,
    vocabulary: Mapping[str, Any],
    arrays: dict[str, np.ndarray],
    params: dict[str, Any],
    fitted_on: Mapping[str, Any],
) -> dict[str, Any]:
    from safetensors.numpy import save_file

    target.mkdir(parents=True, exist_ok=False)
    (target / VOCABULARY).write_text(
        json.dumps(dict(vocabulary), ensure_ascii=False), encoding="utf-8"
    )
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(target / ARRAYS))
    manifest = {
        "format": FORMAT,
        "kind": kind,
        "files": {name: _sha256(target / name) for name in (VOCABULARY, ARRAYS)},
        "params": params,
        "fitted_on": dict(fitted_on),
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), "utf-8")
    return manifest


def write_tfidf_lr(
    target: Path,
    *,
    labels: Sequence[str],
    terms: Sequence[str],
    idf: np.ndarray,
    weights: np.ndarray,
    bias: np.ndarray,
    max_ngram: int,
    fitted_on: Mapping[str, Any],
) -> dict[str, Any]:
    """Write a tfidf-lr folder at ``target`` (which must not exist); returns the manifest."""
    arrays = {
        "idf": np.asarray(idf, dtype=np.float64),
        "weights": np.asarray(weights, dtype=np.float64),
        "bias": np.asarray(bias, dtype=np.float64),
    }
    params = {"labels": list(labels), "max_ngram": int(max_ngram)}
    return _write(target, TFIDF_LR, {"terms": list(terms)}, arrays, params, fitted_on)


def write_bm25(
    target: Path,
    *,
    terms: Sequence[str],
    document_frequency: np.ndarray,
    documents: int,
    mean_length: float,
    k1: float,
    b: float,
    stopwords: Sequence[str],
    fitted_on: Mapping[str, Any],
) -> dict[str, Any]:
    """Write a bm25 folder at ``target`` (which must not exist); returns the manifest."""
    arrays = {"document_frequency": np.asarray(document_frequency, dtype=np.int64)}
    params = {"k1": k1, "b": b, "documents": int(documents), "mean_length": float(mean_length)}
    vocabulary = {"terms": list(terms), "stopwords": sorted(stopwords)}
    return _write(target, BM25, vocabulary, arrays, params, fitted_on)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest, checked for shape, with every file's sha256 verified against it."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"format error in {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BaselineError(f"format error in {path}: expected an object with format {FORMAT}")
    kind = manifest.get("kind")
    if kind not in KINDS:
        raise BaselineError(f"format error in {path}: kind must be one of {', '.join(KINDS)}")
    files = manifest.get("files")
    expected = {VOCABULARY, ARRAYS}
    if not isinstance(files, dict) or set(files) != expected:
        raise BaselineError(f"format error in {path}: 'files' must name {sorted(expected)}")
    if not isinstance(manifest.get("params"), dict):
        raise BaselineError(f"format error in {path}: 'params' must be an object")
    present = {p.name for p in folder.iterdir()}
    extra = sorted(present - expected - {MANIFEST})
    if extra:
        raise BaselineError(f"format error in {folder}: unexpected file(s) {', '.join(extra)}")
    for name in sorted(expected):
        digest = files[name]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise BaselineError(f"format error in {path}: files.{name} is not a sha256")
        file = folder / name
        if not file.is_file():
            raise BaselineError(f"format error in {folder}: missing {name}")
        actual = _sha256(file)
        if actual != digest:
            raise BaselineError(
                f"sha256 mismatch in {folder}: {name} is {actual[:12]}..., the manifest says "
                f"{digest[:12]}..."
            )
    return manifest


def _arrays(folder: Path, kind: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = folder / ARRAYS
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BaselineError(f"format error in {path}: {exc}") from None
    want = _ARRAYS[kind]
    if set(arrays) != set(want):
        raise BaselineError(f"format error in {path}: expected tensors {sorted(want)}")
    for name, dtype in want.items():
        if str(arrays[name].dtype) != dtype:
            raise BaselineError(f"format error in {path}: {name} must be {dtype}")
    return arrays


def _strings(value: object, what: str, path: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BaselineError(f"format error in {path}: {what} must be a list of strings")
    return value


def _vocabulary(folder: Path, terms_count: int) -> tuple[dict[str, int], dict[str, Any]]:
    path = folder / VOCABULARY
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"format error in {path}: {exc}") from None
    if not isinstance(data, dict):
        raise BaselineError(f"format error in {path}: expected an object with 'terms'")
    terms = _strings(data.get("terms"), "'terms'", path)
    vocabulary = {t: i for i, t in enumerate(terms)}
    if len(vocabulary) != len(terms) or len(terms) != terms_count:
        raise BaselineError(
            f"format error in {path}: {len(terms)} terms ({len(vocabulary)} distinct) for "
            f"{terms_count} rows of arrays"
        )
    return vocabulary, data


def _number(params: Mapping[str, Any], name: str, path: Path, *, positive: bool = True) -> float:
    value = params.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise BaselineError(f"format error in {path}: params.{name} must be a finite number")
    if positive and value <= 0:
        raise BaselineError(f"format error in {path}: params.{name} must be above 0")
    return float(value)


def load_baseline(folder: Path) -> Baseline:
    """The model a baseline folder holds, after every check in the module's docstring."""
    manifest = read_manifest(folder)
    kind = manifest["kind"]
    params = manifest["params"]
    path = folder / MANIFEST
    arrays = _arrays(folder, kind)
    if kind == TFIDF_LR:
        idf, weights, bias = arrays["idf"], arrays["weights"], arrays["bias"]
        labels = _strings(params.get("labels"), "params.labels", path)
        if len(labels) < 2 or len(set(labels)) != len(labels):
            raise BaselineError(f"format error in {path}: params.labels needs 2+ distinct labels")
        if (
            idf.ndim != 1
            or weights.shape != (len(labels), idf.shape[0])
            or bias.shape != (len(labels),)
        ):
            raise BaselineError(
                f"format error in {folder / ARRAYS}: shapes idf {idf.shape}, weights "
                f"{weights.shape}, bias {bias.shape} do not fit {len(labels)} labels"
            )
        max_ngram = params.get("max_ngram")
        if not isinstance(max_ngram, int) or isinstance(max_ngram, bool) or not 1 <= max_ngram <= 5:
            raise BaselineError(f"format error in {path}: params.max_ngram must be 1..5")
        vocabulary, _ = _vocabulary(folder, idf.shape[0])
        return TfidfLogReg(tuple(labels), vocabulary, idf, weights, bias, max_ngram)
    frequency = arrays["document_frequency"]
    if frequency.ndim != 1:
        raise BaselineError(f"format error in {folder / ARRAYS}: document_frequency must be 1-D")
    documents = _number(params, "documents", path)
    if documents != int(documents) or (
        frequency.size and (frequency.min() < 1 or frequency.max() > documents)
    ):
        raise BaselineError(
            f"format error in {path}: document frequencies must lie within 1..documents"
        )
    vocabulary, data = _vocabulary(folder, frequency.shape[0])
    stopwords = _strings(data.get("stopwords", []), "'stopwords'", folder / VOCABULARY)
    return Bm25(
        k1=_number(params, "k1", path),
        b=_number(params, "b", path, positive=False),
        documents=int(documents),
        mean_length=_number(params, "mean_length", path),
        vocabulary=vocabulary,
        idf=lucene_idf(frequency, int(documents)),
        stopwords=frozenset(stopwords),
    )
