"""How far a shadow's answer agrees with the champion's on the same live input, per task kind.

The control plane computes one :class:`Agreement` per input of every sampled request that both
answered (``taskfleet/production.py``); the registry keeps them and summarises them over time
with a bootstrap CI. Each measure is in [0, 1] (1: the two models answered alike), except
Kendall's tau, which is in [-1, 1]:

- classification: ``same`` (1 when the two argmax labels are the same label, compared by name,
  so two heads may order their labels differently) and ``mean |dp|``, the mean absolute
  difference of the two probability vectors over the union of their labels (a label one head
  lacks has probability 0 there);
- rerank: ``top3`` (the share of the champion's three best documents that are also the shadow's
  three best) and ``tau`` (Kendall's tau-b of the two score vectors over all documents);
- retrieval: ``top10``, the share of the champion's ten best corpus documents for the query
  that are also the shadow's ten best, each model ranking the task's suite corpus with its own
  vectors of it (what the eval cache holds for it). Vectors of two models live in different
  spaces and cannot be compared directly; their rankings of one corpus can, and the top of the
  ranking is what a caller of a retrieval task consumes.

``same``, ``top3`` and ``top10`` are the headline (``Agreement.value``): the fraction of live
inputs on which a caller would have seen the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RERANK_TOP = 3
RETRIEVAL_TOP = 10


@dataclass(frozen=True)
class Agreement:
    """One input's agreement: ``value`` is the headline measure, ``extra`` the others."""

    value: float
    extra: dict[str, float]


def classification(
    champion: np.ndarray,
    champion_labels: list[str],
    shadow: np.ndarray,
    shadow_labels: list[str],
) -> list[Agreement]:
    """Per input (rows of both probability matrices): same label, mean |dp|."""
    if champion.shape[0] != shadow.shape[0]:
        raise ValueError(f"{champion.shape[0]} champion rows but {shadow.shape[0]} shadow rows")
    labels = list(dict.fromkeys([*champion_labels, *shadow_labels]))
    a = _aligned(champion, champion_labels, labels)
    b = _aligned(shadow, shadow_labels, labels)
    out = []
    for row_a, row_b in zip(a, b, strict=True):
        same = float(labels[int(np.argmax(row_a))] == labels[int(np.argmax(row_b))])
        out.append(Agreement(same, {"mean_abs_dp": float(np.mean(np.abs(row_a - row_b)))}))
    return out


def _aligned(matrix: np.ndarray, own: list[str], labels: list[str]) -> np.ndarray:
    if matrix.shape[1] != len(own):
        raise ValueError(f"{matrix.shape[1]} probabilities per row but {len(own)} labels")
    out = np.zeros((matrix.shape[0], len(labels)), dtype=np.float64)
    for j, label in enumerate(own):
        out[:, labels.index(label)] = matrix[:, j]
    return out


def rerank(champion: np.ndarray, shadow: np.ndarray) -> Agreement:
    """One request's documents: top-3 overlap and Kendall's tau-b of the two score vectors."""
    if champion.shape != shadow.shape:
        raise ValueError(f"{champion.shape[0]} champion scores but {shadow.shape[0]} shadow ones")
    top = min(RERANK_TOP, champion.shape[0])
    overlap = len(set(_best(champion, top)) & set(_best(shadow, top))) / top if top else 1.0
    return Agreement(overlap, {"kendall_tau": kendall_tau_b(champion, shadow)})


def retrieval(
    champion_query: np.ndarray,
    champion_corpus: np.ndarray,
    shadow_query: np.ndarray,
    shadow_corpus: np.ndarray,
) -> Agreement:
    """One query: the overlap of the two models' top-10 of the same corpus (rows in the same
    document order in both corpus matrices), each by cosine with its own vectors."""
    if champion_corpus.shape[0] != shadow_corpus.shape[0]:
        raise ValueError("the two corpus matrices do not hold the same documents")
    top = min(RETRIEVAL_TOP, champion_corpus.shape[0])
    a = _best(_cosines(champion_corpus, champion_query), top)
    b = _best(_cosines(shadow_corpus, shadow_query), top)
    return Agreement(len(set(a) & set(b)) / top if top else 1.0, {})


def _cosines(corpus: np.ndarray, query: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(corpus, axis=1) * max(float(np.linalg.norm(query)), 1e-12)
    return np.asarray(corpus @ query / np.maximum(norms, 1e-12))


def _best(scores: np.ndarray, k: int) -> list[int]:
    # Stable on ties (lowest index first), as the eval harness ranks.
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def kendall_tau_b(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b (ties in either vector accounted for); 1.0 for fewer than 2 items or
    when either vector is constant (nothing to disagree about)."""
    n = a.shape[0]
    if n < 2:
        return 1.0
    i, j = np.triu_indices(n, k=1)
    da = np.sign(a[i] - a[j])
    db = np.sign(b[i] - b[j])
    concordant_minus_discordant = float(np.sum(da * db))
    pairs_a = float(np.count_nonzero(da))
    pairs_b = float(np.count_nonzero(db))
    if pairs_a == 0 or pairs_b == 0:
        return 1.0
    return concordant_minus_discordant / float(np.sqrt(pairs_a * pairs_b))
