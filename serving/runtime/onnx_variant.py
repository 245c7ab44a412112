"""Optimised variants of an embedding base model: ONNX export and int8 dynamic quantisation.

A variant folder holds the whole sentence-transformers pipeline (transformer, pooling,
normalisation) as one ONNX graph ``model.onnx`` that maps token ids to the sentence embedding,
the source's tokenizer and config files, and ``taskfleet_variant.json`` (which variant, the
source's sha256, the sequence limit, the export versions). The registry stores it
content-addressed like any base model, with lineage to its source (``registry/variants.py``);
the runtime and the eval harness load it with ONNX Runtime through ``OnnxModel``, which offers
the part of the SentenceTransformer interface that ``Encoder`` uses, so batching, padding-aware
planning and the socket protocol are the same as for torch; inside a pass, ``onnx-int8`` runs
each text alone (``OnnxModel.one_text_per_call``). A variant embeds only: it carries no LoRA
adapter and no score/classify head.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serving.runtime.model_folder import VARIANT_MANIFEST, embedding_dimension

#: The variants this module builds; the registry's vocabulary (registry.runtimes.MODEL_VARIANTS)
#: names the same ones (a test checks), since the runtime imports nothing of the registry.
VARIANTS = ("onnx", "onnx-int8")
ONNX_FILE = "model.onnx"
#: Files of the source folder a variant keeps: tokenizer and configs, never torch weights.
_KEPT_FILES = (
    "config.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
)
_OPSET = 17
#: An fp32 export whose vectors differ from torch's by more than this is refused.
FP32_TOLERANCE = 1e-4


class VariantError(RuntimeError):
    """A variant could not be built or loaded."""


def read_variant(folder: Path) -> dict[str, Any] | None:
    """The variant manifest of a model folder, or None for a plain (torch) model folder."""
    path = folder / VARIANT_MANIFEST
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise VariantError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return variant


# ---------------------------------------------------------------------------- export


def export_variant(
    source: Path, target: Path, variant: str, *, source_sha256: str
) -> dict[str, Any]:
    """Write the ``variant`` of the sentence-transformers folder ``source`` into ``target``
    (an empty or missing folder), checking its vectors against torch's on sample texts;
    returns the manifest written beside the graph."""
    from sentence_transformers import SentenceTransformer

    check_variant(variant)
    # Eager attention exports to plain MatMul/Softmax nodes that ONNX Runtime fuses.
    st = SentenceTransformer(
        str(source),
        device="cpu",
        local_files_only=True,
        model_kwargs={"attn_implementation": "eager"},
    )
    st.eval()
    dims = embedding_dimension(st)
    if dims is None:
        raise VariantError(f"{source} is not an embedding model (no sentence embedding size)")
    samples = [
        "Wer haftet für Schäden durch den Hund des Nachbarn?",
        "§ 833 BGB: Wird durch ein Tier ein Mensch getötet oder verletzt ...",
        "kurz",
    ]
    features = {k: v for k, v in dict(st.preprocess(samples)).items() if hasattr(v, "shape")}
    names = list(features)
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="taskfleet-onnx-") as tmp:
        fp32 = Path(tmp) / ONNX_FILE
        pipeline = _Pipeline(st, names)
        dynamic = {name: {0: "batch", 1: "tokens"} for name in names}
        # The tracer warns about Python branches on shapes (constant for an encoder: the mask
        # covers every token) and the exporter about its own deprecations; the check below
        # compares the graph's vectors with torch's.
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                pipeline,
                tuple(features[n] for n in names),
                str(fp32),
                input_names=names,
                output_names=["sentence_embedding"],
                dynamic_axes={**dynamic, "sentence_embedding": {0: "batch"}},
                opset_version=_OPSET,
                dynamo=False,
            )
        if variant == "onnx-int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # Per-channel scales: per-tensor int8 weights bent MiniLM's vectors to a mean cosine
            # of 0.87 with the fp32 ones on GerLayQA passages; per channel, 0.988.
            # It logs a hint about shape-inference pre-processing on the root logger, for every
            # model; the variant is judged by its eval instead.
            root = logging.getLogger()
            level = root.level
            root.setLevel(logging.ERROR)
            try:
                quantize_dynamic(
                    str(fp32),
                    str(target / ONNX_FILE),
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                )
            finally:
                root.setLevel(level)
        else:
            shutil.copyfile(fp32, target / ONNX_FILE)
    for name in _KEPT_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)
    import onnxruntime

    manifest = {
        "variant": variant,
        "source_sha256": source_sha256,
        "inputs": names,
        "dims": dims,
        "max_seq_length": st.max_seq_length,
        "normalized": any(type(m).__name__ == "Normalize" for m in st),
        "opset": _OPSET,
        "torch": torch.__version__.split("+")[0],
        "onnxruntime": onnxruntime.__version__,
    }
    (target / VARIANT_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    with torch.inference_mode():
        expected = st.encode(samples, convert_to_numpy=True, batch_size=len(samples))
    got = OnnxModel(target).encode(samples)
    diff = float(np.abs(got - expected).max())
    if variant == "onnx" and diff > FP32_TOLERANCE:
        raise VariantError(
            f"the ONNX export of {source} differs from torch by {diff:.2e} "
            f"(more than {FP32_TOLERANCE:g}); refusing it"
        )
    return manifest


class _Pipeline(torch.nn.Module):
    """Token ids -> sentence embedding, through every module of the source pipeline."""

    def __init__(self, st: Any, names: list[str]) -> None:
        super().__init__()
        self.st = st
        self.names = names

    def forward(self, *inputs: Any) -> Any:
        return self.st(dict(zip(self.names, inputs, strict=True)))["sentence_embedding"]


# ---------------------------------------------------------------------------- runtime


def _session_threads() -> int:
    """ONNX Runtime's intra-op threads: the runtime's OMP_NUM_THREADS if set, else its default
    (one per core)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else 0


class OnnxModel:
    """A variant folder run by ONNX Runtime, shaped like the SentenceTransformer calls that
    ``Encoder`` makes: ``tokenizer``, ``max_seq_length``, ``preprocess``, a call on the
    features returning ``sentence_embedding``, the embedding size."""

    def __init__(self, folder: Path, *, threads: int | None = None) -> None:
        """``threads``: intra-op threads (default: the runtime's OMP_NUM_THREADS, else one per
        core)."""
        import onnxruntime as ort
        from transformers import AutoTokenizer

        manifest = read_variant(folder)
        if manifest is None or not (folder / ONNX_FILE).is_file():
            raise VariantError(f"{folder} is not a taskfleet ONNX variant folder")
        self.folder = folder
        self.variant = str(manifest["variant"])
        self.inputs = list(manifest["inputs"])
        self.dims = int(manifest["dims"])
        self.default_max_seq_length = int(manifest["max_seq_length"])
        self.max_seq_length = self.default_max_seq_length
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads or _session_threads()
        options.inter_op_num_threads = 1
        if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
            # Like libgomp's passive wait (serving/runtime/server.py cpu_thread_defaults): the
            # runtime shares its cores with the sidecar and gateway, so idle threads sleep.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"]
        )
        self.memory_bytes = (folder / ONNX_FILE).stat().st_size

    def get_embedding_dimension(self) -> int:
        return self.dims

    def preprocess(self, texts: Sequence[str]) -> dict[str, Any]:
        """Tokenise like sentence-transformers' Transformer module (pad to the longest, cut
        at ``max_seq_length``), as torch tensors so ``Encoder`` can slice its passes."""
        encoded = self.tokenizer(
            list(texts),
            padding=True,
            truncation="longest_first",
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        return {k: v for k, v in encoded.items() if k in self.inputs}

    def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
        feeds = {name: _int64(features[name]) for name in self.inputs}
        if self.one_text_per_call:
            vectors = np.concatenate([self._run(row) for row in _unpadded_rows(feeds)])
        else:
            vectors = self._run(feeds)
        return {"sentence_embedding": torch.from_numpy(vectors)}

    @property
    def one_text_per_call(self) -> bool:
        """Whether each text runs alone and unpadded. Dynamic quantisation (``onnx-int8``)
        scales the activations per call, over the whole tensor, padding included: in a batch a
        text's vector would depend on the texts beside it (cos down to 0.987 for MiniLM), and a
        fleet reply would differ from the same text in-process. Alone, a vector is a function of
        the text, in the eval harness and the runtime alike; fp32 needs no such rule."""
        return self.variant == "onnx-int8"

    def _run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        (vectors,) = self.session.run(["sentence_embedding"], feeds)
        return np.asarray(vectors, dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """All texts in one pass, as ``Encoder`` would send them (export checks and tests)."""
        return self(self.preprocess(texts))["sentence_embedding"].numpy()

    def eval(self) -> OnnxModel:
        return self


def _unpadded_rows(feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """One feed per row, holding only the row's real tokens (where its attention mask is 1,
    so either padding side works); without a mask, the whole row."""
    mask = feeds.get("attention_mask")
    rows = []
    for i in range(next(iter(feeds.values())).shape[0]):
        keep = np.flatnonzero(mask[i]) if mask is not None else slice(None)
        rows.append({name: value[i : i + 1, keep] for name, value in feeds.items()})
    return rows


def _int64(value: Any) -> np.ndarray:
    array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    return array.astype(np.int64, copy=False)
