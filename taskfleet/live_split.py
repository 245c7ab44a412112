"""Live versions of a suite: its newest version's own files plus a ``live`` split of labelled
production items, written as a folder and registered like any version (fingerprinted, read by
the kind's reader, evaluated by ``taskfleet eval run TASK -c X --split live``).

The live split holds every labelled item the task has (``registry/live_items.py``), in the form
the kind reads:

- classification: ``live.jsonl`` lines ``{"id", "text", "label"}`` (``labels.json`` as before);
- retrieval: the live queries appended to ``queries.jsonl`` and ``qrels/live.tsv`` naming the
  relevant corpus ids (the corpus is the suite's own);
- rerank: the live queries appended to ``queries.jsonl``, ``top_ranked/live.jsonl`` listing each
  request's documents in the order they were sent, ``qrels/live.tsv`` the relevant ones. A
  document whose text is a corpus document's keeps that document's id (the n-th copy of a text
  that several corpus documents share, the n-th of them in corpus order); any other is appended
  to ``corpus.jsonl`` under an id from its text's hash.

Item ids are ``live-<request id>-<input index>``, so two versions name the same item alike. The
folder lives under the home (``<home>/live/<suite>/v<next version>``); a cut that would hold
what the newest version already holds registers nothing new (same fingerprint).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from evals import readers
from evals.beir import doc_text, read_jsonl
from evals.errors import SuiteDataError
from evals.suites import CLASSIFICATION, RERANK, RETRIEVAL, declare, spec_from_record
from registry import entities as e
from registry.store import AbstractStore

LIVE_SPLIT = "live"


def item_id(item: e.LiveItem) -> str:
    return f"live-{item.request_id}-{item.index}"


def write_live_folder(
    suite: e.Suite, items: list[e.LiveItem], target: Path, *, data_root: Path | None = None
) -> Path:
    """Write ``suite``'s own splits (not an older live split) and ``items`` as its live split
    into ``target`` (replaced if it exists)."""
    spec = spec_from_record(suite)
    source = spec.data_dir(data_root)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    own = [s for s in (suite.test_split, suite.train_split) if s]
    for split in own:
        for path in readers.split_files(suite.kind, source, split):
            copy = target / path.relative_to(source)
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, copy)
    if suite.kind == CLASSIFICATION:
        _classification(items, target)
    elif suite.kind == RETRIEVAL:
        _retrieval(items, target)
    elif suite.kind == RERANK:
        _rerank(items, target)
    else:
        raise SuiteDataError(f"a {suite.kind} suite has no live split")
    return target


def _lines(path: Path, rows: list[dict[str, object]], *, append: bool = False) -> None:
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def _append_queries(path: Path, items: list[e.LiveItem]) -> None:
    """Add the live queries to ``queries.jsonl``, dropping the lines of the same ids that a
    live version before this one added (the other lines stay byte for byte)."""
    ids = {item_id(i) for i in items}
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and json.loads(line).get("_id") in ids:
            continue
        kept.append(line)
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    _lines(path, [{"_id": item_id(i), "text": i.item["query"]} for i in items], append=True)


def _qrels(path: Path, judged: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t1" for q, d in judged)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _classification(items: list[e.LiveItem], target: Path) -> None:
    _lines(
        target / f"{LIVE_SPLIT}.jsonl",
        [{"id": item_id(i), "text": i.item["text"], "label": i.item["label"]} for i in items],
    )


def _retrieval(items: list[e.LiveItem], target: Path) -> None:
    _append_queries(target / "queries.jsonl", items)
    _qrels(
        target / "qrels" / f"{LIVE_SPLIT}.tsv",
        [(item_id(i), doc) for i in items for doc in i.item["relevant_ids"]],
    )


def _rerank(items: list[e.LiveItem], target: Path) -> None:
    corpus_path = target / "corpus.jsonl"
    # Every id per text, in corpus order: a corpus may hold one text under several ids (GerLayQA
    # has repealed paragraphs that all read "(weggefallen)"), and a list naming two of them must
    # name each once. The n-th copy of a text in a request is the n-th such id, as the suite's
    # lists (in corpus order) name them; copies beyond those get ids of their own.
    by_text: dict[str, list[str]] = {}
    for _, row in read_jsonl(corpus_path):
        by_text.setdefault(doc_text(row), []).append(str(row["_id"]))
    added: list[dict[str, object]] = []
    lists: list[dict[str, object]] = []
    judged: list[tuple[str, str]] = []
    for item in items:
        ids: list[str] = []
        seen: dict[str, int] = {}
        for text in item.item["documents"]:
            key = text.strip()
            copy = seen.get(key, 0)
            seen[key] = copy + 1
            known = by_text.setdefault(key, [])
            if copy >= len(known):
                digest = hashlib.sha256(text.encode()).hexdigest()[:24]
                doc = f"live-doc-{digest}" + (f"-{copy}" if copy else "")
                known.append(doc)
                added.append({"_id": doc, "title": "", "text": text})
            ids.append(known[copy])
        lists.append({"query-id": item_id(item), "corpus-ids": ids})
        judged += [(item_id(item), ids[k]) for k in item.item["relevant"]]
    text = corpus_path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        corpus_path.write_text(text + "\n", encoding="utf-8")
    _lines(corpus_path, added, append=True)
    _append_queries(target / "queries.jsonl", items)
    (target / "top_ranked").mkdir(exist_ok=True)
    _lines(target / "top_ranked" / f"{LIVE_SPLIT}.jsonl", lists)
    _qrels(target / "qrels" / f"{LIVE_SPLIT}.tsv", judged)


def cut_live_version(
    registry: AbstractStore, task: str, home: Path, *, data_root: Path | None = None
) -> tuple[e.Suite, bool]:
    """Register a live version of the task's suite holding all its labelled items; returns
    (the version, whether it is new). Items already in the newest version: nothing new."""
    items = registry.live_items(task)
    if not items:
        raise SuiteDataError(
            f"task {task!r} has no labelled live items yet (feedback on sampled requests makes "
            "them: POST /v1/feedback)"
        )
    suite = registry.get_suite(registry.get_task(task).suite)
    folder = home / "live" / suite.name / f"v{suite.version + 1}"
    write_live_folder(suite, items, folder, data_root=data_root)
    create, _ = declare(
        suite.name,
        suite.kind,
        folder,
        test_split=suite.test_split,
        train_split=suite.train_split,
        main_metric=suite.main_metric,
        description=suite.description,
        data_root=data_root,
        live_split=LIVE_SPLIT,
    )
    version, created = registry.add_suite(create)
    if not created and folder.resolve() != Path(version.location).resolve():
        shutil.rmtree(folder, ignore_errors=True)  # the same content is registered elsewhere
    registry.mark_live_items_cut(task, [i.id for i in items], version.version)
    return version, created
