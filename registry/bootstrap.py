"""Seeded percentile bootstrap over queries (or items): a CI for one candidate's score, and a
*paired* CI for the difference between two candidates scored on the same queries.

Pairing matters: both candidates see the same resampled queries in each round, so the
(large) per-query difficulty cancels and the interval reflects only how they differ.

The one home of this maths. It lives with the registry's database-free rules (it imports no
SQLAlchemy) because the promotion rule is defined by the paired bootstrap and the registry
imports nothing of evals; the eval harness imports it from here, so the CIs an eval run reports
and the ones the rule judges are one computation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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


# ---- classification: macro-F1 is not a mean over items, so the bootstrap recomputes it -------


def macro_f1_resamples(gold: np.ndarray, pred: np.ndarray, n_labels: int, idx: np.ndarray) -> Any:
    """Macro-F1 of each resample (rows of ``idx``), as scikit-learn computes it: F1 per label
    present in gold or predictions of that resample (2TP / (2TP + FP + FN)), averaged."""
    rounds = idx.shape[0]
    cells = (np.arange(rounds)[:, None] * n_labels * n_labels) + gold[idx] * n_labels + pred[idx]
    confusion = np.bincount(cells.ravel(), minlength=rounds * n_labels * n_labels).reshape(
        rounds, n_labels, n_labels
    )
    tp = np.diagonal(confusion, axis1=1, axis2=2).astype(np.float64)
    fp = confusion.sum(axis=1) - tp  # predicted as the label, gold another
    fn = confusion.sum(axis=2) - tp
    denominator = 2 * tp + fp + fn
    present = denominator > 0
    f1 = np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=present)
    return f1.sum(axis=1) / np.maximum(present.sum(axis=1), 1)


def _encode_labels(
    gold: Mapping[str, str], *preds: Mapping[str, str]
) -> tuple[list[str], np.ndarray, list[np.ndarray]]:
    items = sorted(set(gold).intersection(*preds))
    if not items:
        raise ValueError("the runs share no item; a paired comparison is impossible")
    labels = sorted({gold[i] for i in items}.union(*({p[i] for i in items} for p in preds)))
    index = {label: n for n, label in enumerate(labels)}
    encoded_gold = np.asarray([index[gold[i]] for i in items])
    encoded_preds = [np.asarray([index[p[i]] for i in items]) for p in preds]
    return labels, encoded_gold, encoded_preds


def _percentile(values: np.ndarray, estimate: float, confidence: float) -> Interval:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return Interval(float(estimate), float(low), float(high))


def macro_f1_ci(
    gold: Mapping[str, str],
    pred: Mapping[str, str],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> Interval:
    """Percentile bootstrap CI of macro-F1, resampling items."""
    labels, g, (p,) = _encode_labels(gold, pred)
    n = g.shape[0]
    point = macro_f1_resamples(g, p, len(labels), np.arange(n)[None, :])[0]
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    return _percentile(macro_f1_resamples(g, p, len(labels), idx), point, confidence)


def paired_macro_f1_ci(
    gold: Mapping[str, str],
    a: Mapping[str, str],
    b: Mapping[str, str],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = 0.95,
) -> tuple[Interval, int]:
    """CI of macro-F1(a) - macro-F1(b), both recomputed on the same resampled items."""
    labels, g, (pa, pb) = _encode_labels(gold, a, b)
    n = g.shape[0]
    everything = np.arange(n)[None, :]
    point = (
        macro_f1_resamples(g, pa, len(labels), everything)[0]
        - macro_f1_resamples(g, pb, len(labels), everything)[0]
    )
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    diff = macro_f1_resamples(g, pa, len(labels), idx) - macro_f1_resamples(g, pb, len(labels), idx)
    return _percentile(diff, point, confidence), n


class ScoredEvidence(Protocol):
    """What a paired comparison reads from a recorded run (entity or row alike)."""

    @property
    def main_metric(self) -> str: ...
    @property
    def per_query(self) -> Mapping[str, float]: ...
    @property
    def details(self) -> Mapping[str, Any] | None: ...


def paired_run_difference(
    a: ScoredEvidence, b: ScoredEvidence, *, seed: int = DEFAULT_SEED
) -> tuple[Interval, int]:
    """CI of main-metric(a) - main-metric(b): a mean of per-query differences, or for
    macro-F1 the metric recomputed per paired resample from the runs' predictions."""
    if a.main_metric == "macro_f1":
        da, db = a.details or {}, b.details or {}
        if not ("pred" in da and "pred" in db and "gold" in da):
            raise ValueError("a macro-F1 comparison needs both runs' per-item predictions")
        return paired_macro_f1_ci(da["gold"], da["pred"], db["pred"], seed=seed)
    return paired_difference_ci(a.per_query, b.per_query, seed=seed)
