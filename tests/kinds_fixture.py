"""Small, deterministic rerank and classification suite folders for tests (the retrieval one
is tests/beir_fixture.py)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from tests.beir_fixture import FILLER, TOPICS, build_beir


def build_rerank(
    root: Path, *, queries: dict[str, int] | None = None, candidates: int = 6, seed: int = 11
) -> Path:
    """A BEIR folder plus top_ranked/<split>.jsonl: each judged query's relevant documents and
    other documents up to ``candidates``, in corpus order."""
    queries = queries or {"test": 16, "train": 24}
    build_beir(root, queries=queries, seed=seed)
    rng = random.Random(seed)
    corpus = [json.loads(line)["_id"] for line in (root / "corpus.jsonl").open(encoding="utf-8")]
    (root / "top_ranked").mkdir(exist_ok=True)
    for split in queries:
        judged: dict[str, set[str]] = {}
        with (root / "qrels" / f"{split}.tsv").open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh, delimiter="\t"):
                judged.setdefault(row["query-id"], set()).add(row["corpus-id"])
        with (root / "top_ranked" / f"{split}.jsonl").open("w", encoding="utf-8") as out:
            for qid, relevant in judged.items():
                others = rng.sample([d for d in corpus if d not in relevant], candidates)
                chosen = set(relevant) | set(others[: max(1, candidates - len(relevant))])
                ordered = [d for d in corpus if d in chosen]
                out.write(json.dumps({"query-id": qid, "corpus-ids": ordered}) + "\n")
    return root


LABELS = ("miete", "kauf", "erbe")


def build_classification(
    root: Path, *, splits: dict[str, int] | None = None, seed: int = 13
) -> Path:
    """labels.json and <split>.jsonl rows whose words mostly come from their label's topic."""
    splits = splits or {"test": 30, "train": 45}
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    labels = [{"label": label, "description": f"Fragen zu {label}"} for label in LABELS]
    (root / "labels.json").write_text(json.dumps(labels, indent=1), encoding="utf-8")
    for split, count in splits.items():
        with (root / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            for n in range(count):
                label = LABELS[n % len(LABELS)]
                vocab = TOPICS[label].split()
                words = [
                    rng.choice(vocab) if rng.random() < 0.5 else rng.choice(FILLER)
                    for _ in range(12)
                ]
                row = {"id": f"{split}-{n:03d}", "text": " ".join(words) + "?", "label": label}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return root
