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
# kind -> capabilities (protocol names). Only the torch runtime classifies; candle embeds only
# (its backend answers score/classify with UNKNOWN_OP); http embeds and scores (a bi-encoder's
# cosines, or an endpoint's own rerank API).
RUNTIME_CAPABILITIES: dict[str, frozenset[str]] = {
    "torch": frozenset({"embed", "lora", "score", "classify"}),
    "candle": frozenset({"embed", "lora"}),
    "http": frozenset({"embed", "score"}),
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
# Fitted lexical baselines (registry/fitted_baselines.py, serving/runtime/baseline_artifact.py):
# an artifact the Python runtime runs without torch, for one task kind each. BM25 for retrieval
# makes no embedding, so it is never one of them.
BASELINE_FORMATS: dict[str, str] = {"tfidf-lr": "classification", "bm25": "rerank"}
BASELINE_RUNTIMES: tuple[str, ...] = (DEFAULT_RUNTIME,)
# Endpoint models (registry/endpoint_models.py): served by the http runtime only; an embedding
# API serves retrieval and (as a bi-encoder) rerank tasks, a rerank API rerank tasks.
ENDPOINT = "endpoint"
ENDPOINT_RUNTIMES: tuple[str, ...] = ("http",)
ENDPOINT_TASK_KINDS: dict[str, tuple[str, ...]] = {
    "embedding": ("retrieval", "rerank"),
    "rerank": ("rerank",),
}
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
    model_format: str | None = None,
    endpoint_kind: str | None = None,
) -> None:
    """Refuse a (model, adapter, runtime) pairing the runtime cannot serve, saying why."""
    if runtime not in RUNTIME_CAPABILITIES:
        raise InvalidInput(f"unknown runtime {runtime!r}; known: {', '.join(RUNTIME_KINDS)}")
    if model_format is not None:
        _check_format(runtime, model, model_format, endpoint_kind, adapter, task_kind)
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


def _check_format(
    runtime: str,
    model: str,
    model_format: str,
    endpoint_kind: str | None,
    adapter: str | None,
    task_kind: str,
) -> None:
    """A fitted baseline or an endpoint model: the one runtime and task kinds it serves."""
    if model_format == ENDPOINT:
        what = f"model {model!r} is an endpoint model ({endpoint_kind} API)"
        if adapter is not None:
            raise InvalidInput(
                f"{what}: it cannot apply LoRA adapters, so it cannot serve {adapter!r}"
            )
        if runtime not in ENDPOINT_RUNTIMES:
            raise InvalidInput(f"{what}: only the http runtime reaches it, not {runtime}")
        serves = ENDPOINT_TASK_KINDS.get(endpoint_kind or "", ())
        if task_kind not in serves:
            raise InvalidInput(f"{what}: it serves {' and '.join(serves)} tasks, not {task_kind}")
        return
    serves_kind = BASELINE_FORMATS.get(model_format)
    if serves_kind is None:
        raise InvalidInput(f"model {model!r} has an unknown format {model_format!r}")
    what = f"model {model!r} is a fitted {model_format} baseline"
    if adapter is not None:
        raise InvalidInput(f"{what}: it takes no adapter ({adapter!r})")
    if runtime not in BASELINE_RUNTIMES:
        raise InvalidInput(
            f"{what}: only the Python runtime ({DEFAULT_RUNTIME}) runs it, not {runtime}"
        )
    if task_kind != serves_kind:
        raise InvalidInput(f"{what}: it serves {serves_kind} tasks, not {task_kind}")
