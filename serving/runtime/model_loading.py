"""Load a base model from its local folder and attach or detach peft LoRA adapters on it.

A sentence-transformers folder loads as a ``SentenceTransformer`` on the asked device; a
variant folder (``VARIANT_MANIFEST``) loads as an ``OnnxModel`` run by ONNX Runtime. Every
failure is a ``ModelLoadError`` naming the folder. The eval harness, the trainer and the
serving runtime all load here, so what is evaluated is what is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.runtime.model_folder import (
    VARIANT_MANIFEST,
    ModelLoadError,
    ModelSpec,
    check_adapter_folder,
    has_lora,
    refuse_adapter_on_variant,
)


def load_sentence_transformer(spec: ModelSpec, *, device: str = "cpu") -> Any:
    """Load a sentence-transformers folder from a local path, then attach the adapter's LoRA."""
    from sentence_transformers import SentenceTransformer

    if not spec.base_path.is_dir():
        raise ModelLoadError(f"base model folder does not exist: {spec.base_path}")
    if (spec.base_path / VARIANT_MANIFEST).is_file():
        return load_onnx_variant(spec)
    try:
        model = SentenceTransformer(str(spec.base_path), device=device, local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad folder
        raise ModelLoadError(f"cannot load base model from {spec.base_path}: {exc}") from exc
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    check_adapter_folder(spec.adapter_path)
    if has_lora(spec.adapter_path):
        assert spec.adapter_path is not None
        attach_adapter(model, spec.adapter_path)
    model.eval()
    return model


def load_onnx_variant(spec: ModelSpec) -> Any:
    """An ONNX variant folder (serving/runtime/onnx_variant.py), run by ONNX Runtime; it embeds
    only, so an adapter (LoRA or head) is refused."""
    from serving.runtime.onnx_variant import OnnxModel

    refuse_adapter_on_variant(spec)
    try:
        model = OnnxModel(spec.base_path)
    except Exception as exc:  # VariantError, or onnxruntime's own types for a bad graph
        raise ModelLoadError(f"cannot load ONNX variant from {spec.base_path}: {exc}") from exc
    if spec.max_seq_length is not None:
        model.max_seq_length = spec.max_seq_length
    return model


def attach_adapter(model: Any, adapter_path: Path, name: str = "default") -> None:
    """Wrap the transformer inside a SentenceTransformer with a peft LoRA adapter.

    When the transformer is already wrapped, the adapter is added under ``name`` beside the
    others (activate one with ``set_adapter``), so many adapters share one loaded base.
    """
    from peft import PeftModel

    if not (adapter_path / "adapter_config.json").is_file():
        raise ModelLoadError(f"not a peft adapter folder (no adapter_config.json): {adapter_path}")
    transformer = model[0]
    try:
        if isinstance(transformer.auto_model, PeftModel):
            transformer.auto_model.load_adapter(
                str(adapter_path), adapter_name=name, is_trainable=False
            )
            return
        wrapped = PeftModel.from_pretrained(
            transformer.auto_model, str(adapter_path), adapter_name=name, is_trainable=False
        )
    except Exception as exc:
        raise ModelLoadError(f"adapter {adapter_path} does not fit this base model: {exc}") from exc
    replace_network(transformer, wrapped)


def detach_adapter(model: Any, name: str) -> None:
    """Remove the adapter ``name``; removing the last one restores the plain base network."""
    from peft import PeftModel

    transformer = model[0]
    wrapped = transformer.auto_model
    if not isinstance(wrapped, PeftModel) or name not in wrapped.peft_config:
        raise KeyError(f"no adapter named {name!r} is attached")
    if len(wrapped.peft_config) == 1:
        replace_network(transformer, wrapped.unload())
    else:
        wrapped.delete_adapter(name)


def replace_network(transformer: Any, network: Any) -> None:
    # sentence-transformers >= 6 keeps the network in `.model`; `auto_model` is a read-only view.
    if isinstance(getattr(type(transformer), "auto_model", None), property):
        transformer.model = network
    else:
        transformer.auto_model = network
