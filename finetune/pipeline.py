"""`taskfleet finetune lora|head`: check everything, train, register with lineage, evaluate.

`lora` trains what the task's kind needs: a LoRA for an embedding model (retrieval), a LoRA and
a score head (a cross-encoder, rerank), a LoRA and a classify head (classification). `head`
fits only a classify head on the frozen base by logistic regression (mteb's protocol).

Order matters for what a failure leaves behind. Every check that can fail cheaply (task, suite,
split, base, parent, adapter name) runs before training; the adapter is written to a temporary
folder and registered only after training finished, so an interrupted or failed run registers
nothing and leaves no half-written adapter. The eval runs after registration: a failed eval
leaves a registered, unevaluated adapter that `taskfleet eval` can score later.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from evals.errors import EvalError
from evals.provenance import code_version
from evals.suites import SuiteSpec
from finetune.config import LoraHyperparameters
from finetune.data import (
    LabelledTexts,
    RerankGroups,
    TrainingPairs,
    load_labelled,
    load_rerank_groups,
    load_training_pairs,
)
from finetune.errors import FinetuneError, TrainingInterrupted, caused_by_ctrl_c
from finetune.job import fit_linear_head, train_adapter, train_head_adapter
from finetune.trainer import StepCallback, TrainingResult
from finetune.training_run import TrainingRun
from registry import Registry
from registry.entities import Adapter, Candidate, EvalRun, TrainingRecord
from registry.errors import AlreadyExists, LineageError, NotFound


@dataclass(frozen=True)
class FinetuneRequest:
    task: str
    base: str
    hyperparameters: LoraHyperparameters = field(default_factory=LoraHyperparameters)
    parent: str | None = None
    name: str | None = None
    split: str | None = None  # default: the suite's declared training split
    evaluate: bool = True
    data_root: Path | None = None  # where suites' data lives (default ../shared/data)
    suite_location: Path | None = None  # overrides the suite's own data folder
    eval_sample: int | None = None  # score only the first N test queries


@dataclass(frozen=True)
class FinetuneOutcome:
    adapter: Adapter
    candidate: Candidate
    training: TrainingResult
    data: TrainingPairs | RerankGroups | LabelledTexts
    eval_run: EvalRun | None
    mlflow_run_id: str | None


# (phase, detail) for the CLI: "data", "train", "register", "evaluate".
PhaseCallback = Callable[[str, str], None]


def finetune_lora(
    reg: Registry,
    request: FinetuneRequest,
    *,
    tracking_uri: str | None = None,
    cache_dir: Path | None = None,
    on_step: StepCallback | None = None,
    on_phase: PhaseCallback | None = None,
) -> FinetuneOutcome:
    from evals.runner import EvalPaths, task_suite

    phase = on_phase or (lambda _phase, _detail: None)
    task = reg.get_task(request.task)
    suite = task_suite(
        reg,
        task.name,
        EvalPaths(
            cache_dir=Path("."), data_root=request.data_root, suite_location=request.suite_location
        ),
    )
    model = reg.get_model(request.base)
    _check_trainable(model.name, model.format)
    base_path = reg.model_path(model.name)
    parent_path = _check_parent(reg, request)
    hp = request.hyperparameters
    if parent_path is not None:
        hp = inherit_lora_shape(hp, parent_path)
    name = request.name or default_adapter_name(task.name)
    _check_name_free(reg, name)

    phase("data", f"suite {suite.name} ({suite.kind})")
    data = _training_data(suite, request, hp)
    size, unit = _size(data)
    run = TrainingRun(tracking_uri, task=task.name, run_name=name)
    try:
        run.log_params(
            {
                **hp.as_dict(),
                "task": task.name,
                "base": model.name,
                "parent": request.parent,
                "suite": suite.name,
                "kind": suite.kind,
                "train_split": data.split,
                unit: size,
                "data_fingerprint": data.fingerprint,
            }
        )
        with tempfile.TemporaryDirectory(prefix="taskfleet-lora-") as tmp:
            phase("train", f"{size} {unit} from split {data.split}")
            if isinstance(data, TrainingPairs):
                trained = train_adapter(
                    base_path,
                    data,
                    hp,
                    Path(tmp) / "adapter",
                    parent_adapter=parent_path,
                    query_prefix=model.query_prefix,
                    passage_prefix=model.passage_prefix,
                    on_step=on_step,
                )
            else:
                trained = train_head_adapter(
                    "score" if isinstance(data, RerankGroups) else "classify",
                    base_path,
                    data,
                    hp,
                    Path(tmp) / "adapter",
                    parent_adapter=parent_path,
                    query_prefix=model.query_prefix,
                    on_step=on_step,
                )
            phase("register", name)
            record = TrainingRecord(
                data_fingerprint=data.fingerprint,
                train_split=data.split,
                hyperparameters=hp.as_dict(),
                seed=hp.seed,
                code_version=code_version(),
                suite=suite.name,
                mlflow_run_id=run.run_id,
            )
            run.log_losses(trained.result.losses)
            run.log_metrics({"train_seconds": trained.result.wall_seconds})
            run.log_adapter(trained.path)
            adapter = reg.register_adapter(
                name,
                base=model.name,
                source_dir=trained.path,
                training=record,
                parent=request.parent,
            )
    except BaseException as exc:
        if not caused_by_ctrl_c(exc):
            run.finish("FAILED")
            raise
        run.finish("KILLED")
        raise TrainingInterrupted("training interrupted; nothing was registered") from None
    candidate = reg.add_candidate(
        task.name, base=model.name, adapter=adapter.name, kind=MODEL_CANDIDATE[suite.kind]
    )
    eval_run: EvalRun | None = None
    try:
        if request.evaluate:
            phase("evaluate", f"suite {suite.name}")
            try:
                eval_run = _evaluate(
                    reg, task.name, candidate, request, cache_dir or Path(tmp_cache()), tracking_uri
                )
            except EvalError as exc:
                raise FinetuneError(
                    f"adapter {adapter.name!r} is registered (candidate {candidate.name!r}) but "
                    f"its evaluation failed: {exc}; evaluate it later with `taskfleet eval run`"
                ) from exc
            run.log_metrics({f"eval_{k}": v for k, v in eval_run.metrics.items()})
    finally:
        run.finish()
    return FinetuneOutcome(adapter, candidate, trained.result, data, eval_run, run.run_id)


# The candidate a trained adapter becomes, by task kind.
MODEL_CANDIDATE = {
    "retrieval": "embedding",
    "rerank": "cross-encoder",
    "classification": "classifier",
}


def _training_data(
    suite: SuiteSpec, request: FinetuneRequest, hp: LoraHyperparameters
) -> TrainingPairs | RerankGroups | LabelledTexts:
    if suite.kind == "rerank":
        return load_rerank_groups(suite, request.split, data_root=request.data_root)
    if suite.kind == "classification":
        return load_labelled(suite, request.split, data_root=request.data_root)
    return load_training_pairs(
        suite, request.split, data_root=request.data_root, max_pairs=hp.max_pairs, seed=hp.seed
    )


def _size(data: TrainingPairs | RerankGroups | LabelledTexts) -> tuple[int, str]:
    if isinstance(data, TrainingPairs):
        return len(data.pairs), "pairs"
    if isinstance(data, RerankGroups):
        return len(data.groups), "queries"
    return len(data.texts), "texts"


@dataclass(frozen=True)
class HeadRequest:
    """A classify head fitted by logistic regression on the frozen base's embeddings."""

    task: str
    base: str
    name: str | None = None
    split: str | None = None
    c: float = 1.0  # inverse regularisation strength of the logistic regression
    evaluate: bool = True
    data_root: Path | None = None
    eval_sample: int | None = None


def finetune_head(
    reg: Registry,
    request: HeadRequest,
    *,
    tracking_uri: str | None = None,
    cache_dir: Path | None = None,
    on_phase: PhaseCallback | None = None,
) -> FinetuneOutcome:
    """Fit, store, register (with lineage) and evaluate an embedding + logistic-regression
    head: the classification candidate mteb's protocol describes, as a servable artifact."""
    from evals.runner import EvalPaths, task_suite

    phase = on_phase or (lambda _phase, _detail: None)
    task = reg.get_task(request.task)
    if task.kind != "classification":
        raise FinetuneError(f"task {task.name!r} is a {task.kind} task; a head classifies")
    if not request.c > 0:
        raise FinetuneError("--c must be > 0")
    suite = task_suite(reg, task.name, EvalPaths(cache_dir=Path("."), data_root=request.data_root))
    model = reg.get_model(request.base)
    _check_trainable(model.name, model.format)
    name = request.name or default_adapter_name(task.name).replace("-lora-", "-head-")
    _check_name_free(reg, name)
    phase("data", f"suite {suite.name} ({suite.kind})")
    data = load_labelled(suite, request.split, data_root=request.data_root)
    hyperparameters = {"method": "logistic-regression", "C": request.c, "class_weight": "balanced"}
    run = TrainingRun(tracking_uri, task=task.name, run_name=name)
    try:
        run.log_params({**hyperparameters, "task": task.name, "base": model.name})
        with tempfile.TemporaryDirectory(prefix="taskfleet-head-") as tmp:
            phase("train", f"embedding {len(data.texts)} texts, fitting the head")
            path, result = fit_linear_head(
                reg.model_path(model.name),
                data,
                Path(tmp) / "head",
                c=request.c,
                query_prefix=model.query_prefix,
            )
            phase("register", name)
            record = TrainingRecord(
                data_fingerprint=data.fingerprint,
                train_split=data.split,
                hyperparameters=hyperparameters,
                seed=0,
                code_version=code_version(),
                suite=suite.name,
                mlflow_run_id=run.run_id,
            )
            run.log_metrics({"train_seconds": result.wall_seconds})
            run.log_adapter(path)
            adapter = reg.register_adapter(name, base=model.name, source_dir=path, training=record)
    except BaseException as exc:
        if not caused_by_ctrl_c(exc):
            run.finish("FAILED")
            raise
        run.finish("KILLED")
        raise TrainingInterrupted("interrupted; nothing was registered") from None
    candidate = reg.add_candidate(
        task.name, base=model.name, adapter=adapter.name, kind="classifier"
    )
    eval_run: EvalRun | None = None
    try:
        if request.evaluate:
            phase("evaluate", f"suite {suite.name}")
            eval_request = FinetuneRequest(
                task=task.name,
                base=model.name,
                data_root=request.data_root,
                eval_sample=request.eval_sample,
            )
            try:
                eval_run = _evaluate(
                    reg,
                    task.name,
                    candidate,
                    eval_request,
                    cache_dir or Path(tmp_cache()),
                    tracking_uri,
                )
            except EvalError as exc:
                raise FinetuneError(
                    f"head {adapter.name!r} is registered (candidate {candidate.name!r}) but its "
                    f"evaluation failed: {exc}"
                ) from exc
    finally:
        run.finish()
    return FinetuneOutcome(adapter, candidate, result, data, eval_run, run.run_id)


def _check_parent(reg: Registry, request: FinetuneRequest) -> Path | None:
    if request.parent is None:
        return None
    parent = reg.get_adapter(request.parent)
    if parent.base_model != request.base:
        raise LineageError(
            f"parent adapter {parent.name!r} was trained on base {parent.base_model!r}, "
            f"not on {request.base!r}"
        )
    return reg.adapter_path(parent.name)


def inherit_lora_shape(hp: LoraHyperparameters, parent_path: Path) -> LoraHyperparameters:
    """A child continues its parent's LoRA matrices, so rank, alpha and targets are the parent's;
    the record says so rather than repeating flags that had no effect."""
    import json

    config = json.loads((parent_path / "adapter_config.json").read_text(encoding="utf-8"))
    targets = config.get("target_modules") or list(hp.target_modules)
    return hp.with_overrides(
        rank=config.get("r"),
        alpha=config.get("lora_alpha"),
        dropout=config.get("lora_dropout"),
        target_modules=tuple(sorted(targets)) if isinstance(targets, list) else (targets,),
    )


def _check_name_free(reg: Registry, name: str) -> None:
    try:
        reg.get_adapter(name)
    except NotFound:
        return
    raise AlreadyExists(f"adapter {name!r} already exists; choose another --name")


def _evaluate(
    reg: Registry,
    task: str,
    candidate: Candidate,
    request: FinetuneRequest,
    cache_dir: Path,
    tracking_uri: str | None,
) -> EvalRun:
    """Score the new candidate on the task's test split and record it as an eval run."""
    from evals.runner import EvalPaths, run_eval

    paths = EvalPaths(
        cache_dir=cache_dir,
        mlflow_uri=tracking_uri,
        data_root=request.data_root,
        suite_location=request.suite_location,
    )
    return run_eval(reg, task, candidate.name, paths, sample=request.eval_sample)


def tmp_cache() -> str:
    """Without a configured cache the eval still works, it just re-encodes next time."""
    return tempfile.mkdtemp(prefix="taskfleet-eval-cache-")


def default_adapter_name(task: str) -> str:
    return f"{task}-lora-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def _check_trainable(model: str, model_format: str | None) -> None:
    """A LoRA or a head needs weights to train on: an endpoint model (behind an API) or a fitted
    lexical baseline has none, so it is refused before any data is read."""
    from registry.adapters import refuse_derived_work
    from registry.errors import InvalidInput

    try:
        refuse_derived_work(model, model_format, "adapters or heads")
    except InvalidInput as exc:
        raise FinetuneError(str(exc)) from None
