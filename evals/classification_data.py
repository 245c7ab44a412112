"""Read a classification suite: ``labels.json`` plus ``<split>.jsonl`` rows.

``labels.json`` is ``[{"label": str, "description": str}]``; each split line is
``{"id": str, "text": str, "label": str}``. Bad input names the file and line: malformed JSON,
a missing or non-string field, an empty text, a duplicate id, a label ``labels.json`` does not
declare, a label MLflow cannot name a metric after; a split with no rows is an error too.
Checks are linear in the rows and labels (20,000 labels once took 11 s: lists searched).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from evals.beir import iter_json_lines, parse_json, read_text, shown
from evals.errors import SuiteDataError
from evals.tracking import key_problem, per_class_metric

LABELS_FILE = "labels.json"


@dataclass(frozen=True)
class ClassificationSplit:
    ids: list[str]
    texts: list[str]
    labels: list[str]  # gold label per row
    label_names: tuple[str, ...]  # labels.json order
    split: str
    warnings: list[str] = field(default_factory=list)

    def sample(self, n: int | None) -> ClassificationSplit:
        """The first n rows of the split file."""
        if n is None or n >= len(self.ids):
            return self
        if n < 1:
            raise SuiteDataError(f"sample size must be at least 1, got {n}")
        return ClassificationSplit(
            self.ids[:n],
            self.texts[:n],
            self.labels[:n],
            self.label_names,
            self.split,
            list(self.warnings),
        )

    def label_counts(self) -> dict[str, int]:
        counts = Counter(self.labels)
        return {name: counts[name] for name in self.label_names}


def split_files(folder: Path, split: str) -> list[Path]:
    return [folder / LABELS_FILE, folder / f"{split}.jsonl"]


def available_splits(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.jsonl"))


def read_labels(path: Path) -> tuple[str, ...]:
    """The declared labels, in order. Every label must also make a valid MLflow metric name
    (`f1_<label>`, see `evals/tracking.py`): a label MLflow refuses would let the suite register
    and then fail every eval run at logging, so it is refused here, naming the entry."""
    data = parse_json(read_text(path), str(path))
    if not isinstance(data, list) or not data:
        raise SuiteDataError(f'{path}: expected a non-empty list of {{"label", "description"}}')
    names: list[str] = []
    seen: set[str] = set()
    for n, entry in enumerate(data, start=1):
        label = entry.get("label") if isinstance(entry, dict) else None
        if not isinstance(label, str) or not label:
            raise SuiteDataError(f"{path}: entry {n} needs a non-empty string 'label'")
        if not isinstance(entry.get("description", ""), str):
            raise SuiteDataError(f"{path}: entry {n}: 'description' must be a string")
        if label in seen:
            raise SuiteDataError(f"{path}: entry {n} repeats label {shown(label)}")
        problem = key_problem(per_class_metric(label))
        if problem is not None:
            raise SuiteDataError(
                f"{path}: entry {n}: label {shown(label)} cannot name its MLflow metric "
                f"{shown(per_class_metric(label))}: {problem}"
            )
        seen.add(label)
        names.append(label)
    if len(names) < 2:
        raise SuiteDataError(f"{path}: a classification suite needs at least two labels")
    return tuple(names)


def _listing(names: tuple[str, ...], limit: int = 10) -> str:
    """Labels for a message: all of a few, the first ten and a count of many."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])}, ... ({len(names)} labels)"


def load_split(folder: Path, split: str) -> ClassificationSplit:
    label_names = read_labels(folder / LABELS_FILE)
    path = folder / f"{split}.jsonl"
    known = set(label_names)
    ids: list[str] = []
    texts: list[str] = []
    labels: list[str] = []
    first: dict[str, int] = {}
    for number, row in iter_json_lines(path):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise SuiteDataError(f"{where}: expected an object with 'id', 'text' and 'label'")
        for key in ("id", "text", "label"):
            if not isinstance(row.get(key), str):
                raise SuiteDataError(f"{where}: {key!r} must be a string")
        item_id, text, label = row["id"], row["text"], row["label"]
        if item_id in first:
            raise SuiteDataError(
                f"{where}: duplicate id {shown(item_id)} (first on line {first[item_id]})"
            )
        if not text.strip():
            raise SuiteDataError(f"{where}: 'text' of {shown(item_id)} is empty")
        if label not in known:
            raise SuiteDataError(
                f"{where}: unknown label {shown(label)}; {LABELS_FILE} declares "
                f"{_listing(label_names)}"
            )
        first[item_id] = number
        ids.append(item_id)
        texts.append(text)
        labels.append(label)
    if not ids:
        raise SuiteDataError(f"split {split!r} is empty: {path} has no rows")
    data = ClassificationSplit(ids, texts, labels, label_names, split)
    unused = [name for name, count in data.label_counts().items() if count == 0]
    if unused:
        data.warnings.append(f"label(s) {_listing(tuple(unused))} never occur in split {split!r}")
    return data
