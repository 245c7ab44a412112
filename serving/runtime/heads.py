"""Task heads: a small linear layer on a model's sentence embedding, stored with its adapter.

An adapter artifact is a folder with a peft LoRA (``adapter_config.json`` + weights), a task
head (``head.json`` + ``head.safetensors``), or both:

- ``score`` head: one logit per (query, passage) pair encoded together — a cross-encoder;
- ``classify`` head: one logit per label for a text, softmax gives label probabilities. A head
  trained by logistic regression on frozen embeddings (mteb's classification protocol) is such a
  head without a LoRA; a fine-tuned classifier is a LoRA plus a head trained with it.

``head.json``: ``{"kind": "score"|"classify", "labels": [str] (classify), "dims": int,
"max_seq_length": int or null, "window_stride": int or null, "max_windows": int, "format": 1}``;
``head.safetensors``: ``weight`` (outputs x dims) and ``bias`` (outputs). ``max_seq_length`` is
the token limit the head was trained with; a model spec that names none reads inputs with it
(``with_head_limit``), in evaluation and serving alike. A classify head with a
``window_stride`` reads a longer text as windows and averages their logits
(serving/runtime/windows.py); without one the text is cut. The registry reads only ``kind``
(registry/fingerprint.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

HeadKind = Literal["score", "classify"]
HEAD_KINDS: tuple[HeadKind, ...] = ("score", "classify")
MANIFEST = "head.json"
WEIGHTS = "head.safetensors"
FORMAT = 1


class HeadError(ValueError):
    """A head folder is missing, malformed, or does not fit the model it is put on."""


@dataclass(frozen=True)
class HeadSpec:
    kind: HeadKind
    dims: int
    labels: tuple[str, ...] = ()
    max_seq_length: int | None = None
    # Classify: read a text longer than max_seq_length as windows starting every this many
    # word pieces (at most max_windows) and average the logits; None cuts the text.
    window_stride: int | None = None
    max_windows: int = 1

    @property
    def outputs(self) -> int:
        return 1 if self.kind == "score" else len(self.labels)


def has_head(folder: Path | None) -> bool:
    return folder is not None and (folder / MANIFEST).is_file()


def read_spec(folder: Path) -> HeadSpec:
    path = folder / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HeadError(f"cannot read {path}: {exc}") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in HEAD_KINDS:
        raise HeadError(f"{path}: 'kind' must be one of {', '.join(HEAD_KINDS)}")
    labels = tuple(data.get("labels") or ())
    if kind == "classify" and (len(labels) < 2 or not all(isinstance(x, str) for x in labels)):
        raise HeadError(f"{path}: a classify head needs at least two string 'labels'")
    dims = data.get("dims")
    if not isinstance(dims, int) or dims < 1:
        raise HeadError(f"{path}: 'dims' must be a positive integer")
    limit = data.get("max_seq_length")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise HeadError(f"{path}: 'max_seq_length' must be a positive integer or null")
    stride = data.get("window_stride")
    max_windows = data.get("max_windows", 1)
    if stride is not None and (
        kind != "classify"
        or limit is None
        or not isinstance(stride, int)
        or not isinstance(max_windows, int)
        or stride < 1
        or max_windows < 1
    ):
        raise HeadError(
            f"{path}: 'window_stride' needs a classify head with a 'max_seq_length', and it and "
            "'max_windows' must be positive integers"
        )
    return HeadSpec(
        kind=kind,
        dims=dims,
        labels=labels,
        max_seq_length=limit,
        window_stride=stride,
        max_windows=max_windows if stride is not None else 1,
    )


def new_head(spec: HeadSpec, *, seed: int = 0) -> Any:
    """A freshly initialised head (torch Linear), deterministic given the seed."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(spec.dims, spec.outputs)
    with torch.no_grad():
        bound = 1.0 / spec.dims**0.5
        layer.weight.uniform_(-bound, bound, generator=generator)
        layer.bias.zero_()
    return layer


def load_head(folder: Path) -> tuple[HeadSpec, Any]:
    """(spec, torch Linear in eval mode) from an adapter folder."""
    import torch
    from safetensors.torch import load_file

    spec = read_spec(folder)
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError, RuntimeError) as exc:
        raise HeadError(f"cannot read {folder / WEIGHTS}: {exc}") from None
    weight, bias = tensors.get("weight"), tensors.get("bias")
    if weight is None or bias is None or tuple(weight.shape) != (spec.outputs, spec.dims):
        raise HeadError(
            f"{folder / WEIGHTS}: expected weight {spec.outputs}x{spec.dims} and bias "
            f"{spec.outputs}"
        )
    layer = new_head(spec)
    with torch.no_grad():
        layer.weight.copy_(weight.float())
        layer.bias.copy_(bias.float())
    layer.eval()
    return spec, layer


def save_head(folder: Path, spec: HeadSpec, layer: Any) -> None:
    """Write head.json and head.safetensors into ``folder`` (created if missing)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, "kind": spec.kind, "dims": spec.dims}
    if spec.kind == "classify":
        manifest["labels"] = list(spec.labels)
    manifest["max_seq_length"] = spec.max_seq_length
    if spec.window_stride is not None:
        manifest["window_stride"] = spec.window_stride
        manifest["max_windows"] = spec.max_windows
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    tensors = {
        "weight": layer.weight.detach().float().cpu().contiguous(),
        "bias": layer.bias.detach().float().cpu().contiguous(),
    }
    save_file(tensors, str(folder / WEIGHTS))


def save_linear_head(folder: Path, spec: HeadSpec, weight: np.ndarray, bias: np.ndarray) -> None:
    """Write a head from numpy weights (e.g. a scikit-learn logistic regression)."""
    import torch

    layer = new_head(spec)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.asarray(weight, dtype=np.float32)))
        layer.bias.copy_(torch.from_numpy(np.asarray(bias, dtype=np.float32)))
    save_head(folder, spec, layer)


def with_head_limit(spec: Any) -> Any:
    """A ModelSpec that reads inputs with its head's training limit when it names none."""
    from dataclasses import replace

    if spec.max_seq_length is not None or not has_head(spec.adapter_path):
        return spec
    limit = read_spec(spec.adapter_path).max_seq_length
    return replace(spec, max_seq_length=limit) if limit is not None else spec


def check_fits(spec: HeadSpec, dims: int, where: Path) -> None:
    if spec.dims != dims:
        raise HeadError(
            f"the head in {where} expects {spec.dims}-dimensional embeddings, but the model "
            f"produces {dims}"
        )
