"""Write the golden wire vectors: ``<name>.msgpack`` (exact bytes) and ``<name>.json``.

Run from the repository root:  python tests/vectors/generate.py
The test suite checks that the committed files equal what this script produces, so a change
to serving/protocol/ that alters bytes shows up as a diff here (and breaks the Rust side).

JSON convention: a msgpack ``bin`` value is written as ``{"$base64": "<standard base64>"}``;
everything else maps one to one (nil <-> null). Key order in the JSON equals the msgpack order.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from serving import protocol as p

HERE = Path(__file__).resolve().parent
BIN_TAG = "$base64"

# Exactly representable float32 values, so every language prints and parses them the same.
EMBEDDINGS_2X3 = np.array([[0.5, -1.0, 0.25], [1.5, 0.0, -0.125]], dtype=np.float32)
EMBEDDINGS_1X4 = np.array([[1.0, 2.0, -3.5, 0.75]], dtype=np.float32)
SCORES_3 = np.array([2.5, -0.75, 0.125], dtype=np.float32)
PROBABILITIES_2X3 = np.array([[0.75, 0.125, 0.125], [0.25, 0.5, 0.25]], dtype=np.float32)
AREA_LABELS = ["schuldrecht", "sachenrecht", "erbrecht"]


def messages() -> dict[str, Any]:
    """Every vector by name. Values are chosen to exercise each msgpack width class we use."""
    return {
        "socket_hello_request": p.HelloRequest(id=1, protocol=1, client="taskfleet-sidecar 0.1.0"),
        "socket_hello_reply": p.HelloReply(
            id=1,
            protocol=1,
            runtime="torch",
            runtime_version="2.5.1",
            capabilities=["embed", "lora", "mixed_adapters", "score", "classify"],
        ),
        "socket_load_request": p.LoadRequest(
            id=2,
            model_key="minilm+legal-de@3f2a",
            base_path="/models/all-MiniLM-L6-v2",
            adapter_path="/adapters/3f2a",
            query_prefix="query: ",
            passage_prefix="passage: ",
            max_seq_length=None,
            settings=p.LoadSettings(
                intra_op_threads=1, runtimes=2, max_padding=0.25, engine="onnx"
            ),
        ),
        "socket_load_reply": p.LoadReply(
            id=2, model_key="minilm+legal-de@3f2a", memory_bytes=90_868_224
        ),
        "socket_unload_request": p.UnloadRequest(id=3, model_key="minilm+legal-de@3f2a"),
        "socket_unload_reply": p.UnloadReply(
            id=3, model_key="minilm+legal-de@3f2a", memory_bytes=294_912
        ),
        "socket_infer_request": p.InferRequest(
            id=300,
            batch_id="b-000042",
            items=[
                p.InferItem(model_key="minilm", kind="query", texts=["Was regelt § 823 BGB?"]),
                p.InferItem(
                    model_key="minilm+legal-de@3f2a",
                    kind="passage",
                    texts=["Schadensersatzpflicht", "Haftung für Verschulden"],
                ),
            ],
            deadline_ms=1_735_689_630_000,
        ),
        "socket_infer_reply": p.InferReply(
            id=300,
            batch_id="b-000042",
            results=[
                p.InferResult.from_matrix(EMBEDDINGS_2X3[1:]),
                p.InferResult.from_matrix(EMBEDDINGS_2X3),
            ],
        ),
        "socket_score_request": p.ScoreRequest(
            id=301,
            batch_id="b-000043",
            items=[
                p.ScoreItem(
                    model_key="minilm+rerank@9c1d",
                    query="Darf der Vermieter die Kaution behalten?",
                    passages=[
                        "§ 551 Begrenzung und Anlage von Mietsicherheiten",
                        "§ 535",
                        "§ 1922",
                    ],
                ),
                p.ScoreItem(model_key="minilm+rerank@9c1d", query="Erbschein", passages=["§ 2353"]),
            ],
            deadline_ms=1_735_689_631_000,
        ),
        "socket_score_reply": p.ScoreReply(
            id=301,
            batch_id="b-000043",
            results=[
                p.ScoreResult.from_array(SCORES_3),
                p.ScoreResult.from_array(SCORES_3[:1]),
            ],
        ),
        "socket_classify_request": p.ClassifyRequest(
            id=302,
            batch_id="b-000044",
            items=[
                p.ClassifyItem(
                    model_key="minilm+area@51be",
                    texts=["Mein Vermieter kündigt", "Wer erbt das Haus?"],
                )
            ],
            deadline_ms=1_735_689_632_000,
            background=True,  # a shadow's batch
        ),
        "socket_classify_reply": p.ClassifyReply(
            id=302,
            batch_id="b-000044",
            results=[p.ClassifyResult.from_matrix(AREA_LABELS, PROBABILITIES_2X3)],
        ),
        "socket_stats_request": p.StatsRequest(id=70_000),
        "socket_stats_reply": p.StatsReply(
            id=70_000,
            memory_bytes=91_163_136,
            models=[
                p.ModelStats(
                    model_key="minilm", memory_bytes=0, base_key="/models/all-MiniLM-L6-v2"
                ),
                p.ModelStats(
                    model_key="minilm+legal-de@3f2a",
                    memory_bytes=294_912,
                    base_key="/models/all-MiniLM-L6-v2",
                ),
            ],
            queue_depth=2,
        ),
        "socket_error_reply": p.ErrorReply(
            id=5_000_000_000,
            error=p.ErrorInfo.of(p.SocketErrorCode.MODEL_NOT_LOADED, "model 'x' is not loaded"),
        ),
        "socket_shutdown_request": p.ShutdownRequest(id=9),
        "socket_shutdown_reply": p.ShutdownReply(id=9),
        "queue_payload": p.QueuePayload(
            task="german-legal-retrieval",
            kind="query",
            inputs=["Kündigungsfrist Mietvertrag", "Was ist eine Grundschuld?"],
        ),
        "queue_payload_ref": p.QueuePayload(
            task="german-legal-retrieval",
            kind="passage",
            inputs=p.PayloadRef(ref="payloads/01J9ZK3T4Q"),
        ),
        "queue_payload_score": p.ScorePayload(
            task="german-legal-rerank",
            query="Darf der Vermieter die Kaution behalten?",
            documents=["§ 551 Begrenzung und Anlage von Mietsicherheiten", "§ 535", "§ 1922"],
        ),
        "queue_payload_score_ref": p.ScorePayload(
            task="german-legal-rerank",
            query="Darf der Vermieter die Kaution behalten?",
            documents=p.PayloadRef(ref="payloads/01J9ZK3T4R"),
        ),
        "queue_payload_classify": p.ClassifyPayload(
            task="german-legal-area",
            inputs=["Mein Vermieter kündigt", "Wer erbt das Haus?"],
        ),
        "reply_score": p.ScoreReplyOk(
            request_id="01J9ZK3T4R",
            model_key="minilm+rerank@9c1d",
            epoch=3,
            count=3,
            scores=p.floats_to_bytes(SCORES_3),
        ),
        "reply_classify": p.ClassifyReplyOk(
            request_id="01J9ZK3T4S",
            model_key="minilm+area@51be",
            epoch=2,
            count=2,
            labels=AREA_LABELS,
            probabilities=p.floats_to_bytes(PROBABILITIES_2X3),
        ),
        # 2048 texts x 160 labels would not fit max_payload: the probabilities by reference.
        "reply_classify_ref": p.ClassifyReplyOk(
            request_id="01J9ZK3T4T",
            model_key="minilm+area@51be",
            epoch=2,
            count=2048,
            labels=AREA_LABELS,
            probabilities=p.PayloadRef(ref="reply-01J9ZK3T4T"),
        ),
        "reply_ok": p.ReplyOk(
            request_id="01J9ZK3T4Q",
            model_key="minilm+legal-de@3f2a",
            epoch=7,
            dims=4,
            count=1,
            embeddings=p.embeddings_to_bytes(EMBEDDINGS_1X4)[2],
        ),
        "reply_ok_ref": p.ReplyOk(
            request_id="01J9ZK3T4R",
            model_key="minilm",
            epoch=7,
            dims=384,
            count=2048,
            embeddings=p.PayloadRef(ref="reply-01J9ZK3T4R"),
        ),
        "reply_error": p.ReplyError(
            request_id="01J9ZK3T4Q",
            error=p.ErrorInfo.of(p.SocketErrorCode.INFER_FAILED, "input 3 is empty"),
        ),
        "placement_value": p.PlacementValue(
            task="german-legal-retrieval",
            epoch=12,
            candidate="minilm+legal-de@3f2a",
            model_key="minilm+legal-de@3f2a",
            base=p.Artifact(sha256="ab" * 32, size=90_868_376),
            adapter=p.Artifact(sha256="3f2a" * 16, size=295_200),
            query_prefix="",
            passage_prefix="",
            max_seq_length=256,
            pinned=True,
            replicas=2,
            memory_bytes=91_163_136,
            runtime="candle",
            profiles=[
                p.RuntimeProfileValue(
                    id=7,
                    machine_class="cpu:AMD EPYC x2",
                    max_batch_tokens=4096,
                    max_batch_wait_ms=2,
                    intra_op_threads=1,
                    runtimes=2,
                    max_padding=0.25,
                    engine="onnx",
                ),
                p.RuntimeProfileValue(
                    id=9, machine_class="gpu:NVIDIA H200", max_batch_tokens=65536
                ),
            ],
        ),
        # A shadow (KV key `german-legal-area.shadow`): served beside the champion, never to
        # a caller.
        "placement_value_shadow": p.PlacementValue(
            task="german-legal-area",
            epoch=3,
            candidate="tiny-cls",
            model_key="tiny+cls@9c1d",
            base=p.Artifact(sha256="cd" * 32, size=1_000),
            adapter=None,
            query_prefix="",
            passage_prefix="",
            max_seq_length=None,
            pinned=False,
            replicas=1,
            memory_bytes=4_096,
            shadow=True,
        ),
        "worker_heartbeat": p.WorkerHeartbeat(
            worker_id="w-host1-0",
            host="host1",
            ts_ms=1_735_689_600_000,
            loaded=["minilm", "minilm+legal-de@3f2a"],
            memory_used=91_163_136,
            memory_budget=8_589_934_592,
            queue_depth={"german-legal-retrieval": 3, "faq-search": 0},
            runtimes=["torch"],
            epochs={"german-legal-retrieval": 12, "faq-search": 4},
            started_ms=1_735_689_000_000,
            runtime_kind="torch",
            profiles={"german-legal-retrieval": 7},
        ),
    }


def to_json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {BIN_TAG: base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json_value(v) for v in value]
    return value


def from_json_value(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {BIN_TAG}:
            return base64.b64decode(value[BIN_TAG], validate=True)
        return {k: from_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_json_value(v) for v in value]
    return value


def render() -> dict[str, bytes]:
    """File name -> exact file content for every vector."""
    files: dict[str, bytes] = {}
    for name, message in messages().items():
        files[f"{name}.msgpack"] = p.pack(message)
        text = json.dumps(to_json_value(p.to_wire(message)), indent=2, ensure_ascii=False)
        files[f"{name}.json"] = (text + "\n").encode("utf-8")
    return files


def main() -> None:
    for file_name, content in render().items():
        (HERE / file_name).write_bytes(content)
    print(f"wrote {len(messages())} vectors to {HERE}")


if __name__ == "__main__":
    main()
