"""The machine class a runtime profile is tuned for and applied on: ``cpu:<processor> x<cores>``
for a CPU runtime (the processor model from /proc/cpuinfo and the cores this process may use),
``gpu:<device name>`` for an accelerator. Only this module computes it: `taskfleet tune` records
profiles under it and the launchers (`taskfleet up`, `taskfleet worker`) hand it to their
sidecars (``--machine-class``), which apply only the profiles of their own class."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def machine_class(device: str = "cpu") -> str:
    """This machine's class for a runtime on ``device`` (``cpu``, ``cuda``, ``cuda:1``)."""
    if device == "cpu":
        return f"cpu:{processor_model()} x{usable_cores()}"
    if device.startswith("cuda"):
        import torch  # only for accelerators: a CPU worker's launcher never loads it

        index = int(device.partition(":")[2] or 0)
        return f"gpu:{torch.cuda.get_device_name(index)}"
    raise ValueError(f"no machine class for device {device!r} (cpu or cuda[:N])")


def processor_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (its affinity; a container's cpuset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
