"""Read a classification suite: ``labels.json`` plus ``<split>.jsonl`` rows.

``labels.json`` is ``[{"label": str, "description": str}]``; each split line is
``{"id": str, "text": str, "label": str}``. Bad input names the file and line: malformed JSON,
a missing or non-string field, an empty text, a duplicate id, a label ``labels.json`` does not
declare; a split with no rows is an error too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from evals.beir import iter_json_lines
from evals.errors import SuiteDataError

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
        return {name: self.labels.count(name) for name in self.label_names}


def split_files(folder: Path, split: str) -> list[Path]:
    return [folder / LABELS_FILE, folder / f"{split}.jsonl"]


def available_splits(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.jsonl"))


def read_labels(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        raise SuiteDataError(f"missing file: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SuiteDataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if not isinstance(data, list) or not data:
        raise SuiteDataError(f'{path}: expected a non-empty list of {{"label", "description"}}')
    names: list[str] = []
    for n, entry in enumerate(data, start=1):
        label = entry.get("label") if isinstance(entry, dict) else None
        if not isinstance(label, str) or not label:
            raise SuiteDataError(f"{path}: entry {n} needs a non-empty string 'label'")
        if label in names:
            raise SuiteDataError(f"{path}: entry {n} repeats label {label!r}")
        names.append(label)
    if len(names) < 2:
        raise SuiteDataError(f"{path}: a classification suite needs at least two labels")
    return tuple(names)


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
                f"{where}: duplicate id {item_id!r} (first on line {first[item_id]})"
            )
        if not text.strip():
            raise SuiteDataError(f"{where}: 'text' of {item_id!r} is empty")
        if label not in known:
            raise SuiteDataError(
                f"{where}: unknown label {label!r}; {LABELS_FILE} declares {', '.join(label_names)}"
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
        data.warnings.append(f"label(s) {', '.join(unused)} never occur in split {split!r}")
    return data
