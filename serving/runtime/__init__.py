"""The model library: the one place that loads a base model (+ LoRA adapter) and encodes.

The eval harness, the trainer and the serving runtime all call this same code in-process,
so what is evaluated is exactly what is served.
"""

from serving.runtime.encoder import Batch, Encoder, EncodeStats, ModelSpec

__all__ = ["Batch", "EncodeStats", "Encoder", "ModelSpec"]
