"""Put a trainable LoRA on a model built by the shared model library, and embed with it.

The model always comes from `serving.runtime.model_loading.load_sentence_transformer`, and `embed`
runs the same tokenize + forward the runtime's `Encoder` runs, so the vectors seen during
training are the vectors the served adapter produces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finetune.config import LoraHyperparameters
from finetune.errors import AdapterConfigError
from serving.runtime.model_folder import ModelLoadError
from serving.runtime.model_loading import attach_adapter, replace_network


def add_trainable_lora(model: Any, hp: LoraHyperparameters, parent_adapter: Path | None) -> None:
    """Wrap the model's transformer with a new LoRA, or with the parent's LoRA to continue it."""
    transformer = model[0]
    if parent_adapter is not None:
        try:
            attach_adapter(model, parent_adapter)
        except ModelLoadError as exc:
            raise AdapterConfigError(str(exc)) from exc
        # attach_adapter loads for inference; a child continues from the parent's weights.
        for name, parameter in transformer.auto_model.named_parameters():
            parameter.requires_grad = "lora_" in name
        return

    from peft import LoraConfig, get_peft_model

    _check_target_modules(transformer.auto_model, hp.target_modules)
    layers: dict[str, Any] = {}
    if hp.lora_layers is not None:
        depth = int(getattr(transformer.auto_model.config, "num_hidden_layers", 0) or 0)
        if not depth:
            raise AdapterConfigError("this base model does not say how many layers it has")
        first = max(0, depth - hp.lora_layers)
        layers = {"layers_to_transform": list(range(first, depth)), "layers_pattern": "layer"}
    config = LoraConfig(
        r=hp.rank,
        lora_alpha=hp.alpha,
        lora_dropout=hp.dropout,
        target_modules=list(hp.target_modules),
        bias="none",
        **layers,
    )
    try:
        # Installed the way attach_adapter installs a served adapter, so forward is identical.
        replace_network(transformer, get_peft_model(transformer.auto_model, config))
    except ValueError as exc:  # peft's message for modules it cannot adapt
        raise AdapterConfigError(f"LoRA config does not fit the base model: {exc}") from exc


def _check_target_modules(module: Any, targets: Sequence[str]) -> None:
    """Name the modules that do exist when a target does not, instead of peft's long error."""
    import torch

    linear_names = {
        name.rsplit(".", 1)[-1]
        for name, child in module.named_modules()
        if isinstance(child, torch.nn.Linear)
    }
    missing = [t for t in targets if t not in linear_names]
    if missing:
        raise AdapterConfigError(
            f"target modules {', '.join(missing)} are not linear layers of this base model; "
            f"its linear layers are named: {', '.join(sorted(linear_names))}"
        )


@contextlib.contextmanager
def gradient_checkpointing(model: Any, *, enabled: bool = True) -> Iterator[bool]:
    """Keep only each layer's input for the backward pass and recompute the rest.

    A step of the preset `epoch` (32 queries + 64 passages at 128 tokens) otherwise holds every
    layer's activations at once: ~4.6 GB, for 90 MB of weights. The recomputation
    replays the forward pass with the random state it had (torch's checkpoint keeps it), so the
    dropout masks, the loss and the adapter are the same to the last digit; it costs one more
    forward pass per step. Yields whether it is on: ``enabled`` and supported by the model
    (else the model trains as before).
    """
    network = model[0].auto_model
    base = network.get_base_model() if hasattr(network, "get_base_model") else network
    supported = enabled and bool(getattr(base, "supports_gradient_checkpointing", False))
    # transformers 5 renamed gradient checkpointing to activation checkpointing (the old name
    # warns and goes in 6).
    renamed = hasattr(base, "activation_checkpointing_enable")
    if supported:
        # Non-reentrant: gradients reach the LoRA weights although the frozen embeddings'
        # outputs (each checkpointed layer's input) need no gradient.
        kwargs = {"use_reentrant": False}
        if renamed:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield supported
    finally:
        if supported:
            if renamed:
                base.activation_checkpointing_disable()
            else:
                base.gradient_checkpointing_disable()


def trainable_parameters(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def embed(model: Any, texts: Sequence[str]) -> Any:
    """Sentence embeddings (torch tensor, with grad when grad is on) exactly as the runtime does."""
    features = model.tokenize(list(texts))
    device = next(model.parameters()).device
    # sentence-transformers 6 adds non-tensor entries (e.g. "modality"); they pass through as is.
    features = {k: v.to(device) if hasattr(v, "to") else v for k, v in features.items()}
    return model(features)["sentence_embedding"]


def embed_no_grad(model: Any, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Normalised float32 vectors for ranking (hard-negative mining, probes)."""
    import torch

    was_training = model.training
    model.eval()
    # Similar lengths share a batch, so little compute goes to padding.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    chunks: list[np.ndarray] = []
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = [texts[i] for i in order[start : start + batch_size]]
            vectors = torch.nn.functional.normalize(embed(model, batch).float(), dim=-1)
            chunks.append(vectors.cpu().numpy())
    model.train(was_training)
    if not chunks:
        return np.zeros((0, 0), dtype=np.float32)
    result = np.empty((len(texts), chunks[0].shape[1]), dtype=np.float32)
    result[order] = np.concatenate(chunks)
    return result


def save_adapter(model: Any, target: Path) -> Path:
    """Write only the LoRA weights and config (peft format), never a merged copy of the base."""
    model[0].auto_model.save_pretrained(str(target))
    # peft adds a generated model card; the artifact holds weights and config only.
    (target / "README.md").unlink(missing_ok=True)
    return target
