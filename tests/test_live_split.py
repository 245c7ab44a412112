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


def test_a_cut_that_fails_for_one_task_leaves_the_others_ticking(
    registry: Registry, tmp_path: Path
) -> None:
    """A live cut refused by the suite's reader is that task's warning, retried next tick:
    before, its SuiteDataError left the ticker's loop, the leader gave up the lead and no
    task was cut, re-evaluated or watched for drift any more."""
    from evals.runner import EvalPaths
    from taskfleet.production import ProductionTicker, ShellPaths, SuiteJudge
    from tests.kinds_fixture import build_classification

    rank = build_rerank(tmp_path / "rank", queries={"test": 4, "train": 2})
    area = build_classification(tmp_path / "area")
    for task, kind, folder in (("a-rank", "rerank", rank), ("b-area", "classification", area)):
        registry.add_suite(declare(f"{task}-suite", kind, folder)[0])
        registry.add_task(task, suite=f"{task}-suite")
        registry.set_production_settings(task, live_every=1)
    live: dict[str, dict[str, object]] = {
        "a-rank": {"query": "wer erbt?", "documents": ["x", "y"], "relevant": [0]},
        "b-area": {"text": "Darf der Vermieter kündigen?", "label": "miete"},
    }
    for task, item in live.items():
        registry.add_live_item(e.LiveItemCreate(task, f"r-{task}", 0, item))
    # The rerank suite's files changed under it so that its reader refuses them: its cut fails.
    ranked = rank / "top_ranked" / "test.jsonl"
    first = json.loads(ranked.read_text(encoding="utf-8").splitlines()[0])
    first["corpus-ids"] = first["corpus-ids"][:1] * 2
    ranked.write_text(json.dumps(first) + "\n", encoding="utf-8")
    paths = EvalPaths(cache_dir=tmp_path / "cache")
    shell = ShellPaths(home=tmp_path / "home", database_url="", data_root=None, eval_paths=paths)
    ProductionTicker(registry, SuiteJudge(registry, paths), shell, reevaluate=False).tick()
    assert registry.get_suite("b-area-suite").version == 2
    assert registry.get_suite("a-rank-suite").version == 1
