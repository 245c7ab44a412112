"""Runtime kinds a placement can name, and what each can do.

A base model record lists the runtimes that may serve it (``runtime_kinds``); a placement picks
one; only workers of that kind run the task. The registry never talks to workers, so what each
kind can do is stated here, mirroring the capabilities the sidecar's backends report in
``hello`` (sidecar/src/runtime/*.rs): a pairing a runtime cannot serve is refused when it is
evaluated or promoted, not when a request arrives.
"""

from __future__ import annotations

from registry.errors import InvalidInput

DEFAULT_RUNTIME = "torch"
# kind -> capabilities (protocol names). Only the torch runtime scores (query, passage) pairs
# and classifies: candle and http embed only (their backends answer score/classify with
# UNKNOWN_OP).
RUNTIME_CAPABILITIES: dict[str, frozenset[str]] = {
    "torch": frozenset({"embed", "lora", "score", "classify"}),
    "candle": frozenset({"embed", "lora"}),
    "http": frozenset({"embed"}),
}
RUNTIME_KINDS: tuple[str, ...] = tuple(RUNTIME_CAPABILITIES)
# Optimised variants of an embedding base model (registry/variants.py): one ONNX graph run by
# ONNX Runtime inside the Python runtime (kind torch). A variant embeds only: no LoRA adapter,
# no score/classify head.
MODEL_VARIANTS: dict[str, str] = {
    "onnx": "ONNX Runtime, fp32 (the source's weights, exported)",
    "onnx-int8": "ONNX Runtime, int8 weights (dynamic quantisation, per channel)",
}
VARIANT_RUNTIMES: tuple[str, ...] = (DEFAULT_RUNTIME,)
VARIANT_CAPABILITIES: frozenset[str] = frozenset({"embed"})
# The op each task kind needs of a runtime (a rerank task is served by `score` even when its
# candidate is a bi-encoder: the runtime computes the cosine).
TASK_KIND_NEEDS: dict[str, str] = {
    "retrieval": "embed",
    "rerank": "score",
    "classification": "classify",
}


def check_runtime_kinds(kinds: list[str]) -> list[str]:
    unknown = [k for k in kinds if k not in RUNTIME_CAPABILITIES]
    if unknown or not kinds:
        raise InvalidInput(
            f"runtimes must be one or more of {', '.join(RUNTIME_KINDS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    return list(dict.fromkeys(kinds))


def check_servable(
    runtime: str,
    *,
    model: str,
    model_runtimes: list[str],
    adapter: str | None,
    task_kind: str,
    variant: str | None = None,
) -> None:
    """Refuse a (model, adapter, runtime) pairing the runtime cannot serve, saying why."""
    if runtime not in RUNTIME_CAPABILITIES:
        raise InvalidInput(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIME_KINDS)}")
    if runtime not in model_runtimes:
        raise InvalidInput(
            f"model {model!r} is not marked as servable by the {runtime} runtime (it lists "
            f"{', '.join(model_runtimes)}); `taskfleet model runtimes {model} ...` changes that"
        )
    can = RUNTIME_CAPABILITIES[runtime]
    if variant is not None:
        if adapter is not None:
            raise InvalidInput(
                f"model {model!r} is an {variant} variant: it cannot apply LoRA adapters, so it "
                f"cannot serve {adapter!r}"
            )
        need = TASK_KIND_NEEDS.get(task_kind, task_kind)
        if need not in VARIANT_CAPABILITIES:
            raise InvalidInput(
                f"model {model!r} is an {variant} variant: it embeds only, so it cannot serve "
                f"{task_kind} tasks (no {need!r})"
            )
    if adapter is not None and "lora" not in can:
        raise InvalidInput(
            f"the {runtime} runtime cannot apply LoRA adapters, so it cannot serve {adapter!r}"
        )
    need = TASK_KIND_NEEDS.get(task_kind, task_kind)
    if need not in can:
        raise InvalidInput(f"the {runtime} runtime cannot serve {task_kind} tasks (no {need!r})")
