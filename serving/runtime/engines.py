"""How the runtime runs a model, as a runtime profile's runtime knobs ask (``LoadSettings``):
the fp32 engine (torch, or the same model's fp32 graph through ONNX Runtime), intra-op threads,
the padding bound of its passes, and how many of its batches run at once (``runtimes``).

The ONNX engine serves the very weights of the torch folder: the runtime exports the model's
whole sentence-transformers pipeline to one fp32 graph (``export_variant``, as the ``onnx``
variant is built) once per folder, into a cache beside the artifact cache, and serves it only
if its vectors agree with torch's within ``ENGINE_TOLERANCE`` (1 - cosine) on sample texts; a
folder whose export disagrees is refused (``LOAD_FAILED``), never served with other vectors.
A model with an adapter (LoRA, task head) runs on torch with one batch at a time whatever the
profile says: the graph holds the base only, and adapter passes share state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serving import protocol as p

log = logging.getLogger("taskfleet.runtime")

ENGINES = ("torch", "onnx")
#: Largest 1 - cosine between an ONNX engine's vectors and torch's on the check texts.
ENGINE_TOLERANCE = 1e-6
_CHECK_FILE = "taskfleet_engine_check.json"
_CHECK_TEXTS = (
    "Darf mein Vermieter die Kaution behalten?",
    "§ 535 BGB: Durch den Mietvertrag wird der Vermieter verpflichtet, dem Mieter den "
    "Gebrauch der Mietsache während der Mietzeit zu gewähren.",
    "kurz",
    "Wer haftet, wenn der Hund des Nachbarn mein Kind beißt? " * 20,
)


class EngineError(RuntimeError):
    """A profile's settings cannot be applied to this model (the load fails with it)."""


@dataclass(frozen=True)
class Applied:
    """What the runtime does with a model: the engine, its threads (None: the process's
    default), the padding bound (None: the runtime's) and how many batches run at once."""

    engine: str = "torch"
    threads: int | None = None
    max_padding: float | None = None
    runtimes: int = 1


def applied(settings: p.LoadSettings | None, *, has_adapter: bool) -> Applied:
    """The settings as this model can take them (see the module's note on adapters)."""
    if settings is None:
        return Applied()
    engine = settings.engine or "torch"
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    for name in ("intra_op_threads", "runtimes"):
        value = getattr(settings, name)
        if value is not None and value < 1:
            raise EngineError(f"{name} must be at least 1, not {value}")
    if settings.max_padding is not None and not 0.0 <= settings.max_padding <= 1.0:
        raise EngineError(f"max_padding must be within 0..1, not {settings.max_padding}")
    runtimes = settings.runtimes or 1
    if has_adapter and (engine != "torch" or runtimes > 1):
        log.warning(
            "a model with an adapter runs on torch, one batch at a time (profile asked for "
            "engine %s, %d at once)", engine, runtimes,
        )  # fmt: skip
        engine, runtimes = "torch", 1
    return Applied(engine, settings.intra_op_threads, settings.max_padding, runtimes)


def engine_cache() -> Path:
    """Where exported engines are kept: TASKFLEET_ENGINE_CACHE, else the user's cache."""
    root = os.environ.get("TASKFLEET_ENGINE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "taskfleet" / "engines"


def folder_key(base_path: Path) -> str:
    """A folder of the artifact cache is named by its sha256; any other folder by its path and
    its files' sizes and times (an edited folder is exported again)."""
    resolved = base_path.resolve()
    if resolved.parent.name == "sha256" and len(resolved.name) == 64:
        return resolved.name
    digest = hashlib.sha256(str(resolved).encode())
    for path in sorted(resolved.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(
                f"{path.relative_to(resolved)}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
            )
    return digest.hexdigest()


def onnx_engine(base_path: Path, threads: int | None, cache: Path | None = None) -> Any:
    """The fp32 ONNX Runtime engine of the torch folder ``base_path``: exported (and checked)
    on first use into ``cache``, loaded with ``threads`` intra-op threads."""
    from serving.runtime.onnx_variant import OnnxModel

    folder = (cache or engine_cache()) / "onnx-fp32" / folder_key(base_path)
    if not (folder / _CHECK_FILE).is_file():
        _export(base_path, folder)
    check = json.loads((folder / _CHECK_FILE).read_text())
    apart = float(check["one_minus_cos"])
    if apart > ENGINE_TOLERANCE:
        raise EngineError(
            f"the ONNX engine of {base_path} differs from torch (1 - cos {apart:.1e} > "
            f"{ENGINE_TOLERANCE:g}): it is not served"
        )
    return OnnxModel(folder, threads=threads)


_export_lock = threading.Lock()


def _export(base_path: Path, folder: Path) -> None:
    """Export into a staging folder, check against torch, then rename into place (workers
    sharing a cache see a whole folder or none)."""
    from sentence_transformers import SentenceTransformer

    from serving.runtime.onnx_variant import OnnxModel, export_variant

    with _export_lock:
        if (folder / _CHECK_FILE).is_file():
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=folder.parent))
        try:
            log.info("exporting %s to an fp32 ONNX engine", base_path)
            export_variant(base_path, staging, "onnx", source_sha256=folder.name)
            torch_model = SentenceTransformer(str(base_path), device="cpu", local_files_only=True)
            expected = np.asarray(torch_model.encode(list(_CHECK_TEXTS)))
            got = OnnxModel(staging).encode(list(_CHECK_TEXTS))
            cos = np.sum(expected * got, axis=1) / (
                np.linalg.norm(expected, axis=1) * np.linalg.norm(got, axis=1)
            )
            check = {
                "one_minus_cos": float(np.max(1.0 - cos)),
                "max_abs": float(np.max(np.abs(expected - got))),
                "texts": len(_CHECK_TEXTS),
            }
            (staging / _CHECK_FILE).write_text(json.dumps(check, indent=2) + "\n")
            try:
                staging.rename(folder)
            except OSError:
                if not (folder / _CHECK_FILE).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)


class LockedTokenizer:
    """A tokenizer that several batch threads of one model share: calls take turns (a fast
    tokenizer changes its truncation and padding state per call and refuses to be entered
    twice), attribute reads and writes pass through."""

    def __init__(self, tokenizer: Any) -> None:
        self._inner = tokenizer
        self._lock = threading.Lock()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance checks see the tokenizer: sentence-transformers 6 hands out its processor
        # as the tokenizer only if it is a PreTrainedTokenizerBase.
        return type(self._inner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._inner(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        # Writes reach the tokenizer (a key's max length is set on it before a pass).
        if name in ("_inner", "_lock"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        lock = self._lock

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return locked


def share_tokenizer(model: Any) -> None:
    """Let several threads tokenise with ``model`` (a SentenceTransformer or an ONNX engine);
    one thread at a time still may, at the cost of an uncontended lock."""
    owner = model[0] if hasattr(model, "_first_module") else model
    # sentence-transformers 6 tokenises through the module's processor (its ``tokenizer`` is a
    # read-only view of it); older ones and the ONNX engine hold a ``tokenizer``.
    name = "processor" if getattr(owner, "processor", None) is not None else "tokenizer"
    inner = getattr(owner, name)
    if type(inner) is not LockedTokenizer:  # isinstance would see the tokenizer's class
        setattr(owner, name, LockedTokenizer(inner))
