"""Benchmark: german-legal-area (classification) end to end on the full test split.

Registers the built-in suite as a user would, scores the majority class and TF-IDF + logistic
regression baselines, fits an embedding + logistic-regression head on the packaged MiniLM
(mteb's protocol, a registered artifact) and fine-tunes a classifier (LoRA + head) with the
same code as `taskfleet finetune`, then writes reports/german-legal-area/: leaderboard.md + PNG
(CIs), the fine-tuned classifier's confusion matrix as a picture, and area.json.

    .venv/bin/python benchmarks/area_german_legal.py [--preset default] [--threads 2]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kinds_bench import (
    REPO,
    Bench,
    arguments,
    comparison_lines,
    fine_tune,
    training_lines,
    write_json,
)

TASK = "german-legal-area"


def main() -> None:
    args = arguments(__doc__.splitlines()[0], REPO / "reports" / TASK, "classification preset")

    import torch

    from evals.report import confusion_chart, machine_description, write_leaderboard
    from finetune.config import preset
    from finetune.pipeline import HeadRequest, finetune_head

    torch.set_num_threads(args.threads)
    bench = Bench.open(args.home or Path(tempfile.mkdtemp(prefix="taskfleet-bench-area-")))
    bench.task(TASK)
    base = bench.model()
    reg = bench.reg
    for kind in ("majority", "tfidf-lr"):
        reg.add_candidate(TASK, kind=kind)
        bench.evaluate(TASK, kind, sample=args.sample)

    head = finetune_head(
        reg,
        HeadRequest(
            task=TASK, base=base, name="minilm-lr-head", evaluate=False, data_root=bench.data_root
        ),
        cache_dir=bench.paths.cache_dir,
    )
    bench.figures["head_fit_seconds"] = round(head.training.wall_seconds, 1)
    bench.evaluate(TASK, head.candidate.name, sample=args.sample)

    hp = preset(args.preset, "classification").with_overrides(max_steps=args.max_steps)
    tuned, training = fine_tune(bench, TASK, base, hp, "minilm-area-lora")
    bench.figures["training"] = {tuned.candidate.name: training}
    bench.figures["hyperparameters"] = hp.as_dict()
    fine_tuned = bench.evaluate(TASK, tuned.candidate.name, sample=args.sample)

    for baseline in ("tfidf-lr", head.candidate.name, "majority"):
        bench.compare(TASK, tuned.candidate.name, baseline)
    bench.compare(TASK, "tfidf-lr", head.candidate.name)

    board = reg.leaderboard(TASK)
    bench.figures["leaderboard"] = {
        name: {"metrics": run.metrics, "ci": run.ci, "items": len(run.per_query)}
        for name, run in board.items()
    }
    details = fine_tuned.details or {}
    png = confusion_chart(
        f"{TASK}: {tuned.candidate.name} (test split)",
        details["labels"],
        details["confusion_matrix"],
        args.out / "confusion.png",
    )
    suite = reg.get_suite(TASK)
    options = (f" --preset {args.preset}" if args.preset != "default" else "") + (
        f" --threads {args.threads}" if args.threads != 2 else ""
    )
    command = f"`.venv/bin/python benchmarks/area_german_legal.py{options}`"
    extra = [
        *comparison_lines(bench.figures["comparisons"], "macro_f1"),
        "",
        "## Training",
        "",
        *training_lines(tuned.candidate.name, training),
        f"- `{head.candidate.name}`: logistic regression (class-balanced, C=1) on frozen MiniLM "
        f"embeddings of the train split, fitted in {bench.figures['head_fit_seconds']:.0f} s "
        "(encoding included); a registered artifact (head only, no LoRA).",
        f"- Hyperparameters (preset `{args.preset}`): "
        + ", ".join(f"{k}={v}" for k, v in sorted(hp.as_dict().items())),
        "",
        "## Confusion matrix of the fine-tuned classifier",
        "",
        "![confusion matrix](confusion.png)",
        "",
        f"Suite `{suite.name}` version {suite.version} (fingerprint `{suite.fingerprint[:12]}`), "
        f"test split `{suite.test_split}`, "
        + ("all items" if args.sample is None else f"first {args.sample} items")
        + "; models trained on `train` only. Main metric macro-F1 (the labels are imbalanced).",
        f"Machine: {machine_description()}.",
        f"Reproduce: {command} (`make bench` runs it).",
    ]
    md, chart = write_leaderboard(TASK, board, args.out, extra_lines=extra)
    write_json(args.out / "area.json", bench.figures)
    print(f"wrote {md}, {chart}, {png}")
    reg.close()


if __name__ == "__main__":
    main()
