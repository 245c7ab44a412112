"""LoRA fine-tuning of sentence-transformers embedding models (peft on torch).

The trainer builds its model with the shared model library (`serving.runtime`), so the
adapter it writes is evaluated and served through exactly the code it was trained with.
"""

from finetune.config import LoraHyperparameters, preset
from finetune.errors import FinetuneError

__all__ = ["FinetuneError", "LoraHyperparameters", "preset"]
