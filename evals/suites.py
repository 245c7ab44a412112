"""Eval suites are declared data: what to read, which splits exist, which metrics count.

A suite is versioned by hand (``version``: bump it when the declaration changes meaning) and
fingerprinted by content (sha256 of its data files), so a score always names the exact bytes
it was computed on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from evals.errors import SuiteDataError, UnknownSuite

RETRIEVAL = "retrieval"

# Relative to the data root; the data root defaults to ../shared/data next to the repository.
_REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_ROOT = _REPO_ROOT.parent / "shared" / "data"


@dataclass(frozen=True)
class SuiteSpec:
    """One eval suite. ``location`` is relative to the data root unless absolute."""

    name: str
    version: str
    kind: str
    location: Path
    test_splits: tuple[str, ...]
    train_splits: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
    main_metric: str = "ndcg_at_10"
    description: str = ""
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def splits(self) -> tuple[str, ...]:
        return self.test_splits + self.train_splits

    def with_location(self, location: Path) -> SuiteSpec:
        return replace(self, location=location)

    def data_dir(self, data_root: Path | None = None) -> Path:
        """The suite's folder: absolute location as is, else under the data root."""
        if self.location.is_absolute():
            return self.location
        return (data_root or DEFAULT_DATA_ROOT) / self.location

    def data_files(self, data_root: Path | None = None) -> list[Path]:
        """The files whose bytes define the suite, in a stable order; all must exist."""
        folder = self.data_dir(data_root)
        if not folder.is_dir():
            raise SuiteDataError(
                f"suite {self.name!r}: data folder {folder} does not exist "
                "(set TASKFLEET_DATA_DIR or pass --data-dir)"
            )
        if self.kind != RETRIEVAL:
            raise SuiteDataError(f"suite {self.name!r}: unsupported kind {self.kind!r}")
        names = ["corpus.jsonl", "queries.jsonl"] + [f"qrels/{s}.tsv" for s in self.splits]
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise SuiteDataError(
                f"suite {self.name!r}: missing file(s) in {folder}: {', '.join(missing)}"
            )
        return [folder / n for n in names]

    def fingerprint(self, data_root: Path | None = None) -> str:
        """sha256 over (relative name, content sha256) of every data file."""
        folder = self.data_dir(data_root)
        digest = hashlib.sha256()
        for path in self.data_files(data_root):
            digest.update(path.relative_to(folder).as_posix().encode())
            digest.update(b"\0")
            digest.update(_file_sha256(path).encode())
            digest.update(b"\n")
        return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


GERMAN_LEGAL_RETRIEVAL = SuiteSpec(
    name="german-legal-retrieval",
    version="1",
    kind=RETRIEVAL,
    location=Path("gerlayqa") / "beir",
    test_splits=("eval",),
    train_splits=("dev",),
    description=(
        "GerLayQA: German lay questions -> BGB paragraphs (Büttner & Habernal, EACL 2024). "
        "dev is the fine-tuning split, eval the test split."
    ),
)

BUILTIN_SUITES: dict[str, SuiteSpec] = {GERMAN_LEGAL_RETRIEVAL.name: GERMAN_LEGAL_RETRIEVAL}


def get_suite(name: str, *, location: Path | None = None) -> SuiteSpec:
    """A declared suite by name; ``location`` overrides where its data lives."""
    try:
        suite = BUILTIN_SUITES[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_SUITES))
        raise UnknownSuite(f"unknown eval suite {name!r} (known: {known})") from None
    return suite.with_location(location) if location is not None else suite


def beir_suite(
    name: str,
    folder: Path,
    *,
    test_splits: tuple[str, ...] = ("test",),
    train_splits: tuple[str, ...] = (),
    version: str = "1",
) -> SuiteSpec:
    """An ad-hoc retrieval suite over any BEIR-layout folder (used by tests and experiments)."""
    return SuiteSpec(
        name=name,
        version=version,
        kind=RETRIEVAL,
        location=folder.resolve(),
        test_splits=test_splits,
        train_splits=train_splits,
    )
