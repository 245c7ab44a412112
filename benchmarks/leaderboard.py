"""Benchmark: a built-in task's leaderboard end to end on its full test split.

Registers the task's built-in suite as a user would (in a fresh home, or --home) and scores what
its kind can serve, through the same code as `taskfleet eval run` and `taskfleet finetune`:

- retrieval (german-legal-retrieval): BM25 and the packaged MiniLM, MiniLM a second time from
  the embedding cache (it must reproduce the scores exactly); the table of wall times.
- rerank (german-legal-rerank): random and BM25 order, MiniLM as a bi-encoder, the retrieval
  task's LoRA as a bi-encoder (--retrieval-preset), a cross-encoder fine-tuned from MiniLM
  (LoRA + score head); rerank.json.
- classification (german-legal-area): the majority class and TF-IDF + logistic regression, an
  embedding + logistic-regression head on MiniLM, a fine-tuned classifier (LoRA + head); the
  classifier's confusion matrix as a picture; area.json.

Writes reports/<task>/leaderboard.md + PNG (CIs) with the paired comparisons. The stages
(baselines, fine-tune, report) may run as separate processes on one --home.

    .venv/bin/python -m benchmarks.leaderboard --task german-legal-retrieval [--sample N]
    .venv/bin/python -m benchmarks.leaderboard --task german-legal-rerank --preset floor
        [--max-steps 120] [--retrieval-preset demo|none] [--stage all|baselines|fine-tune|report]
    .venv/bin/python -m benchmarks.leaderboard --task german-legal-area [--preset default]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import REPO
from benchmarks.kinds_bench import (
    Bench,
    comparison_lines,
    fine_tune,
    training_lines,
    write_json,
)

STAGES = ("all", "baselines", "fine-tune", "report")
# The retrieval task whose LoRA the rerank leaderboard also scores as a bi-encoder.
RETRIEVAL = "german-legal-retrieval"
MINILM = "all-minilm-l6-v2"  # the retrieval leaderboard's name for the packaged model
CROSS = "minilm-cross-encoder-lora"
# What each kind's report keeps besides the leaderboard.
FIGURES = {"rerank": "rerank.json", "classification": "area.json"}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    from evals.suites import builtin_declarations

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True, choices=sorted(builtin_declarations()))
    parser.add_argument("--stage", choices=STAGES, default="all")
    parser.add_argument("--preset", default="default", help="fine-tuning preset of the kind")
    parser.add_argument(
        "--retrieval-preset",
        default="demo",
        help="rerank: preset of the retrieval LoRA scored as a bi-encoder, or none",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sample", type=int, default=None, help="first N test items (smoke)")
    parser.add_argument("--max-steps", type=int, default=None, help="cut training (smoke)")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="default: reports/<task>")
    args = parser.parse_args(argv)
    args.out = args.out or REPO / "reports" / args.task
    return args


def main(argv: list[str] | None = None) -> None:
    import torch

    args = arguments(argv)
    torch.set_num_threads(args.threads)
    home = args.home or Path(tempfile.mkdtemp(prefix=f"taskfleet-bench-{args.task}-"))
    bench = Bench.open(home)
    bench.task(args.task)
    kind = bench.reg.get_suite(args.task).kind
    base = bench.model()
    baselines, tuned, report = PLANS[kind]
    bench.load_stages()  # what earlier runs on this --home measured and trained
    if args.stage in ("all", "baselines"):
        baselines(bench, args, base)
        bench.save_stage("baselines")
    if args.stage in ("all", "fine-tune"):
        bench.load_stages()
        tuned(bench, args, base)
        bench.save_stage("fine-tune")
    if args.stage in ("all", "report"):
        bench.load_stages()
        lines = report(bench, args)
        write(bench, args, kind, lines)
    bench.reg.close()


def _add(bench: Bench, task: str, **candidate: Any) -> None:
    from registry.errors import AlreadyExists

    with contextlib.suppress(AlreadyExists):  # an earlier run on this --home added it
        bench.reg.add_candidate(task, **candidate)


def _hyperparameters(args: argparse.Namespace, kind: str) -> Any:
    from finetune.config import preset

    return preset(args.preset, kind).with_overrides(max_steps=args.max_steps)


def _fine_tuned(bench: Bench, args: argparse.Namespace, base: str, name: str) -> None:
    """The kind's LoRA (+ head) through `taskfleet finetune lora`'s pipeline, then its eval; a
    candidate trained by an earlier run of this stage on this --home is evaluated again."""
    kind = bench.reg.get_suite(args.task).kind
    if bench.figures.get("fine_tuned_candidate") is None:
        hp = _hyperparameters(args, kind)
        tuned, training = fine_tune(bench, args.task, base, hp, name)
        bench.figures.setdefault("training", {})[tuned.candidate.name] = training
        bench.figures["hyperparameters"] = hp.as_dict()
        bench.figures["fine_tuned_candidate"] = tuned.candidate.name
        bench.save_stage("fine-tune")  # the training survives a failed eval
    else:
        print(f"evaluating the trained {bench.figures['fine_tuned_candidate']}", flush=True)
    bench.evaluate(args.task, bench.figures["fine_tuned_candidate"], sample=args.sample)


# ---- retrieval ---------------------------------------------------------------------------
def retrieval_baselines(bench: Bench, args: argparse.Namespace, base: str) -> None:
    _add(bench, args.task, name="bm25", kind="bm25")
    _add(bench, args.task, name=MINILM, base=base)
    bench.evaluate(args.task, "bm25", sample=args.sample)
    wall = {"bm25": [bench.figures["eval_seconds"]["bm25"], None, None]}
    for label in ("first run", "second run (cache)"):
        run = bench.evaluate(args.task, MINILM, sample=args.sample)
        seconds = bench.figures["eval_seconds"][MINILM]
        wall[f"{MINILM}, {label}"] = [seconds, run.cost["encoded_items"], run.cost["cached_items"]]
        if label == "first run":
            first = run
    assert run.metrics == first.metrics, "a cached run must reproduce the scores exactly"
    bench.figures["wall"] = wall


def retrieval_fine_tuned(bench: Bench, args: argparse.Namespace, base: str) -> None:
    print("retrieval LoRAs: python -m benchmarks.lora_german_legal", flush=True)


def retrieval_report(bench: Bench, args: argparse.Namespace) -> list[str]:
    from evals.report import machine_description

    suite = bench.reg.get_suite(args.task)
    rows = [
        f"| {name} | {wall:.1f} | "
        + (" | ".join("-" if n is None else f"{n:.0f}" for n in (encoded, cached)))
        + " |"
        for name, (wall, encoded, cached) in bench.figures.get("wall", {}).items()
    ]
    scope = f"first {args.sample} eval queries" if args.sample else "all eval queries"
    return [
        "",
        "## Wall time (this machine)",
        "",
        "| run | wall s (incl. model load, MLflow) | encoded items | cached items |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Split `{suite.test_split}`, {scope}, full corpus ({suite.name}@{suite.version}, "
        f"fingerprint `{suite.fingerprint[:12]}`). MiniLM truncates the long queries at "
        "its max_seq_length (256 word pieces); BM25 is bm25s (Lucene, k1=1.5, b=0.75) over "
        "lowercased Unicode word tokens minus German stopwords, no stemming.",
        f"Machine: {machine_description()}.",
        f"Reproduce: {command(args)}",
    ]


# ---- rerank ------------------------------------------------------------------------------
def rerank_baselines(bench: Bench, args: argparse.Namespace, base: str) -> None:
    """Random and BM25 order, MiniLM as a bi-encoder, the retrieval task's LoRA as one."""
    from finetune.config import preset

    for kind in ("random", "bm25"):
        _add(bench, args.task, kind=kind)
        bench.evaluate(args.task, kind, sample=args.sample)
    _add(bench, args.task, name="minilm-bi-encoder", base=base, kind="embedding")
    bench.evaluate(args.task, "minilm-bi-encoder", sample=args.sample)
    if args.retrieval_preset != "none":
        # The retrieval task's own LoRA (trained on GerLayQA dev = this suite's train split),
        # put on the rerank task as a bi-encoder: the same adapter, another task.
        bench.task(RETRIEVAL)
        hp = preset(args.retrieval_preset).with_overrides(max_steps=args.max_steps)
        retrieval, training = fine_tune(bench, RETRIEVAL, base, hp, "minilm-retrieval-lora")
        bench.figures.setdefault("training", {})["minilm-retrieval-lora"] = training
        _add(
            bench,
            args.task,
            name="retrieval-lora-bi-encoder",
            adapter=retrieval.adapter.name,
            kind="embedding",
        )
        bench.evaluate(args.task, "retrieval-lora-bi-encoder", sample=args.sample)


def rerank_fine_tuned(bench: Bench, args: argparse.Namespace, base: str) -> None:
    _fine_tuned(bench, args, base, CROSS)


def rerank_report(bench: Bench, args: argparse.Namespace) -> list[str]:
    board = bench.reg.leaderboard(args.task)
    tuned = bench.figures.get("fine_tuned_candidate")
    if tuned in board:
        for baseline in ("random", "minilm-bi-encoder", "bm25", "retrieval-lora-bi-encoder"):
            if baseline in board:
                bench.compare(args.task, tuned, baseline)
    if {"retrieval-lora-bi-encoder", "minilm-bi-encoder"} <= set(board):
        bench.compare(args.task, "retrieval-lora-bi-encoder", "minilm-bi-encoder")
    return [
        *comparison_lines(bench.figures.get("comparisons", []), "ndcg_at_10"),
        *_training_section(bench, args, "Cross-encoder hyperparameters"),
        "",
        _suite_line(bench, args, "queries")
        + " with their candidate lists (gold + BM25 top-30 non-gold paragraphs, listed in "
        "corpus order, so the `random` candidate shuffles them with a fixed seed per query). "
        "The cross-encoder and the retrieval LoRA were trained on `train` (GerLayQA dev) only.",
        *_machine_and_command(args),
    ]


# ---- classification ----------------------------------------------------------------------
def classification_baselines(bench: Bench, args: argparse.Namespace, base: str) -> None:
    """The majority class, TF-IDF + LR, and an LR head on frozen MiniLM embeddings."""
    from finetune.pipeline import HeadRequest, finetune_head

    for kind in ("majority", "tfidf-lr"):
        _add(bench, args.task, kind=kind)
        bench.evaluate(args.task, kind, sample=args.sample)
    if bench.figures.get("head_candidate") is None:  # not fitted by an earlier run on --home
        head = finetune_head(
            bench.reg,
            HeadRequest(
                task=args.task,
                base=base,
                name="minilm-lr-head",
                evaluate=False,
                data_root=bench.data_root,
            ),
            cache_dir=bench.paths.cache_dir,
        )
        bench.figures["head_fit_seconds"] = round(head.training.wall_seconds, 1)
        bench.figures["head_candidate"] = head.candidate.name
    bench.evaluate(args.task, bench.figures["head_candidate"], sample=args.sample)


def classification_fine_tuned(bench: Bench, args: argparse.Namespace, base: str) -> None:
    _fine_tuned(bench, args, base, "minilm-area-lora")


def classification_report(bench: Bench, args: argparse.Namespace) -> list[str]:
    from evals.report import confusion_chart

    board = bench.reg.leaderboard(args.task)
    tuned = bench.figures.get("fine_tuned_candidate")
    head = bench.figures.get("head_candidate", "minilm-lr-head")
    lines: list[str] = []
    if tuned in board:
        for baseline in ("tfidf-lr", head, "majority"):
            if baseline in board:
                bench.compare(args.task, tuned, baseline)
        details = board[tuned].details or {}
        confusion_chart(
            f"{args.task}: {tuned} (test split)",
            details["labels"],
            details["confusion_matrix"],
            args.out / "confusion.png",
        )
        lines = [
            "",
            "## Confusion matrix of the fine-tuned classifier",
            "",
            "![confusion matrix](confusion.png)",
        ]
    if {"tfidf-lr", head} <= set(board):
        bench.compare(args.task, "tfidf-lr", head)
    head_s = bench.figures.get("head_fit_seconds")
    head_line = (
        f"- `{head}`: logistic regression (class-balanced, C=1) on frozen MiniLM "
        "embeddings of the train split"
        + (f", fitted in {head_s:.0f} s (encoding included)" if head_s is not None else "")
        + "; a registered artifact (head only, no LoRA)."
    )
    return [
        *comparison_lines(bench.figures.get("comparisons", []), "macro_f1"),
        *_training_section(bench, args, "Hyperparameters", also=(head_line,)),
        *lines,
        "",
        _suite_line(bench, args, "items")
        + "; models trained on `train` only. Main metric macro-F1 (the labels are imbalanced).",
        *_machine_and_command(args),
    ]


PLANS: dict[str, tuple[Callable[..., None], Callable[..., None], Callable[..., list[str]]]] = {
    "retrieval": (retrieval_baselines, retrieval_fine_tuned, retrieval_report),
    "rerank": (rerank_baselines, rerank_fine_tuned, rerank_report),
    "classification": (classification_baselines, classification_fine_tuned, classification_report),
}


# ---- the report --------------------------------------------------------------------------
def _training_section(
    bench: Bench, args: argparse.Namespace, label: str, also: tuple[str, ...] = ()
) -> list[str]:
    """What was trained, how long it took and with which hyperparameters."""
    trainings: dict[str, dict[str, Any]] = bench.figures.get("training", {})
    used = bench.figures.get("hyperparameters")
    lines = [line for name, t in trainings.items() for line in training_lines(name, t)]
    lines += also
    if used:
        lines.append(
            f"- {label} (preset `{args.preset}`): "
            + ", ".join(f"{k}={v}" for k, v in sorted(used.items()))
        )
    return ["", "## Training", "", *lines] if lines else []


def _suite_line(bench: Bench, args: argparse.Namespace, unit: str) -> str:
    suite = bench.reg.get_suite(args.task)
    return (
        f"Suite `{suite.name}` version {suite.version} (fingerprint `{suite.fingerprint[:12]}`), "
        f"test split `{suite.test_split}`, "
        + (f"all {unit}" if args.sample is None else f"first {args.sample} {unit}")
    )


def _machine_and_command(args: argparse.Namespace) -> list[str]:
    from evals.report import machine_description

    return [
        f"Machine: {machine_description()}.",
        f"Reproduce: {command(args)} (`make bench` runs it; `--stage baselines` and "
        "`--stage fine-tune` on one `--home` may run as two processes, then `--stage report`).",
    ]


def command(args: argparse.Namespace) -> str:
    options = [f"--task {args.task}"]
    if args.preset != "default":
        options.append(f"--preset {args.preset}")
    if args.max_steps:
        options.append(f"--max-steps {args.max_steps}")
    if args.sample:
        options.append(f"--sample {args.sample}")
    if args.threads != 2:
        options.append(f"--threads {args.threads}")
    return f"`.venv/bin/python -m benchmarks.leaderboard {' '.join(options)}`"


def write(bench: Bench, args: argparse.Namespace, kind: str, extra: list[str]) -> None:
    from evals.report import write_leaderboard

    board = bench.reg.leaderboard(args.task)
    unit = "items" if kind == "classification" else "queries"
    bench.figures["leaderboard"] = {
        name: {"metrics": run.metrics, "ci": run.ci, unit: len(run.per_query)}
        for name, run in board.items()
    }
    md, chart = write_leaderboard(args.task, board, args.out, extra_lines=extra)
    written = [md, chart]
    if kind in FIGURES:
        write_json(args.out / FIGURES[kind], bench.figures)
        written.append(args.out / FIGURES[kind])
    print("wrote " + ", ".join(str(p) for p in written), flush=True)


if __name__ == "__main__":
    main()
