"""Benchmark: MiniLM's optimised variants (ONNX fp32, ONNX int8) as candidates on the full
german-legal-retrieval suite, decided by the promotion rule.

In a fresh home: registers the packaged MiniLM, derives its variants with `candidate add
--variant` (timed), evaluates the torch source and both variants on the eval split through the
real harness, makes the torch source the champion, and asks the promotion rule about each
variant (a build of the champion's model may replace it when its nDCG@10 is no worse than the
task's margin). Writes reports/german-legal-retrieval/variants.md.

    .venv/bin/python -m benchmarks.variants_german_legal [--margin 0.002] [--sample N]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.kinds_bench import MODEL_PACKAGE
from evals.report import machine_description
from evals.runner import EvalPaths, run_eval
from registry import Registry
from registry.entities import EvalRun
from taskfleet.variant_builder import build_variant

TASK = "german-legal-retrieval"
VARIANTS = ("onnx", "onnx-int8")
HEADER = (
    "| candidate | build | sha256 | size MB | nDCG@10 [95% CI] | recall@100 "
    "| promotion rule vs the torch champion (margin {margin:g}) |"
)


def timed(label: str, fn: Callable[[], EvalRun]) -> tuple[EvalRun, float]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="TASKFLEET_HOME to use (default: fresh temp).")
    parser.add_argument("--sample", type=int, default=None, help="First N eval queries only.")
    parser.add_argument(
        "--margin", type=float, default=0.002, help="the task's margin (default: the demo's)"
    )
    parser.add_argument(
        "--variants",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        default=list(VARIANTS),
        help="which variants to derive and evaluate, in this order (default: onnx,onnx-int8)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / TASK / "variants.md")
    args = parser.parse_args(argv)
    home = args.home or Path(tempfile.mkdtemp(prefix="taskfleet-bench-variants-"))
    print(f"home: {home}", flush=True)
    reg = Registry.open(
        f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor="bench"
    )
    data_dir = os.environ.get("TASKFLEET_DATA_DIR")
    from taskfleet.suite_registration import ensure_suite

    ensure_suite(reg, TASK, data_root=Path(data_dir) if data_dir else None, mteb_dir=home)
    if not any(t.name == TASK for t in reg.list_tasks()):  # a --home of an earlier run: reuse
        reg.add_task(TASK, suite=TASK, margin=args.margin)
        reg.add_model("minilm", package=MODEL_PACKAGE)
        reg.add_candidate(TASK, name="minilm", base="minilm")
    have = {c.name for c in reg.list_candidates(TASK)}
    built: dict[str, float] = {}
    for variant in args.variants:
        if f"minilm-{variant}" in have:
            continue
        started = time.perf_counter()
        reg.add_variant_candidate(TASK, base="minilm", variant=variant, build=build_variant)
        built[variant] = time.perf_counter() - started
        print(f"{variant}: derived in {built[variant]:.1f}s", flush=True)
    paths = EvalPaths(
        cache_dir=home / "cache",
        mlflow_uri=f"sqlite:///{home / 'mlflow.db'}",
        data_root=Path(data_dir) if data_dir else None,
    )
    names = ["minilm", *(f"minilm-{v}" for v in args.variants)]
    runs = {
        name: timed(name, functools.partial(run_eval, reg, TASK, name, paths, sample=args.sample))
        for name in names
    }
    if reg.champion(TASK) is None:
        reg.promote(TASK, "minilm", reason="first champion: the torch source")
    rows = []
    for name in names:
        run, _ = runs[name]
        model = reg.get_model(name)
        ci = run.ci[run.main_metric]
        verdict = "champion (torch source)"
        if name != "minilm":
            check = reg.check_promotion(TASK, name)
            verdict = f"{'**promotable**' if check.passes else '**refused**'}: {check.reason}"
        rows.append(
            f"| `{name}` | {model.variant or 'torch fp32'} | `{model.sha256[:12]}` "
            f"| {model.size_bytes / 1e6:.1f} | {run.main_score:.4f} [{ci[0]:.4f}, {ci[1]:.4f}] "
            f"| {run.metrics['recall_at_100']:.4f} | {verdict} |"
        )
    torch_run = runs["minilm"][0]
    scope = f"first {args.sample} eval queries" if args.sample else "all eval queries"
    command = "python -m benchmarks.variants_german_legal" + (
        f" --sample {args.sample}" if args.sample else ""
    )
    if args.margin != 0.002:
        command += f" --margin {args.margin:g}"
    if args.variants != list(VARIANTS):
        command += f" --variants {','.join(args.variants)}"
    derived = ", ".join(
        f"{v} {built[v]:.0f} s" if v in built else f"{v} (derived by an earlier run)"
        for v in args.variants
    )
    text = f"""# MiniLM's optimised variants on german-legal-retrieval

Generated by `benchmarks/variants_german_legal.py` (do not edit by hand). Command: `{command}`

{HEADER.format(margin=args.margin)}
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

- Variants derived by `taskfleet candidate add {TASK} --base minilm --variant onnx|onnx-int8`
  (export + vector check): {derived};
  each is a base model with lineage to `minilm` (`taskfleet model show minilm-onnx-int8`).
- Split `eval`, {scope}, full corpus ({torch_run.suite_name}@{torch_run.suite_version}); each
  model is encoded by itself (the embedding cache is keyed by the model's sha256). Speed is the
  serving benchmark's subject (reports/serving/peer.md), not this report's.
- The rule: a build of the champion's model (an ONNX or int8 variant of it) need not beat it;
  it may replace it when its nDCG@10 is no worse than the champion's by more than the task's
  margin (paired over the same queries). registry/promotion_rule.py.
- Machine: {machine_description()}.
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    reg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
