"""The project's one MLflow convention, for eval runs and training runs alike.

MLflow is imported lazily (it takes seconds) and told to stay off the network: telemetry off,
a local SQLite tracking store by default, artifacts in a folder next to that database (never
``./mlruns`` in whatever directory the user happens to be in). ``evals/tracking.py`` (eval runs)
and ``finetune/training_run.py`` (training runs) both open their experiment here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


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


def open_experiment(tracking_uri: str, name: str) -> tuple[Any, str]:
    """An ``MlflowClient`` on the store and the id of experiment ``name``, created on first use
    (artifacts beside a local SQLite store). MLflow's own exceptions pass through: each caller
    says in its own words that its run could not be logged."""
    quiet_offline_env()
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(name)
    experiment_id: str = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(name, artifact_location=artifact_root(tracking_uri))
    )
    return client, experiment_id
