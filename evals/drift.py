"""Drift of a window of live inputs from the inputs of the suite the task is scored on.

Up to three signals per window, each a statistic with a p-value against the suite's test split:

- ``length``: the population stability index (PSI) of input lengths in words (a rerank or
  retrieval request's query), over the deciles of the test inputs' lengths;
- ``label`` (classification): the PSI of the champion's predicted labels on the window against
  its predicted labels on the test split (what its eval run recorded). Not against the gold
  labels: a classifier's predictions are distributed differently from the gold labels even with
  no drift at all (it confuses some classes more than others), so that comparison would flag
  every window;
- ``vector`` (retrieval): the cosine distance between the mean of the champion's live query
  vectors (its replies) and the mean of its vectors of the test queries. A shift of topic moves
  the mean; MMD would also see changes of spread, at a cost quadratic in the window per
  permutation, and mean shift is what a new kind of question causes.

A statistic's scale depends on the window size and, for vectors, on the model, so no fixed
threshold fits all; each p-value is therefore taken against the statistic's own distribution on
random windows of the same size drawn from the test split (with replacement: a slightly wider
null than the without-replacement draw of a replay, so the test errs towards silence). A window
drifts when its smallest p-value is below ``alpha`` divided by the number of signals
(Bonferroni): ``alpha`` is the false-alarm rate per window a task accepts (default 0.01).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHA = 0.01
DEFAULT_RESAMPLES = 2000
LENGTH_BINS = 10
# Added to every bin's count before PSI, so a bin a small window leaves empty stays finite.
SMOOTHING = 0.5
_CHUNK = 100  # null windows drawn at once for vectors (memory: chunk x window x dims floats)


@dataclass(frozen=True)
class Reference:
    """What a task's live inputs are compared with, from its suite's test split."""

    lengths: np.ndarray  # words per test input
    labels: list[str] | None = None  # classification: the label names...
    predicted: np.ndarray | None = None  # ...and the champion's predicted label per test input
    vectors: np.ndarray | None = None  # retrieval: the champion's vectors of the test queries


@dataclass(frozen=True)
class Window:
    """One window of live inputs, as the champion served them."""

    lengths: np.ndarray
    predicted: list[str] | None = None  # classification: the champion's label per input
    vectors: np.ndarray | None = None  # retrieval: the champion's query vectors


@dataclass(frozen=True)
class Signal:
    name: str
    statistic: float
    p_value: float


@dataclass(frozen=True)
class Report:
    size: int
    signals: list[Signal]
    alpha: float

    @property
    def p_min(self) -> float:
        return min((s.p_value for s in self.signals), default=1.0)

    @property
    def drifted(self) -> bool:
        return bool(self.signals) and self.p_min < self.alpha / len(self.signals)


def words(text: str) -> int:
    return len(text.split())


def psi(expected: np.ndarray, observed: np.ndarray) -> float:
    """PSI of ``observed`` counts against ``expected`` counts over the same bins."""
    p = (expected + SMOOTHING) / float(np.sum(expected + SMOOTHING))
    q = (observed + SMOOTHING) / float(np.sum(observed + SMOOTHING))
    return float(np.sum((q - p) * np.log(q / p)))


def length_edges(lengths: np.ndarray, bins: int = LENGTH_BINS) -> np.ndarray:
    """Inner bin edges at the reference's quantiles (ties merged)."""
    inner = np.quantile(lengths, np.linspace(0, 1, bins + 1)[1:-1])
    return np.unique(inner)


def window_report(
    reference: Reference,
    window: Window,
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Report:
    """The signals the window and reference both have, each with its p-value."""
    n = int(window.lengths.shape[0])
    if n == 0:
        raise ValueError("an empty window cannot drift")
    rng = np.random.default_rng(seed)
    signals = [_length(reference.lengths, window.lengths, rng, resamples)]
    if reference.predicted is not None and reference.labels and window.predicted is not None:
        signals.append(
            _labels(reference.labels, reference.predicted, window.predicted, rng, resamples)
        )
    if reference.vectors is not None and window.vectors is not None:
        signals.append(_vectors(reference.vectors, window.vectors, rng, resamples))
    return Report(size=n, signals=signals, alpha=alpha)


def _p_value(null: np.ndarray, observed: float) -> float:
    return float((1 + np.count_nonzero(null >= observed)) / (1 + null.shape[0]))


def _counts(codes: np.ndarray, bins: int) -> np.ndarray:
    return np.bincount(codes, minlength=bins).astype(np.float64)


def _null_psi(ref_codes: np.ndarray, bins: int, n: int, rng: np.random.Generator, b: int):
    expected = _counts(ref_codes, bins)
    idx = rng.integers(0, ref_codes.shape[0], size=(b, n))
    drawn = ref_codes[idx] + bins * np.arange(b)[:, None]
    counts = np.bincount(drawn.ravel(), minlength=bins * b).reshape(b, bins).astype(np.float64)
    p = (expected + SMOOTHING) / float(np.sum(expected + SMOOTHING))
    q = (counts + SMOOTHING) / (n + SMOOTHING * bins)
    return expected, np.sum((q - p) * np.log(q / p), axis=1)


def _length(ref: np.ndarray, live: np.ndarray, rng: np.random.Generator, b: int) -> Signal:
    edges = length_edges(ref)
    bins = edges.shape[0] + 1
    ref_codes = np.searchsorted(edges, ref, side="right")
    expected, null = _null_psi(ref_codes, bins, live.shape[0], rng, b)
    observed = psi(expected, _counts(np.searchsorted(edges, live, side="right"), bins))
    return Signal("length", observed, _p_value(null, observed))


def _labels(
    labels: list[str],
    ref: np.ndarray,
    live: Sequence[str],
    rng: np.random.Generator,
    b: int,
) -> Signal:
    index = {label: i for i, label in enumerate(labels)}
    # A label the suite does not know counts in a bin of its own (it is drift by itself).
    bins = len(labels) + 1
    live_codes = np.asarray([index.get(label, len(labels)) for label in live], dtype=np.int64)
    ref_codes = np.asarray(ref, dtype=np.int64)
    expected, null = _null_psi(ref_codes, bins, live_codes.shape[0], rng, b)
    observed = psi(expected, _counts(live_codes, bins))
    return Signal("label", observed, _p_value(null, observed))


def _vectors(ref: np.ndarray, live: np.ndarray, rng: np.random.Generator, b: int) -> Signal:
    center = ref.mean(axis=0)

    def distance(means: np.ndarray) -> np.ndarray:
        cos = (
            means
            @ center
            / np.maximum(np.linalg.norm(means, axis=-1) * np.linalg.norm(center), 1e-12)
        )
        return np.asarray(1.0 - cos)

    n = live.shape[0]
    null = np.concatenate(
        [
            distance(ref[rng.integers(0, ref.shape[0], size=(min(_CHUNK, b - k), n))].mean(1))
            for k in range(0, b, _CHUNK)
        ]
    )
    observed = float(distance(live.mean(axis=0)[None, :])[0])
    return Signal("vector", observed, _p_value(null, observed))
