"""Eval suites are declared data: a kind, a folder, its splits and metrics, and a fingerprint.

Users declare suites (`taskfleet suite add`); the declaration is read through the kind's reader
(every declared split, so bad input fails here with file:line and nothing is registered), and
fingerprinted: sha256 over the declaration (kind, splits, metrics) and every data file. The
registry stores it as a version of that name; a changed folder is a new version. The built-in
suites are declarations in ``builtin_suites.json``, registered through the same path.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evals import readers
from evals.errors import SuiteDataError, UnknownSuite
from evals.ranking_metrics import parse_metric
from registry.fingerprint import file_sha256

if TYPE_CHECKING:
    from registry.entities import Suite, SuiteCreate

RETRIEVAL = "retrieval"
RERANK = "rerank"
CLASSIFICATION = "classification"
KINDS = (RETRIEVAL, RERANK, CLASSIFICATION)
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    RETRIEVAL: ("ndcg_at_10", "mrr_at_10", "recall_at_100"),
    RERANK: ("ndcg_at_10", "mrr_at_10", "map_at_1000"),
    CLASSIFICATION: ("macro_f1", "accuracy"),
}
CLASSIFICATION_METRICS = ("macro_f1", "accuracy")

# Relative locations are under the data root, which defaults to ../shared/data next to the
# repository (TASKFLEET_DATA_DIR moves it).
_REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_ROOT = _REPO_ROOT.parent / "shared" / "data"
BUILTIN_FILE = Path(__file__).resolve().parent / "builtin_suites.json"


@dataclass(frozen=True)
class SuiteSpec:
    """A suite as the harness uses it; built from a registered version or a declaration."""

    name: str
    kind: str
    location: Path
    test_split: str
    train_split: str | None = None
    metrics: tuple[str, ...] = ()
    main_metric: str = ""
    description: str = ""
    version: str = "0"  # the registry's version number; "0" before registration
    registered_fingerprint: str | None = None
    # A live version's split of labelled production items (taskfleet/live_split.py).
    live_split: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SuiteDataError(f"unknown suite kind {self.kind!r}; known: {', '.join(KINDS)}")
        if not self.metrics:
            object.__setattr__(self, "metrics", DEFAULT_METRICS[self.kind])
        if not self.main_metric:
            object.__setattr__(self, "main_metric", self.metrics[0])

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in (self.test_split, self.train_split, self.live_split) if s)

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
        files: list[Path] = []
        for split in self.splits:
            files += [f for f in readers.split_files(self.kind, folder, split) if f not in files]
        missing = [f.relative_to(folder).as_posix() for f in files if not f.is_file()]
        if missing:
            raise SuiteDataError(
                f"suite {self.name!r}: missing file(s) in {folder}: {', '.join(missing)}"
            )
        return sorted(files, key=lambda f: f.relative_to(folder).as_posix())

    def fingerprint(self, data_root: Path | None = None) -> str:
        """sha256 over the declaration and (relative name, content sha256) of every file."""
        folder = self.data_dir(data_root)
        digest = hashlib.sha256()
        declaration = {
            "kind": self.kind,
            "test_split": self.test_split,
            "train_split": self.train_split,
            "metrics": list(self.metrics),
            "main_metric": self.main_metric,
        }
        if self.live_split is not None:  # absent otherwise: older fingerprints stay valid
            declaration["live_split"] = self.live_split
        digest.update(json.dumps(declaration, sort_keys=True).encode())
        digest.update(b"\n")
        for path in self.data_files(data_root):
            digest.update(path.relative_to(folder).as_posix().encode())
            digest.update(b"\0")
            digest.update(file_sha256(path).encode())
            digest.update(b"\n")
        return digest.hexdigest()

    def checked_fingerprint(self, data_root: Path | None = None) -> str:
        """The fingerprint of the data as it is now, which must be the registered one: a
        score always belongs to exactly the version it names."""
        actual = self.fingerprint(data_root)
        if self.registered_fingerprint is not None and actual != self.registered_fingerprint:
            raise SuiteDataError(
                f"the data in {self.data_dir(data_root)} is not version {self.version} of suite "
                f"{self.name!r} (fingerprint {actual[:12]}, registered "
                f"{self.registered_fingerprint[:12]}); register it as a new version with "
                f"`taskfleet suite add {self.name} --kind {self.kind} --path DIR`"
            )
        return actual

    def load(self, split: str, data_root: Path | None = None) -> readers.SuiteData:
        return readers.load(self.kind, self.data_dir(data_root), split)


def spec_from_record(suite: Suite, location: Path | None = None) -> SuiteSpec:
    """The harness's view of a registered suite version (``location`` overrides its folder)."""
    return SuiteSpec(
        name=suite.name,
        kind=suite.kind,
        location=location if location is not None else Path(suite.location),
        test_split=suite.test_split,
        train_split=suite.train_split,
        metrics=tuple(suite.metrics),
        main_metric=suite.main_metric,
        description=suite.description,
        version=str(suite.version),
        registered_fingerprint=suite.fingerprint,
        live_split=suite.live_split,
    )


def check_metrics(kind: str, main_metric: str | None) -> tuple[tuple[str, ...], str]:
    """The kind's metrics, plus a requested main metric (which must be computable)."""
    metrics = DEFAULT_METRICS[kind]
    if main_metric is None:
        return metrics, metrics[0]
    if kind == CLASSIFICATION:
        if main_metric not in CLASSIFICATION_METRICS:
            raise SuiteDataError(
                f"main metric {main_metric!r} is not a classification metric "
                f"(use {' or '.join(CLASSIFICATION_METRICS)})"
            )
        return metrics, main_metric
    try:
        parse_metric(main_metric)
    except ValueError as exc:
        raise SuiteDataError(str(exc)) from None
    return (metrics if main_metric in metrics else (*metrics, main_metric)), main_metric


def declare(
    name: str,
    kind: str,
    folder: Path,
    *,
    test_split: str | None = None,
    train_split: str | None = None,
    main_metric: str | None = None,
    description: str = "",
    data_root: Path | None = None,
    live_split: str | None = None,
) -> tuple[SuiteCreate, dict[str, dict[str, int]]]:
    """Read and fingerprint a declaration; returns what the registry stores and per-split
    counts. ``folder`` relative to the data root stays relative (the built-ins); any other
    folder is stored as an absolute path."""
    from registry.entities import SuiteCreate

    if kind not in KINDS:
        raise SuiteDataError(f"unknown suite kind {kind!r}; known: {', '.join(KINDS)}")
    location = folder if not folder.is_absolute() else folder.resolve()
    probe = SuiteSpec(name=name, kind=kind, location=location, test_split="-")
    root = probe.data_dir(data_root)
    if not root.is_dir():
        raise SuiteDataError(f"suite folder does not exist: {root}")
    found = readers.available_splits(kind, root)
    test = _split(test_split, "test", found, root, kind, required=True)
    assert test is not None  # required
    train = _split(train_split, "train", found, root, kind, required=False)
    if train is not None and train == test:
        raise SuiteDataError(f"the test split and the training split are both {test!r}")
    if live_split is not None:
        _split(live_split, live_split, found, root, kind, required=True)
        if live_split in (test, train):
            raise SuiteDataError(
                f"the live split {live_split!r} is also the test or training split"
            )
    metrics, main = check_metrics(kind, main_metric)
    spec = SuiteSpec(
        name=name,
        kind=kind,
        location=location,
        test_split=test,
        train_split=train,
        metrics=metrics,
        main_metric=main,
        description=description,
        live_split=live_split,
    )
    stats: dict[str, dict[str, int]] = {}
    for split in spec.splits:  # read everything now: bad input fails before registration
        stats[split] = readers.describe(spec.load(split, data_root))
    create = SuiteCreate(
        name=name,
        kind=kind,
        location=location.as_posix(),
        test_split=test,
        train_split=train,
        main_metric=main,
        metrics=list(metrics),
        fingerprint=spec.fingerprint(data_root),
        description=description,
        stats=stats,
        live_split=live_split,
    )
    return create, stats


def _split(
    given: str | None, default: str, found: list[str], root: Path, kind: str, *, required: bool
) -> str | None:
    listing = ", ".join(found) or "none"
    if given is not None:
        if given not in found:
            raise SuiteDataError(f"{root} has no {kind} split {given!r} (splits found: {listing})")
        return given
    if default in found:
        return default
    if required:
        raise SuiteDataError(
            f"{root} has no split {default!r} (splits found: {listing}); name the test split "
            "with --test-split"
        )
    return None


def builtin_declarations() -> dict[str, dict[str, Any]]:
    """The built-in suites, by name, as declared in builtin_suites.json."""
    entries = json.loads(BUILTIN_FILE.read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in entries}


def declare_builtin(
    name: str, data_root: Path | None = None
) -> tuple[SuiteCreate, dict[str, dict[str, int]]]:
    """Declare a built-in suite exactly as a user would declare a folder (relative to the
    data root, so TASKFLEET_DATA_DIR can move it)."""
    entry = builtin_spec_entry(name)
    return declare(
        name,
        entry["kind"],
        Path(entry["location"]),
        test_split=entry["test_split"],
        train_split=entry.get("train_split"),
        main_metric=entry.get("main_metric"),
        description=entry.get("description", ""),
        data_root=data_root,
    )


def builtin_spec_entry(name: str) -> dict[str, Any]:
    declarations = builtin_declarations()
    if name not in declarations:
        known = ", ".join(sorted(declarations))
        raise UnknownSuite(f"{name!r} is not a built-in suite (built in: {known})")
    return declarations[name]


def builtin_spec(name: str) -> SuiteSpec:
    """An unregistered spec of a built-in suite (benchmarks and tests read data with it)."""
    entry = builtin_spec_entry(name)
    return SuiteSpec(
        name=name,
        kind=entry["kind"],
        location=Path(entry["location"]),
        test_split=entry["test_split"],
        train_split=entry.get("train_split"),
        description=entry.get("description", ""),
    )


def beir_suite(
    name: str, folder: Path, *, test_split: str = "test", train_split: str | None = None
) -> SuiteSpec:
    """An unregistered retrieval suite over any BEIR folder (tests and experiments)."""
    return SuiteSpec(
        name=name,
        kind=RETRIEVAL,
        location=folder.resolve(),
        test_split=test_split,
        train_split=train_split,
    )
