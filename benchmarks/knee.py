"""Benchmark: the knee of the central pull queue against a push router, under uneven load.

One fleet, built from the real parts: nats-server, `taskfleet serve --no-auth` (registry on
SQLite, placement publisher), `taskfleet gateway --no-auth`, and N workers (the real sidecar,
each supervising its own PyTorch runtime, `OMP_NUM_THREADS=1`). All workers serve the packaged
all-MiniLM-L6-v2. The load generator sends open-loop Poisson arrivals over HTTP (msgpack) to
the gateway, stepping the offered rate, and checks every reply against in-process vectors.

Modes, same fleet, same arrivals per rate, modes alternating step by step:
- **pull** (taskfleet): every request goes to task `knee-pull`, placed on all N workers; their
  sidecars pull from its one JetStream queue (the product, default sidecar settings).
- **push-rr** / **push-lo**: a router assigns each request to one worker up front. Emulated
  without product changes: each worker also serves a task of its own (`knee-w<i>-<j>`, names
  chosen so that the sidecars' rendezvous hashing gives each to exactly worker i; replicas 1),
  and the load generator, acting as the router, picks the task name per request: round-robin,
  or least-outstanding (fewest of its own requests in flight on that worker; an exact, instant
  view, a stronger baseline than a router that refreshes its view periodically).

Uneven load: heavy-tailed request sizes (most requests embed one query; `--bulk-share` of them
embed `--bulk-size` passages) and one worker `--slow-factor` times slower (emulated by
benchmarks/slow_runtime.py: it sleeps that much longer than each call took, as an older
machine). The knee of a mode is the highest offered rate at which (and at every rate below it)
every request is answered, right, and the one-query requests' p99 stays under `--p99-bound-s`.
Writes reports/serving/knee.md + knee.png + knee.json (the raw steps) with --report.

    .venv/bin/python -m benchmarks.knee --report
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks import knee_sim
from benchmarks.common import (
    CORPUS,
    QUERIES,
    REPO,
    cpu_seconds,
    load_passages,
    machine,
    packaged_model,
)
from benchmarks.knee_load import MODES, Arrival, Router, schedule
from benchmarks.knee_report import Run, Step, write_report

REPORT = REPO / "reports" / "serving" / "knee.md"
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# ---- the fleet -----------------------------------------------------------------------------
def holders(task: str, replicas: int, worker_ids: list[str]) -> set[str]:
    """The workers that hold a task placed with ``replicas``: the sidecar's rendezvous hashing
    (sidecar/src/members.rs: the highest sha256 of task NUL worker id)."""
    ranked = sorted(
        worker_ids, key=lambda w: hashlib.sha256(f"{task}\0{w}".encode()).digest(), reverse=True
    )
    return set(ranked[:replicas])


def task_on(prefix: str, targets: list[str], worker_ids: list[str]) -> str:
    """A task name ``prefix-<j>`` that rendezvous hashing places on exactly ``targets``."""
    j = 0
    while holders(f"{prefix}-{j}", len(targets), worker_ids) != set(targets):
        j += 1
    return f"{prefix}-{j}"


@dataclass
class Fleet:
    """Two groups of N workers on one NATS, one gateway, one control plane. Each worker holds
    exactly one task (an idle task's loop would hold one of its sidecar's in-flight batch
    permits while it long-polls, so a worker serving both modes' tasks would run each mode
    with fewer permits): the pull group holds the shared task, push worker i its own."""

    root: Path
    model_path: Path
    workers: int
    slow_factor: float
    sidecar_args: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sidecars: list[Any] = field(default_factory=list)
    nats: Any = None
    url: str = ""
    pull_ids: list[str] = field(default_factory=list)
    push_ids: list[str] = field(default_factory=list)
    pull_task: str = ""
    tasks: list[str] = field(default_factory=list)  # push worker i's own task

    def start(self) -> Fleet:
        from registry import Registry
        from serving.embedded_nats import EmbeddedNats, free_port
        from taskfleet.stack import SidecarProcess, find_sidecar_binary
        from testbed.fleet import register_served_task

        self.nats = EmbeddedNats(self.root / "nats").start()
        self.pull_ids = [f"knee-pull-w{i}" for i in range(self.workers)]
        self.push_ids = [f"knee-push-w{i}" for i in range(self.workers)]
        everyone = self.pull_ids + self.push_ids
        self.pull_task = task_on("knee-pull", self.pull_ids, everyone)
        self.tasks = [task_on(f"knee-w{i}", [w], everyone) for i, w in enumerate(self.push_ids)]
        reg = Registry.open(
            f"sqlite:///{self.root / 'registry.db'}", artifact_dir=self.root / "artifacts"
        )
        try:
            # Admin overrides place them, pinned (no eval run in a serving benchmark).
            for task, replicas in [(self.pull_task, self.workers), *((t, 1) for t in self.tasks)]:
                register_served_task(
                    reg, task, self.model_path, model_name="minilm", pinned=True,
                    replicas=replicas,
                )  # fmt: skip
        finally:
            reg.close()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("TASKFLEET_NATS_URL", None)
        port = free_port()
        taskfleet = [sys.executable, "-m", "taskfleet", "--home", str(self.root)]
        for name, command in (
            # No re-evaluation of the override-placed models beside the measured load.
            (
                "serve",
                [*taskfleet, "serve", "--no-auth", "--no-reevaluate", "--port", str(free_port())],
            ),
            ("gateway", [*taskfleet, "gateway", "--no-auth", "--port", str(port)]),
        ):
            log = (self.root / f"{name}.log").open("wb")
            self.processes.append(
                subprocess.Popen(
                    [*command, "--nats-url", self.nats.url],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        binary = find_sidecar_binary()
        slow_runtime = f"-m benchmarks.slow_runtime --slow-factor {self.slow_factor}"
        for worker in everyone:
            slow = worker.endswith("-w0") and self.slow_factor > 1
            runtime = (
                f"{shlex.quote(sys.executable)} "
                f"{slow_runtime if slow else '-m serving.runtime.server'} "
                "--socket {socket} --device cpu"
            )
            sidecar = SidecarProcess(
                binary=binary,
                nats_url=self.nats.url,
                worker_id=worker,
                run_dir=self.root / "run",
                metrics_addr=f"127.0.0.1:{free_port()}",
                runtime_cmd=runtime,
                extra_args=self.sidecar_args,
                env={"RUST_LOG": "info,async_nats=warn", **THREAD_ENV},
            )
            sidecar.start()
            self.sidecars.append(sidecar)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def group(self, mode: str) -> list[int]:
        """Indices into ``sidecars`` of the workers that serve ``mode``."""
        n = self.workers
        return list(range(n)) if mode == "pull" else list(range(n, 2 * n))

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.stop(timeout_s=10)
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if self.nats is not None:
            self.nats.cleanup()

    def metrics(self) -> list[dict[str, float]]:
        """Per worker: Prometheus samples of its sidecar, name{labels} -> value."""
        import httpx

        out = []
        for sidecar in self.sidecars:
            text = httpx.get(f"http://{sidecar.metrics_addr}/metrics", timeout=10).text
            samples = {}
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    samples[name] = float(value)
            out.append(samples)
        return out

    def runtime_calls(self, index: int) -> tuple[float, float]:
        """Sidecar ``index``'s runtime infer calls so far: (seconds in all, calls)."""
        import httpx

        text = httpx.get(f"http://{self.sidecars[index].metrics_addr}/metrics", timeout=10).text
        total = calls = 0.0
        for line in text.splitlines():
            if 'op="infer"' in line and line.startswith("taskfleet_sidecar_runtime_seconds_"):
                name, _, value = line.rpartition(" ")
                if name.startswith("taskfleet_sidecar_runtime_seconds_sum"):
                    total += float(value)
                elif name.startswith("taskfleet_sidecar_runtime_seconds_count"):
                    calls += float(value)
        return total, calls

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                role = cast("list[str]", process.args)[5]  # serve or gateway
                sys.exit(f"error: {role} exited; see logs under {self.root}")
        for sidecar in self.sidecars:
            if not sidecar.running():
                sys.exit(f"error: sidecar {sidecar.worker_id} exited:\n{sidecar.log_tail(30)}")


# ---- load ----------------------------------------------------------------------------------
@dataclass
class Pools:
    queries: list[str]
    passages: list[str]
    query_vectors: np.ndarray
    passage_vectors: np.ndarray
    # Each text's token length as the runtime counts it (truncated): the simulation's sizes.
    query_tokens: list[int]
    passage_tokens: list[int]


async def run_step(
    client: Any,
    router: Router,
    tasks: tuple[str, list[str]],
    arrivals: list[Arrival],
    pools: Pools,
    step: Step,
) -> None:
    """Sends ``arrivals`` open-loop to the pull task or the push task the router picks
    (``tasks``: the pull task, push worker i's task) and records what comes back."""
    import httpx

    from serving.client import TaskfleetError

    pull_task, push_tasks = tasks
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def one(arrival: Arrival) -> None:
        due = started + arrival.at
        step.send_lag.append(loop.time() - due)
        texts = [(pools.passages if arrival.bulk else pools.queries)[i] for i in arrival.texts]
        expected = (pools.passage_vectors if arrival.bulk else pools.query_vectors)[
            list(arrival.texts)
        ]
        worker = router.pick()
        try:
            reply = await client.embed_with_info(
                push_tasks[worker] if worker >= 0 else pull_task,
                texts,
                kind="passage" if arrival.bulk else "query",
                timeout_ms=300_000,
            )
        except (TaskfleetError, httpx.TransportError) as e:
            code = getattr(e, "code", None) or type(e).__name__
            step.errors[code] = step.errors.get(code, 0) + 1
            return
        finally:
            router.done(worker)
        now = loop.time()
        step.answered += 1
        step.texts += len(texts)
        step.last_answer_s = max(step.last_answer_s, now - started)
        (step.bulk_latency if arrival.bulk else step.small_latency).append(now - due)
        vectors = np.asarray(reply.vectors, dtype=np.float64)
        if vectors.shape != expected.shape:
            step.wrong += 1
            return
        norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
        if float(np.min(np.sum(vectors * expected, axis=1) / norms)) < 0.999:
            step.wrong += 1

    pending = []
    for arrival in arrivals:
        delay = started + arrival.at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(arrival)))
        step.sent += 1
    await asyncio.gather(*pending)


def profile(fleet: Fleet) -> tuple[list[float], list[float], list[float]]:
    """Per worker so far: its runtime's CPU seconds (the runtime is the sidecar's child),
    requests answered and tokens batched (all tasks, from the sidecar's /metrics)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(stat.parent.name))
    cpu = [sum(cpu_seconds(pid) for pid in parents.get(s.pid or -1, [])) for s in fleet.sidecars]
    replies, tokens = [], []
    for samples in fleet.metrics():
        replies.append(
            sum(v for k, v in samples.items() if k.startswith("taskfleet_sidecar_replies_total"))
        )
        tokens.append(
            sum(v for k, v in samples.items() if k.startswith("taskfleet_sidecar_batch_tokens_sum"))
        )
    return cpu, replies, tokens


# ---- the run -------------------------------------------------------------------------------
def references(model_path: Path, args: argparse.Namespace) -> Pools:
    from sentence_transformers import SentenceTransformer

    queries = load_passages(QUERIES, args.query_pool, args.seed)
    passages = load_passages(CORPUS, args.passage_pool, args.seed)
    from serving.runtime.encoder import Encoder
    from serving.runtime.model_folder import ModelSpec

    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    encoder = Encoder(ModelSpec(base_path=model_path), model=model)
    return Pools(
        queries,
        passages,
        np.asarray(model.encode(queries, batch_size=32), dtype=np.float64),
        np.asarray(model.encode(passages, batch_size=32), dtype=np.float64),
        encoder.token_lengths(queries),
        encoder.token_lengths(passages),
    )


#: Batches the calibration sends, (questions, passages): lone and batched queries, bulk
#: requests of several sizes, and mixes, which the fleet's fills form under load.
CALIBRATION_BATCHES = (
    (1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (32, 0), (0, 1), (0, 2), (0, 4), (0, 8),
    (0, 16), (0, 32), (0, 48), (1, 16), (4, 16), (8, 32),
)  # fmt: skip


async def calibrate(fleet: Fleet, pools: Pools, args: argparse.Namespace) -> dict[str, Any]:
    """Service times for the simulation (benchmarks/knee_sim.py ``Calibration``), measured on
    this fleet before the steps: batches of known texts sent one at a time to push worker 0
    (the slow one) and push worker 1, each one request so one runtime call, timed by the
    sidecar (the change of its runtime-seconds sum); then lone questions to worker 1, whose
    time from send to reply less that call is the path around the runtime."""
    from serving.client import AsyncClient

    rng = random.Random(args.seed)
    plan = [
        (kind, q, p)
        for _ in range(args.calibration_repeats)
        for kind in ("slow", "fast")
        for q, p in CALIBRATION_BATCHES
    ]
    rng.shuffle(plan)  # drift on a shared machine hits every size alike
    points: dict[str, list[tuple[list[int], float]]] = {"slow": [], "fast": []}
    path: list[float] = []
    async with AsyncClient(fleet.url, timeout_s=600, max_retries=0) as client:

        async def timed(kind: str, questions: list[int], passages: list[int]) -> float:
            worker = 0 if kind == "slow" else 1
            index = fleet.workers + worker  # push worker i
            before = fleet.runtime_calls(index)
            texts = [pools.queries[i] for i in questions] + [pools.passages[i] for i in passages]
            started = time.perf_counter()
            await client.embed(fleet.tasks[worker], texts, kind="passage", timeout_ms=300_000)
            took = time.perf_counter() - started
            after = fleet.runtime_calls(index)
            if after[1] - before[1] != 1:
                raise RuntimeError(f"expected one runtime call, saw {after[1] - before[1]:g}")
            seconds = after[0] - before[0]
            lengths = [pools.query_tokens[i] for i in questions]
            points[kind].append((lengths + [pools.passage_tokens[i] for i in passages], seconds))
            return took - seconds

        for kind, q, p in plan:
            await timed(
                kind,
                rng.sample(range(len(pools.queries)), q),
                [rng.randrange(len(pools.passages)) for _ in range(p)],
            )
        for _ in range(args.calibration_repeats * 10):
            path.append(await timed("fast", [rng.randrange(len(pools.queries))], []))
    return {
        "points": points,
        "path_s": float(np.median(path)),
        "query_tokens": pools.query_tokens,
        "passage_tokens": pools.passage_tokens,
    }


async def wait_ready(fleet: Fleet, timeout_s: float) -> None:
    """Until every task answers through the gateway (each worker has loaded the model)."""
    from serving.client import AsyncClient

    deadline = time.monotonic() + timeout_s
    async with AsyncClient(fleet.url, timeout_s=60, max_retries=0) as client:
        for task in [fleet.pull_task, *fleet.tasks]:
            while True:
                fleet.check_alive()
                try:
                    await client.embed(task, "warm up", kind="query", timeout_ms=30_000)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        sys.exit(f"error: task {task} did not serve within {timeout_s:.0f}s")
                    await asyncio.sleep(0.5)


async def sweep(fleet: Fleet, pools: Pools, args: argparse.Namespace) -> list[Step]:
    import httpx

    from serving.client import AsyncClient

    steps: list[Step] = []
    active = list(args.modes)
    # Idle connections are dropped after 2 s, before uvicorn's 5 s keep-alive closes them
    # from its side: reusing one the server is closing fails the request with a ReadError.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0)
    http = httpx.AsyncClient(timeout=600, limits=limits)
    async with AsyncClient(fleet.url, timeout_s=600, max_retries=30, http=http) as client:
        for index, rate in enumerate(args.rates):
            arrivals = schedule(
                rate,
                args.step_seconds,
                args.bulk_share,
                args.bulk_size,
                (len(pools.queries), len(pools.passages)),
                seed=args.seed * 1000 + index,
            )
            for mode in list(active):
                fleet.check_alive()
                step = Step(mode, rate, args.step_seconds, load=os.getloadavg()[0])
                router = Router(mode, len(fleet.tasks))
                before = profile(fleet)
                tasks = (fleet.pull_task, fleet.tasks)
                await run_step(client, router, tasks, arrivals, pools, step)
                after = profile(fleet)
                step.cpu_s, step.worker_replies, step.worker_tokens = (
                    [x[i] - y[i] for i in fleet.group(mode)]
                    for x, y in zip(after, before, strict=True)
                )
                steps.append(step)
                print(json.dumps(step.row()), flush=True)
                # One step past the knee shows the cliff; further steps only cost time.
                if not step.ok(args.p99_bound_s):
                    past = [s for s in steps if s.mode == mode and not s.ok(args.p99_bound_s)]
                    if len(past) >= 2:
                        active.remove(mode)
                await asyncio.sleep(1.0)
            if not active:
                break
    return steps


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="sidecar+runtime pairs")
    parser.add_argument(
        "--slow-factor", type=float, default=2.0, help="worker 0 is this much slower (1: none)"
    )
    parser.add_argument(
        "--rates",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
        help="offered requests/s, comma-separated, ascending",
    )
    parser.add_argument("--step-seconds", type=float, default=30.0)
    parser.add_argument("--bulk-share", type=float, default=0.1)
    parser.add_argument("--bulk-size", type=int, default=16, help="passages per bulk request")
    parser.add_argument(
        "--p99-bound-s",
        type=float,
        default=5.0,
        help="the knee's bound on the one-query requests' p99 (the report adds 2, 5 and 10 s)",
    )
    parser.add_argument(
        "--sidecar-args",
        default="",
        help="extra sidecar flags for every worker, e.g. '--max-inflight-batches 1' "
        "(default: none, the product's defaults)",
    )
    parser.add_argument("--modes", default=",".join(MODES), type=lambda s: s.split(","))
    parser.add_argument(
        "--calibration-repeats",
        type=int,
        default=3,
        help="times each calibration batch is measured on each kind of worker",
    )
    parser.add_argument(
        "--sim-workers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[4, 16, 64, 256],
        help="fleet sizes the simulation finds the knee at (comma-separated)",
    )
    parser.add_argument(
        "--sim-slowest",
        type=float,
        default=3.0,
        help="the simulated fleets' speeds spread evenly from 1x to this",
    )
    parser.add_argument("--sim-seeds", type=int, default=3, help="arrival processes per knee")
    parser.add_argument("--query-pool", type=int, default=64)
    parser.add_argument("--passage-pool", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, default=None, help="default: the packaged MiniLM")
    parser.add_argument("--report", action="store_true", help=f"write {REPORT.relative_to(REPO)}")
    parser.add_argument("--report-path", type=Path, default=REPORT)
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="write the report again from a run's raw results (the .json beside its report) "
        "instead of measuring",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.modes) - set(MODES):
        parser.error(f"unknown mode(s) {sorted(unknown)}; known: {', '.join(MODES)}")
    if args.workers < 2 or not 0 <= args.bulk_share <= 1 or args.slow_factor < 1:
        parser.error("need --workers >= 2, 0 <= --bulk-share <= 1, --slow-factor >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parse_args(given)
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        run = Run(**{**raw, "steps": [Step(**step) for step in raw["steps"]]})
        measured = parse_args(run.argv)
        measured.sim_workers, measured.sim_seeds = args.sim_workers, args.sim_seeds
        measured.sim_slowest = args.sim_slowest
        lines = simulated(run, measured, args.report_path)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        lines[2:2] = [
            f"Simulated {when}, after the run, from its raw results: `.venv/bin/python -m "
            f"benchmarks.knee --from-json {args.from_json}`.",
            "",
        ]
        write_report(run, measured, args.report_path, lines)
        return 0
    model_path = args.model or packaged_model()
    command = f".venv/bin/python -m benchmarks.knee {shlex.join(given)}".rstrip()
    print("in-process reference vectors ...", flush=True)
    pools = references(model_path, args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="taskfleet-knee-") as tmp:
        fleet = Fleet(
            Path(tmp), model_path, args.workers, args.slow_factor, shlex.split(args.sidecar_args)
        )
        try:
            fleet.start()
            print(f"fleet at {fleet.url}; push tasks {fleet.tasks}", flush=True)
            asyncio.run(wait_ready(fleet, 300))
            print("calibrating the simulation's service times ...", flush=True)
            calibration = asyncio.run(calibrate(fleet, pools, args))
            steps = asyncio.run(sweep(fleet, pools, args))
            misplaced = check_placement(fleet)
        finally:
            fleet.stop()
    run = Run(
        argv=given,
        command=command,
        measured=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        machine=machine(),
        pull_task=fleet.pull_task,
        tasks=fleet.tasks,
        misplaced=misplaced,
        steps=steps,
        calibration=calibration,
    )
    if args.report:
        args.report_path.parent.mkdir(parents=True, exist_ok=True)
        raw = {**asdict(run), "steps": [asdict(step) for step in steps]}
        args.report_path.with_suffix(".json").write_text(json.dumps(raw) + "\n")
        write_report(run, args, args.report_path, simulated(run, args, args.report_path))
    bad = [s for s in steps if s.wrong or s.answered != s.sent]
    if misplaced:
        print(f"error: tasks answered by other workers: {misplaced}", file=sys.stderr)
    if bad:
        print(f"error: wrong or unanswered replies in {len(bad)} step(s)", file=sys.stderr)
    return 1 if bad or misplaced else 0


def simulated(run: Run, args: argparse.Namespace, report: Path) -> list[str]:
    """The report's simulation section: this run replayed, then fleets of --sim-workers."""
    pools = (args.query_pool, args.passage_pool)

    def arrivals(index: int, rate: float) -> list[Arrival]:
        return schedule(
            rate, args.step_seconds, args.bulk_share, args.bulk_size, pools,
            seed=args.seed * 1000 + index,
        )  # fmt: skip

    started = time.monotonic()
    lines = knee_sim.section(
        run.calibration, run.steps, args, arrivals, report.with_name(f"{report.stem}-scale.png"),
        knee_sim.ScaleSettings(
            tuple(args.sim_workers), args.sim_slowest, tuple(range(args.sim_seeds))
        ),
    )  # fmt: skip
    print(f"simulation: {time.monotonic() - started:.0f} s", flush=True)
    return lines


def check_placement(fleet: Fleet) -> list[str]:
    """Each task was answered by its own workers only (the emulation held)."""
    own = {fleet.pull_task: set(fleet.group("pull"))}
    own.update({task: {fleet.workers + i} for i, task in enumerate(fleet.tasks)})
    misplaced = []
    for i, samples in enumerate(fleet.metrics()):
        for task, workers in own.items():
            served = sum(
                v
                for k, v in samples.items()
                if k.startswith("taskfleet_sidecar_replies_total") and f'task="{task}"' in k
            )
            if i not in workers and served:
                misplaced.append(f"{task} on {fleet.sidecars[i].worker_id}")
    return misplaced


if __name__ == "__main__":
    sys.exit(main())
