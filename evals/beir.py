"""Read a BEIR-layout folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) into memory.

Bad input never turns into a silently wrong score: a malformed line is an error naming the
file and line; qrels pointing at unknown documents or queries are counted, skipped and reported
as warnings; a split left with no judged query is an error.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.errors import SuiteDataError

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class RetrievalSplit:
    """Everything one retrieval eval needs: the full corpus, the judged queries, their qrels."""

    corpus: dict[str, str]  # doc id -> text as the model reads it (title + " " + text)
    queries: dict[str, str]  # query id -> text, only queries with >= 1 relevant known doc
    qrels: Qrels  # query id -> {doc id: relevance > 0}
    split: str
    warnings: list[str] = field(default_factory=list)

    def sample(self, n: int | None) -> RetrievalSplit:
        """The first n judged queries (in queries.jsonl order) with the full corpus."""
        if n is None or n >= len(self.queries):
            return self
        if n < 1:
            raise SuiteDataError(f"sample size must be at least 1, got {n}")
        keep = list(self.queries)[:n]
        return RetrievalSplit(
            corpus=self.corpus,
            queries={q: self.queries[q] for q in keep},
            qrels={q: self.qrels[q] for q in keep},
            split=self.split,
            warnings=list(self.warnings),
        )


def parse_json(text: str, where: str) -> Any:
    """One JSON document of a suite file; every way it can fail is one line naming `where`
    (`file:line`): malformed, nested too deeply for the parser, or a number too long to hold."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SuiteDataError(f"{where}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise SuiteDataError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal of more than 4300 digits
        raise SuiteDataError(f"{where}: a JSON value is too large ({exc})") from None


def read_text(path: Path) -> str:
    """A whole suite file as text (UTF-8); a missing, unreadable or undecodable file is one
    line naming it."""
    if not path.is_file():
        raise SuiteDataError(f"missing file: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SuiteDataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise SuiteDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def iter_json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of a JSON-lines file; blank lines are skipped, a malformed
    line is an error naming the file and line. Every reader of suite data uses this."""
    if not path.is_file():
        raise SuiteDataError(f"missing file: {path}")
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                yield number, parse_json(line, f"{path}:{number}")
    except UnicodeDecodeError as exc:
        raise SuiteDataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise SuiteDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def shown(value: object, limit: int = 80) -> str:
    """A value from the user's data as an error message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """BEIR rows (corpus or queries) with their line numbers."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, row in iter_json_lines(path):
        if not isinstance(row, dict) or not isinstance(row.get("_id"), str):
            raise SuiteDataError(f"{path}:{number}: expected an object with a string '_id'")
        if not isinstance(row.get("text", ""), str) or not isinstance(row.get("title", ""), str):
            raise SuiteDataError(f"{path}:{number}: 'text' and 'title' must be strings")
        rows.append((number, row))
    return rows


def doc_text(row: dict[str, Any]) -> str:
    """Title and text joined exactly as mteb joins them, so both see the same input."""
    title = row.get("title") or ""
    text = str(row.get("text", ""))
    return (title + " " + text).strip() if title else text.strip()


def read_corpus(path: Path) -> dict[str, str]:
    corpus: dict[str, str] = {}
    first: dict[str, int] = {}
    for number, row in read_jsonl(path):
        if row["_id"] in corpus:
            raise SuiteDataError(
                f"{path}:{number}: duplicate document id {shown(row['_id'])} "
                f"(first on line {first[row['_id']]})"
            )
        corpus[row["_id"]] = doc_text(row)
        first[row["_id"]] = number
    if not corpus:
        raise SuiteDataError(f"{path}: corpus is empty")
    return corpus


def read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    first: dict[str, int] = {}
    for number, row in read_jsonl(path):
        if row["_id"] in queries:
            raise SuiteDataError(
                f"{path}:{number}: duplicate query id {shown(row['_id'])} "
                f"(first on line {first[row['_id']]})"
            )
        queries[row["_id"]] = str(row.get("text", "")).strip()
        first[row["_id"]] = number
    return queries


def read_qrels(path: Path) -> Qrels:
    """Tab-separated ``query-id corpus-id score`` with an optional header row."""
    qrels: Qrels = {}
    if not path.is_file():
        raise SuiteDataError(f"missing file: {path}")
    number = 0
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            for number, fields in enumerate(csv.reader(fh, delimiter="\t"), start=1):
                if not fields or all(not f.strip() for f in fields):
                    continue
                if number == 1 and fields[0].strip().lower() in {"query-id", "query_id", "qid"}:
                    continue
                if len(fields) != 3:
                    raise SuiteDataError(f"{path}:{number}: expected 3 tab-separated fields")
                qid, did, score = (f.strip() for f in fields)
                try:
                    relevance = int(float(score))
                except (ValueError, OverflowError):  # not a number, nan, inf
                    raise SuiteDataError(
                        f"{path}:{number}: score {shown(score)} is not a finite number"
                    ) from None
                if did in qrels.get(qid, {}):
                    raise SuiteDataError(
                        f"{path}:{number}: duplicate judgement of {shown(qid)} / {shown(did)}"
                    )
                qrels.setdefault(qid, {})[did] = relevance
    except UnicodeDecodeError as exc:
        raise SuiteDataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:  # a field above csv's size limit, a NUL byte
        raise SuiteDataError(f"{path}:{number + 1}: unreadable line ({exc})") from None
    except OSError as exc:
        raise SuiteDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return qrels


def split_files(folder: Path, split: str) -> list[Path]:
    return [folder / "corpus.jsonl", folder / "queries.jsonl", folder / "qrels" / f"{split}.tsv"]


def available_splits(folder: Path) -> list[str]:
    return sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))


def load_split(folder: Path, split: str) -> RetrievalSplit:
    """Load one split; unknown ids in its qrels are skipped and reported, never scored."""
    for path in split_files(folder, split):
        if not path.is_file():
            raise SuiteDataError(f"missing file: {path}")
    corpus = read_corpus(folder / "corpus.jsonl")
    all_queries = read_queries(folder / "queries.jsonl")
    qrels, warnings = judged_queries(
        read_qrels(folder / "qrels" / f"{split}.tsv"), split, folder, corpus, all_queries
    )
    # Keep queries.jsonl order so "the first N queries" is a stable, documented sample.
    queries = {q: t for q, t in all_queries.items() if q in qrels}
    return RetrievalSplit(
        corpus=corpus,
        queries=queries,
        qrels={q: qrels[q] for q in queries},
        split=split,
        warnings=warnings,
    )


def judged_queries(
    raw: Qrels, split: str, folder: Path, corpus: dict[str, str], all_queries: dict[str, str]
) -> tuple[Qrels, list[str]]:
    """The judgements that can be scored (known query, known relevant document), and warnings
    counting what was skipped. A split left with nothing to score is an error."""
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not raw:
        raise SuiteDataError(f"split {split!r} is empty: {qrels_path} has no judgements")

    warnings: list[str] = []
    unknown_docs = sum(1 for docs in raw.values() for d in docs if d not in corpus)
    unknown_queries = [q for q in raw if q not in all_queries]
    qrels: Qrels = {}
    for qid, docs in raw.items():
        if qid not in all_queries:
            continue
        kept = {d: r for d, r in docs.items() if d in corpus and r > 0}
        if kept:
            qrels[qid] = kept
    # Queries without a (known) relevant doc cannot be scored; mteb drops them too.
    dropped = [q for q in raw if q in all_queries and q not in qrels]
    if unknown_docs:
        warnings.append(
            f"{unknown_docs} qrels pair(s) in {split!r} point to documents not in the corpus; "
            "skipped"
        )
    if unknown_queries:
        warnings.append(
            f"{len(unknown_queries)} query id(s) in qrels {split!r} are not in queries.jsonl; "
            "skipped"
        )
    if dropped:
        warnings.append(
            f"{len(dropped)} query(ies) in {split!r} have no relevant document in the corpus; "
            "not scored"
        )
    if not qrels:
        raise SuiteDataError(f"split {split!r} has no query with a relevant document in the corpus")
    return qrels, warnings
