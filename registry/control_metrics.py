"""The control plane's ``GET /metrics``: what only the registry knows, in Prometheus text.

Endpoint models whose probe no longer answers as at registration, and the pairings on them (a
task's champion, or any candidate) that are stale with them: an operator alerts on
``taskfleet_pairing_stale == 1``. Read from the database (the endpoint watcher writes the
probes, serving/endpoint_watch.py), so every control plane answers the same.
"""

from __future__ import annotations

from registry.store import AbstractStore

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def registry_metrics(reg: AbstractStore) -> str:
    lines = [
        "# HELP taskfleet_endpoint_stale 1 when an endpoint model answers its probe otherwise "
        "than when it was registered.",
        "# TYPE taskfleet_endpoint_stale gauge",
        "# HELP taskfleet_endpoint_probe_failing 1 when the latest probe of an endpoint model "
        "failed (unreachable or a malformed answer).",
        "# TYPE taskfleet_endpoint_probe_failing gauge",
    ]
    models = {m.name: m for m in reg.list_models() if m.format == "endpoint"}
    for name, model in sorted(models.items()):
        lines.append(f'taskfleet_endpoint_stale{{model="{_label(name)}"}} {int(model.stale)}')
        failing = int(model.probe_error is not None)
        lines.append(f'taskfleet_endpoint_probe_failing{{model="{_label(name)}"}} {failing}')
    lines += [
        "# HELP taskfleet_pairing_stale 1 for a candidate on a stale endpoint model (champion "
        "says whether the task serves it).",
        "# TYPE taskfleet_pairing_stale gauge",
    ]
    for task in reg.list_tasks():
        champion = reg.champion(task.name)
        for candidate in reg.list_candidates(task.name):
            on = models.get(candidate.base_model or "")
            if on is None:
                continue
            serving = "true" if champion is not None and champion.id == candidate.id else "false"
            lines.append(
                f'taskfleet_pairing_stale{{task="{_label(task.name)}",'
                f'candidate="{_label(candidate.name)}",model="{_label(on.name)}",'
                f'champion="{serving}"}} {int(on.stale)}'
            )
    return "\n".join(lines) + "\n"
