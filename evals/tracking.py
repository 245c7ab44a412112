"""MLflow logging of a finished eval run: params, metrics (with CI bounds), cost, the report.

MLflow is imported lazily (it takes seconds) and told to stay off the network: telemetry off,
a local SQLite tracking store by default, artifacts in a folder next to that database (never
``./mlruns`` in whatever directory the user happens to be in).
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

EXPERIMENT_PREFIX = "taskfleet-eval"

# MLflow's rule for metric and param names (mlflow.utils.validation, as on Linux and macOS),
# mirrored so a suite's labels are checked at `suite add` without importing MLflow (seconds);
# tests/test_user_suites.py holds the two equal. Stricter only in refusing a trailing newline.
MAX_KEY_CHARS = 250
_KEY_CHARS = re.compile(r"[/\w.\- :]*")


def key_problem(key: str) -> str | None:
    """Why MLflow would refuse `key` as a metric or param name, or None when it takes it."""
    if len(key) > MAX_KEY_CHARS:
        return f"MLflow names hold at most {MAX_KEY_CHARS} characters"
    if not _KEY_CHARS.fullmatch(key):
        return "MLflow names hold only letters, digits, spaces and the characters _ - . : /"
    normal = posixpath.normpath(key)
    if normal != key or normal == "." or normal.startswith(("..", "/")):
        return f"MLflow reads names as paths and this one resolves to {normal!r}"
    return None


def per_class_metric(label: str) -> str:
    """The MLflow metric of one label's F1 (a classification suite's labels must make valid
    names: `evals/classification_data.py` refuses the others at `suite add`)."""
    return f"f1_{label}"


def quiet_offline_env() -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")


def artifact_root(tracking_uri: str) -> str | None:
    """For a local SQLite store, the artifact folder beside it; otherwise the server decides."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        return (db.parent / f"{db.stem}-artifacts").resolve().as_uri()
    return None


def log_eval_run(
    tracking_uri: str,
    *,
    task: str,
    run_name: str,
    params: Mapping[str, object],
    metrics: Mapping[str, float],
    report_markdown: str,
) -> str:
    """Log one run and return its MLflow run id."""
    quiet_offline_env()
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    name = f"{EXPERIMENT_PREFIX}/{task}"
    experiment = client.get_experiment_by_name(name)
    experiment_id = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(name, artifact_location=artifact_root(tracking_uri))
    )
    run = client.create_run(experiment_id, run_name=run_name)
    run_id: str = run.info.run_id
    try:
        # Batched (a suite may have thousands of labels, one F1 metric each); MLflow takes at
        # most 100 params and 1000 metrics per call.
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        logged = [Param(key, str(value)[:500]) for key, value in params.items()]
        for start in range(0, len(logged), 100):
            client.log_batch(run_id, params=logged[start : start + 100])
        points = [Metric(key, float(value), now, 0) for key, value in metrics.items()]
        for start in range(0, len(points), 1000):
            client.log_batch(run_id, metrics=points[start : start + 1000])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.md"
            path.write_text(report_markdown, encoding="utf-8")
            client.log_artifact(run_id, str(path))
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id
