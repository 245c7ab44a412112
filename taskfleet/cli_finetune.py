"""`taskfleet finetune lora TASK --base MODEL [--parent ADAPTER] [hyperparameters]` and
`taskfleet finetune head TASK --base MODEL` (classification: logistic regression on embeddings).

`lora` trains what the task's kind needs: an embedding LoRA (retrieval), a cross-encoder LoRA
plus score head (rerank), a classifier LoRA plus classify head (classification)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from taskfleet.console import bold, console, line, styled
from taskfleet.context import get_settings, open_registry

out = console()
finetune_app = typer.Typer(help="Fine-tune adapters for a task.", no_args_is_help=True)


class StopAtNextStep:
    """Ctrl-C during `finetune lora` stops the run at the next training step or phase, raised
    there as KeyboardInterrupt (the pipeline registers nothing and closes the run KILLED).

    Raised wherever the signal lands, it could land inside a library: while the training
    libraries import, in a dataclass's `__set_name__`, Python 3.11 re-raises it as a
    RuntimeError, which a library's `except Exception` may swallow (training then ran on) or
    which surfaced as a traceback. A second Ctrl-C interrupts at once, and so does the first
    once the evaluation phase began (`deferring` off: an evaluation has no steps to wait for)."""

    def __init__(self) -> None:
        self.requested = False
        self.deferring = True
        self._restore: Callable[[], object] | None = None

    def __enter__(self) -> StopAtNextStep:
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
            if previous is not None:  # None: a handler not installed from Python
                self._restore = lambda: signal.signal(signal.SIGINT, previous)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._restore is not None:
            self._restore()

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or not self.deferring:
            raise KeyboardInterrupt
        self.requested = True
        # A plain write: the handler may run in the middle of the progress bar's own output.
        # A closed stderr must not raise here, wherever the handler runs.
        with contextlib.suppress(OSError):
            os.write(2, b"\nstopping at the next step (Ctrl-C again stops at once)\n")

    def check(self) -> None:
        """Raise the interruption here, at a point of our own, if Ctrl-C was pressed."""
        if self.requested:
            raise KeyboardInterrupt


@finetune_app.command("lora")
def lora(
    task: str = typer.Argument(..., help="Task whose suite supplies the training split."),
    base: str = typer.Option(..., "--base", help="Registered base model to adapt."),
    parent: str | None = typer.Option(
        None, "--parent", help="Continue training this adapter (recorded as the parent)."
    ),
    name: str | None = typer.Option(None, "--name", help="Adapter name (default: dated)."),
    preset_name: str = typer.Option(
        "default",
        "--preset",
        help="Hyperparameter preset of the task's kind (default, demo; retrieval also epoch, "
        "short); flags override it.",
    ),
    split: str | None = typer.Option(
        None, "--split", help="Training split (default: the suite's); test splits are refused."
    ),
    rank: int | None = typer.Option(None, "--rank", help="LoRA rank r."),
    alpha: int | None = typer.Option(None, "--alpha", help="LoRA alpha."),
    dropout: float | None = typer.Option(None, "--dropout", help="LoRA dropout."),
    target_modules: str | None = typer.Option(
        None, "--target-modules", help="Comma-separated module names, e.g. query,key,value,dense."
    ),
    learning_rate: float | None = typer.Option(None, "--lr", help="Learning rate."),
    epochs: int | None = typer.Option(None, "--epochs", help="Passes over the split."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Pairs per step."),
    max_seq_length: int | None = typer.Option(
        None, "--max-seq-length", help="Token limit for queries and passages while training."
    ),
    seed: int | None = typer.Option(None, "--seed", help="Seed (runs are repeatable on CPU)."),
    hard_negatives: str | None = typer.Option(
        None, "--hard-negatives", help="none, bm25 or base (mined with the base model)."
    ),
    max_pairs: int | None = typer.Option(
        None, "--max-pairs", help="Train on a seeded sample of this many pairs."
    ),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop after this many steps."),
    head_lr: float | None = typer.Option(
        None, "--head-lr", help="Learning rate of a task head (rerank, classification)."
    ),
    group_size: int | None = typer.Option(
        None, "--group-size", help="Rerank: candidates per query in one listwise group."
    ),
    class_weighting: str | None = typer.Option(
        None, "--class-weighting", help="Classification: balanced or none."
    ),
    lora_layers: int | None = typer.Option(
        None, "--lora-layers", help="Adapt only the top N transformer layers (cheaper steps)."
    ),
    threads: int = typer.Option(2, "--threads", help="CPU threads for torch."),
    no_eval: bool = typer.Option(False, "--no-eval", help="Register without evaluating."),
    eval_sample: int | None = typer.Option(
        None, "--eval-sample", help="Evaluate on the first N test queries only."
    ),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        help="Root of the suites' data (env TASKFLEET_DATA_DIR; default ../shared/data).",
    ),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log to MLflow."),
) -> None:
    """Train a LoRA adapter on the task's training split, register it, evaluate it."""
    import torch

    from finetune.config import preset
    from finetune.pipeline import FinetuneRequest, finetune_lora
    from finetune.trainer import StepReport, mean_loss

    torch.set_num_threads(threads)
    # Our own progress bar is the one to watch; transformers' weight-loading bars are noise.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    modules = (
        tuple(m.strip() for m in target_modules.split(",") if m.strip()) if target_modules else None
    )
    kind = open_registry().get_task(task).kind
    hp = preset(preset_name, kind).with_overrides(
        rank=rank,
        alpha=alpha,
        dropout=dropout,
        target_modules=modules,
        learning_rate=learning_rate,
        epochs=epochs,
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        seed=seed,
        hard_negatives=hard_negatives,
        max_pairs=max_pairs,
        max_steps=max_steps,
        head_learning_rate=head_lr,
        group_size=group_size,
        class_weighting=class_weighting,
        lora_layers=lora_layers,
    )
    settings = get_settings()
    request = FinetuneRequest(
        task=task,
        base=base,
        hyperparameters=hp,
        parent=parent,
        name=name,
        split=split,
        evaluate=not no_eval,
        data_root=data_dir or get_settings().data_dir,
        eval_sample=eval_sample,
    )
    progress = Progress(
        TextColumn("{task.description}", markup=False, style="bold"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}", markup=False),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=out,
    )
    bar: list[TaskID] = []

    stop = StopAtNextStep()

    def on_step(step: StepReport) -> None:
        stop.check()
        if not bar:
            bar.append(progress.add_task("training", total=step.total_steps, loss="-"))
        progress.update(bar[0], completed=step.step, loss=f"{step.loss:.4f}")

    def on_phase(phase: str, detail: str) -> None:
        stop.check()
        stop.deferring = phase != "evaluate"
        progress.console.print(line(styled(f"{phase}:", "dim"), f" {detail}"), markup=False)

    with stop, progress:
        outcome = finetune_lora(
            open_registry(),
            request,
            tracking_uri=None if no_mlflow else settings.resolved_mlflow_uri,
            cache_dir=settings.cache_dir,
            on_step=on_step,
            on_phase=on_phase,
        )
    result = outcome.training
    a = outcome.adapter
    out.print(
        line(
            "adapter ",
            bold(a.name),
            f" on {a.base_model}"
            + (f" (parent {a.parent})" if a.parent else "")
            + f": {result.steps} steps in {result.wall_seconds:.0f}s, loss "
            f"{mean_loss(result.losses, first=True):.4f} -> "
            f"{mean_loss(result.losses, first=False):.4f}",
        )
    )
    out.print(f"sha256 {a.sha256}  ({a.size_bytes:,} bytes)  candidate {outcome.candidate.name}")
    if outcome.mlflow_run_id:
        out.print(f"mlflow run {outcome.mlflow_run_id}")
    if outcome.eval_run is not None:
        run = outcome.eval_run
        low, high = run.ci.get(run.main_metric, (float("nan"), float("nan")))
        out.print(
            f"{run.suite_name}/{run.split}: {run.main_metric} {run.main_score:.4f} "
            f"[95% CI {low:.4f}, {high:.4f}]"
        )


@finetune_app.command("head")
def head(
    task: str = typer.Argument(..., help="A classification task."),
    base: str = typer.Option(..., "--base", help="Registered base model (kept frozen)."),
    name: str | None = typer.Option(None, "--name", help="Head name (default: dated)."),
    split: str | None = typer.Option(
        None, "--split", help="Training split (default: the suite's)."
    ),
    c: float = typer.Option(1.0, "--c", help="Inverse regularisation of the logistic regression."),
    no_eval: bool = typer.Option(False, "--no-eval", help="Register without evaluating."),
    eval_sample: int | None = typer.Option(
        None, "--eval-sample", help="Evaluate on the first N test items only."
    ),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Root of the suites' data (env TASKFLEET_DATA_DIR)."
    ),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log to MLflow."),
) -> None:
    """Fit a logistic-regression head on the frozen base's embeddings of the training split,
    register it as an artifact with lineage, and evaluate it."""
    from finetune.pipeline import HeadRequest, finetune_head

    settings = get_settings()
    request = HeadRequest(
        task=task,
        base=base,
        name=name,
        split=split,
        c=c,
        evaluate=not no_eval,
        data_root=data_dir or settings.data_dir,
        eval_sample=eval_sample,
    )
    with out.status("fitting the head..."):
        outcome = finetune_head(
            open_registry(),
            request,
            tracking_uri=None if no_mlflow else settings.resolved_mlflow_uri,
            cache_dir=settings.cache_dir,
            on_phase=lambda phase, detail: out.print(
                line(styled(f"{phase}:", "dim"), f" {detail}")
            ),
        )
    a = outcome.adapter
    out.print(
        line(
            "head ",
            bold(a.name),
            f" on {a.base_model}: fitted in {outcome.training.wall_seconds:.0f}s; "
            f"candidate {outcome.candidate.name}",
        )
    )
    out.print(f"sha256 {a.sha256}  ({a.size_bytes:,} bytes)")
    if outcome.eval_run is not None:
        run = outcome.eval_run
        low, high = run.ci.get(run.main_metric, (float("nan"), float("nan")))
        out.print(
            f"{run.suite_name}/{run.split}: {run.main_metric} {run.main_score:.4f} "
            f"[95% CI {low:.4f}, {high:.4f}]"
        )
