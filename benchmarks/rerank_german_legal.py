"""Benchmark: german-legal-rerank end to end on the full test split.

Registers the built-in suite as a user would and scores the candidate lists in random order,
in BM25 order, by the packaged MiniLM as a bi-encoder, by a german-legal-retrieval LoRA used as
a bi-encoder, and by a cross-encoder fine-tuned from MiniLM (LoRA + score head) with the same
code as `taskfleet finetune`. Writes reports/german-legal-rerank/: leaderboard.md + PNG (CIs)
and rerank.json.

    .venv/bin/python benchmarks/rerank_german_legal.py [--preset default] [--threads 2]
        [--stage all|baselines|cross-encoder|report] [--home DIR]
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

from kinds_bench import (
    REPO,
    Bench,
    arguments,
    comparison_lines,
    fine_tune,
    training_lines,
    write_json,
)

TASK = "german-legal-rerank"
RETRIEVAL = "german-legal-retrieval"


STAGES = ("all", "baselines", "cross-encoder", "report")


def main() -> None:
    args = arguments(
        __doc__.splitlines()[0],
        REPO / "reports" / TASK,
        "rerank preset",
        retrieval_preset=True,
        stages=STAGES,
    )

    import torch

    from finetune.config import preset

    torch.set_num_threads(args.threads)
    bench = Bench.open(args.home or Path(tempfile.mkdtemp(prefix="taskfleet-bench-rerank-")))
    bench.task(TASK)
    base = bench.model()
    reg = bench.reg
    if args.stage in ("all", "baselines"):
        baselines(bench, base, args)
    hp = preset(args.preset, "rerank").with_overrides(max_steps=args.max_steps)
    if args.stage in ("all", "cross-encoder"):
        bench.load_stages()
        if bench.figures.get("cross_encoder_candidate") is None:
            tuned, training = fine_tune(bench, TASK, base, hp, CROSS)
            bench.figures.setdefault("training", {})[CROSS] = training
            bench.figures["hyperparameters"] = hp.as_dict()
            bench.figures["cross_encoder_candidate"] = tuned.candidate.name
            bench.save_stage("cross-encoder")  # the training survives a failed eval
        else:  # trained by an earlier run of this stage on this --home: evaluate it again
            print(f"evaluating the trained {bench.figures['cross_encoder_candidate']}", flush=True)
        bench.evaluate(TASK, bench.figures["cross_encoder_candidate"], sample=args.sample)
    if args.stage in ("all", "report"):
        report(bench, args, hp)
    reg.close()


CROSS = "minilm-cross-encoder-lora"


def baselines(bench: Bench, base: str, args: Any) -> None:
    """Random and BM25 order, MiniLM as a bi-encoder, the retrieval task's LoRA as one."""
    from finetune.config import preset
    from registry.errors import AlreadyExists

    reg = bench.reg
    for kind in ("random", "bm25"):
        with contextlib.suppress(AlreadyExists):  # an earlier run on this --home added it
            reg.add_candidate(TASK, kind=kind)
        bench.evaluate(TASK, kind, sample=args.sample)
    with contextlib.suppress(AlreadyExists):
        reg.add_candidate(TASK, name="minilm-bi-encoder", base=base, kind="embedding")
    bench.evaluate(TASK, "minilm-bi-encoder", sample=args.sample)
    if args.retrieval_preset != "none":
        # The retrieval task's own LoRA (trained on GerLayQA dev = this suite's train split),
        # put on the rerank task as a bi-encoder: the same adapter, another task.
        bench.task(RETRIEVAL)
        hp = preset(args.retrieval_preset).with_overrides(max_steps=args.max_steps)
        retrieval, training = fine_tune(bench, RETRIEVAL, base, hp, "minilm-retrieval-lora")
        bench.figures.setdefault("training", {})["minilm-retrieval-lora"] = training
        reg.add_candidate(
            TASK, name="retrieval-lora-bi-encoder", adapter=retrieval.adapter.name, kind="embedding"
        )
        bench.evaluate(TASK, "retrieval-lora-bi-encoder", sample=args.sample)
    bench.save_stage("baselines")


def report(bench: Bench, args: Any, hp: Any) -> None:
    from evals.report import machine_description, write_leaderboard

    reg = bench.reg
    bench.load_stages()
    tuned = bench.figures.get("cross_encoder_candidate")
    board = reg.leaderboard(TASK)
    if tuned in board:
        for baseline in ("random", "minilm-bi-encoder", "bm25", "retrieval-lora-bi-encoder"):
            if baseline in board:
                bench.compare(TASK, tuned, baseline)
    if {"retrieval-lora-bi-encoder", "minilm-bi-encoder"} <= set(board):
        bench.compare(TASK, "retrieval-lora-bi-encoder", "minilm-bi-encoder")
    bench.figures["leaderboard"] = {
        name: {"metrics": run.metrics, "ci": run.ci, "queries": len(run.per_query)}
        for name, run in board.items()
    }
    trainings: dict[str, dict[str, Any]] = bench.figures.get("training", {})
    used = bench.figures.get("hyperparameters", hp.as_dict())
    suite = reg.get_suite(TASK)
    command = (
        "`.venv/bin/python benchmarks/rerank_german_legal.py`"
        + (f" --preset {args.preset}" if args.preset != "default" else "")
        + (f" --max-steps {args.max_steps}" if args.max_steps else "")
    )
    extra = [
        *comparison_lines(bench.figures.get("comparisons", []), "ndcg_at_10"),
        "",
        "## Training",
        "",
        *[line for name, t in trainings.items() for line in training_lines(name, t)],
        f"- Cross-encoder hyperparameters (preset `{args.preset}`): "
        + ", ".join(f"{k}={v}" for k, v in sorted(used.items())),
        "",
        f"Suite `{suite.name}` version {suite.version} (fingerprint `{suite.fingerprint[:12]}`), "
        f"test split `{suite.test_split}`, "
        + ("all queries" if args.sample is None else f"first {args.sample} queries")
        + " with their candidate lists (gold + BM25 top-30 non-gold paragraphs, listed in "
        "corpus order, so the `random` candidate shuffles them with a fixed seed per query). "
        "The cross-encoder and the retrieval LoRA were trained on `train` (GerLayQA dev) only.",
        f"Machine: {machine_description()}.",
        f"Reproduce: {command} (`make bench` runs it; `--stage baselines` and "
        "`--stage cross-encoder` on one `--home` may run as two processes, then "
        "`--stage report`).",
    ]
    md, chart = write_leaderboard(TASK, board, args.out, extra_lines=extra)
    write_json(args.out / "rerank.json", bench.figures)
    print(f"wrote {md}, {chart}")


if __name__ == "__main__":
    main()
