"""Read a rerank suite: a BEIR folder plus ``top_ranked/<split>.jsonl`` candidate lists.

Each ``top_ranked`` line is ``{"query-id": str, "corpus-ids": [str]}`` — the candidates a
reranker orders for that query, as mteb's reranking tasks declare them. Malformed lines,
duplicate query ids and candidates missing from the corpus are errors naming the file and line;
queries without a judged relevant document cannot be scored and are skipped with a warning.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from evals.beir import (
    Qrels,
    iter_json_lines,
    judged_queries,
    read_corpus,
    read_qrels,
    read_queries,
    shown,
)
from evals.errors import SuiteDataError


@dataclass(frozen=True)
class RerankSplit:
    corpus: dict[str, str]  # every document some candidate list names, text as the model reads it
    queries: dict[str, str]  # scored queries, in queries.jsonl order
    candidates: dict[str, list[str]]  # query id -> candidate doc ids, in file order
    qrels: Qrels
    split: str
    warnings: list[str] = field(default_factory=list)

    def sample(self, n: int | None) -> RerankSplit:
        """The first n scored queries (queries.jsonl order)."""
        if n is None or n >= len(self.queries):
            return self
        if n < 1:
            raise SuiteDataError(f"sample size must be at least 1, got {n}")
        keep = list(self.queries)[:n]
        docs = {d for q in keep for d in self.candidates[q]}
        return RerankSplit(
            corpus={d: t for d, t in self.corpus.items() if d in docs},
            queries={q: self.queries[q] for q in keep},
            candidates={q: self.candidates[q] for q in keep},
            qrels={q: self.qrels[q] for q in keep},
            split=self.split,
            warnings=list(self.warnings),
        )

    @property
    def pairs(self) -> int:
        return sum(len(c) for c in self.candidates.values())


def split_files(folder: Path, split: str) -> list[Path]:
    return [
        folder / "corpus.jsonl",
        folder / "queries.jsonl",
        folder / "qrels" / f"{split}.tsv",
        folder / "top_ranked" / f"{split}.jsonl",
    ]


def available_splits(folder: Path) -> list[str]:
    judged = {p.stem for p in (folder / "qrels").glob("*.tsv")}
    return sorted(p.stem for p in (folder / "top_ranked").glob("*.jsonl") if p.stem in judged)


def read_top_ranked(
    path: Path, corpus: dict[str, str], queries: dict[str, str]
) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    first: dict[str, int] = {}
    for number, row in iter_json_lines(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise SuiteDataError(f"{where}: expected an object with 'query-id' and 'corpus-ids'")
        qid, ids = row.get("query-id"), row.get("corpus-ids")
        if not isinstance(qid, str) or not isinstance(ids, list):
            raise SuiteDataError(
                f"{where}: expected 'query-id' (string) and 'corpus-ids' (list of strings)"
            )
        if qid in lists:
            raise SuiteDataError(
                f"{where}: duplicate query id {shown(qid)} (first on line {first[qid]})"
            )
        if qid not in queries:
            raise SuiteDataError(f"{where}: query id {shown(qid)} is not in queries.jsonl")
        if not ids:
            raise SuiteDataError(f"{where}: query {shown(qid)} has no candidates")
        seen: set[str] = set()
        for doc in ids:
            if not isinstance(doc, str):
                raise SuiteDataError(f"{where}: 'corpus-ids' must hold strings")
            if doc not in corpus:
                raise SuiteDataError(f"{where}: candidate {shown(doc)} is not in corpus.jsonl")
            if doc in seen:
                raise SuiteDataError(f"{where}: candidate {shown(doc)} is listed twice")
            seen.add(doc)
        lists[qid] = list(ids)
        first[qid] = number
    return lists


def load_split(folder: Path, split: str) -> RerankSplit:
    for path in split_files(folder, split):
        if not path.is_file():
            raise SuiteDataError(f"missing file: {path}")
    corpus = read_corpus(folder / "corpus.jsonl")
    all_queries = read_queries(folder / "queries.jsonl")
    lists = read_top_ranked(folder / "top_ranked" / f"{split}.jsonl", corpus, all_queries)
    if not lists:
        raise SuiteDataError(f"split {split!r} is empty: top_ranked/{split}.jsonl lists no query")
    qrels, warnings = judged_queries(
        read_qrels(folder / "qrels" / f"{split}.tsv"), split, folder, corpus, all_queries
    )
    unlisted = [q for q in qrels if q not in lists]
    if unlisted:
        warnings.append(f"{len(unlisted)} judged query(ies) in {split!r} have no candidate list")
    unjudged = [q for q in lists if q not in qrels]
    if unjudged:
        warnings.append(
            f"{len(unjudged)} query(ies) in top_ranked/{split}.jsonl have no relevant document; "
            "not scored"
        )
    scored = [q for q in all_queries if q in lists and q in qrels]
    if not scored:
        raise SuiteDataError(f"split {split!r} has no query with candidates and a judgement")
    listed = {q: set(lists[q]) for q in scored}
    missed = sum(1 for q in scored for d in qrels[q] if d not in listed[q])
    if missed:
        warnings.append(
            f"{missed} relevant document(s) in {split!r} are not among their query's candidates; "
            "a reranker cannot find them (they count as misses)"
        )
    docs = {d for q in scored for d in lists[q]}
    return RerankSplit(
        corpus={d: t for d, t in corpus.items() if d in docs},
        queries={q: all_queries[q] for q in scored},
        candidates={q: lists[q] for q in scored},
        qrels={q: qrels[q] for q in scored},
        split=split,
        warnings=warnings,
    )


def shuffled(candidates: list[str], seed: int, query_id: str) -> list[str]:
    """A candidate list in a random order that depends only on (seed, query id)."""
    order = list(candidates)
    random.Random(f"{seed}:{query_id}").shuffle(order)
    return order
