"""Fault scenarios: a stream of counted calls with one fault injected while it runs.

Each scenario returns a :class:`FaultRun` (the tally of every call and the fault's window), so
the seconds-long tests (``tests/faults/test_faults.py``) and the soak
(``benchmarks/reliability.py``) run the very same code with a small or a large load.

The calls run in a background thread; the fault is injected from the calling (main) thread,
which outlives any process it restarts (see :mod:`testbed.faults.injectors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.publisher import model_key
from testbed.faults.counting import PROTOCOLS, Call, CountingClient, Protocol, Tally
from testbed.faults.injectors import (
    Window,
    freeze_runtime,
    kill_nats_node,
    kill_runtime,
    kill_sidecar,
    restart_nats,
    wait_holding,
)
from testbed.faults.reference import Reference
from testbed.fleet import (
    COLD_START_S,
    LocalFleet,
    register_served_task,
    unique_task,
    wait_until,
)

LIMIT = 2048
WORDS = [
    "miete",
    "kündigung",
    "frist",
    "vertrag",
    "vermieter",
    "mieter",
    "schaden",
    "haftung",
    "recht",
    "gericht",
    "klage",
    "urteil",
    "kauf",
    "mangel",
    "erbe",
    "testament",
    "arbeit",
    "lohn",
    "urlaub",
    "steuer",
    "bescheid",
    "widerspruch",
]


def sentence(i: int, words: int = 8) -> str:
    """A deterministic text per index (distinct texts, so a swapped answer is caught)."""
    return f"frage {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(words))


@dataclass(frozen=True)
class Load:
    """How many calls, how many in flight, and what they look like."""

    calls: int = 120
    concurrency: int = 12
    texts_per_call: int = 1
    protocols: tuple[Protocol, ...] = PROTOCOLS
    timeout_ms: int | None = None
    retry_budget_s: float = 90.0

    def call(self, i: int, *, task: str | None = None, kind: str = "query") -> Call:
        texts = [sentence(i * self.texts_per_call + k) for k in range(self.texts_per_call)]
        protocol = self.protocols[i % len(self.protocols)]
        return Call(texts, kind=kind, protocol=protocol, timeout_ms=self.timeout_ms, task=task)

    def texts(self) -> list[str]:
        return [sentence(i) for i in range(self.calls * self.texts_per_call)]


@dataclass
class FaultRun:
    name: str
    tally: Tally
    window: Window
    notes: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """The counts of the run, the p99 of the calls that began during the fault."""
        summary = self.tally.summary()
        summary["p99_fault_s"] = round(self.tally.p99(self.window.began, self.window.ended), 3)
        summary["p99_all_s"] = summary.pop("p99_s")
        return {"fault": self.name, **summary, **self.notes}


def serve(fleet: LocalFleet, model: Path, *, prefix: str = "fault", pinned: bool = True) -> str:
    """A new task on ``model`` (registered as ``m-<task>``), placed, held by every worker."""
    task = unique_task(prefix)
    placement = register_served_task(
        fleet.reg, task, model, pinned=pinned, replicas=fleet.n_workers
    )
    if pinned:
        fleet.serving(task, placement.epoch)
    return task


def served_model_key(fleet: LocalFleet, model_name: str) -> str:
    """The model key the fleet serves a registered base model under (no adapter)."""
    return model_key(fleet.reg.get_model(model_name), None)


def run_stream(
    fleet: LocalFleet,
    client: CountingClient,
    next_call: Callable[[int], Call | None],
    concurrency: int,
    fault: Callable[[Tally], Window],
) -> tuple[Tally, Window]:
    """Calls in a thread, ``fault(tally)`` on this thread; returns when both are done."""
    errors: list[BaseException] = []

    async def stream() -> None:
        async with client:
            await client.stream(next_call, concurrency=concurrency)

    def calls() -> None:
        try:
            asyncio.run(stream())
        except BaseException as exc:  # surfaced below, on the main thread
            errors.append(exc)

    caller = threading.Thread(target=calls, name="fault-calls")
    caller.start()
    try:
        window = fault(client.tally)
    finally:
        caller.join()
    if errors:
        raise errors[0]
    return client.tally, window


def _counted(load: Load, task: str | None = None) -> Callable[[int], Call | None]:
    return lambda i: load.call(i, task=task) if i < load.calls else None


def _when_sent(tally: Tally, share: float, load: Load) -> None:
    wait_until(lambda: tally.sent >= max(1, int(load.calls * share)), timeout_s=120, every_s=0.01)


def _client(fleet: LocalFleet, task: str, reference: Reference, load: Load, **kw: Any) -> Any:
    return CountingClient(
        fleet.gateway_url, task, reference, retry_budget_s=load.retry_budget_s, **kw
    )


# ---- the faults -----------------------------------------------------------------------------


def no_fault(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, *, api_key: str | None = None
) -> FaultRun:
    """The same stream with nothing injected: the baseline of a run's latencies."""
    window = Window("none (baseline)")

    def fault(tally: Tally) -> Window:
        wait_until(lambda: tally.sent >= load.calls, timeout_s=600, every_s=0.05)
        return window

    client = _client(fleet, task, reference, load, api_key=api_key)
    tally, _ = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun(window.name, tally, window.close())


def kill_sidecar_under_load(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, *, restart: bool = True
) -> FaultRun:
    """kill -9 of a worker's sidecar while it holds requests (restarted as `up` would)."""
    victim = fleet.sidecars[0]

    def fault(tally: Tally) -> Window:
        _when_sent(tally, 0.2, load)
        # A tiny model answers in milliseconds: frozen, the victim surely holds requests when
        # it dies (its runtime dies with it).
        freeze_runtime(victim)
        wait_holding(fleet, victim, task)
        window = kill_sidecar(victim, restart=restart)
        if restart:
            wait_until(lambda: holds_loop(fleet, victim.worker_id, task), timeout_s=COLD_START_S)
        return window.close()

    client = _client(fleet, task, reference, load)
    tally, window = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun("kill -9 sidecar", tally, window)


def holds_loop(fleet: LocalFleet, worker_id: str, task: str) -> bool:
    beat = fleet.heartbeat(worker_id)
    return beat is not None and task in beat.epochs


def kill_runtime_under_load(
    fleet: LocalFleet, task: str, reference: Reference, load: Load
) -> FaultRun:
    """kill -9 of a worker's PyTorch runtime; the sidecar restarts it and reloads models."""
    victim = fleet.sidecars[0]

    def fault(tally: Tally) -> Window:
        _when_sent(tally, 0.2, load)
        freeze_runtime(victim)  # so that the sidecar surely holds requests when it dies
        wait_holding(fleet, victim, task)
        window = kill_runtime(victim)
        wait_until(lambda: holds_loop(fleet, victim.worker_id, task), timeout_s=COLD_START_S)
        return window.close()

    client = _client(fleet, task, reference, load)
    tally, window = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun("kill -9 runtime", tally, window)


def restart_nats_under_load(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, down_s: float = 1.0
) -> FaultRun:
    """nats-server stopped and started again (same port and store) mid-stream."""

    def fault(tally: Tally) -> Window:
        _when_sent(tally, 0.2, load)
        window = restart_nats(fleet, down_s=down_s)
        return window

    client = _client(fleet, task, reference, load)
    tally, window = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun("nats-server restart", tally, window)


def kill_nats_node_under_load(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, down_s: float = 3.0
) -> FaultRun:
    """kill -9 of the NATS cluster node the gateway is connected to, mid-stream; it starts
    again after ``down_s`` and rejoins (streams and KV are R3: two nodes keep a quorum)."""
    index = fleet.gateway_nats_node()

    def fault(tally: Tally) -> Window:
        _when_sent(tally, 0.2, load)
        return kill_nats_node(fleet, index, down_s=down_s)

    client = _client(fleet, task, reference, load)
    tally, window = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun("kill -9 nats node", tally, window, {"node": index})


def promote_with_control_plane_restart(
    fleet: LocalFleet,
    task: str,
    candidate: str,
    reference: Reference,
    references: dict[str, Reference],
    load: Load,
) -> FaultRun:
    """A promotion to ``candidate`` written while the control plane's NATS side (placement
    publisher, fleet watcher) is down, published when it comes back; answers come from the old
    or the new model, each checked against its own in-process vectors (``references`` by
    model key)."""
    before = fleet.reg.current_placement(task)
    assert before is not None
    notes: dict[str, Any] = {}

    def fault(tally: Tally) -> Window:
        _when_sent(tally, 0.2, load)
        window = Window("promotion + control-plane restart")
        fleet.stop_control_loops()
        # Written to the registry, not yet published: the publisher is down.
        fleet.reg.promote(task, candidate, override=True, reason="fault suite", pinned=True)
        time.sleep(1.0)
        fleet.start_control_loops()
        after = fleet.reg.current_placement(task)
        assert after is not None and after.epoch == before.epoch + 1
        fleet.serving(task, after.epoch)
        notes["epochs"] = f"{before.epoch}->{after.epoch}"
        return window.close()

    by_model = {(task, key): ref for key, ref in references.items()}
    client = _client(fleet, task, reference, load, by_model=by_model)
    tally, window = run_stream(fleet, client, _counted(load), load.concurrency, fault)
    return FaultRun("promotion + control-plane restart", tally, window, notes)


def memory_pressure(
    fleet: LocalFleet, tasks: dict[str, Reference], model_keys: dict[str, str], load: Load
) -> FaultRun:
    """Calls alternate between lazy tasks whose models do not fit the worker's memory budget
    together: every switch evicts one model and loads the other while requests wait."""
    names = list(tasks)
    first = names[0]
    by_model = {(t, model_keys[t]): tasks[t] for t in names}
    window = Window("memory budget full (lazy models evicted)")

    def next_call(i: int) -> Call | None:
        if i >= load.calls:
            return None
        return load.call(i, task=names[(i // 8) % len(names)])

    def fault(tally: Tally) -> Window:
        wait_until(lambda: tally.sent >= load.calls, timeout_s=600, every_s=0.05)
        return window

    client = _client(fleet, first, tasks[first], load, by_model=by_model)
    tally, _ = run_stream(fleet, client, next_call, load.concurrency, fault)
    text = fleet.sidecar_metrics()
    evictions = _sample(text, "taskfleet_sidecar_model_evictions_total")
    return FaultRun(window.name, tally, window.close(), {"evictions": int(evictions)})


def poison_inputs(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, every: int = 10
) -> FaultRun:
    """Every ``every``-th call holds a text the model's forward pass fails on; those must end
    with INFER_FAILED (dead-lettered), every other call with its vectors."""
    poison_text = "recht " * 200
    window = Window("poison input (runtime fails)")

    def next_call(i: int) -> Call | None:
        if i >= load.calls:
            return None
        if i % every == every - 1:
            call = load.call(i)
            return Call(
                [*call.texts, poison_text],
                protocol=call.protocol,
                timeout_ms=call.timeout_ms,
                expect_error="INFER_FAILED",
                family="poison",
            )
        return load.call(i)

    def fault(tally: Tally) -> Window:
        wait_until(lambda: tally.sent >= load.calls, timeout_s=600, every_s=0.05)
        return window

    client = _client(fleet, task, reference, load)
    tally, _ = run_stream(fleet, client, next_call, load.concurrency, fault)
    return FaultRun(window.name, tally, window.close())


def at_the_limit(
    fleet: LocalFleet, task: str, reference: Reference, load: Load, every: int = 20
) -> FaultRun:
    """Every ``every``-th call holds 2048 inputs (the documented limit), in every format."""
    window = Window("requests at the 2048-input limit")
    protocols = itertools.cycle(PROTOCOLS)

    def next_call(i: int) -> Call | None:
        if i >= load.calls:
            return None
        if i % every == 0:
            texts = [sentence(100_000 + k) for k in range(LIMIT)]
            return Call(texts, protocol=next(protocols), timeout_ms=300_000, family="limit")
        return load.call(i)

    def fault(tally: Tally) -> Window:
        wait_until(lambda: tally.sent >= load.calls, timeout_s=900, every_s=0.05)
        return window

    reference.prepare(sentence(100_000 + k) for k in range(LIMIT))
    client = _client(fleet, task, reference, load)
    tally, _ = run_stream(fleet, client, next_call, load.concurrency, fault)
    return FaultRun(window.name, tally, window.close())


def _sample(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- a hostile but authorised caller ------------------------------------------------------

# What an attacking caller sends, each the worst request of its kind that the gateway accepts
# or that once took a task down: ``epoch`` a minimum epoch far ahead of every placement (the
# issue: every other caller got 504 for ~50 s), ``huge`` one text above the task's limit inside
# the body limit (the issue: a 30 MB text stalled the task for 114 s), ``flood`` requests of
# the most inputs the key's token burst allows, each longer than the model reads, as fast as
# the key's token rate lets them through, and ``flood`` requests above that burst (refused).
ATTACKS = ("epoch", "huge", "flood")
HUGE_TEXT_CHARS = 4_000_000
FAR_EPOCH = "999999"


@dataclass
class Attack:
    """What the attacking lanes were answered (status -> count) and how long the refusals
    took at most."""

    statuses: dict[int, int] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    slowest_refusal_s: float = 0.0

    def note(self, response: Any, seconds: float) -> None:
        self.statuses[response.status_code] = self.statuses.get(response.status_code, 0) + 1
        if response.status_code != 200:
            code = response.json()["error"]["code"]
            self.codes[code] = self.codes.get(code, 0) + 1
            self.slowest_refusal_s = max(self.slowest_refusal_s, seconds)


def flood_texts(n: int) -> list[str]:
    """Distinct texts, each long enough that the model reads its whole max_seq_length."""
    return [sentence(500_000 + i, words=120) for i in range(n)]


async def _attack_lane(
    base_url: str,
    task: str,
    kind: str,
    api_key: str | None,
    stop: asyncio.Event,
    seen: Attack,
    flood_inputs: int,
) -> None:
    import httpx
    import msgpack

    headers = {"Content-Type": "application/msgpack"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    if kind == "epoch":
        texts, headers = ["frage"], {**headers, "X-Taskfleet-Min-Epoch": FAR_EPOCH}
        headers["X-Taskfleet-Timeout-Ms"] = "60000"
    elif kind == "huge":
        texts = ["x" * HUGE_TEXT_CHARS]
        headers["X-Taskfleet-Timeout-Ms"] = "120000"
    else:
        texts = flood_texts(flood_inputs)
        headers["X-Taskfleet-Timeout-Ms"] = "60000"
    body = msgpack.packb({"inputs": texts, "kind": "passage"})
    async with httpx.AsyncClient(timeout=180) as http:
        while not stop.is_set():
            began = time.monotonic()
            response = await http.post(f"{base_url}/v1/tasks/{task}", content=body, headers=headers)
            seen.note(response, time.monotonic() - began)
            if response.status_code == 429:  # at its quota: as often as the quota allows
                wait = float(response.headers.get("Retry-After", "1"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            elif response.status_code != 200:
                await asyncio.sleep(0.05)  # refused at once: again, but not in a busy loop


def _attacker(
    base_url: str,
    task: str,
    kinds: list[str],
    api_key: str | None,
    flood_inputs: int,
    started: Any,
    stop: Any,
    results: Any,
) -> None:
    """The attacking caller in a process of its own (as on another machine, so that it slows
    the normal caller only through the fleet): its lanes until ``stop``, then what they were
    answered into ``results``."""
    seen = Attack()

    async def run() -> None:
        stopping = asyncio.Event()

        async def watch() -> None:
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            stopping.set()

        lanes = [
            _attack_lane(base_url, task, kind, api_key, stopping, seen, flood_inputs)
            for kind in kinds
        ]
        await asyncio.gather(watch(), *lanes)

    asyncio.run(run())
    results.put((seen.statuses, seen.codes, seen.slowest_refusal_s))


def hostile_caller(
    fleet: LocalFleet,
    task: str,
    reference: Reference,
    load: Load,
    *,
    attacks: tuple[str, ...] = ATTACKS,
    lanes: int = 2,
    normal_key: str | None = None,
    attacker_key: str | None = None,
    flood_inputs: int = 64,
) -> FaultRun:
    """A normal caller's counted stream (``normal_key``) while another caller
    (``attacker_key``, its own process) keeps ``lanes`` connections per attack busy with the
    worst requests (``ATTACKS``; a flood holds ``flood_inputs`` texts, the most its token
    burst allows) until the stream has ended. The notes say what the attacker was answered."""
    import multiprocessing

    window = Window(f"hostile caller ({', '.join(attacks)})")
    spawn = multiprocessing.get_context("spawn")  # no fork of a process running threads
    started, stop, results = spawn.Event(), spawn.Event(), spawn.Queue()
    kinds = [kind for kind in attacks for _ in range(lanes)]
    args = (fleet.gateway_url, task, kinds, attacker_key, flood_inputs, started, stop, results)
    attacker = spawn.Process(target=_attacker, args=args, name="hostile-caller", daemon=True)
    attacker.start()
    try:
        if not started.wait(timeout=120):
            raise RuntimeError("the attacking process did not start")
        time.sleep(0.5)  # the attack is under way before the stream begins
        client = _client(fleet, task, reference, load, api_key=normal_key)

        async def normal() -> Tally:
            async with client:
                return await client.stream(_counted(load), concurrency=load.concurrency)

        tally = asyncio.run(normal())
    finally:
        stop.set()
    # Lanes finish the request they are in: at most its timeout (the huge text's 120 s).
    statuses, codes, slowest = results.get(timeout=240)
    attacker.join(timeout=30)
    notes = {
        "attacker": {str(k): v for k, v in sorted(statuses.items())},
        "attacker_codes": dict(sorted(codes.items())),
        "slowest_refusal_s": round(slowest, 2),
    }
    return FaultRun(window.name, tally, window.close(), notes)
