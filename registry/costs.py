"""What serving a million items with a candidate costs: one figure from an eval run's cost.

An eval run measures CPU milliseconds per item and peak memory on the runtime that would serve
it (evals/cost.py). ``price_per_million`` turns the CPU into money at a CPU-hour price and adds
an endpoint model's own price per million items when the user gave one at registration, so a
local model, a lexical baseline and a paid API compare on one scale. With only local
candidates the ratio between two prices is their CPU ratio, whatever the CPU-hour price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# USD per vCPU-hour: an on-demand general-purpose cloud vCPU (memory included) costs about
# this; only its ratio to an endpoint's own price matters.
DEFAULT_CPU_HOUR_PRICE = 0.04
CPU_MS_PER_HOUR = 3_600_000.0


@dataclass(frozen=True)
class Cost:
    """A candidate's serving cost per million items, with the figures it comes from."""

    price_per_million: float  # USD
    cpu_ms_per_item: float
    peak_memory_mb: float | None
    endpoint_price_per_million: float | None  # the API's own price, when given

    def line(self) -> str:
        parts = [f"${self.price_per_million:.4g}/1M", f"{self.cpu_ms_per_item:.3g} CPU-ms/item"]
        if self.peak_memory_mb is not None:
            parts.append(f"{self.peak_memory_mb:.0f} MB peak")
        if self.endpoint_price_per_million is not None:
            parts.append(f"API ${self.endpoint_price_per_million:g}/1M")
        return ", ".join(parts)


def serving_cost(
    cost: Mapping[str, float],
    *,
    endpoint_price_per_million: float | None = None,
    cpu_hour_price: float = DEFAULT_CPU_HOUR_PRICE,
) -> Cost | None:
    """The run's cost per million items, or None when the run measured no CPU per item (runs
    recorded before costs were comparable)."""
    cpu_ms = cost.get("cpu_ms_per_item")
    if cpu_ms is None:
        return None
    price = cpu_ms * 1e6 / CPU_MS_PER_HOUR * cpu_hour_price + (endpoint_price_per_million or 0.0)
    return Cost(
        price_per_million=price,
        cpu_ms_per_item=float(cpu_ms),
        peak_memory_mb=cost.get("peak_memory_mb"),
        endpoint_price_per_million=endpoint_price_per_million,
    )
