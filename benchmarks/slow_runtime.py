"""The PyTorch runtime on an emulated slower device, for benchmarks/knee.py.

Runs `serving.runtime.server` unchanged except that each call on its worker thread (load,
infer, score, classify) is followed by a sleep of ``(factor - 1)`` times the call's own time:
a device ``factor`` times slower, as an older machine or a throttled VM in a mixed fleet.
Wall time, not CPU time: on a shared machine a call's time includes waiting for a core, and
a slower device would wait as long. Sleeping, not spinning, leaves the CPU to the other
workers of a small benchmark machine.

    python -m benchmarks.slow_runtime --slow-factor 2 --socket PATH [runtime flags]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from serving.runtime import server


def slowed(factor: float) -> None:
    original = server.RuntimeServer._in_worker

    async def in_worker(self: server.RuntimeServer, fn: Any, *args: Any) -> Any:
        def run(*inner: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*inner)
            finally:
                time.sleep((factor - 1.0) * (time.perf_counter() - started))

        return await original(self, run, *args)

    server.RuntimeServer._in_worker = in_worker  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    factor = 1.0
    if argv[:1] == ["--slow-factor"]:
        factor, argv = float(argv[1]), argv[2:]
    if factor < 1.0:
        print("error: --slow-factor must be >= 1", file=sys.stderr)
        return 2
    slowed(factor)
    return server.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
