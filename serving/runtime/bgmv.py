"""Rows for different LoRA adapters of one base in one forward pass (the BGMV idea).

peft runs one adapter at a time: a batch that mixes adapters costs one forward pass per
adapter, so 32 adapters spread over 32 texts make 32 passes of one text. Here every LoRA'd
``Linear`` of the base computes its base output once for the whole pass (peft's adapters are
disabled) and a forward hook adds each row's own delta::

    y[b] = W x[b] + scaling[s_b] * B[s_b] (A[s_b] x[b])

where ``s_b`` is row ``b``'s adapter slot. The adapters' A and B matrices are stacked per layer
(padded with zeros to the largest rank; a slot for an adapter that does not touch a layer is
zero there) and gathered per row, then applied with two batched matrix products. Slot 0 is all
zeros: a row of the plain base gets no delta. Pure torch, so it runs on a CPU.

Only vanilla LoRA on ``Linear`` layers is stacked. An adapter with DoRA or another variant, a
LoRA bias, LoRA on embeddings or convolutions, ``modules_to_save``, or merged weights makes
:func:`mixed_lora` answer ``None``: the caller then runs one pass per adapter, as peft does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: Slot of a row that uses no adapter: its delta is zero.
BASE_SLOT = 0


@dataclass
class _Layer:
    module: Any
    #: (slots, rank, in_features), zero for slot 0 and for adapters not on this layer.
    a: Any
    #: (slots, out_features, rank)
    b: Any
    #: (slots,) peft's scaling per adapter (alpha / r, or its rsLoRA form), 0 for slot 0.
    scaling: Any


class MixedLora:
    """The stacked adapters of one peft-wrapped base network, ready for mixed passes."""

    def __init__(self, network: Any, slots: dict[str, int], layers: list[_Layer]) -> None:
        self.network = network
        #: adapter name -> slot (1..n)
        self.slots = slots
        self._layers = layers
        self._rows: Any = None  # (batch,) slot per row of the pass being run, or None
        self._single: int | None = None  # the one slot of a pass that uses one adapter

    @property
    def stacked_bytes(self) -> int:
        """Memory the stacked copies take (the adapters' weights, padded to the largest rank)."""
        return sum(
            t.numel() * t.element_size() for layer in self._layers for t in (layer.a, layer.b)
        )

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """peft's adapters off, the per-row hooks on; :meth:`rows` picks the slots per pass."""
        handles = [layer.module.register_forward_hook(self._hook(layer)) for layer in self._layers]
        try:
            with self.network.disable_adapter():
                yield
        finally:
            for handle in handles:
                handle.remove()
            self._rows = None
            self._single = None

    @contextlib.contextmanager
    def rows(self, slots: Sequence[int]) -> Iterator[None]:
        """The slot of each row of the next forward pass, in the pass's row order."""
        import torch

        distinct = set(slots)
        if len(distinct) == 1:
            self._single, self._rows = next(iter(distinct)), None
        else:
            device = self._layers[0].a.device
            self._single, self._rows = None, torch.as_tensor(slots, dtype=torch.long, device=device)
        try:
            yield
        finally:
            self._rows = None
            self._single = None

    def _hook(self, layer: _Layer) -> Any:
        import torch

        def add_delta(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            x = args[0]
            single = self._single
            if single is not None:
                if single == BASE_SLOT:
                    return output
                # One adapter for the whole pass: plain matrix products, as peft computes them.
                h = x.to(layer.a.dtype) @ layer.a[single].T
                delta = (h @ layer.b[single].T) * layer.scaling[single]
                return output + delta.to(output.dtype)
            rows = self._rows
            if rows is None or x.shape[0] != rows.shape[0]:
                raise RuntimeError(
                    f"mixed-adapter pass: a LoRA layer saw {x.shape[0]} rows, the pass has "
                    f"{None if rows is None else rows.shape[0]}"
                )
            a = layer.a.index_select(0, rows)  # (batch, rank, in)
            b = layer.b.index_select(0, rows)  # (batch, out, rank)
            flat = x.to(a.dtype).reshape(x.shape[0], -1, x.shape[-1])  # (batch, tokens, in)
            h = torch.bmm(flat, a.transpose(1, 2))
            delta = torch.bmm(h, b.transpose(1, 2)) * layer.scaling.index_select(0, rows).view(
                -1, 1, 1
            )
            return output + delta.reshape(output.shape).to(output.dtype)

        return add_delta


def mixed_lora(network: Any, adapter_names: Sequence[str]) -> MixedLora | None:
    """Stack ``adapter_names`` (slots 1..n in that order) of a peft-wrapped network, or
    ``None`` when the network is not wrapped or one of them cannot be stacked."""
    import torch
    from peft import PeftModel
    from peft.tuners.lora.layer import Linear as LoraLinear
    from peft.tuners.lora.layer import LoraLayer

    if not isinstance(network, PeftModel) or not adapter_names:
        return None
    for name in adapter_names:
        config = network.peft_config.get(name)
        if (
            config is None
            or getattr(config, "peft_type", None) != "LORA"
            or getattr(config, "modules_to_save", None)
        ):
            return None
    wanted = set(adapter_names)
    slots = {name: i + 1 for i, name in enumerate(adapter_names)}
    layers: list[_Layer] = []
    for module in network.modules():
        if not isinstance(module, LoraLayer):
            continue
        present = wanted & set(module.lora_A.keys())
        if not present:
            continue
        if not isinstance(module, LoraLinear) or module.merged:
            return None
        if any(name in module.lora_variant or module.lora_bias.get(name) for name in present):
            return None
        weight = module.lora_A[next(iter(present))].weight
        rank = max(module.r[name] for name in present)
        count = len(adapter_names) + 1
        a = torch.zeros(count, rank, module.in_features, dtype=weight.dtype, device=weight.device)
        b = torch.zeros(count, module.out_features, rank, dtype=weight.dtype, device=weight.device)
        scaling = torch.zeros(count, dtype=weight.dtype, device=weight.device)
        with torch.no_grad():
            for name in present:
                slot, r = slots[name], module.r[name]
                a[slot, :r] = module.lora_A[name].weight
                b[slot, :, :r] = module.lora_B[name].weight
                scaling[slot] = module.scaling[name]
        layers.append(_Layer(module, a, b, scaling))
    if not layers:
        return None
    return MixedLora(network, slots, layers)
