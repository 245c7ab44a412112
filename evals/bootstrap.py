"""Bootstrap CIs for eval runs; the implementation lives in `registry.stats` because the
registry's promotion rule needs the same paired bootstrap (and must not import evals)."""

from registry.stats import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    Interval,
    bootstrap_ci,
    paired_difference_ci,
)

__all__ = ["DEFAULT_RESAMPLES", "DEFAULT_SEED", "Interval", "bootstrap_ci", "paired_difference_ci"]
