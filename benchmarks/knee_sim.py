"""The knee at fleet scale: a discrete-event simulation of the pull queue against push routers.

benchmarks/knee.py measures the knee on a real fleet, but two shared cores hold two workers per
mode. This module replays the same load on simulated fleets of 2 to 256 workers:

- **Service times** come from the real runtime: knee.py sends batches of known texts, one at a
  time, to each kind of worker and reads the time of each runtime call from its sidecar's
  /metrics (``Calibration``). ``ServiceModel`` fits them as a per-call cost plus, per forward
  pass, a per-pass cost, a cost per padded token and one per row x length^2 (attention), with
  the passes planned by the runtime's own ``plan_batches`` (longest first, 4096 padded tokens,
  32 texts, 10% padding).
- **Requests** are the real mix: the same arrivals as knee.py (Poisson, most requests one
  GerLayQA question, ``bulk_share`` of them ``bulk_size`` passages), each text with its token
  length as the model's tokenizer counts it.
- **Workers** follow the sidecar's batching (sidecar/src/worker/batch.rs): ``inflight``
  permits; with a free one a worker takes messages from the front of its queue up to
  ``max_batch_tokens`` (at least one) and hands the batch to its runtime, which runs batches
  one at a time in order; with a free permit and an empty queue it waits, and JetStream gives
  a new message to the worker that has waited longest. Speeds differ by a factor per worker
  (a slower device takes ``factor`` times as long for every batch).
- **Modes**: pull (one queue all workers take from), push-rr and push-lo (a router assigns each
  request to a worker's own queue on arrival: benchmarks/knee_load.py's ``Router``, the same
  code the real run routes with). A reply reaches the caller ``path_s`` after its batch ends
  (gateway, NATS, sidecar and socket, measured).

What it leaves out is listed in ``LIMITS`` and in the report.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.knee_load import MODES, Arrival, Router, scaled_schedule
from benchmarks.knee_report import Step, knee
from serving.runtime.batch_planning import DEFAULT_MAX_PADDING, default_batch_limits, plan_batches

LIMITS = (
    "each worker owns its CPU: the real run's workers share two cores with each other and "
    "with the gateway, NATS, the control plane and the load generator, the simulated ones "
    "contend for nothing",
    "the path around a batch (gateway, JetStream, sidecar, socket, reply) is a fixed delay "
    "per request, never a queue: no gateway, NATS or network capacity limit is modelled",
    "a slower worker is the same runtime with every batch taking `factor` times as long (as "
    "the real run's emulated slow worker); real devices also differ in how time grows with "
    "batch size",
    "push-lo's router sees its own requests in flight exactly and at once (one router): a "
    "fleet behind several gateways, or a router refreshing its view, does worse",
    "no failures, redeliveries, deadlines or model loads; the sidecar's batch wait (5 ms) and "
    "its carry of pulled messages beyond the budget are not modelled: a worker takes what "
    "fits the budget at the moment it has a free permit (plus the one message it polled for "
    "while busy)",
)


# ---- service times -----------------------------------------------------------------------
@dataclass(frozen=True)
class ServiceModel:
    """Seconds one runtime call takes for a batch of texts of the given token lengths."""

    per_call: float
    per_pass: float
    per_token: float  # per padded token of a pass
    per_attention: float  # per row x padded length^2 of a pass
    max_pass_tokens: int = default_batch_limits("cpu")[0]
    max_pass_texts: int = default_batch_limits("cpu")[1]
    max_padding: float = DEFAULT_MAX_PADDING

    FEATURES = ("per_call", "per_pass", "per_token", "per_attention")

    def features(self, lengths: Sequence[int]) -> list[float]:
        passes = plan_batches(lengths, self.max_pass_tokens, self.max_pass_texts, self.max_padding)
        padded = sum(b.padded_tokens for b in passes)
        attention = sum(b.padded_tokens * (b.padded_tokens / len(b.indices)) for b in passes)
        return [1.0, float(len(passes)), float(padded), float(attention)]

    def seconds(self, lengths: Sequence[int]) -> float:
        coefficients = (self.per_call, self.per_pass, self.per_token, self.per_attention)
        return float(np.dot(coefficients, self.features(lengths)))

    @classmethod
    def fit(cls, points: Sequence[tuple[Sequence[int], float]]) -> ServiceModel:
        """Non-negative least squares over (token lengths of a batch, measured seconds),
        weighted by 1/seconds so that small batches count as much as large ones."""
        from scipy.optimize import nnls

        if len(points) < 4:
            raise ValueError(f"need at least 4 measured batches to fit, got {len(points)}")
        probe = cls(0.0, 0.0, 0.0, 0.0)
        rows = np.asarray([probe.features(lengths) for lengths, _ in points])
        seconds = np.asarray([s for _, s in points])
        weights = 1.0 / np.maximum(seconds, 1e-6)
        # Columns scaled to comparable size first: tokens and attention are 1e3-1e6 per call.
        scale = np.maximum(rows.max(axis=0), 1e-12)
        solution, _ = nnls(rows / scale * weights[:, None], seconds * weights)
        per_call, per_pass, per_token, per_attention = (float(c) for c in solution / scale)
        return cls(per_call, per_pass, per_token, per_attention)

    def relative_errors(self, points: Sequence[tuple[Sequence[int], float]]) -> list[float]:
        return [abs(self.seconds(lengths) - s) / s for lengths, s in points]

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.FEATURES}


@dataclass(frozen=True)
class Calibration:
    """What the real run measured for the simulation (saved in knee.json).

    ``points``: per worker kind ("fast", "slow"), (token lengths of the batch, seconds of the
    runtime call) for batches sent one at a time. ``path_s``: a one-query request's time from
    the caller's send to its reply, less its runtime call (median). ``query_tokens`` /
    ``passage_tokens``: each pool text's token length, truncated as the model truncates."""

    points: dict[str, list[tuple[list[int], float]]]
    path_s: float
    query_tokens: list[int]
    passage_tokens: list[int]

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Calibration:
        points = {
            kind: [(list(lengths), float(s)) for lengths, s in rows]
            for kind, rows in raw["points"].items()
        }
        return cls(points, float(raw["path_s"]), raw["query_tokens"], raw["passage_tokens"])

    def model(self, kind: str) -> ServiceModel:
        return ServiceModel.fit(self.points[kind])

    def slow_factor(self) -> float:
        """The slow worker's time over the fast worker's model, median over its batches."""
        fast = self.model("fast")
        return statistics.median(s / fast.seconds(lengths) for lengths, s in self.points["slow"])

    def lengths(self, arrival: Arrival) -> tuple[int, ...]:
        pool = self.passage_tokens if arrival.bulk else self.query_tokens
        return tuple(pool[i] for i in arrival.texts)


# ---- the fleet -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SidecarModel:
    """The sidecar flags the simulation follows (their defaults)."""

    max_batch_tokens: int = 32768
    inflight: int = 2
    # Messages a worker's loop pulls before it has a free batch slot: with an empty carry it
    # polls for one message whatever its slots (sidecar/src/worker/batch.rs, `run`: an idle
    # poll holding a slot kept the worker's other tasks waiting), and holds it until a slot
    # frees, while another worker may sit idle. 0: a worker pulls only with a free slot.
    ahead: int = 1


@dataclass
class _Worker:
    model: ServiceModel
    factor: float
    free: int
    queue: deque[int] = field(default_factory=deque)  # push: its own queue
    runtime: deque[list[int]] = field(default_factory=deque)  # batches sent, first running
    waiting: bool = False
    held: int = -1  # the request pulled ahead of a free slot (SidecarModel.ahead), or -1
    busy_s: float = 0.0
    replies: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class SimWorker:
    model: ServiceModel
    factor: float = 1.0


_DONE, _REPLY = 0, 1


def simulate(
    mode: str,
    arrivals: Sequence[Arrival],
    sizes: Sequence[tuple[int, ...]],
    workers: Sequence[SimWorker],
    *,
    seconds: float,
    path_s: float = 0.0,
    sidecar: SidecarModel = SidecarModel(),
    rate: float = 0.0,
) -> Step:
    """One step of ``arrivals`` (sorted by time; ``sizes``: each one's token lengths) on a
    simulated fleet, run until the last reply; measured as the real run measures
    (benchmarks/knee_report.py's ``Step``)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    fleet = [_Worker(w.model, w.factor, sidecar.inflight) for w in workers]
    router = Router(mode, len(fleet))
    tokens = [sum(s) for s in sizes]
    assigned = [-1] * len(arrivals)
    shared: deque[int] = deque()
    waiting: deque[int] = deque()  # pull: workers with a pull outstanding, oldest first
    # Batch completions and replies; arrivals are read in order beside them.
    events: list[tuple[float, int, int, int]] = []
    replies: dict[int, list[int]] = {}
    sequence = 0
    step = Step(mode, rate, seconds, sent=len(arrivals))
    cost = _cached(fleet)

    def push(at: float, kind: int, what: int) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (at, sequence, kind, what))

    def start(i: int, now: float) -> None:
        w = fleet[i]
        took = cost(i, tuple(sorted(n for r in w.runtime[0] for n in sizes[r])))
        w.busy_s += took
        push(now + took, _DONE, i)

    def wait(i: int) -> None:
        w = fleet[i]
        if not w.waiting:
            w.waiting = True
            if mode == "pull":
                waiting.append(i)

    def take(i: int, now: float) -> None:
        w = fleet[i]
        queue = shared if mode == "pull" else w.queue
        while True:
            if w.free == 0:
                if sidecar.ahead and w.held < 0:  # the idle poll, without a slot
                    if queue:
                        w.held = queue.popleft()
                    else:
                        wait(i)
                return
            if w.held < 0 and not queue:
                wait(i)
                return
            batch: list[int] = []
            budget = 0
            if w.held >= 0:
                batch.append(w.held)
                budget = tokens[w.held]
                w.held = -1
            while queue and (not batch or budget + tokens[queue[0]] <= sidecar.max_batch_tokens):
                r = queue.popleft()
                batch.append(r)
                budget += tokens[r]
            w.free -= 1
            w.tokens += budget
            w.runtime.append(batch)
            if len(w.runtime) == 1:
                start(i, now)

    def arrive(r: int, now: float) -> None:
        worker = router.pick()
        assigned[r] = worker
        if worker < 0:
            shared.append(r)
            while waiting and shared:
                i = waiting.popleft()
                fleet[i].waiting = False
                take(i, now)
        else:
            fleet[worker].queue.append(r)
            if fleet[worker].waiting:
                fleet[worker].waiting = False
                take(worker, now)

    for i in range(len(fleet)):
        take(i, 0.0)
    next_arrival = 0
    while events or next_arrival < len(arrivals):
        if next_arrival < len(arrivals) and (
            not events or arrivals[next_arrival].at <= events[0][0]
        ):
            arrive(next_arrival, arrivals[next_arrival].at)
            next_arrival += 1
            continue
        now, key, kind, what = heapq.heappop(events)
        if kind == _DONE:
            w = fleet[what]
            batch = w.runtime.popleft()
            w.replies += len(batch)
            replies[key] = batch
            push(now + path_s, _REPLY, key)
            w.free += 1
            if w.runtime:
                start(what, now)
            if not w.waiting:
                take(what, now)
        else:
            for r in replies.pop(what):
                arrival = arrivals[r]
                router.done(assigned[r])
                step.answered += 1
                step.texts += len(arrival.texts)
                step.last_answer_s = max(step.last_answer_s, now)
                latency = now - arrival.at
                (step.bulk_latency if arrival.bulk else step.small_latency).append(latency)
    step.cpu_s = [w.busy_s for w in fleet]
    step.worker_replies = [float(w.replies) for w in fleet]
    step.worker_tokens = [float(w.tokens) for w in fleet]
    return step


def _cached(fleet: Sequence[_Worker]) -> Callable[[int, tuple[int, ...]], float]:
    """Worker i's seconds for a batch of (sorted) token lengths; many batches repeat (a lone
    query), and planning the passes is the simulation's costliest step."""
    seen: dict[tuple[ServiceModel, tuple[int, ...]], float] = {}

    def cost(i: int, lengths: tuple[int, ...]) -> float:
        w = fleet[i]
        key = (w.model, lengths)
        if key not in seen:
            seen[key] = w.model.seconds(lengths)
        return seen[key] * w.factor

    return cost


# ---- the knee at scale ---------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """The request mix and step of the real run (its flags)."""

    seconds: float
    bulk_share: float
    bulk_size: int


def spread(workers: int, slowest: float) -> list[float]:
    """Speed factors evenly spaced from 1 (the fastest) to ``slowest``."""
    if workers == 1:
        return [1.0]
    return [1.0 + (slowest - 1.0) * i / (workers - 1) for i in range(workers)]


def knee_rate(
    mode: str,
    calibration: Calibration,
    fleet: Sequence[SimWorker],
    load: Load,
    bound_s: float,
    *,
    seed: int,
    sidecar: SidecarModel = SidecarModel(),
    iterations: int = 12,
) -> float:
    """The highest offered rate (req/s) at which the one-query requests' p99 stays within
    ``bound_s``, by bisection over rates on one arrival process (``scaled_schedule``)."""
    pools = (len(calibration.query_tokens), len(calibration.passage_tokens))
    sizes: list[tuple[int, ...]] = []  # the i-th request is the same at every rate

    def ok(rate: float) -> bool:
        arrivals = scaled_schedule(rate, load.seconds, load.bulk_share, load.bulk_size, pools, seed)
        sizes.extend(calibration.lengths(a) for a in arrivals[len(sizes) :])
        step = simulate(
            mode, arrivals, sizes[: len(arrivals)], fleet, seconds=load.seconds,
            path_s=calibration.path_s, sidecar=sidecar, rate=rate,
        )  # fmt: skip
        return step.ok(bound_s)

    # What the fleet could do with every worker busy on lone requests: the bracket's top.
    mean_request = load.bulk_share * fleet[0].model.seconds(
        calibration.passage_tokens[: load.bulk_size]
    ) + (1 - load.bulk_share) * fleet[0].model.seconds(calibration.query_tokens[:1])
    low, high = 0.0, 2.0 * sum(1.0 / w.factor for w in fleet) / mean_request
    while ok(high):
        low, high = high, 2 * high
    for _ in range(iterations):
        middle = (low + high) / 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class ScaleRow:
    workers: int
    knees: dict[str, list[float]]  # mode -> knee per seed

    def ratio(self, push: str) -> list[float]:
        return [p / q for p, q in zip(self.knees["pull"], self.knees[push], strict=True)]


def at_scale(
    calibration: Calibration,
    load: Load,
    sizes: Sequence[int],
    *,
    slowest: float,
    bound_s: float,
    seeds: Sequence[int],
    sidecar: SidecarModel = SidecarModel(),
) -> list[ScaleRow]:
    """The knee of every mode on fleets of ``sizes`` workers, speeds spread 1x..``slowest``,
    each worker the fast worker's measured runtime slowed by its factor."""
    model = calibration.model("fast")
    rows = []
    for n in sizes:
        fleet = [SimWorker(model, f) for f in spread(n, slowest)]
        knees = {
            mode: [
                knee_rate(mode, calibration, fleet, load, bound_s, seed=s, sidecar=sidecar)
                for s in seeds
            ]
            for mode in MODES
        }
        rows.append(ScaleRow(n, knees))
    return rows


def compare(
    real: Sequence[Step], simulated: Sequence[Step], bounds: Sequence[float]
) -> list[tuple[float, str, float | None, float | None]]:
    """(bound, mode, real knee, simulated knee) for every bound and mode of the real run."""
    rows = []
    for bound in bounds:
        for mode in MODES:
            if not any(s.mode == mode for s in real):
                continue
            r, s = knee(list(real), mode, bound), knee(list(simulated), mode, bound)
            rows.append((bound, mode, r.rate if r else None, s.rate if s else None))
    return rows


# ---- the report's section ------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleSettings:
    sizes: tuple[int, ...] = (4, 16, 64, 256)
    slowest: float = 3.0
    seeds: tuple[int, ...] = (0, 1, 2)


def _knee_rows(rows: list[ScaleRow]) -> list[str]:
    """One table line per fleet size: each mode's median knee, then pull's ratio to each push
    mode (median, range over the seeds)."""
    lines = []
    for row in rows:
        cells = [f"{statistics.median(row.knees[m]):.1f}" for m in MODES]
        for push in ("push-rr", "push-lo"):
            ratios = row.ratio(push)
            cells.append(
                f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f})"
            )
        lines.append(f"| {row.workers} | " + " | ".join(cells) + " |")
    return lines


def section(
    calibration_raw: dict[str, Any] | None,
    real_steps: Sequence[Step],
    args: Any,
    arrivals: Callable[[int, float], list[Arrival]],
    png: Any,
    scale: ScaleSettings,
) -> list[str]:
    """The report's simulation section: the calibration, the real run's steps replayed, the
    knee at scale (and its chart at ``png``). ``args``: the real run's flags."""
    if calibration_raw is None:
        return [
            "## The knee at fleet scale (simulation)",
            "",
            "This run measured no service times (it predates the calibration): no simulation.",
        ]
    calibration = Calibration.from_json(calibration_raw)
    fast, slow = calibration.model("fast"), calibration.model("slow")
    question = calibration.query_tokens[:1]
    bulk = calibration.passage_tokens[: args.bulk_size]
    errors = {k: calibration.model(k).relative_errors(v) for k, v in calibration.points.items()}
    sidecar = SidecarModel()
    replayed = replay_fleet(calibration, real_steps, arrivals, args, sidecar)
    load = Load(args.step_seconds, args.bulk_share, args.bulk_size)
    rows = at_scale(
        calibration, load, scale.sizes, slowest=scale.slowest, bound_s=args.p99_bound_s,
        seeds=scale.seeds, sidecar=sidecar,
    )  # fmt: skip
    # What-if: the same fleets with one batch in flight per worker (`--max-inflight-batches 1`):
    # a worker then pulls only when its runtime is idle, so no request waits behind a batch.
    one = SidecarModel(inflight=1)
    rows_one = at_scale(
        calibration, load, scale.sizes, slowest=scale.slowest, bound_s=args.p99_bound_s,
        seeds=scale.seeds, sidecar=one,
    )  # fmt: skip
    # What-if: a worker that polls only with a free batch slot (``ahead=0``): the message a
    # busy worker holds today waits for its running batch while another worker may be idle.
    no_ahead = SidecarModel(ahead=0)
    rows_no_ahead = at_scale(
        calibration, load, scale.sizes, slowest=scale.slowest, bound_s=args.p99_bound_s,
        seeds=scale.seeds, sidecar=no_ahead,
    )  # fmt: skip
    replayed_no_ahead = replay_fleet(calibration, real_steps, arrivals, args, no_ahead)
    plot_scale(rows, scale, args.p99_bound_s, png)
    bounds = sorted({2.0, 5.0, 10.0, args.p99_bound_s})
    compared = compare(real_steps, replayed, bounds)
    # A knee at the grid's top rate is censored (the fleet kept up with every rate offered):
    # two such knees agree that far, not on a value.
    top = max(step.rate for step in real_steps)
    both = [(r, s) for _, _, r, s in compared if r is not None and s is not None]
    within = [abs(s - r) / r <= 0.10 for r, s in both if r < top and s < top]
    censored = sum(1 for r, s in both if r >= top or s >= top)
    lines = [
        "## The knee at fleet scale (simulation)",
        "",
        "benchmarks/knee_sim.py replays this load on simulated fleets: each worker follows the "
        "sidecar's batching (2 batches in flight, fills up to 32768 tokens from the front of "
        "its queue, waits with a pull when the queue is empty; JetStream gives a message to the "
        "worker that has waited longest; a worker whose slots are all busy still polls for one "
        "message and holds it until a slot frees, as the sidecar's idle poll does), its "
        "runtime runs batches one at a time for the "
        "measured time of each batch; requests are this run's mix with each text's real token "
        "length; routers are the real run's code.",
        "",
        "**Calibration** (measured on this fleet before the steps; each batch one request, one "
        "runtime call, timed by the sidecar): "
        + "; ".join(
            f"{kind} worker: {len(calibration.points[kind])} batches, fitted as "
            f"{_describe(calibration.model(kind))}, error median "
            f"{100 * statistics.median(errors[kind]):.0f}%, max {100 * max(errors[kind]):.0f}%"
            for kind in ("fast", "slow")
        )
        + f". The slow worker took {calibration.slow_factor():.2f}x the fast worker's time "
        f"(set: {args.slow_factor:g}x); the path around a runtime call (HTTP, gateway, "
        f"JetStream, sidecar, socket, reply) took {1000 * calibration.path_s:.0f} ms "
        f"(median of lone questions). Examples: one question {1000 * fast.seconds(question):.0f}"
        f" ms, one bulk request ({args.bulk_size} passages) {1000 * fast.seconds(bulk):.0f} ms "
        f"on the fast worker, {1000 * slow.seconds(bulk):.0f} ms on the slow one.",
        "",
        f"### The simulation against this run ({args.workers} workers per mode)",
        "",
        "Every real step replayed with its very arrivals; the knee on the same steps.",
        "",
        "| p99 bound | mode | real knee | simulated knee | difference |",
        "|---:|---|---:|---:|---:|",
    ]
    for bound, mode, r, s in compared:
        diff = f"{100 * (s - r) / r:+.0f}%" if r is not None and s is not None else "-"
        lines.append(f"| {bound:g} s | {mode} | {_rate(r)} | {_rate(s)} | {diff} |")
    lines += [
        "",
        f"**Simulated knees within 10% of the real ones: {sum(within)} of {len(within)}** "
        f"where both are below the grid's top rate ({top:g} req/s)"
        + (", every such knee" if within and all(within) else "")
        + f"; {censored} more are censored at the top (real or simulated fleet kept p99 "
        "under the bound at every rate offered), which says only that both kept up that far.",
        "",
        "| mode | offered req/s | real p50 | simulated p50 | real p99 | simulated p99 "
        "| real tokens on the fast worker(s) | simulated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for real, sim in zip(real_steps, replayed, strict=True):
        lines.append(
            f"| {real.mode} | {real.rate:.2f} | {real.p(50):.2f} s | {sim.p(50):.2f} s "
            f"| {real.p(99):.2f} s | {sim.p(99):.2f} s | {_fast_share(real)} "
            f"| {_fast_share(sim)} |"
        )
    lines += [
        "",
        f"### At scale: {', '.join(str(n) for n in scale.sizes)} workers, speeds spread evenly "
        f"from 1x to {scale.slowest:g}x",
        "",
        f"Knee at p99 <= {args.p99_bound_s:g} s (offered req/s), each worker the fast worker's "
        f"measured runtime times its factor, the same mix and {args.step_seconds:g} s steps; "
        f"bisection over the rate on one Poisson process per seed (seeds "
        f"{', '.join(str(s) for s in scale.seeds)}: median, range in brackets).",
        "",
        "| workers | pull | push-rr | push-lo | pull / push-rr | pull / push-lo |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _knee_rows(rows)
    lines += [
        "",
        "The same fleets with **one batch in flight per worker** (`--max-inflight-batches 1`; "
        "the default 2 lets a busy worker pull a second batch, which then waits behind the "
        "running one, on a slow worker for seconds):",
        "",
        "| workers | pull | push-rr | push-lo | pull / push-rr | pull / push-lo |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _knee_rows(rows_one)
    lines += [
        "",
        "The same fleets if a worker **polled only with a free batch slot** (today's sidecar "
        "polls for one message whatever its slots and holds it until one frees: the request "
        "waits behind the running batch while another worker may be idle):",
        "",
        "| workers | pull | push-rr | push-lo | pull / push-rr | pull / push-lo |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _knee_rows(rows_no_ahead)
    held = compare(real_steps, replayed_no_ahead, bounds)
    lines += [
        "",
        "This run's own steps replayed so: "
        + "; ".join(
            f"pull at p99 <= {bound:g} s {_rate(s)} (today's model {_rate(t)}, real {_rate(r)})"
            for (bound, mode, r, s), (_, _, _, t) in zip(held, compared, strict=True)
            if mode == "pull"
        )
        + ".",
    ]
    capacity = statistics.mean(1 / f for f in spread(max(scale.sizes), scale.slowest))
    lines += [
        "",
        f"What speed alone predicts for this spread: pull keeps every worker busy "
        f"({capacity:.2f} of a fast worker's capacity per worker on average); push-rr gives "
        f"each worker the same share and saturates when the slowest ({scale.slowest:g}x) "
        f"does, at {1 / scale.slowest:.2f}: pull / push-rr <= "
        f"{capacity * scale.slowest:.2f}x from capacity, the rest is queueing (request-size "
        "variance behind a slow worker). push-lo follows each worker's backlog with an exact, "
        "instant view of it.",
        "",
        f"![simulated knee against fleet size]({png.name})",
        "",
        "What the model leaves out:",
        "",
        *(f"- {limit}" for limit in LIMITS),
    ]
    return lines


def replay_fleet(
    calibration: Calibration,
    real_steps: Sequence[Step],
    arrivals: Callable[[int, float], list[Arrival]],
    args: Any,
    sidecar: SidecarModel,
) -> list[Step]:
    """The real run's steps on a simulated fleet shaped as the real one: worker 0 slow (its
    own measured model), the others fast."""
    fast = calibration.model("fast")
    slow = calibration.model("slow") if args.slow_factor > 1 else fast
    fleet = [SimWorker(slow)] + [SimWorker(fast)] * (args.workers - 1)
    out = []
    for real in real_steps:
        step_arrivals = arrivals(list(args.rates).index(real.rate), real.rate)
        out.append(
            simulate(
                real.mode, step_arrivals, [calibration.lengths(a) for a in step_arrivals],
                fleet, seconds=real.seconds, path_s=calibration.path_s, sidecar=sidecar,
                rate=real.rate,
            )
        )  # fmt: skip
    return out


def _describe(model: ServiceModel) -> str:
    return (
        f"{1000 * model.per_call:.1f} ms per call + per forward pass "
        f"{1000 * model.per_pass:.1f} ms + {1e6 * model.per_token:.0f} ms per 1000 padded "
        f"tokens + {1e9 * model.per_attention:.2f} ms per 10^6 row x length^2"
    )


def _rate(rate: float | None) -> str:
    return f"{rate:.2f}" if rate is not None else "below the lowest"


def _fast_share(step: Step) -> str:
    total = sum(step.worker_tokens)
    return f"{100 * sum(step.worker_tokens[1:]) / total:.0f}%" if total else "-"


def plot_scale(rows: Sequence[ScaleRow], scale: ScaleSettings, bound_s: float, png: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [row.workers for row in rows]
    for mode in MODES:
        left.plot(
            sizes, [statistics.median(r.knees[mode]) / r.workers for r in rows], marker="o",
            label=mode,
        )  # fmt: skip
    for push in ("push-rr", "push-lo"):
        right.plot(
            sizes, [statistics.median(r.ratio(push)) for r in rows], marker="o",
            label=f"pull / {push}",
        )  # fmt: skip
    right.axhline(1.0, color="grey", linestyle=":")
    left.set_ylabel(f"knee (p99 <= {bound_s:g} s): offered req/s per worker")
    right.set_ylabel("knee ratio")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("workers")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(f"Simulated fleets, speeds spread 1x-{scale.slowest:g}x")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
