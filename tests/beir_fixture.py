"""A small, deterministic BEIR-layout folder for eval tests (tiny models: tests/tiny_model.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = {
    "miete": "mieter vermieter wohnung kaution kündigung nebenkosten mietvertrag",
    "kauf": "käufer verkäufer kaufpreis sache mangel gewährleistung rücktritt",
    "erbe": "erbe erblasser testament pflichtteil nachlass erbschein vermächtnis",
    "ehe": "ehegatte scheidung unterhalt zugewinn ehevertrag trennung sorgerecht",
    "arbeit": "arbeitnehmer arbeitgeber lohn urlaub kündigungsschutz zeugnis überstunden",
    "schaden": "schadensersatz haftung verschulden unfall schmerzensgeld fahrlässigkeit",
}
FILLER = ["der", "die", "das", "und", "oder", "nicht", "mit", "bei", "für", "von", "ist"]


def _words(rng: random.Random, topic: str, n: int) -> list[str]:
    vocab = TOPICS[topic].split()
    return [rng.choice(vocab) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(n)]


def build_beir(
    root: Path,
    *,
    docs_per_topic: int = 6,
    queries: dict[str, int] | None = None,
    seed: int = 7,
) -> Path:
    """Write corpus.jsonl, queries.jsonl, qrels/<split>.tsv under root; returns root.

    Each query is drawn from one topic and judged relevant to 1-2 documents of that topic,
    one of which shares some of its words, so lexical and dense retrieval both have signal.
    """
    queries = queries or {"test": 24, "dev": 12}
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    docs: dict[str, tuple[str, str]] = {}  # id -> (topic, text)
    for topic in TOPICS:
        for i in range(docs_per_topic):
            docs[f"§ {topic}-{i}"] = (topic, " ".join(_words(rng, topic, 30)).capitalize() + ".")
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for doc_id, (topic, text) in docs.items():
            row = {"_id": doc_id, "title": topic.capitalize(), "text": text}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as qfh:
        for split, count in queries.items():
            lines = ["query-id\tcorpus-id\tscore"]
            for n in range(count):
                qid = f"{split}-{n:04d}"
                topic = rng.choice(list(TOPICS))
                same = [d for d, (t, _) in docs.items() if t == topic]
                relevant = rng.sample(same, rng.choice([1, 1, 2]))
                borrowed = rng.sample(docs[relevant[0]][1].rstrip(".").lower().split(), 5)
                text = " ".join(borrowed + _words(rng, topic, 10)) + "?"
                qfh.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
                lines += [f"{qid}\t{d}\t1" for d in relevant]
            (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root
