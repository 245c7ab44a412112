"""Rows for different LoRA adapters of one base run in one forward pass (serving.runtime.bgmv).

The reference is the one-adapter-at-a-time path: sentence-transformers with that adapter alone
(peft's own forward), and the pool with mixing turned off. Mixed passes must match both within
1e-5 and must take fewer forward passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.runtime.model_folder import ModelSpec
from serving.runtime.pool import EncodeItem, ModelPool
from testbed.tiny_model import build_tiny_adapter, build_tiny_model

TEXTS = [
    "Wer haftet für den Schaden?",
    "der vermieter kündigt den mietvertrag",
    "frist",
    "Was regelt § 823 BGB über Schadensersatz und Haftung bei Verschulden des Käufers?",
    "the tenant asks the court",
    "eine frage zur ehe und scheidung und unterhalt nach dem gesetz",
]
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Models:
    base: Path
    adapters: dict[str, Path]  # name -> adapter folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("mixed")
    base = build_tiny_model(root / "base", seed=7)
    adapters = {
        # Different ranks and different layers: the stack pads ranks and zeroes missing layers.
        "qv4": build_tiny_adapter(base, root / "qv4", seed=1, rank=4),
        "all8": build_tiny_adapter(
            base, root / "all8", seed=2, rank=8, alpha=4, target_modules=("query", "key", "dense")
        ),
        "key2": build_tiny_adapter(base, root / "key2", seed=3, rank=2, target_modules=("key",)),
        "rs": build_tiny_adapter(base, root / "rs", seed=4, rank=4, use_rslora=True),
    }
    return Models(base, adapters)


def reference(models: Models, adapter: str | None, texts: list[str], prefix: str = "") -> Any:
    """One adapter at a time, through sentence-transformers' own peft support."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(models.base), device="cpu", local_files_only=True)
    if adapter is not None:
        model.load_adapter(str(models.adapters[adapter]))
    return np.asarray(model.encode([prefix + t for t in texts], convert_to_numpy=True))


def load_pool(
    models: Models, *, mixed: bool, names: list[str], max_padding: float | None = None
) -> ModelPool:
    pool = ModelPool(
        device="cpu",
        max_batch_tokens=None,
        max_batch_size=None,
        max_padding=max_padding,
        mixed_adapters=mixed,
    )
    pool.load("plain", ModelSpec(base_path=models.base))
    pool.load("plain-prefixed", ModelSpec(base_path=models.base, query_prefix="query: "))
    for name in names:
        pool.load(name, ModelSpec(base_path=models.base, adapter_path=models.adapters[name]))
    return pool


class PassCounter:
    """Counts forward passes of a pool's base model (a hook on the sentence-transformer)."""

    def __init__(self, pool: ModelPool) -> None:
        (base,) = pool._bases.values()
        self.passes = 0
        self._handle = base.model.register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self.passes += 1

    def close(self) -> None:
        self._handle.remove()


@pytest.fixture
def counted() -> Iterator[list[PassCounter]]:
    counters: list[PassCounter] = []
    yield counters
    for c in counters:
        c.close()


def mixed_items(names: list[str]) -> list[EncodeItem]:
    """Each key gets texts spread round-robin, the plain keys too, queries and passages."""
    keys = ["plain", "plain-prefixed", *names]
    items = []
    for i, text in enumerate(TEXTS * 2):
        kind = "query" if i % 3 else "passage"
        items.append(EncodeItem(keys[i % len(keys)], kind, [text]))
    return items


def test_mixed_rows_equal_one_adapter_at_a_time(models: Models, counted: list[Any]) -> None:
    names = sorted(models.adapters)
    items = mixed_items(names)
    # No padding bound: the planner would otherwise cut these ragged texts into several passes.
    mixed_pool = load_pool(models, mixed=True, names=names, max_padding=1.0)
    grouped_pool = load_pool(models, mixed=False, names=names, max_padding=1.0)
    counters = [PassCounter(mixed_pool), PassCounter(grouped_pool)]
    counted.extend(counters)

    mixed = mixed_pool.encode(items)
    grouped = grouped_pool.encode(items)

    for item, got, other in zip(items, mixed, grouped, strict=True):
        adapter = item.model_key if item.model_key in models.adapters else None
        prefix = "query: " if item.model_key == "plain-prefixed" and item.kind == "query" else ""
        want = reference(models, adapter, list(item.texts), prefix)
        assert np.abs(got - want).max() < TOLERANCE, item
        assert np.abs(got - other).max() < TOLERANCE, item
    # All 12 rows in one pass; one adapter at a time needs a pass per (key, kind) group.
    assert counters[0].passes == 1
    assert counters[1].passes >= len(names) + 2
    # The adapters really differ from each other and from the base.
    by_key = {item.model_key: vec for item, vec in zip(items, mixed, strict=True)}
    assert len({round(float(v[0, 0]), 6) for v in by_key.values()}) >= 5


def test_a_pass_of_one_adapter_and_of_the_base_alone(models: Models) -> None:
    pool = load_pool(models, mixed=True, names=["qv4", "all8"])
    for key, adapter in (("all8", "all8"), ("plain", None)):
        (got,) = pool.encode([EncodeItem(key, "passage", TEXTS)])
        want = reference(models, adapter, TEXTS)
        assert np.abs(got - want).max() < TOLERANCE, key


def test_unload_and_load_rebuild_the_stack(models: Models) -> None:
    pool = load_pool(models, mixed=True, names=["qv4", "all8", "key2"])
    pool.encode([EncodeItem("qv4", "query", TEXTS[:2]), EncodeItem("key2", "query", TEXTS[:2])])
    pool.unload("qv4")
    pool.load("rs", ModelSpec(base_path=models.base, adapter_path=models.adapters["rs"]))
    got = pool.encode([EncodeItem(k, "passage", TEXTS) for k in ("key2", "rs", "all8", "plain")])
    for key, vectors in zip(("key2", "rs", "all8", None), got, strict=True):
        assert np.abs(vectors - reference(models, key, TEXTS)).max() < TOLERANCE, key


def test_keys_with_different_sequence_lengths_truncate_apart(models: Models) -> None:
    pool = load_pool(models, mixed=True, names=["qv4"])
    spec = ModelSpec(base_path=models.base, adapter_path=models.adapters["all8"], max_seq_length=6)
    pool.load("short", spec)
    long_text = TEXTS[3]
    short, full = pool.encode(
        [EncodeItem("short", "passage", [long_text]), EncodeItem("qv4", "passage", [long_text])]
    )
    assert np.abs(full - reference(models, "qv4", [long_text])).max() < TOLERANCE
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(models.base), device="cpu", local_files_only=True)
    model.load_adapter(str(models.adapters["all8"]))
    model.max_seq_length = 6
    assert np.abs(short - model.encode([long_text])).max() < TOLERANCE


def test_an_adapter_that_cannot_be_stacked_runs_one_adapter_at_a_time(
    models: Models, tmp_path: Path, counted: list[Any]
) -> None:
    dora = build_tiny_adapter(models.base, tmp_path / "dora", seed=5, use_dora=True)
    pool = load_pool(models, mixed=True, names=["qv4"])
    pool.load("dora", ModelSpec(base_path=models.base, adapter_path=dora))
    counter = PassCounter(pool)
    counted.append(counter)
    got_dora, got_qv4 = pool.encode(
        [EncodeItem("dora", "passage", TEXTS), EncodeItem("qv4", "passage", TEXTS)]
    )
    # transformers' own adapter loading misreads DoRA's magnitudes: peft alone is the reference.
    alone = ModelPool(device="cpu", max_batch_tokens=None, max_batch_size=None)
    alone.load("dora", ModelSpec(base_path=models.base, adapter_path=dora))
    (want_dora,) = alone.encode([EncodeItem("dora", "passage", TEXTS)])
    assert np.abs(got_dora - want_dora).max() < TOLERANCE
    assert np.abs(got_dora - reference(models, None, TEXTS)).max() > 1e-3
    assert np.abs(got_qv4 - reference(models, "qv4", TEXTS)).max() < TOLERANCE
    assert counter.passes >= 2  # fell back to a pass per adapter
    # With the DoRA adapter gone, the base mixes again.
    pool.unload("dora")
    counter.passes = 0
    pool.encode([EncodeItem("qv4", "passage", TEXTS[:2]), EncodeItem("plain", "query", TEXTS[:2])])
    assert counter.passes == 1
