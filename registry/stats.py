"""Seeded percentile bootstrap over queries: a CI for one candidate's mean, and a *paired*
CI for the difference between two candidates scored on the same queries.

Pairing matters: both candidates see the same resampled queries in each round, so the
(large) per-query difficulty cancels and the interval reflects only how they differ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 1000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low


def _resampled_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = values.shape[0]
    idx = rng.integers(0, n, size=(resamples, n))
    return np.asarray(values[idx].mean(axis=1))


def _interval(values: np.ndarray, resamples: int, seed: int, confidence: float) -> Interval:
    if values.size == 0:
        raise ValueError("cannot bootstrap an empty set of scores")
    means = _resampled_means(values, resamples, seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(float(values.mean()), float(low), float(high))


def bootstrap_ci(
    scores: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Interval:
    """Percentile CI of the mean of per-query scores."""
    return _interval(np.asarray(scores, dtype=np.float64), resamples, seed, confidence)


def paired_difference_ci(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[Interval, int]:
    """CI of mean(a - b) over the queries both were scored on; also returns that count."""
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two runs share no query; a paired comparison is impossible")
    diff = np.asarray([a[q] - b[q] for q in common], dtype=np.float64)
    return _interval(diff, resamples, seed, confidence), len(common)
