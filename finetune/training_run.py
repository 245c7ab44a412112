"""MLflow logging of a training run: params, the loss curve, the adapter files.

The run is opened before training so its id can go into the adapter's lineage record, and is
closed FINISHED only after the adapter is registered; a failed or interrupted run is closed
FAILED/KILLED and nothing is registered. MLflow is imported lazily (it takes seconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# One MLflow convention for the project: offline, artifacts beside a local SQLite store.
from evals.mlflow_experiments import open_experiment
from finetune.errors import FinetuneError

EXPERIMENT_PREFIX = "taskfleet-finetune"


class TrainingRun:
    """An open MLflow run; `None` tracking URI turns every call into a no-op."""

    def __init__(self, tracking_uri: str | None, *, task: str, run_name: str) -> None:
        self.run_id: str | None = None
        self._client: Any = None
        if tracking_uri is None:
            return
        try:
            self._client, experiment_id = open_experiment(
                tracking_uri, f"{EXPERIMENT_PREFIX}/{task}"
            )
            self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        except Exception as exc:  # MLflow raises many types for a bad or unreachable store
            raise FinetuneError(f"cannot log to MLflow at {tracking_uri}: {exc}") from exc

    def log_params(self, params: Mapping[str, object]) -> None:
        if self._client is None:
            return
        for key, value in params.items():
            self._client.log_param(self.run_id, key, str(value)[:500])

    def log_losses(self, losses: Sequence[float]) -> None:
        """The loss curve, one point per optimizer step, in one batched call."""
        if self._client is None or not losses:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric("loss", float(v), now, step) for step, v in enumerate(losses, start=1)]
        for start in range(0, len(metrics), 1000):  # MLflow's per-request limit
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        if self._client is None:
            return
        for key, value in metrics.items():
            self._client.log_metric(self.run_id, key, float(value))

    def log_adapter(self, adapter_dir: Path) -> None:
        if self._client is None:
            return
        self._client.log_artifacts(self.run_id, str(adapter_dir), artifact_path="adapter")

    def finish(self, status: str = "FINISHED") -> None:
        if self._client is not None:
            self._client.set_terminated(self.run_id, status=status)
            self._client = None
