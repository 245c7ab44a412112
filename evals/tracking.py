"""MLflow logging of a finished eval run: params, metrics (with CI bounds), cost, the report.

MLflow is imported lazily (it takes seconds) and told to stay off the network: telemetry off,
a local SQLite tracking store by default, artifacts in a folder next to that database (never
``./mlruns`` in whatever directory the user happens to be in).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

EXPERIMENT_PREFIX = "taskfleet-eval"


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
        for key, value in params.items():
            client.log_param(run_id, key, str(value)[:500])
        for key, value in metrics.items():
            client.log_metric(run_id, key, float(value))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.md"
            path.write_text(report_markdown, encoding="utf-8")
            client.log_artifact(run_id, str(path))
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id
