"""Ranking metrics (retrieval and rerank) computed by mteb's own scoring code, kept per query.

mteb's ``calculate_retrieval_scores`` (pytrec_eval underneath) gives per-query nDCG/recall/MAP;
its ``mrr`` gives per-query reciprocal ranks. We keep the per-query values (for the bootstrap)
and average them ourselves without rounding; mteb rounds its averages to 5 decimals, and a test
shows our means equal mteb's full AbsTaskRetrieval path to that precision.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from evals.beir import Qrels

Results = Mapping[str, Mapping[str, float]]  # query id -> {doc id: score}

_METRIC = re.compile(r"^(ndcg|mrr|recall|map)_at_(\d+)$")
_PYTREC_KEY = {"ndcg": "ndcg_cut_{k}", "recall": "recall_{k}", "map": "map_cut_{k}"}


def parse_metric(name: str) -> tuple[str, int]:
    match = _METRIC.match(name)
    if not match:
        raise ValueError(
            f"unsupported metric {name!r} (use ndcg_at_K, mrr_at_K, recall_at_K or map_at_K)"
        )
    return match.group(1), int(match.group(2))


def max_depth(metrics: Sequence[str]) -> int:
    """How many ranked documents per query the metrics look at."""
    return max(parse_metric(m)[1] for m in metrics)


def per_query_scores(
    results: Results, qrels: Qrels, metrics: Sequence[str]
) -> dict[str, dict[str, float]]:
    """metric name -> {query id: score} for every query in qrels (missing results score 0)."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores, mrr

    parsed = [parse_metric(m) for m in metrics]
    k_values = sorted({k for _, k in parsed})
    # Score exactly the judged queries; a query with no results still counts (as zero).
    run = {qid: dict(results.get(qid, {})) for qid in qrels}
    evaluation = calculate_retrieval_scores(run, qrels, k_values)
    reciprocal = mrr(qrels, run, k_values)
    qids = list(run)
    out: dict[str, dict[str, float]] = {}
    for name, (kind, k) in zip(metrics, parsed, strict=True):
        if kind == "mrr":
            values = reciprocal[f"MRR@{k}"]
            out[name] = {q: float(v) for q, v in zip(qids, values, strict=True)}
        else:
            key = _PYTREC_KEY[kind].format(k=k)
            out[name] = {q: float(evaluation.all_scores.get(q, {}).get(key, 0.0)) for q in qids}
    return out


def mean_scores(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {m: float(np.mean(list(v.values()))) if v else 0.0 for m, v in per_query.items()}
