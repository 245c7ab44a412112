"""The load of the knee benchmark, shared by the real fleet (benchmarks/knee.py) and the
simulated one (benchmarks/knee_sim.py): Poisson arrivals with a heavy-tailed size mix, and the
push routers that assign each request to one worker up front."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

MODES = ("pull", "push-rr", "push-lo")


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the step starts
    bulk: bool
    texts: tuple[int, ...]  # indices into the query pool (one) or the passage pool (bulk)


def schedule(
    rate: float,
    seconds: float,
    bulk_share: float,
    bulk_size: int,
    pools: tuple[int, int],
    seed: int,
) -> list[Arrival]:
    """Poisson arrivals at ``rate`` per second for ``seconds``, the same list for every mode.
    Exactly ``rate * seconds`` of them (uniform times, sorted: a Poisson process given its
    count), so that steps of a few dozen requests offer the rate they name."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(0, seconds) for _ in range(round(rate * seconds)))
    return [_sized(t, rng, bulk_share, bulk_size, pools) for t in times]


def scaled_schedule(
    rate: float,
    seconds: float,
    bulk_share: float,
    bulk_size: int,
    pools: tuple[int, int],
    seed: int,
) -> list[Arrival]:
    """Poisson arrivals at ``rate`` for ``seconds`` from one unit-rate process per seed, its
    times divided by the rate: the i-th request is the same (size, texts) at every rate, only
    sooner. A search for the highest rate that meets a bound then compares like with like
    (common random numbers), so pass/fail is monotone in the rate up to the noise of one
    process, not of a new draw per rate."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = rng.expovariate(1.0) / rate
    while t < seconds:
        out.append(_sized(t, rng, bulk_share, bulk_size, pools))
        t += rng.expovariate(1.0) / rate
    return out


def _sized(
    at: float, rng: random.Random, bulk_share: float, bulk_size: int, pools: tuple[int, int]
) -> Arrival:
    if rng.random() < bulk_share:
        return Arrival(at, True, tuple(rng.randrange(pools[1]) for _ in range(bulk_size)))
    return Arrival(at, False, (rng.randrange(pools[0]),))


class Router:
    """Which worker a request goes to: none for the shared queue (pull), else one worker,
    round-robin (push-rr) or the one with the fewest of this router's requests in flight
    (push-lo; among those, the one picked least recently).

    push-lo keeps a heap of (in flight, last picked, worker) with stale entries skipped, so a
    pick costs O(log workers): the simulation routes a quarter of a million requests over 256
    workers per step."""

    def __init__(self, mode: str, workers: int) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        self.outstanding = [0] * workers
        self.turn = 0
        self._last = [-1] * workers
        self._heap = [(0, -1, i) for i in range(workers)]

    def pick(self) -> int:
        """The worker's index, or -1 for the shared queue."""
        if self.mode == "pull":
            return -1
        if self.mode == "push-rr":
            i = self.turn % len(self.outstanding)
        else:
            while True:
                count, last, i = heapq.heappop(self._heap)
                if count == self.outstanding[i] and last == self._last[i]:
                    break
            self._last[i] = self.turn
        self.turn += 1
        self._change(i, +1)
        return i

    def done(self, i: int) -> None:
        if i >= 0:
            self._change(i, -1)

    def _change(self, i: int, by: int) -> None:
        self.outstanding[i] += by
        if self.mode == "push-lo":
            heapq.heappush(self._heap, (self.outstanding[i], self._last[i], i))
