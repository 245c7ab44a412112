"""A model as the runtime names it, and what its folders hold, read without loading weights.

``ModelSpec`` says where a base model and its adapter are and how to prompt them; the checks
here read only file names (a variant's manifest, a peft ``adapter_config.json``, a
``head.json``), so they import no torch. The loader (``serving/runtime/model_loading.py``)
and the ONNX variants (``serving/runtime/onnx_variant.py``) both build on this module, and
neither imports the other's importer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# Set before transformers or huggingface_hub is imported (they read it once): this is the
# module every path to a model imports first, so no load ever reaches for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: A model folder holding this file is an optimised variant (serving/runtime/onnx_variant.py).
VARIANT_MANIFEST = "taskfleet_variant.json"
TextKind = Literal["query", "passage"]


class ModelLoadError(RuntimeError):
    """The base model or adapter could not be loaded from its local path."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build an encoder: where the weights are and how to prompt them."""

    base_path: Path
    adapter_path: Path | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    max_seq_length: int | None = None

    def prefix(self, kind: TextKind) -> str:
        return self.query_prefix if kind == "query" else self.passage_prefix


def has_lora(adapter_path: Path | None) -> bool:
    """An adapter folder may hold a task head only (serving/runtime/heads.py), no LoRA."""
    return adapter_path is not None and (adapter_path / "adapter_config.json").is_file()


def check_adapter_folder(adapter_path: Path | None) -> None:
    """An adapter folder holds a peft LoRA, a task head (head.json), or both."""
    if adapter_path is None:
        return
    if not adapter_path.is_dir():
        raise ModelLoadError(f"adapter folder does not exist: {adapter_path}")
    if not has_lora(adapter_path) and not (adapter_path / "head.json").is_file():
        raise ModelLoadError(
            f"not an adapter folder (neither a peft adapter_config.json nor a head.json): "
            f"{adapter_path}"
        )


def refuse_adapter_on_variant(spec: ModelSpec) -> None:
    """A variant embeds only: a spec pairing one with an adapter (LoRA or head) is refused."""
    if spec.adapter_path is not None and (spec.base_path / VARIANT_MANIFEST).is_file():
        raise ModelLoadError(
            f"{spec.base_path} is an ONNX variant: it embeds only and cannot apply the "
            f"adapter {spec.adapter_path}"
        )


def is_onnx_variant(model: Any) -> bool:
    return getattr(model, "variant", None) is not None and hasattr(model, "session")


def embedding_dimension(model: Any) -> int | None:
    """The model's output size (sentence-transformers 6 renamed the getter)."""
    getter = getattr(model, "get_embedding_dimension", None)
    dims = getter() if getter is not None else model.get_sentence_embedding_dimension()
    return int(dims) if dims is not None else None
