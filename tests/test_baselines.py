"""Servable lexical baselines: the artifact equals what it was fitted from, the runtime serves
what the eval scores, and a tampered or crafted artifact is refused at load, never run."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evals.baselines import fit_bm25, fit_tfidf_lr
from evals.beir import read_corpus
from evals.classification_data import ClassificationSplit, load_split
from evals.classifiers import BaselineClassifier, TfidfLogisticRegression
from evals.rerank_data import load_split as load_rerank_split
from evals.retrievers import tokenize_german
from serving import protocol as p
from serving.runtime.baseline_artifact import (
    ARRAYS,
    MANIFEST,
    VOCABULARY,
    BaselineError,
    load_baseline,
)
from serving.runtime.lexical import Bm25, TfidfLogReg
from testbed.gerlayqa import SHARED_DATA
from tests.test_runtime_server import Conn, start_server, stop_server

DATA = Path(os.environ.get("TASKFLEET_DATA_DIR") or SHARED_DATA)
AREA = DATA / "gerlayqa-area"
RERANK = DATA / "gerlayqa-rerank"


@pytest.fixture(scope="module")
def area() -> tuple[ClassificationSplit, ClassificationSplit]:
    # A quarter of the training split keeps the fit to a few seconds; every label occurs.
    return load_split(AREA, "train").sample(600), load_split(AREA, "test").sample(300)


@pytest.fixture(scope="module")
def tfidf(tmp_path_factory: pytest.TempPathFactory, area: Any) -> Path:
    folder = tmp_path_factory.mktemp("baselines") / "tfidf-lr"
    fit_tfidf_lr(area[0], folder, fitted_on={"suite": "german-legal-area"})
    return folder


@pytest.fixture(scope="module")
def bm25(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("baselines") / "bm25"
    fit_bm25(list(read_corpus(RERANK / "corpus.jsonl").values()), folder)
    return folder


def test_tfidf_artifact_predicts_what_scikit_learn_fitted(tfidf: Path, area: Any) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train, test = area
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    features = vectorizer.fit_transform(train.texts)
    reference = LogisticRegression(class_weight="balanced", max_iter=2000, random_state=0)
    reference.fit(features, train.labels)
    expected = reference.predict_proba(vectorizer.transform(test.texts))

    model = load_baseline(tfidf)
    assert isinstance(model, TfidfLogReg)
    assert list(model.labels) == [x for x in train.label_names if x in set(train.labels)]
    columns = [list(reference.classes_).index(label) for label in model.labels]
    got = model.predict_proba(test.texts)
    assert got.dtype == np.float32
    assert np.abs(got - expected[:, columns]).max() < 1e-6
    dense = vectorizer.transform(test.texts[:40]).toarray()
    for row, text in enumerate(test.texts[:40]):
        cols, values = model.features(text)
        mine = np.zeros(dense.shape[1])
        mine[cols] = values
        assert np.abs(mine - dense[row]).max() < 1e-12


def test_tfidf_fitted_at_eval_time_scores_as_the_artifact(tfidf: Path, area: Any) -> None:
    train, test = area
    fitted = TfidfLogisticRegression().classify(test, train)
    placed = BaselineClassifier(tfidf).classify(test, None)
    assert fitted.predictions == placed.predictions
    assert fitted.cost["fit_seconds"] > 0


def test_bm25_artifact_scores_as_bm25s_over_the_corpus(bm25: Path) -> None:
    import bm25s

    corpus = read_corpus(RERANK / "corpus.jsonl")
    ids = list(corpus)
    index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    index.index([tokenize_german(corpus[d]) for d in ids], show_progress=False)
    row_of = {d: i for i, d in enumerate(ids)}
    data = load_rerank_split(RERANK, "test")
    model = load_baseline(bm25)
    assert isinstance(model, Bm25)
    for qid in list(data.candidates)[:60]:
        candidates = data.candidates[qid]
        got = model.score(data.queries[qid], [corpus[d] for d in candidates])
        tokens = index.get_tokens_ids(tokenize_german(data.queries[qid]))
        row = np.asarray(index.get_scores_from_ids(tokens)) if tokens else np.zeros(len(ids))
        expected = np.asarray([row[row_of[d]] for d in candidates])
        # bm25s keeps float32 tables; relative 1e-6 is that precision.
        assert np.all(np.abs(got - expected) <= 1e-6 * np.maximum(1.0, np.abs(expected)))
    # A document the corpus never held is scored from its own text.
    assert model.score("Kaution Vermieter", ["der vermieter behält die kaution", "nichts"])[1] == 0


class Executed(Exception):
    pass


class _Payload:
    """Unpickling this writes a marker file: proof that a loader ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.write_text, (self.marker, "executed"))


def _copy(folder: Path, target: Path) -> Path:
    target.mkdir()
    for file in folder.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


def _rewrite_manifest_digest(folder: Path, name: str) -> None:
    import hashlib

    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _refusals(tfidf: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Tampered copies of the tfidf artifact and the start of the line each must be refused with."""
    marker = tmp_path / "marker"
    pickled = pickle.dumps(_Payload(marker))
    cases: dict[str, tuple[Path, str]] = {}

    swapped = _copy(tfidf, tmp_path / "pickle-swapped")
    (swapped / ARRAYS).write_bytes(pickled)
    cases["pickle in place of the arrays"] = (swapped, "sha256 mismatch")

    blessed = _copy(tfidf, tmp_path / "pickle-blessed")
    (blessed / ARRAYS).write_bytes(pickled)
    _rewrite_manifest_digest(blessed, ARRAYS)  # the manifest vouches for the pickle
    cases["pickle the manifest vouches for"] = (blessed, "format error")

    extra = _copy(tfidf, tmp_path / "pickle-beside")
    (extra / "model.pkl").write_bytes(pickled)
    cases["pickle beside the files"] = (extra, "format error")

    altered = _copy(tfidf, tmp_path / "json-altered")
    vocabulary = json.loads((altered / VOCABULARY).read_text())
    vocabulary["terms"][0], vocabulary["terms"][1] = vocabulary["terms"][1], vocabulary["terms"][0]
    (altered / VOCABULARY).write_text(json.dumps(vocabulary))
    cases["vocabulary JSON altered"] = (altered, "sha256 mismatch")

    reshaped = _copy(tfidf, tmp_path / "json-blessed")
    vocabulary["terms"] = vocabulary["terms"][:-1]
    (reshaped / VOCABULARY).write_text(json.dumps(vocabulary))
    _rewrite_manifest_digest(reshaped, VOCABULARY)
    cases["vocabulary JSON altered, digest updated"] = (reshaped, "format error")

    manifest = _copy(tfidf, tmp_path / "manifest-altered")
    (manifest / MANIFEST).write_text((manifest / MANIFEST).read_text().replace('"format"', "'f"))
    cases["manifest not JSON"] = (manifest, "format error")
    return cases


def test_a_crafted_or_altered_artifact_is_refused_in_one_line(tfidf: Path, tmp_path: Path) -> None:
    for what, (folder, start) in _refusals(tfidf, tmp_path).items():
        with pytest.raises(BaselineError) as caught:
            load_baseline(folder)
        message = str(caught.value)
        assert message.startswith(start), (what, message)
        assert "\n" not in message, what
    assert not (tmp_path / "marker").exists()
    # The pickle really would run code if anything unpickled it.
    pickle.loads((tmp_path / "pickle-swapped" / ARRAYS).read_bytes())
    assert (tmp_path / "marker").read_text() == "executed"


@pytest.fixture(scope="module")
def runtime() -> Any:
    proc, sock = start_server()
    yield sock
    stop_server(proc, sock)


def _load(key: str, folder: Path) -> dict[str, Any]:
    return {
        "op": "load",
        "id": 1,
        "model_key": key,
        "base_path": str(folder),
        "adapter_path": None,
        "query_prefix": "",
        "passage_prefix": "",
        "max_seq_length": None,
    }


def test_the_runtime_serves_what_the_eval_scores(
    runtime: Path, tfidf: Path, bm25: Path, area: Any, tmp_path: Path
) -> None:
    texts = area[1].texts
    data = load_rerank_split(RERANK, "test")
    queries = list(data.candidates)[:20]

    async def go() -> tuple[list[dict[str, Any]], ...]:
        conn = await Conn.open(runtime)
        replies = []
        for n, message in enumerate(
            [
                _load("area", tfidf),
                _load("rerank", bm25),
                {
                    "op": "classify",
                    "id": 3,
                    "batch_id": "c",
                    "items": [{"model_key": "area", "texts": texts}],
                },
                {
                    "op": "score",
                    "id": 4,
                    "batch_id": "s",
                    "items": [
                        {
                            "model_key": "rerank",
                            "query": data.queries[q],
                            "passages": [data.corpus[d] for d in data.candidates[q]],
                        }
                        for q in queries
                    ],
                },
                {
                    "op": "infer",
                    "id": 5,
                    "batch_id": "i",
                    "items": [{"model_key": "area", "kind": "query", "texts": ["x"]}],
                },
                {
                    "op": "classify",
                    "id": 6,
                    "batch_id": "c2",
                    "items": [{"model_key": "rerank", "texts": ["x"]}],
                },
                {"op": "stats", "id": 7},
            ]
        ):
            await conn.send({**message, "id": n + 1})
            replies.append(await conn.receive())
        return (replies,)

    (replies,) = asyncio.run(go())
    loads, classified, scored, infer, wrong, stats = (
        replies[:2],
        replies[2],
        replies[3],
        replies[4],
        replies[5],
        replies[6],
    )
    assert all(r["memory_bytes"] > 0 for r in loads), loads
    model = load_baseline(tfidf)
    assert isinstance(model, TfidfLogReg)
    result = p.from_wire(p.ClassifyReply, classified).results[0]
    assert result.labels == list(model.labels)
    assert np.abs(result.matrix() - model.predict_proba(texts)).max() <= 1e-6
    ranker = load_baseline(bm25)
    assert isinstance(ranker, Bm25)
    for q, served in zip(queries, p.from_wire(p.ScoreReply, scored).results, strict=True):
        expected = ranker.score(data.queries[q], [data.corpus[d] for d in data.candidates[q]])
        assert np.abs(served.array() - expected).max() <= 1e-6 * max(1.0, float(expected.max()))
    assert infer["error"]["code"] == "BAD_REQUEST"
    assert "tfidf-lr baseline: it classifies only (no embed)" in infer["error"]["message"]
    assert "bm25 baseline" in wrong["error"]["message"]
    assert {m["model_key"] for m in stats["models"]} == {"area", "rerank"}


def test_the_runtime_refuses_a_crafted_artifact_without_running_it(
    runtime: Path, tfidf: Path, tmp_path: Path
) -> None:
    cases = _refusals(tfidf, tmp_path)

    async def go() -> list[dict[str, Any]]:
        conn = await Conn.open(runtime)
        replies = []
        for n, (folder, _) in enumerate(cases.values()):
            await conn.send({**_load(f"bad-{n}", folder), "id": n + 1})
            replies.append(await conn.receive())
        return replies

    for (what, (_, start)), reply in zip(cases.items(), asyncio.run(go()), strict=True):
        assert reply["error"]["code"] == "LOAD_FAILED", what
        assert reply["error"]["message"].startswith(start), (what, reply)
        assert "\n" not in reply["error"]["message"]
    assert not (tmp_path / "marker").exists()


def test_fitting_needs_no_pickle_and_loading_needs_no_scikit_learn(tfidf: Path) -> None:
    """The loader is numpy + safetensors: a process that cannot import scikit-learn loads and
    runs the artifact."""
    code = (
        "import sys; sys.modules['sklearn'] = None; sys.modules['joblib'] = None\n"
        "from pathlib import Path\n"
        "from serving.runtime.baseline_artifact import load_baseline\n"
        f"m = load_baseline(Path({str(tfidf)!r}))\n"
        "print(m.predict_proba(['Mein Vermieter behält die Kaution']).shape)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "(1, 5)"
    assert not list(tfidf.glob("*.pkl")) and not list(tfidf.glob("*.joblib"))
