"""The real runtime server, started as a subprocess on a Unix socket, with a tiny BERT model."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving import protocol as p
from testbed.tiny_model import build_tiny_adapter, build_tiny_model

REPO = Path(__file__).resolve().parents[1]
TEXTS = ["Was regelt die Kündigungsfrist im Mietvertrag?", "Haftung für Schaden", "der vermieter"]


@dataclass
class Models:
    base: Path
    adapter_a: Path
    adapter_b: Path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("runtime-models")
    base = build_tiny_model(root / "base", seed=0)
    return Models(
        base=base,
        adapter_a=build_tiny_adapter(base, root / "adapter-a", seed=1),
        adapter_b=build_tiny_adapter(base, root / "adapter-b", seed=2),
    )


def start_server(*extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    # Unix socket paths are limited to ~100 bytes, so stay out of pytest's deep tmp tree.
    sock = Path(tempfile.mkdtemp(prefix="tf-rt-")) / "rt.sock"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.runtime.server", "--socket", str(sock), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"runtime exited early ({proc.returncode}): {err}")
        if sock.exists():
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(sock))
                return proc, sock
            except OSError:
                pass
            finally:
                probe.close()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("runtime did not start listening within 120 s")


def stop_server(proc: subprocess.Popen[bytes], sock: Path) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    shutil.rmtree(sock.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[Path]:
    proc, sock = start_server("--max-batch-tokens", "2048")
    yield sock
    stop_server(proc, sock)


class Conn:
    """A test client: sends requests and returns the raw reply maps in arrival order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sock: Path) -> Conn:
        return cls(*await asyncio.open_unix_connection(str(sock)))

    async def send(self, message: Any) -> None:
        await p.write_frame(self.writer, message)

    async def receive(self) -> dict[str, Any]:
        frame = await asyncio.wait_for(p.read_frame(self.reader), timeout=120)
        assert frame is not None, "runtime closed the connection"
        return frame

    async def call(self, message: Any) -> Any:
        await self.send(message)
        reply = await self.receive()
        assert reply["id"] == message.id
        return p.decode_reply(message.op, reply)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def run(sock: Path, scenario: Any) -> Any:
    async def main() -> Any:
        conn = await Conn.open(sock)
        try:
            return await scenario(conn)
        finally:
            await conn.close()

    return asyncio.run(main())


_ids = itertools.count(1000)


def load(model_key: str, base: Path, adapter: Path | None = None, **kw: Any) -> p.LoadRequest:
    return p.LoadRequest(
        id=next(_ids),
        model_key=model_key,
        base_path=str(base),
        adapter_path=str(adapter) if adapter else None,
        query_prefix=kw.get("query_prefix", ""),
        passage_prefix=kw.get("passage_prefix", ""),
        max_seq_length=kw.get("max_seq_length"),
    )


def infer(request_id: int, *items: tuple[str, str, list[str]]) -> p.InferRequest:
    return p.InferRequest(
        id=request_id,
        batch_id=f"b-{request_id}",
        items=[p.InferItem(model_key=k, kind=kind, texts=t) for k, kind, t in items],  # type: ignore[arg-type]
    )


def expected(base: Path, texts: list[str], adapter: Path | None = None) -> np.ndarray:
    """In-process reference through sentence-transformers' own adapter support."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    if adapter is not None:
        model.load_adapter(str(adapter))
    return np.asarray(model.encode(texts, convert_to_numpy=True), dtype=np.float32)


def base_bytes(base: Path) -> int:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


# ---------------------------------------------------------------------------------------- tests


def test_help_explains_the_server() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "serving.runtime.server", "--help"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--socket" in out and "--device" in out and "shutdown" in out


def test_openmp_threads_sleep_unless_told_otherwise() -> None:
    probe = (
        "import os, sys; from serving.runtime import server; "
        "assert 'torch' not in sys.modules, 'torch loaded before the defaults'; "
        "server.cpu_thread_defaults(); print(os.environ['OMP_WAIT_POLICY'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(REPO)
    for given, expected in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        run_env = env if given is None else {**env, "OMP_WAIT_POLICY": given}
        out = subprocess.run(
            [sys.executable, "-c", probe], env=run_env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == expected


def test_hello_reports_protocol_and_runtime(server: Path) -> None:
    async def scenario(c: Conn) -> tuple[Any, Any]:
        ok = await c.call(p.HelloRequest(id=1, protocol=1, client="test"))
        bad = await c.call(p.HelloRequest(id=2, protocol=99, client="test"))
        return ok, bad

    ok, bad = run(server, scenario)
    assert isinstance(ok, p.HelloReply)
    assert (ok.protocol, ok.runtime) == (1, "torch") and "lora" in ok.capabilities
    assert isinstance(bad, p.ErrorReply) and bad.error.code == "BAD_REQUEST"


def test_infer_matches_in_process_encoding(server: Path, models: Models) -> None:
    async def scenario(c: Conn) -> tuple[Any, Any]:
        loaded = await c.call(load("plain", models.base, query_prefix="frage: "))
        reply = await c.call(
            infer(
                3,
                ("plain", "passage", TEXTS),
                ("plain", "query", TEXTS[:2]),
                ("plain", "query", []),
            )
        )
        return loaded, reply

    loaded, reply = run(server, scenario)
    assert isinstance(loaded, p.LoadReply) and loaded.memory_bytes == base_bytes(models.base)
    assert isinstance(reply, p.InferReply) and reply.batch_id == "b-3"
    passages, queries, empty = (r.matrix() for r in reply.results)
    assert empty.shape == (0, passages.shape[1])
    np.testing.assert_allclose(passages, expected(models.base, TEXTS), atol=1e-5)
    prefixed = [f"frage: {t}" for t in TEXTS[:2]]
    np.testing.assert_allclose(queries, expected(models.base, prefixed), atol=1e-5)


def test_a_batch_past_its_deadline_is_dropped_unrun(server: Path, models: Models) -> None:
    now_ms = int(time.time() * 1000)

    async def scenario(c: Conn) -> tuple[Any, Any]:
        await c.call(load("deadline", models.base))
        items = [p.InferItem(model_key="deadline", kind="query", texts=TEXTS)]
        late = p.InferRequest(id=4, batch_id="late", items=items, deadline_ms=now_ms - 1)
        timely = p.InferRequest(id=5, batch_id="ok", items=items, deadline_ms=now_ms + 600_000)
        return await c.call(late), await c.call(timely)

    late, timely = run(server, scenario)
    assert isinstance(late, p.ErrorReply), late
    assert late.error.code == "DEADLINE_EXCEEDED" and late.error.retryable is False
    assert isinstance(timely, p.InferReply) and timely.results[0].count == len(TEXTS)


def test_adapters_share_the_base_and_mix_in_one_batch(server: Path, models: Models) -> None:
    async def scenario(c: Conn) -> list[Any]:
        return [
            await c.call(load("mix-base", models.base)),
            await c.call(load("mix-a", models.base, models.adapter_a)),
            await c.call(load("mix-b", models.base, models.adapter_b)),
            await c.call(
                infer(
                    4,
                    ("mix-a", "passage", TEXTS),
                    ("mix-base", "passage", TEXTS),
                    ("mix-b", "passage", TEXTS[1:]),
                    ("mix-a", "passage", TEXTS[:1]),
                )
            ),
        ]

    _, a_load, b_load, reply = run(server, scenario)
    # The base is already resident (other tests) or loaded by mix-base; adapters add only LoRA.
    assert 0 < a_load.memory_bytes < base_bytes(models.base) // 4
    assert b_load.memory_bytes == a_load.memory_bytes
    with_a, plain, with_b, with_a_again = (r.matrix() for r in reply.results)
    want_a = expected(models.base, TEXTS, models.adapter_a)
    np.testing.assert_allclose(with_a, want_a, atol=1e-5)
    np.testing.assert_allclose(plain, expected(models.base, TEXTS), atol=1e-5)
    np.testing.assert_allclose(
        with_b, expected(models.base, TEXTS[1:], models.adapter_b), atol=1e-5
    )
    np.testing.assert_allclose(with_a_again, want_a[:1], atol=1e-5)
    assert np.abs(with_a - plain).max() > 1e-3, "the adapter must change the vectors"
    assert np.abs(with_a[1:] - with_b).max() > 1e-3, "two adapters must differ"


def test_unknown_model_is_retryable_not_loaded(server: Path) -> None:
    reply = run(server, lambda c: c.call(infer(5, ("nobody", "query", ["x"]))))
    assert isinstance(reply, p.ErrorReply)
    assert reply.error.code == "MODEL_NOT_LOADED" and reply.error.retryable
    assert "nobody" in reply.error.message


def test_load_failures_are_reported_and_leave_nothing_behind(server: Path, models: Models) -> None:
    async def scenario(c: Conn) -> list[Any]:
        before = await c.call(p.StatsRequest(id=60))
        missing = await c.call(load("ghost", models.base.parent / "no-such-model"))
        not_adapter = await c.call(load("bad-adapter", models.base, models.base))
        after = await c.call(p.StatsRequest(id=61))
        first = await c.call(load("twice", models.base, query_prefix="q: "))
        same = await c.call(load("twice", models.base, query_prefix="q: "))
        other = await c.call(load("twice", models.base, query_prefix="other: "))
        await c.call(p.UnloadRequest(id=62, model_key="twice"))
        return [before, missing, not_adapter, after, first, same, other]

    before, missing, not_adapter, after, first, same, other = run(server, scenario)
    assert isinstance(first, p.LoadReply) and same.memory_bytes == 0, "reloading is idempotent"
    assert isinstance(other, p.ErrorReply) and other.error.code == "BAD_REQUEST"
    assert "different spec" in other.error.message
    assert isinstance(missing, p.ErrorReply) and missing.error.code == "LOAD_FAILED"
    assert "no-such-model" in missing.error.message and not missing.error.retryable
    assert isinstance(not_adapter, p.ErrorReply) and not_adapter.error.code == "LOAD_FAILED"
    assert after.memory_bytes == before.memory_bytes
    assert {m.model_key for m in after.models} == {m.model_key for m in before.models}


def test_bad_frames_get_errors_and_the_connection_survives(server: Path) -> None:
    async def scenario(c: Conn) -> list[dict[str, Any]]:
        c.writer.write(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # not msgpack
        c.writer.write(p.encode_frame({"op": "teleport", "id": 77}))
        c.writer.write(p.encode_frame({"op": "unload", "id": 78}))  # missing model_key
        await c.writer.drain()
        replies = [await c.receive() for _ in range(3)]
        await c.send(p.StatsRequest(id=79))
        replies.append(await c.receive())
        return replies

    garbage, unknown_op, missing_field, stats = run(server, scenario)
    assert (garbage["id"], garbage["ok"], garbage["error"]["code"]) == (0, False, "BAD_REQUEST")
    assert (unknown_op["id"], unknown_op["error"]["code"]) == (77, "UNKNOWN_OP")
    assert (missing_field["id"], missing_field["error"]["code"]) == (78, "BAD_REQUEST")
    assert "model_key" in missing_field["error"]["message"]
    assert stats["id"] == 79 and stats["ok"] is True


def test_oversized_frame_closes_only_that_connection(server: Path) -> None:
    async def scenario(c: Conn) -> tuple[dict[str, Any], bytes]:
        c.writer.write(struct.pack(">I", p.DEFAULT_MAX_FRAME_BYTES + 1))
        await c.writer.drain()
        reply = await c.receive()
        rest = await asyncio.wait_for(c.reader.read(), timeout=30)
        return reply, rest

    reply, rest = run(server, scenario)
    assert reply["error"]["code"] == "BAD_REQUEST" and "exceeds" in reply["error"]["message"]
    assert rest == b"", "the runtime closes a connection whose framing is lost"
    assert isinstance(run(server, lambda c: c.call(p.StatsRequest(id=1))), p.StatsReply)


def test_stats_answer_while_batches_run(server: Path, models: Models) -> None:
    many = [f"{TEXTS[i % 3]} {i} " * 6 for i in range(3000)]

    async def scenario(c: Conn) -> list[dict[str, Any]]:
        await c.call(load("busy", models.base))
        await c.send(infer(101, ("busy", "passage", many)))
        await c.send(infer(102, ("busy", "passage", many)))
        await c.send(p.StatsRequest(id=103))
        return [await c.receive() for _ in range(3)]

    first, *rest = run(server, scenario)
    assert first["id"] == 103, "stats must not wait behind running batches"
    assert first["queue_depth"] >= 1
    assert sorted(r["id"] for r in rest) == [101, 102]
    assert all(r["results"][0]["count"] == len(many) for r in rest)


def test_stats_memory_and_unload_free() -> None:
    # A server of its own: exact totals need a state no other test touches.
    proc, sock = start_server()
    root = Path(tempfile.mkdtemp(prefix="tf-models-"))
    try:
        base = build_tiny_model(root / "base", seed=3)
        adapter = build_tiny_adapter(base, root / "adapter", seed=4)

        async def scenario(c: Conn) -> list[Any]:
            return [
                await c.call(load("s-base", base)),
                await c.call(load("s-lora", base, adapter)),
                await c.call(p.StatsRequest(id=200)),
                await c.call(p.UnloadRequest(id=201, model_key="s-lora")),
                await c.call(p.UnloadRequest(id=202, model_key="s-lora")),
                await c.call(p.UnloadRequest(id=203, model_key="s-base")),
                await c.call(p.StatsRequest(id=204)),
                await c.call(infer(205, ("s-base", "query", ["x"]))),
            ]

        loaded_base, loaded_lora, stats, freed_lora, again, freed_base, empty, gone = run(
            sock, scenario
        )
        size = base_bytes(base)
        assert loaded_base.memory_bytes == size
        assert stats.memory_bytes == size + loaded_lora.memory_bytes
        by_key = {m.model_key: m for m in stats.models}
        assert by_key["s-lora"].memory_bytes == loaded_lora.memory_bytes
        assert by_key["s-base"].base_key == by_key["s-lora"].base_key
        assert freed_lora.memory_bytes == loaded_lora.memory_bytes
        assert isinstance(again, p.ErrorReply) and again.error.code == "MODEL_NOT_LOADED"
        assert freed_base.memory_bytes == size
        assert (empty.memory_bytes, empty.models, empty.queue_depth) == (0, [], 0)
        assert isinstance(gone, p.ErrorReply) and gone.error.code == "MODEL_NOT_LOADED"

        shutdown = run(sock, lambda c: c.call(p.ShutdownRequest(id=300)))
        assert isinstance(shutdown, p.ShutdownReply)
        assert proc.wait(timeout=30) == 0
        assert not sock.exists(), "the socket file is removed on shutdown"
    finally:
        stop_server(proc, sock)
        shutil.rmtree(root, ignore_errors=True)


def test_sigterm_exits_cleanly_and_the_libraries_came_before_listening() -> None:
    proc, sock = start_server()
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not sock.exists()
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
        # A listening runtime has its model libraries: a lazy model's first load does not
        # import them in a request's time (serving/runtime/server.py, import_model_libraries).
        imported, listening = log.find("model libraries imported"), log.find("listening on")
        assert 0 <= imported < listening, log
    finally:
        stop_server(proc, sock)


# ---- score and classify: task heads on the shared base ----------------------------------------
QUERY = "Darf der Vermieter die Kaution behalten?"
PASSAGES = ["der mieter zahlt die miete", "testament und erbe", "kauf einer sache mit mangel"]


def head_reference(base: Path, adapter: Path) -> tuple[Any, np.ndarray, np.ndarray]:
    """Independent of serving/runtime: sentence-transformers with the LoRA, the head's raw
    weights read from its safetensors file."""
    from safetensors.numpy import load_file
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base), device="cpu", local_files_only=True)
    model.load_adapter(str(adapter))
    weights = load_file(str(adapter / "head.safetensors"))
    return model, weights["weight"], weights["bias"]


def test_score_and_classify_match_an_independent_computation(server: Path, tmp_path: Path) -> None:
    import torch

    from testbed.tiny_model import build_tiny_head

    base = build_tiny_model(tmp_path / "heads-base", seed=5)
    cross = build_tiny_head(base, tmp_path / "cross", kind="score", seed=6)
    classifier = build_tiny_head(base, tmp_path / "cls", kind="classify", seed=7)
    lr_head = build_tiny_head(base, tmp_path / "lr", kind="classify", seed=8, lora=False)

    async def scenario(c: Conn) -> list[Any]:
        replies = [
            await c.call(load("ce", base, cross)),
            await c.call(load("cls", base, classifier)),
            await c.call(load("lr", base, lr_head)),
            await c.call(load("bi", base)),
        ]
        replies.append(
            await c.call(
                p.ScoreRequest(
                    id=next(_ids),
                    batch_id="s1",
                    items=[
                        p.ScoreItem(model_key="ce", query=QUERY, passages=PASSAGES),
                        p.ScoreItem(model_key="bi", query=QUERY, passages=PASSAGES[:2]),
                        p.ScoreItem(model_key="ce", query="erbe", passages=PASSAGES[1:]),
                    ],
                )
            )
        )
        replies.append(
            await c.call(
                p.ClassifyRequest(
                    id=next(_ids),
                    batch_id="c1",
                    items=[
                        p.ClassifyItem(model_key="cls", texts=TEXTS),
                        p.ClassifyItem(model_key="lr", texts=TEXTS[:1]),
                    ],
                )
            )
        )
        replies.append(
            await c.call(
                p.ClassifyRequest(
                    id=next(_ids),
                    batch_id="c2",
                    items=[p.ClassifyItem(model_key="ce", texts=["x"])],
                )
            )
        )
        replies.append(
            await c.call(
                p.ScoreRequest(
                    id=next(_ids),
                    batch_id="s2",
                    items=[p.ScoreItem(model_key="cls", query="q", passages=["x"])],
                )
            )
        )
        replies.append(await c.call(p.StatsRequest(id=next(_ids))))
        return replies

    ce_load, cls_load, lr_load, bi_load, scored, classified, no_head, wrong_head, stats = run(
        server, scenario
    )
    base_size = base_bytes(base)
    assert base_size < ce_load.memory_bytes < 1.25 * base_size  # the base, with LoRA and head
    assert 0 < cls_load.memory_bytes < base_bytes(base) // 4
    assert 0 < lr_load.memory_bytes < cls_load.memory_bytes  # a head without LoRA
    assert bi_load.memory_bytes == 0  # the same base, already resident
    assert len({m.base_key for m in stats.models if m.model_key in ("ce", "cls", "lr", "bi")}) == 1

    model, weight, bias = head_reference(base, cross)

    def cross_encoder(query: str, passages: list[str]) -> np.ndarray:
        tok = model.tokenizer(
            [query] * len(passages),
            passages,
            padding=True,
            truncation="longest_first",
            return_tensors="pt",
        )
        with torch.inference_mode():
            pooled = model(dict(tok))["sentence_embedding"].numpy()
        return np.asarray((pooled @ weight.T + bias)[:, 0])

    ce, bi, ce_again = scored.results
    np.testing.assert_allclose(ce.array(), cross_encoder(QUERY, PASSAGES), atol=1e-5)
    np.testing.assert_allclose(ce_again.array(), cross_encoder("erbe", PASSAGES[1:]), atol=1e-5)
    assert np.ptp(ce.array()) > 1e-3  # the scores tell the passages apart
    plain = expected(base, [QUERY, *PASSAGES[:2]])
    cosine = plain[1:] @ plain[0] / (np.linalg.norm(plain[1:], axis=1) * np.linalg.norm(plain[0]))
    np.testing.assert_allclose(bi.array(), cosine, atol=1e-5)

    cls_result, lr_result = classified.results
    assert cls_result.labels == ["miete", "kauf", "erbe"] and cls_result.count == 3
    model, weight, bias = head_reference(base, classifier)
    logits = model.encode(TEXTS, convert_to_numpy=True) @ weight.T + bias
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(cls_result.matrix(), softmax, atol=1e-5)
    np.testing.assert_allclose(cls_result.matrix().sum(axis=1), 1.0, atol=1e-6)
    assert lr_result.matrix().shape == (1, 3)

    assert isinstance(no_head, p.ErrorReply) and no_head.error.code == "BAD_REQUEST"
    assert "no classify head" in no_head.error.message
    assert isinstance(wrong_head, p.ErrorReply) and "cannot score" in wrong_head.error.message


def _memory(pid: int) -> tuple[int, int]:
    """(resident, peak resident since the last reset) bytes of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def test_memory_a_large_batch_used_goes_back_to_the_system(tmp_path: Path) -> None:
    """glibc kept what a large batch freed: on main the runtime stayed at 6.7 GB after one 30 MB
    text, and kept about half of what 256 long texts had taken. Once nothing waits, the
    runtime gives it back (malloc_trim): its RSS returns near where it was before.

    512 texts, not 256: glibc keeps the top of each thread's arena up to its dynamic trim
    threshold (serving/runtime/server.py, ``_trim_when_idle``), a residue bounded by the
    largest block freed, not by the batch. Beside other tests 256 texts kept up to 33 of their
    110 MiB that way (CI); 512 texts kept 6-18 of 145-165 MiB in 12 of 12 runs three at a time."""
    base = build_tiny_model(tmp_path / "wide", hidden=384, layers=1, heads=2, max_seq_length=256)
    texts = [
        f"frage {i} " + "der vermieter kann das mietverhältnis kündigen " * 30 for i in range(512)
    ]
    proc, sock = start_server()

    async def scenario(conn: Conn) -> tuple[int, int, int]:
        await conn.call(load("wide", base))
        await conn.call(infer(1, ("wide", "query", ["warm up"] * 8)))
        before, _ = _memory(proc.pid)
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # peak RSS := RSS now
        reply = await conn.call(infer(2, ("wide", "passage", texts)))
        assert reply.results[0].count == len(texts)
        await asyncio.sleep(0.5)
        after, peak = _memory(proc.pid)
        return before, peak, after

    try:
        before, peak, after = run(sock, scenario)
    finally:
        stop_server(proc, sock)
    used, kept = peak - before, after - before
    mib = 1 << 20
    print(f"RSS before {before / mib:.0f} MiB, peak +{used / mib:.0f}, after +{kept / mib:.0f}")
    assert used > 40 * mib, "the batch took too little memory for the test to tell anything"
    assert kept < 0.25 * used, f"kept {kept / mib:.0f} of the {used / mib:.0f} MiB the batch used"


def _thread_nices(pid: int) -> dict[int, int]:
    """Thread id -> nice value of every thread of ``pid`` (/proc/<pid>/task/<tid>/stat)."""
    nices = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            nices[int(task.name)] = int(fields[16])  # field 19 of stat(5); fields[0] is 3
    return nices


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_shadow_batch_runs_at_the_lowest_priority_and_answers_the_same(models: Models) -> None:
    """A ``background`` batch (a shadow's) runs on a thread of nice 19 (the kernel gives the
    cores to champions' batches first), beside the inference thread's batches of the same base,
    and its vectors are the ones a normal batch gives; once an adapter joins the base, the
    inference thread runs it (the pool's adapter state is not shared across threads)."""
    proc, sock = start_server()
    want = expected(models.base, TEXTS)
    try:
        assert 19 not in _thread_nices(proc.pid).values(), "no thread is lowered before a shadow"

        def shadow(request_id: int, key: str) -> p.InferRequest:
            item = p.InferItem(model_key=key, kind="passage", texts=TEXTS)
            return p.InferRequest(
                id=request_id, batch_id=f"s-{request_id}", items=[item], background=True
            )

        async def side_by_side(c: Conn) -> list[Any]:
            await c.call(load("bg-plain", models.base))
            requests = [shadow(400 + i, "bg-plain") for i in range(4)]
            requests += [infer(410 + i, ("bg-plain", "passage", TEXTS)) for i in range(4)]
            for request in requests:  # all in flight at once: both threads busy
                await c.send(request)
            replies = [await c.receive() for _ in requests]
            return [p.decode_reply("infer", r) for r in replies]

        replies = run(sock, side_by_side)
        assert len(replies) == 8 and all(isinstance(r, p.InferReply) for r in replies), replies
        for reply in replies:
            np.testing.assert_allclose(reply.results[0].matrix(), want, atol=1e-5)
        lowered = [tid for tid, nice in _thread_nices(proc.pid).items() if nice == 19]
        assert lowered, "the shadow's batches ran on no thread of nice 19"
        assert proc.pid not in lowered, "the process's main thread keeps its priority"

        async def with_adapter(c: Conn) -> list[Any]:
            await c.call(load("bg-lora", models.base, models.adapter_a))
            return [await c.call(shadow(420, "bg-plain")), await c.call(shadow(421, "bg-lora"))]

        plain, lora = run(sock, with_adapter)
        np.testing.assert_allclose(plain.results[0].matrix(), want, atol=1e-5)
        want_lora = expected(models.base, TEXTS, models.adapter_a)
        np.testing.assert_allclose(lora.results[0].matrix(), want_lora, atol=1e-5)
    finally:
        stop_server(proc, sock)


def test_the_pool_lets_alone_only_keys_whose_base_holds_no_adapter(models: Models) -> None:
    from serving.runtime.model_folder import ModelSpec
    from serving.runtime.pool import ModelPool

    pool = ModelPool(device="cpu", max_batch_tokens=2048, max_batch_size=None)
    pool.load("plain", ModelSpec(base_path=models.base))
    assert pool.alone({"plain"}) and not pool.alone({"plain", "unknown"})
    pool.load("short", ModelSpec(base_path=models.base, max_seq_length=16))
    assert not pool.alone({"plain"}), "two lengths on one base: _activated sets it per call"
    pool.unload("short")
    pool.load("lora", ModelSpec(base_path=models.base, adapter_path=models.adapter_a))
    assert not pool.alone({"plain"}) and not pool.alone({"lora"})
    pool.unload("lora")
    assert pool.alone({"plain"})
