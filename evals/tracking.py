"""MLflow logging of a finished eval run: params, metrics (with CI bounds), cost, the report.

The store, the experiment and staying offline are the project's one MLflow convention
(``evals/mlflow_experiments.py``).
"""

from __future__ import annotations

import posixpath
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from evals.mlflow_experiments import open_experiment

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
    client, experiment_id = open_experiment(tracking_uri, f"{EXPERIMENT_PREFIX}/{task}")
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
