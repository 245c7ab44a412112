"""The shell's variant builder: the registry derives a variant through it (``VariantBuilder``
in registry/variants.py) and so imports no serving code; the CLI, the control plane's REST route
and the benchmarks pass it in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from registry.errors import InvalidInput


def build_variant(
    source: Path, target: Path, variant: str, source_sha256: str
) -> Mapping[str, Any]:
    """serving/runtime/onnx_variant.py's export; a variant it refuses is the registry's
    InvalidInput (one line in the CLI, 400 on REST)."""
    from serving.runtime.onnx_variant import VariantError, export_variant

    try:
        return export_variant(source, target, variant, source_sha256=source_sha256)
    except VariantError as exc:
        raise InvalidInput(str(exc)) from None
