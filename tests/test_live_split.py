"""Live splits written as the kind's reader reads them (taskfleet/live_split.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from evals.beir import doc_text, read_jsonl
from evals.rerank_data import load_split
from evals.suites import declare
from registry import Registry
from registry import entities as e
from taskfleet.live_split import LIVE_SPLIT, item_id, write_live_folder
from tests.kinds_fixture import build_rerank


def test_a_rerank_request_naming_two_corpus_documents_of_one_text_keeps_both(
    registry: Registry, tmp_path: Path
) -> None:
    """GerLayQA's corpus holds repealed paragraphs that all read alike: a request listing two of
    them is written with each one's own id (a list naming one id twice is refused by the
    rerank reader, and the cut failed), the n-th copy as the n-th id in corpus order."""
    folder = build_rerank(tmp_path / "rank", queries={"test": 4, "train": 2})
    corpus = [row for _, row in read_jsonl(folder / "corpus.jsonl")]
    twin = {"_id": "twin", "title": corpus[0].get("title", ""), "text": corpus[0]["text"]}
    with (folder / "corpus.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(twin) + "\n")
    suite, _ = registry.add_suite(declare("rank-suite", "rerank", folder)[0])
    same, other = doc_text(corpus[0]), doc_text(corpus[1])
    documents = [same, other, same, same]  # the third copy is in no corpus line of its own
    item = e.LiveItem(
        id=1,
        task="rank",
        request_id="r1",
        index=0,
        item={"query": "wer erbt?", "documents": documents, "relevant": [2]},
        key=None,
        received_at=datetime.now(UTC),
        suite_version=None,
    )
    target = write_live_folder(suite, [item], tmp_path / "live")
    data = load_split(target, LIVE_SPLIT)
    ids = data.candidates[item_id(item)]
    assert ids[:3] == [str(corpus[0]["_id"]), str(corpus[1]["_id"]), "twin"]
    assert len(set(ids)) == 4 and data.corpus[ids[3]] == same
    assert data.qrels[item_id(item)] == {"twin": 1}
