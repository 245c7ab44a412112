"""Declare an MTEB task as a suite (`taskfleet suite add NAME --mteb TASK_NAME`).

The task's metadata comes from the installed mteb package; its data is loaded through mteb and
`datasets` from the local Hugging Face cache only (taskfleet never downloads at run time). When
the dataset is not in the cache, the error names the dataset, its revision and the cache folder.

Not yet: turning a loaded MTEB dataset into a local suite folder. With the dataset present,
the declaration stops with a clear error saying so (nothing is registered).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from evals.errors import SuiteDataError

if TYPE_CHECKING:
    from registry.entities import SuiteCreate

MTEB_KINDS = {"Retrieval": "retrieval", "Reranking": "rerank", "Classification": "classification"}


def mteb_cache_dirs() -> tuple[str, str]:
    """(hub cache, datasets cache) as the libraries resolve them (HF_HOME and friends)."""
    import datasets.config
    import huggingface_hub.constants

    return str(huggingface_hub.constants.HF_HUB_CACHE), str(datasets.config.HF_DATASETS_CACHE)


def declare_mteb(
    name: str, task_name: str, folder: Path, *, main_metric: str | None = None
) -> tuple[SuiteCreate, dict[str, dict[str, int]]]:
    import mteb

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        task = mteb.get_task(task_name)
    except (KeyError, ValueError):
        raise SuiteDataError(f"mteb knows no task named {task_name!r}") from None
    kind = MTEB_KINDS.get(str(task.metadata.type))
    if kind is None:
        raise SuiteDataError(
            f"mteb task {task_name!r} is a {task.metadata.type} task; taskfleet suites are "
            f"{', '.join(MTEB_KINDS)}"
        )
    dataset = task.metadata.dataset or {}
    path, revision = dataset.get("path", "?"), dataset.get("revision", "?")
    try:
        task.load_data()
    except Exception as exc:  # datasets/huggingface_hub raise many types when data is absent
        hub, cache = mteb_cache_dirs()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SuiteDataError(
            f"mteb task {task_name!r} ({kind}) needs the dataset {path!r} at revision "
            f"{revision} in the local Hugging Face cache ({hub}, {cache}); it is not there "
            f"and taskfleet does not download (HF_HUB_OFFLINE=1): {reason}"
        ) from None
    raise SuiteDataError(
        f"mteb task {task_name!r} loaded from the cache, but converting an MTEB dataset into a "
        f"local suite folder ({folder}) is not implemented yet; export it in the {kind} layout "
        "and register it with --path"
    )
