"""The model library: the one place that loads a base model (+ LoRA adapter) and encodes.

The eval harness, the trainer and the serving runtime all call this same code in-process,
so what is evaluated is exactly what is served.
"""

from serving.runtime.batch_planning import Batch
from serving.runtime.encoder import Encoder, EncodeStats
from serving.runtime.model_folder import ModelSpec

__all__ = ["Batch", "EncodeStats", "Encoder", "ModelSpec"]
