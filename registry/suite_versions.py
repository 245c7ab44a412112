"""Suite versions: declared eval data, registered like any other record, versioned by content.

The registry stores what the eval harness read and fingerprinted; it never reads suite data
itself. Registering a declaration whose fingerprint a version of that name already has is a
no-op that returns that version; anything else becomes the next version. Tasks bind to a suite
by name and are scored on its newest version, so a changed folder never mixes with the old one.

Declaring a suite (reading a folder through its kind's reader, fingerprinting it) is
``evals/suites.py``; the shell joins the two in ``taskfleet/suite_registration.py``.
"""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry import entities as e
from registry.errors import InvalidInput, NotFound
from registry.kinds import SUITE_KINDS, check_name
from registry.models import SuiteRow
from registry.transactions import Transactions

_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{64}$")


class SuiteRepository:
    def __init__(self, tx: Transactions) -> None:
        self.tx = tx

    def add_suite(self, suite: e.SuiteCreate) -> tuple[e.Suite, bool]:
        """Register a suite version; returns (version, created). Same fingerprint: not created."""
        _validate(suite)
        with self.tx.write() as s:
            same = s.scalar(
                select(SuiteRow).where(
                    SuiteRow.name == suite.name, SuiteRow.fingerprint == suite.fingerprint
                )
            )
            if same is not None:
                return suite_entity(same), False
            newest = s.scalar(select(func.max(SuiteRow.version)).where(SuiteRow.name == suite.name))
            previous = newest_suite_row(s, suite.name) if newest else None
            if previous is not None and previous.kind != suite.kind:
                raise InvalidInput(
                    f"suite {suite.name!r} is a {previous.kind} suite; a new version cannot "
                    f"change its kind to {suite.kind} (declare it under another name)"
                )
            row = SuiteRow(
                name=suite.name,
                version=(newest or 0) + 1,
                kind=suite.kind,
                location=suite.location,
                test_split=suite.test_split,
                train_split=suite.train_split,
                main_metric=suite.main_metric,
                metrics=list(suite.metrics),
                description=suite.description,
                fingerprint=suite.fingerprint,
                mteb_task=suite.mteb_task,
                stats=dict(suite.stats),
                live_split=suite.live_split,
            )
            s.add(row)
            s.flush()
            self.tx.audit(
                s,
                "suite.add",
                "suite",
                f"{suite.name}@{row.version}",
                {"kind": suite.kind, "fingerprint": suite.fingerprint},
            )
            return suite_entity(row), True

    def get_suite(self, name: str, version: int | None = None) -> e.Suite:
        """A suite's newest version, or the given one."""
        with self.tx.read() as s:
            if version is None:
                row = newest_suite_row(s, name)
            else:
                row = s.scalar(
                    select(SuiteRow).where(SuiteRow.name == name, SuiteRow.version == version)
                )
            if row is None:
                if version is not None and newest_suite_row(s, name) is not None:
                    raise NotFound(f"suite {name!r} has no version {version}")
                raise NotFound(
                    f"unknown suite {name!r}; register it with `taskfleet suite add {name} "
                    "--kind KIND --path DIR`"
                )
            return suite_entity(row)

    def suite_versions(self, name: str) -> list[e.Suite]:
        """Every version of a suite, newest first."""
        with self.tx.read() as s:
            rows = list(
                s.scalars(
                    select(SuiteRow).where(SuiteRow.name == name).order_by(SuiteRow.version.desc())
                )
            )
            if not rows:
                raise NotFound(f"unknown suite {name!r}")
            return [suite_entity(r) for r in rows]

    def list_suites(self) -> list[e.Suite]:
        """The newest version of every suite, by name."""
        with self.tx.read() as s:
            newest = (
                select(SuiteRow.name, func.max(SuiteRow.version).label("version"))
                .group_by(SuiteRow.name)
                .subquery()
            )
            rows = s.scalars(
                select(SuiteRow)
                .join(
                    newest,
                    (SuiteRow.name == newest.c.name) & (SuiteRow.version == newest.c.version),
                )
                .order_by(SuiteRow.name)
            )
            return [suite_entity(r) for r in rows]


def _validate(suite: e.SuiteCreate) -> None:
    check_name("suite", suite.name)
    if suite.kind not in SUITE_KINDS:
        raise InvalidInput(f"unknown suite kind {suite.kind!r}; known: {', '.join(SUITE_KINDS)}")
    if not _FINGERPRINT_RE.fullmatch(suite.fingerprint):
        raise InvalidInput("a suite fingerprint is a lowercase sha256 hex digest")
    if suite.main_metric not in suite.metrics:
        raise InvalidInput(f"main metric {suite.main_metric!r} is not among the suite's metrics")
    if not suite.test_split or suite.test_split == suite.train_split:
        raise InvalidInput("a suite needs a test split distinct from its training split")
    if suite.live_split is not None and suite.live_split in (suite.test_split, suite.train_split):
        raise InvalidInput("a suite's live split must be distinct from its test and training split")


def newest_suite_row(s: Session, name: str) -> SuiteRow | None:
    """The newest version of a suite (tasks, eval runs and promotion are scored on it)."""
    return s.scalar(
        select(SuiteRow).where(SuiteRow.name == name).order_by(SuiteRow.version.desc()).limit(1)
    )


def suite_entity(r: SuiteRow) -> e.Suite:
    return e.Suite(
        id=r.id,
        name=r.name,
        version=r.version,
        kind=r.kind,
        location=r.location,
        test_split=r.test_split,
        train_split=r.train_split,
        main_metric=r.main_metric,
        metrics=list(r.metrics),
        description=r.description,
        fingerprint=r.fingerprint,
        mteb_task=r.mteb_task,
        stats=dict(r.stats),
        created_at=r.created_at,
        live_split=r.live_split,
    )
