"""`taskfleet tune TASK`: sweep the served model's runtime knobs on this machine, through the
real stack, and record the best as the model's runtime profile for this machine class.

How a sweep runs: a private stack (`taskfleet up --workers 1 --no-auth` in a temporary home,
its own SQLite registry, nats-server, gateway, control plane and one real worker) serves the
task's current base model. Each configuration is applied the way a recorded profile reaches a
fleet: the private registry records it for this machine class (registry/profiles.py), the
placement epoch it writes is published, and the worker reloads the model with it; the sweep
waits until the worker's heartbeat names the profile, warms the model, then measures closed
loops of single-text embed requests (the online case) at rising concurrency. A configuration's
figure is its **knee under the bound**: the most texts/s of a level whose p99 latency stays
within ``--p99-ms``. The defaults (no profile) are always configuration 0.

The sweep changes one knob at a time from the defaults, then measures the combination of every
knob that beat the defaults; the best configuration is applied once more and measured again, and
that figure is what the user's registry records (``ProfileCreate.throughput``). If the measured
again figure falls below the defaults', the defaults are kept: no profile is recorded (one
that exists is left alone) and the command says so.

Profiles are recorded in the registry `taskfleet` is pointed at, keyed by the model's sha256 and
``serving.machine.machine_class()``; placements carry them and only workers of this class apply
them (sidecar/src/placement.rs).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from registry import Registry
from registry import entities as e
from registry.errors import InvalidInput, NotFound

#: Concurrency levels of a configuration's closed loops (requests in flight, 1 text each).
DEFAULT_LEVELS = (1, 8, 32)
#: Seconds of closed-loop load at the highest level before each configuration is measured.
WARM_S = 4.0
#: The knobs the sweep tries, each alone from the defaults (values other than the defaults).
DEFAULT_KNOBS: dict[str, tuple[Any, ...]] = {
    "max_batch_tokens": (4096,),
    "max_batch_wait_ms": (0, 2),
    "intra_op_threads": (1,),
    "runtimes": (2,),
    "max_padding": (0.3,),
    "engine": ("onnx",),
}
KNOBS = tuple(e.RuntimeSettings.__dataclass_fields__)


class TuneError(RuntimeError):
    """The sweep cannot run (the task, its model, the private stack): one line for the user."""


@dataclass(frozen=True)
class Level:
    concurrency: int
    texts_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int


@dataclass(frozen=True)
class Measured:
    settings: dict[str, Any]  # the knobs set (empty: the defaults)
    levels: list[Level]
    p99_bound_ms: float

    @property
    def throughput(self) -> float:
        """Texts/s at the knee under the bound: the best level whose p99 is within it."""
        within = [lv.texts_per_s for lv in self.levels if lv.p99_ms <= self.p99_bound_ms]
        return max(within, default=0.0)

    def row(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "throughput": self.throughput,
            "levels": [asdict(lv) for lv in self.levels],
        }


@dataclass
class TuneResult:
    task: str
    model: str
    machine_class: str
    p99_bound_ms: float
    sweep: list[Measured] = field(default_factory=list)
    best: Measured | None = None
    again: Measured | None = None  # the best, applied once more and measured again
    profile: e.RuntimeProfile | None = None  # what was recorded (None: the defaults kept)
    seconds: float = 0.0

    @property
    def defaults(self) -> Measured:
        return self.sweep[0]

    @property
    def ratio(self) -> float:
        """Measured-again throughput of what is kept over the defaults' (1.0: defaults kept)."""
        if self.profile is None or self.again is None or self.defaults.throughput <= 0:
            return 1.0
        return self.again.throughput / self.defaults.throughput

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "machine_class": self.machine_class,
            "p99_bound_ms": self.p99_bound_ms,
            "sweep": [m.row() for m in self.sweep],
            "best": self.best.row() if self.best else None,
            "again": self.again.row() if self.again else None,
            "profile_id": self.profile.id if self.profile else None,
            "ratio_to_defaults": round(self.ratio, 4),
            "seconds": round(self.seconds, 1),
        }


def parse_knobs(given: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``--knob max_batch_wait_ms=0,2`` (repeatable) -> {knob: values}; none given: the
    default sweep."""
    if not given:
        return dict(DEFAULT_KNOBS)
    knobs: dict[str, tuple[Any, ...]] = {}
    for item in given:
        name, sep, values = item.partition("=")
        if not sep or name not in KNOBS or not values:
            raise InvalidInput(
                f"--knob {item!r} must read NAME=V1[,V2...] with NAME one of {', '.join(KNOBS)}"
            )
        knobs[name] = tuple(_value(name, v) for v in values.split(","))
    return knobs


def _value(name: str, raw: str) -> Any:
    if name == "engine":
        return raw
    try:
        return float(raw) if name == "max_padding" else int(raw)
    except ValueError:
        raise InvalidInput(f"--knob {name}: {raw!r} is not a number") from None


def configurations(knobs: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The defaults, then each knob's values alone."""
    return [{}] + [{name: value} for name, values in knobs.items() for value in values]


def tune(
    registry: Registry,
    task: str,
    *,
    p99_ms: float,
    texts: Sequence[str] | None = None,
    knobs: dict[str, tuple[Any, ...]] | None = None,
    levels: Sequence[int] = DEFAULT_LEVELS,
    seconds: float = 8.0,
    device: str = "cpu",
    data_root: Path | None = None,
    record: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Sweep, pick, measure again and record (see the module's note)."""
    from serving.machine import machine_class

    if p99_ms <= 0 or seconds <= 0 or not levels or min(levels) < 1:
        raise InvalidInput("--p99-ms and --seconds must be > 0, --levels whole numbers >= 1")
    started = time.monotonic()
    placement = registry.current_placement(task)
    if placement is None:
        raise NotFound(f"task {task!r} has no placement: promote a candidate first")
    if placement.runtime != "torch":
        raise InvalidInput(f"task {task!r} runs on {placement.runtime}: only torch is tuned")
    candidate = registry.get_candidate(task, placement.candidate)
    if candidate.base_model is None:
        raise InvalidInput(f"task {task!r} serves {candidate.name!r}, which has no model")
    suite = registry.get_suite(registry.get_task(task).suite)
    if suite.kind != "retrieval":
        raise InvalidInput(f"task {task!r} is a {suite.kind} task: only embeddings are tuned")
    model = registry.get_model(candidate.base_model)
    pool = list(texts) if texts else suite_texts(registry, task, data_root)
    result = TuneResult(task, model.name, machine_class(device), p99_ms)
    with PrivateStack(model, suite, device) as stack:
        progress(f"private stack up: {stack.gateway}")
        for settings in configurations(knobs or dict(DEFAULT_KNOBS)):
            result.sweep.append(stack.measure(settings, pool, levels, seconds, p99_ms, progress))
        defaults = result.defaults
        winners = [
            m for m in result.sweep[1:] if m.throughput > defaults.throughput * 1.03
        ]  # noise on a shared machine is a few per cent: only a clear win is combined
        combined: dict[str, Any] = {}
        for m in sorted(winners, key=lambda m: m.throughput):
            combined.update(m.settings)  # the better value of a knob last
        if len(winners) > 1:
            result.sweep.append(stack.measure(combined, pool, levels, seconds, p99_ms, progress))
        result.best = max(result.sweep, key=lambda m: (m.throughput, not m.settings))
        if result.best.settings:
            result.again = stack.measure(
                result.best.settings, pool, levels, seconds, p99_ms, progress, again=True
            )
    if (
        record
        and result.best.settings
        and result.again is not None
        and result.again.throughput >= defaults.throughput
    ):
        result.profile = registry.record_profile(
            e.ProfileCreate(
                model=model.name,
                machine_class=result.machine_class,
                settings=e.RuntimeSettings(**result.best.settings),
                task=task,
                p99_bound_ms=p99_ms,
                throughput=result.again.throughput,
                default_throughput=defaults.throughput,
                sweep=[m.row() for m in result.sweep],
            )
        )
    result.seconds = time.monotonic() - started
    return result


def suite_texts(
    registry: Registry, task: str, data_root: Path | None = None, count: int = 512
) -> list[str]:
    """The task's traffic as the sweep replays it: passages of its suite's test split."""
    from evals.runner import EvalPaths, task_suite

    try:
        spec = task_suite(registry, task, EvalPaths(cache_dir=Path(tempfile.gettempdir())))
        split = spec.load(spec.test_split, data_root)
    except Exception as exc:  # the suite's own readers: missing files, bad JSON
        raise TuneError(f"cannot read the suite of {task!r} ({exc}); pass --texts FILE") from None
    corpus = list(getattr(split, "corpus", {}).values())
    if not corpus:
        raise TuneError(f"the suite of {task!r} has no passages; pass --texts FILE")
    random.Random(0).shuffle(corpus)
    return corpus[:count]


class PrivateStack:
    """`taskfleet up --workers 1 --no-auth` in a temporary home whose registry serves the
    model under the task's suite; configurations are applied as profiles of this machine."""

    TASK = "tune"

    def __init__(self, model: e.BaseModel, suite: e.Suite, device: str) -> None:
        from serving.embedded_nats import free_port
        from serving.machine import machine_class

        self.model, self.suite, self.device = model, suite, device
        self.machine_class = machine_class(device)
        self._tmp = tempfile.TemporaryDirectory(prefix="taskfleet-tune-")
        self.home = Path(self._tmp.name)
        self.database_url = f"sqlite:///{self.home / 'registry.db'}"
        self.port, self.control_port = free_port(), free_port()
        self.gateway = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.reg: Registry | None = None

    def __enter__(self) -> PrivateStack:
        try:
            self._register()
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.reg is not None:
            self.reg.close()
        self._tmp.cleanup()

    def _register(self) -> None:
        reg = Registry.open(self.database_url, artifact_dir=self.home / "artifacts", actor="tune")
        self.reg = reg
        s = self.suite
        reg.add_suite(
            e.SuiteCreate(
                name=s.name, kind=s.kind, location=s.location, test_split=s.test_split,
                main_metric=s.main_metric, metrics=list(s.metrics), fingerprint=s.fingerprint,
                train_split=s.train_split,
            )
        )  # fmt: skip
        reg.add_task(self.TASK, suite=s.name)
        m = self.model
        path = Path(m.path) if m.path else None
        reg.add_model(
            m.name, path=path, package=None if path else m.package,
            query_prefix=m.query_prefix, passage_prefix=m.passage_prefix,
        )  # fmt: skip
        if reg.get_model(m.name).sha256 != m.sha256:
            raise TuneError(f"the files of model {m.name!r} changed since it was registered")
        candidate = reg.add_candidate(self.TASK, base=m.name)
        reg.promote(self.TASK, candidate.name, override=True, reason="tuning sweep", pinned=True)

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKFLEET_")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if "TASKFLEET_DATA_DIR" in os.environ:
            env["TASKFLEET_DATA_DIR"] = os.environ["TASKFLEET_DATA_DIR"]
        log = (self.home / "stack.log").open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "taskfleet", "--home", str(self.home),
                "--database-url", self.database_url, "up", "--workers", "1", "--no-auth",
                # Measured alone: no re-evaluation of the served model beside the sweep.
                "--no-reevaluate", "--port", str(self.port),
                "--control-port", str(self.control_port), "--device", self.device,
            ],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        stack_json = self.home / "run" / "stack.json"
        deadline = time.monotonic() + 180
        while not stack_json.is_file():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.home / "stack.log").read_text(errors="replace")[-2000:]
                raise TuneError(f"the private stack did not start:\n{tail}")
            time.sleep(0.2)

    def apply(self, settings: dict[str, Any]) -> None:
        """Record ``settings`` as this machine's profile (remove it for the defaults) and wait
        until the worker's heartbeat says it applies it at the new epoch."""
        assert self.reg is not None
        reg = self.reg
        current = reg.list_profiles(self.model.name)
        if settings:
            profile_id: int | None = reg.record_profile(
                e.ProfileCreate(
                    model=self.model.name, machine_class=self.machine_class,
                    settings=e.RuntimeSettings(**settings), task=self.TASK, p99_bound_ms=0.0,
                    throughput=0.0, default_throughput=0.0,
                )
            ).id  # fmt: skip
        elif current:
            reg.remove_profile(self.model.name, self.machine_class)
            profile_id = None
        else:
            profile_id = None
        placement = reg.current_placement(self.TASK)
        assert placement is not None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            self._check_alive()
            status = {s.task: s for s in reg.placement_status()}.get(self.TASK)
            workers = reg.list_workers(reachable_only=True)
            if (
                status is not None
                and any(epoch >= placement.epoch for epoch in status.reported.values())
                and any(w.profiles.get(self.TASK) == profile_id for w in workers)
            ):
                return
            time.sleep(0.2)
        raise TuneError(f"the worker did not apply {settings or 'the defaults'} within 300 s")

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = (self.home / "stack.log").read_text(errors="replace")[-2000:]
            raise TuneError(f"the private stack stopped:\n{tail}")

    def measure(
        self,
        settings: dict[str, Any],
        texts: Sequence[str],
        levels: Sequence[int],
        seconds: float,
        p99_ms: float,
        progress: Callable[[str], None],
        *,
        again: bool = False,
    ) -> Measured:
        self.apply(settings)
        measured = Measured(
            settings, asyncio.run(self._levels(texts, levels, seconds)), p99_bound_ms=p99_ms
        )
        figures = ", ".join(
            f"{lv.concurrency}: {lv.texts_per_s:.1f}/s p99 {lv.p99_ms:.0f} ms"
            for lv in measured.levels
        )
        label = json.dumps(settings) if settings else "defaults"
        progress(
            f"{'again ' if again else ''}{label}: {measured.throughput:.1f} texts/s at the "
            f"bound ({figures})"
        )
        return measured

    async def _levels(
        self, texts: Sequence[str], levels: Sequence[int], seconds: float
    ) -> list[Level]:
        from serving.client import AsyncClient

        client = AsyncClient(self.gateway, timeout_s=120)
        try:
            # Warm, unmeasured: a newly loaded engine pays for allocation during its first
            # passes, and ONNX Runtime's arena grows with each new batch shape. One pass of
            # max(levels) texts was not enough: the engine chosen from a sweep measured 1.08x
            # its own sweep figure when applied again (reports/serving/tune.md).
            await self._level(client, texts, max(levels), WARM_S)
            return [await self._level(client, texts, c, seconds) for c in levels]
        finally:
            await client.aclose()

    async def _level(
        self, client: Any, texts: Sequence[str], concurrency: int, seconds: float
    ) -> Level:
        latencies: list[float] = []
        dims = self.model.dims
        end = time.perf_counter() + seconds
        turn = iter(range(1 << 62))

        async def loop() -> None:
            while time.perf_counter() < end:
                text = texts[next(turn) % len(texts)]
                sent = time.perf_counter()
                vectors = await client.embed(self.TASK, text, kind="passage")
                latencies.append(time.perf_counter() - sent)
                if vectors.shape[0] != 1 or (dims and vectors.shape[1] != dims):
                    raise TuneError(f"the stack answered a {vectors.shape} array for one text")

        began = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
        ordered = sorted(latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return Level(
            concurrency=concurrency,
            texts_per_s=len(latencies) / elapsed,
            p50_ms=statistics.median(ordered) * 1000,
            p99_ms=p99 * 1000,
            requests=len(latencies),
        )
