"""The PyTorch runtime: serves docs/protocol.md (sidecar <-> runtime) on a Unix socket.

    python -m serving.runtime.server --socket /run/taskfleet/torch-0.sock [--device cpu]

Loads, unloads and inference run one at a time in a single worker thread (they all touch the
shared base models), so the event loop keeps answering `hello` and `stats` while a batch runs;
the one exception is an embed batch of a model loaded with ``runtimes`` N > 1 (a runtime
profile's knob, ``serving/runtime/engines.py``), which runs on that model's own N threads, so
N of its batches run at once. A shadow's batch (``background``) runs on the background thread,
whose nice value is the lowest priority (19): the kernel gives a champion's batch the cores
first, on this runtime or any other process of the machine, while the shadow still uses what is
idle. It runs beside the inference thread's batches only when they share no mutable state
(``ModelPool.alone``) and never beside a load or unload; otherwise the inference thread runs it,
at normal priority, as any batch. Replies go out in completion order, each carrying its request's
id. When a batch op's reply is out with no other op waiting, what it freed goes back to the
system (``memory.trim``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from serving import protocol as p
from serving.runtime import memory
from serving.runtime.batch_planning import DEFAULT_MAX_PADDING
from serving.runtime.heads import HeadError
from serving.runtime.model_folder import ModelLoadError, ModelSpec
from serving.runtime.pool import (
    ClassifyWork,
    EncodeItem,
    ModelKeyConflictError,
    ModelNotLoadedError,
    ModelPool,
    ScoreWork,
    UnsupportedOpError,
)

log = logging.getLogger("taskfleet.runtime")
CAPABILITIES = ["embed", "lora", "mixed_adapters", "score", "classify"]
T = TypeVar("T")


class BatchExpired(RuntimeError):
    """A batch (infer, score or classify) whose deadline passed while it waited in the queue:
    it is not run."""


class RuntimeServer:
    def __init__(
        self, pool: ModelPool, socket_path: Path, max_frame_bytes: int = p.DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self.pool = pool
        self.socket_path = socket_path
        self.max_frame_bytes = max_frame_bytes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")
        # Shadows' batches, at the lowest CPU priority (`_lowest_priority`); `_loading` keeps
        # them apart from loads and unloads (the pool's state they read).
        self._background = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="background", initializer=_lowest_priority
        )
        self._loading = _Exclusion()
        # Model key -> its own threads, for a model loaded with runtimes > 1.
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        # Infer batches submitted to the worker thread but not started; the thread decrements.
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        """Listen until a `shutdown` request or SIGTERM/SIGINT; removes the socket on exit."""
        # The handlers before the socket: a SIGTERM sent as soon as the socket accepts (a
        # supervisor stopping a runtime it just started) must stop it cleanly, not kill it
        # with the socket left behind.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        _clear_stale_socket(self.socket_path)
        server = await asyncio.start_unix_server(self._connection, path=str(self.socket_path))
        log.info("listening on %s", self.socket_path)
        try:
            await self._stop.wait()
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
            for task in list(self._tasks):
                task.cancel()
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._background.shutdown(wait=False, cancel_futures=True)
            for lane in self._lanes.values():
                lane.shutdown(wait=False, cancel_futures=True)
            log.info("stopped")

    # ------------------------------------------------------------------ connection

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lock = asyncio.Lock()

        async def send(message: Any) -> None:
            async with lock:
                await p.write_frame(writer, message)

        try:
            while True:
                try:
                    frame = await p.read_frame(reader, self.max_frame_bytes)
                except p.FrameError as exc:
                    # The stream lost its framing; nothing after this can be trusted.
                    await send(_error(p.UNKNOWN_REQUEST_ID, exc.code, str(exc)))
                    break
                except p.ProtocolError as exc:
                    await send(_error(p.UNKNOWN_REQUEST_ID, exc.code, str(exc)))
                    continue
                if frame is None:
                    break
                task = asyncio.create_task(self._answer(frame, send))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except ConnectionError:
            pass  # the peer went away; its in-flight replies have nowhere to go
        except asyncio.CancelledError:
            # Shutdown cancels idle connections. Ending normally here matters on Python 3.11,
            # whose stream callback calls task.exception() on a cancelled handler and logs
            # the CancelledError as an error traceback.
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, frame: dict[str, Any], send: Callable[[Any], Any]) -> None:
        try:
            request = p.decode_request(frame)
        except p.ProtocolError as exc:
            request_id = p.UNKNOWN_REQUEST_ID if exc.request_id is None else exc.request_id
            await send(_error(request_id, exc.code, str(exc)))
            return
        try:
            reply = await self._dispatch(request)
        except Exception as exc:
            code, message = _classify(exc)
            if code == p.SocketErrorCode.INFER_FAILED:
                log.exception("request %s (%s) failed", request.id, request.op)
            reply = _error(request.id, code, message)
        with contextlib.suppress(ConnectionError):
            await send(reply)
        if isinstance(request, p.ShutdownRequest):
            self._stop.set()
        elif isinstance(request, p.InferRequest | p.ScoreRequest | p.ClassifyRequest):
            del request, reply  # what they hold is freed before the trim, not after it
            await self._trim_when_idle()

    async def _trim_when_idle(self) -> None:
        """Give what a batch op freed back to the system once its reply is out and nothing
        waits (``memory.trim``), on the inference thread so it never runs beside a batch of
        that thread. Trimming costs ~10 ms after a large batch and microseconds after a small
        one; it never runs between batches of a busy queue, which would only fault the same
        pages in again. After the reply rather than at the end of the batch: the reply's
        ~10 ms sooner, and what the reply and request held is freed before the trim (a
        256-text batch kept 4 MiB instead of 7).

        What no trim returns: glibc's ``malloc_trim`` leaves the top of each thread's own
        arena, which keeps up to the dynamic trim threshold (twice the largest block freed
        below 32 MiB). Which arenas a batch used depends on scheduling: under contention a
        256-text batch kept up to 27 of its 120 MiB there. Fixing the thresholds would return
        it and cost ~20% of batch throughput (a 1 MiB mmap threshold), or ~5% (one arena).
        """

        def trim_if_idle() -> None:
            if self._waiting == 0:
                memory.trim()

        if self._waiting == 0:
            with contextlib.suppress(RuntimeError):  # the executor shut down: nothing to trim
                await self._in_worker(trim_if_idle)

    # ------------------------------------------------------------------ ops

    async def _dispatch(self, request: p.SocketRequest) -> Any:
        match request:
            case p.HelloRequest():
                return self._hello(request)
            case p.LoadRequest():
                spec = ModelSpec(
                    base_path=Path(request.base_path),
                    adapter_path=Path(request.adapter_path) if request.adapter_path else None,
                    query_prefix=request.query_prefix,
                    passage_prefix=request.passage_prefix,
                    max_seq_length=request.max_seq_length,
                )
                added = await self._in_worker(
                    self._loading.alone, self.pool.load, request.model_key, spec, request.settings
                )
                lanes = self.pool.runtimes(request.model_key)
                if lanes > 1 and request.model_key not in self._lanes:
                    self._lanes[request.model_key] = ThreadPoolExecutor(
                        max_workers=lanes, thread_name_prefix=f"infer-{request.model_key}"
                    )
                return p.LoadReply(id=request.id, model_key=request.model_key, memory_bytes=added)
            case p.UnloadRequest():
                freed = await self._in_worker(
                    self._loading.alone, self.pool.unload, request.model_key
                )
                lane = self._lanes.pop(request.model_key, None)
                if lane is not None:
                    lane.shutdown(wait=False)
                return p.UnloadReply(id=request.id, model_key=request.model_key, memory_bytes=freed)
            case p.InferRequest():
                return await self._infer(request)
            case p.ScoreRequest():
                return await self._score(request)
            case p.ClassifyRequest():
                return await self._classify(request)
            case p.StatsRequest():
                total, models = self.pool.snapshot()
                return p.StatsReply(
                    id=request.id,
                    memory_bytes=total,
                    models=list(models),
                    queue_depth=self._waiting,
                )
            case p.ShutdownRequest():
                return p.ShutdownReply(id=request.id)

    def _hello(self, request: p.HelloRequest) -> Any:
        if request.protocol != p.PROTOCOL_VERSION:
            return _error(
                request.id,
                p.SocketErrorCode.BAD_REQUEST,
                f"protocol {request.protocol} is not supported; "
                f"this runtime speaks {p.PROTOCOL_VERSION}",
            )
        import torch

        return p.HelloReply(
            id=request.id,
            protocol=p.PROTOCOL_VERSION,
            runtime="torch",
            runtime_version=str(torch.__version__),
            capabilities=CAPABILITIES,
        )

    async def _infer(self, request: p.InferRequest) -> p.InferReply:
        items = [EncodeItem(i.model_key, i.kind, i.texts) for i in request.items]
        keys = {i.model_key for i in items}
        lane = self._lanes.get(next(iter(keys))) if len(keys) == 1 else None
        matrices = await self._queued(self.pool.encode, items, request, lane, keys)
        return p.InferReply(
            id=request.id,
            batch_id=request.batch_id,
            results=[p.InferResult.from_matrix(m) for m in matrices],
        )

    async def _score(self, request: p.ScoreRequest) -> p.ScoreReply:
        items = [ScoreWork(i.model_key, i.query, i.passages) for i in request.items]
        scores = await self._queued(
            self.pool.score, items, request, keys={i.model_key for i in items}
        )
        return p.ScoreReply(
            id=request.id,
            batch_id=request.batch_id,
            results=[p.ScoreResult.from_array(s) for s in scores],
        )

    async def _classify(self, request: p.ClassifyRequest) -> p.ClassifyReply:
        items = [ClassifyWork(i.model_key, i.texts) for i in request.items]
        results = await self._queued(
            self.pool.classify, items, request, keys={i.model_key for i in items}
        )
        return p.ClassifyReply(
            id=request.id,
            batch_id=request.batch_id,
            results=[p.ClassifyResult.from_matrix(labels, m) for labels, m in results],
        )

    async def _queued(
        self,
        fn: Callable[[Any], T],
        items: Any,
        request: p.InferRequest | p.ScoreRequest | p.ClassifyRequest,
        lane: ThreadPoolExecutor | None = None,
        keys: set[str] | None = None,
    ) -> T:
        """Run one batch op in the worker thread (or the model's own ``lane``; a shadow's batch
        of ``keys`` the pool lets run alone: the background thread), counted as waiting until
        it starts."""
        started = threading.Event()
        with self._waiting_lock:
            self._waiting += 1

        def run() -> T:
            self._leave_queue(started)
            # Nobody waits for a batch past its deadline: computing it would only delay the next.
            if request.deadline_ms is not None and time.time() * 1000 > request.deadline_ms:
                raise BatchExpired(f"batch {request.batch_id} expired before it could run")
            return fn(items)

        try:
            if request.background and keys is not None and self.pool.alone(keys):
                alone = keys
                with contextlib.suppress(_NotAlone):  # a load came between: run it here
                    return await asyncio.get_running_loop().run_in_executor(
                        self._background, self._loading.beside, lambda: self.pool.alone(alone), run
                    )
            if lane is not None:
                return await asyncio.get_running_loop().run_in_executor(lane, run)
            return await self._in_worker(run)
        finally:
            self._leave_queue(started)  # the batch never started when it was cancelled

    def _leave_queue(self, started: threading.Event) -> None:
        with self._waiting_lock:
            if not started.is_set():
                started.set()
                self._waiting -= 1

    async def _in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)


#: The background thread's nice value: the lowest CPU priority there is.
BACKGROUND_NICE = 19


def _lowest_priority() -> None:
    """Lower the calling thread (and the threads it starts: torch's intra-op team for its
    batches) to ``BACKGROUND_NICE``. On Linux a nice value is per thread; elsewhere it would be
    the whole process's, so there the thread keeps its priority."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError as exc:  # a sandbox that forbids it: the batch still runs
            log.warning("background thread keeps its priority: %s", exc)


class _Exclusion:
    """Loads and unloads (``alone``) never run while a background batch (``beside``) does,
    nor the other way round; batches of the inference thread need none of it (that thread
    runs the loads itself)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def alone(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            return fn(*args)

    def beside(self, allowed: Callable[[], bool], fn: Callable[[], T]) -> T:
        """``fn()`` while no load runs, if ``allowed()`` still holds then (``_NotAlone``)."""
        with self._lock:
            if not allowed():
                raise _NotAlone
            return fn()


class _NotAlone(Exception):
    """A background batch whose keys a load made unsafe to run beside the inference thread."""


def _error(request_id: int, code: p.SocketErrorCode, message: str) -> p.ErrorReply:
    return p.ErrorReply(id=request_id, error=p.ErrorInfo.of(code, message))


def _classify(exc: Exception) -> tuple[p.SocketErrorCode, str]:
    """Map an exception raised by an op to the protocol's error code and a message."""
    if isinstance(exc, ModelNotLoadedError):
        return p.SocketErrorCode.MODEL_NOT_LOADED, str(exc.args[0] if exc.args else exc)
    if isinstance(exc, ModelKeyConflictError | UnsupportedOpError | HeadError):
        return p.SocketErrorCode.BAD_REQUEST, str(exc)
    if isinstance(exc, ModelLoadError):
        return p.SocketErrorCode.LOAD_FAILED, str(exc)
    if isinstance(exc, BatchExpired):
        return p.SocketErrorCode.DEADLINE_EXCEEDED, str(exc)
    if type(exc).__name__ == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError, without import
        return p.SocketErrorCode.OUT_OF_MEMORY, str(exc).splitlines()[0]
    return p.SocketErrorCode.INFER_FAILED, f"{type(exc).__name__}: {exc}"


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file left by a dead runtime; refuse to steal a live one."""
    if not path.exists():
        return
    if not stat.S_ISSOCK(path.stat().st_mode):
        raise SystemExit(f"error: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise SystemExit(f"error: another runtime is already listening on {path}")


def _fraction(value: str) -> float:
    try:
        fraction = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= fraction <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, not {value}")
    return fraction


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m serving.runtime.server",
        description=(
            "taskfleet PyTorch runtime: serves the sidecar<->runtime protocol (docs/protocol.md) "
            "on a Unix socket. Ops: hello, load, unload, infer, score, classify, stats, "
            "shutdown. Adapters of one "
            "base share one loaded base model. Exits on `shutdown` or SIGTERM and removes the "
            "socket file."
        ),
    )
    parser.add_argument("--socket", required=True, type=Path, help="Unix socket path to listen on")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="padded tokens per forward pass (default: 4096 on cpu, 16384 on accelerators)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="texts per forward pass (default: 32 on cpu, 128 on accelerators)",
    )
    parser.add_argument(
        "--max-padding",
        type=_fraction,
        default=DEFAULT_MAX_PADDING,
        help=(
            "share of a forward pass's padded tokens that may be padding before the texts "
            f"(sorted by length) are cut into another pass; 1 turns it off "
            f"(default: {DEFAULT_MAX_PADDING})"
        ),
    )
    parser.add_argument(
        "--adapter-batching",
        choices=["mixed", "grouped"],
        default="mixed",
        help=(
            "mixed: rows for different LoRA adapters of one base share forward passes, each "
            "row with its own adapter's delta; grouped: one group of passes per adapter, as "
            "peft runs them (for comparison). Adapters that cannot be stacked (DoRA, LoRA on "
            "embeddings) always run grouped (default: mixed)"
        ),
    )
    parser.add_argument(
        "--max-frame-bytes",
        type=int,
        default=p.DEFAULT_MAX_FRAME_BYTES,
        help="largest accepted request frame",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    return parser.parse_args(argv)


def cpu_thread_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """OpenMP's defaults for a runtime that shares its CPUs, set before torch loads.

    libgomp's threads spin between parallel regions. The runtime shares its cores with the
    sidecar, the gateway, nats-server and the callers, so a spinning thread holds a core that a
    reply needs, and a descheduled one stalls its partner at the next barrier: on the shared
    2-core machine, 32 one-text requests in flight ran at 2.5 texts/s with spinning threads and
    28.5 with sleeping ones (benchmarks/peer.py, same run). An explicit OMP_WAIT_POLICY wins.
    """
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def import_model_libraries() -> float:
    """Import sentence-transformers (and with it transformers and torch) now; returns seconds.

    The runtime does this before it listens, so a runtime that answers is one whose first model
    load costs the model, not the libraries. The import is most of a cold start: 15.2 CPU-s on
    the 2-core machine (torch alone 4.3), and 28 s of wall time in a first load on a starved CI
    machine, where it made a lazy model's first requests outlive their 30 s deadline. A lazy
    model is loaded in a request's time; the runtime's own start is not.
    """
    started = time.monotonic()
    importlib.import_module("sentence_transformers")
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpu_thread_defaults()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not args.socket.parent.is_dir():
        print(f"error: socket directory does not exist: {args.socket.parent}", file=sys.stderr)
        return 2
    pool = ModelPool(
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        max_padding=args.max_padding,
        mixed_adapters=args.adapter_batching == "mixed",
    )
    server = RuntimeServer(pool, args.socket, max_frame_bytes=args.max_frame_bytes)
    log.info("model libraries imported in %.1f s", import_model_libraries())
    asyncio.run(server.serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
