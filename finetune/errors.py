"""Precise fine-tuning failures; the CLI turns each into one clear message (never a traceback)."""

from __future__ import annotations


class FinetuneError(Exception):
    """Base class: every fine-tuning failure a caller can expect."""

    code = "FINETUNE_ERROR"


class InvalidHyperparameters(FinetuneError):
    code = "INVALID_HYPERPARAMETERS"


class TrainingDataError(FinetuneError):
    """The training split is missing, empty, too small, or is a split the suite tests on."""

    code = "TRAINING_DATA_ERROR"


class AdapterConfigError(FinetuneError):
    """The LoRA configuration does not fit the base model (e.g. unknown target modules)."""

    code = "ADAPTER_CONFIG_ERROR"


class TrainingOutOfMemory(FinetuneError):
    code = "OUT_OF_MEMORY"


class TrainingInterrupted(FinetuneError):
    """The run was stopped (Ctrl-C); nothing was registered."""

    code = "INTERRUPTED"


def caused_by_ctrl_c(exc: BaseException) -> bool:
    """Whether Ctrl-C raised ``exc``, also when Python passed it on wrapped: 3.11 re-raises an
    exception from inside ``__set_name__`` (a dataclass being defined, e.g. while the training
    libraries import) as a RuntimeError whose cause is the KeyboardInterrupt."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
