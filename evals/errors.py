"""Precise eval-harness exceptions; the CLI prints their message on one line and exits non-zero."""

from __future__ import annotations


class EvalError(Exception):
    """Base class: every failure of the eval harness a caller can expect."""


class SuiteDataError(EvalError):
    """The suite's data folder is missing, incomplete or malformed."""


class UnknownSuite(EvalError):
    """No suite of that name is declared."""


class SplitLeakError(EvalError):
    """The requested split was used to train the candidate (or an ancestor of its adapter)."""


class CandidateError(EvalError):
    """The candidate cannot be built: missing model, adapter for the wrong base, unknown kind."""


class EvalInterrupted(EvalError):
    """The run was interrupted (Ctrl-C); nothing was recorded."""
