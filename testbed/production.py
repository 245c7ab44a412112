"""The production loop driven from outside: one `taskfleet up` on a seeded home, a suite's items
replayed as live traffic with the truth sent back as feedback, what the control plane made of
them (judged samples, live eval runs) and offline evals of exactly the replayed items.

Shared by tests/test_e2e_production.py (small fixtures, `make test`) and
benchmarks/production.py (1,000 items of the german-legal tasks, `make bench`). The checks the
two make are the same: each live run's metric equals an offline eval of the same items, and the
agreement the registry reports equals the share computed from the replies the driver saw and
the shadow's answers computed in-process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evals.classification_data import load_split as load_classification
from evals.harness import EvalResult, evaluate
from evals.rerank_data import load_split as load_rerank
from evals.suites import SuiteSpec
from registry import Registry
from registry.entities import AgreementSummary, EvalRun
from serving.client import Classification, Client, Scores
from testbed.fleet import COLD_START_S, free_port, wait_until

REPO = Path(__file__).resolve().parent.parent


# ---- the stack -----------------------------------------------------------------------------
@dataclass
class UpStack:
    """A running `taskfleet up`: its URLs, its process and what it wrote to run/stack.json."""

    home: Path
    gateway: str
    control_plane: str
    process: subprocess.Popen[bytes]
    log: Path

    def info(self) -> dict[str, Any]:
        """run/stack.json: NATS, the worker ids and the Prometheus endpoints (gateway first,
        then one per worker, in worker order)."""
        data: dict[str, Any] = json.loads((self.home / "run" / "stack.json").read_text())
        return data

    def worker_metrics_url(self, worker_id: str) -> str:
        info = self.info()
        return str(info["metrics"][1 + list(info["workers"]).index(worker_id)])

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 6000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""


@contextlib.contextmanager
def taskfleet_up(
    home: Path, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[UpStack]:
    """`taskfleet --home HOME up ARGS` on free ports, until run/stack.json says it is ready;
    stopped with SIGTERM (then SIGKILL after a minute) on the way out."""
    port, control_port = free_port(), free_port()
    environment = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    environment.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), **(env or {}))
    (home / "run" / "stack.json").unlink(missing_ok=True)
    out = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--port", str(port),
         "--control-port", str(control_port), *args],
        cwd=REPO, env=environment, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stack = UpStack(
        home, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}", process, log
    )
    try:
        wait_until(
            lambda: (home / "run" / "stack.json").is_file() or not stack.alive(),
            timeout_s=COLD_START_S,  # `up` is ready once its workers' runtimes are
        )
        if not stack.alive():
            raise RuntimeError(f"taskfleet up exited:\n{stack.log_tail()}")
        yield stack
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        out.close()


def shadow_holders(reg: Registry, task: str) -> tuple[set[str], set[str]]:
    """(workers reporting the task's champion, workers reporting its shadow), reachable ones."""
    workers = reg.list_workers(reachable_only=True)
    champions = {w.worker_id for w in workers if task in w.epochs}
    shadows = {w.worker_id for w in workers if f"{task}.shadow" in w.epochs}
    return champions, shadows


def shadows_serving(
    reg: Registry, tasks: Sequence[str], epochs: dict[str, int] | None = None
) -> bool:
    """Every task's shadow is served beside its champion, on another worker (and, where
    ``epochs`` names one, at that shadow epoch or newer)."""
    workers = reg.list_workers(reachable_only=True)
    for task in tasks:
        champions, shadows = shadow_holders(reg, task)
        if not shadows or not champions or shadows & champions:
            return False
        if epochs and task in epochs:
            held = [w.epochs.get(f"{task}.shadow", 0) for w in workers if w.worker_id in shadows]
            if min(held) < epochs[task]:
                return False
    return True


# ---- the items -----------------------------------------------------------------------------
@dataclass(frozen=True)
class LabelledText:
    id: str
    text: str
    label: str


@dataclass(frozen=True)
class RankedQuery:
    """One judged query of a rerank split: its documents in the order listed, as the harness
    reads their texts, and the indexes of the relevant ones."""

    id: str
    query: str
    doc_ids: list[str]
    documents: list[str]
    relevant: list[int]


def labelled_texts(folder: Path, split: str = "test") -> list[LabelledText]:
    """A classification split's items, read as the eval harness reads them."""
    data = load_classification(folder, split)
    return [
        LabelledText(i, t, label)
        for i, t, label in zip(data.ids, data.texts, data.labels, strict=True)
    ]


def ranked_queries(folder: Path, split: str = "test") -> list[RankedQuery]:
    """A rerank split's scored queries (queries.jsonl order), read as the harness reads them."""
    data = load_rerank(folder, split)
    out = []
    for qid, query in data.queries.items():
        ids = data.candidates[qid]
        relevant = [k for k, d in enumerate(ids) if data.qrels[qid].get(d, 0) > 0]
        out.append(RankedQuery(qid, query, ids, [data.corpus[d] for d in ids], relevant))
    return out


def classification_folder(items: Sequence[LabelledText], source: Path, root: Path) -> Path:
    """A suite folder whose test split is exactly ``items`` (labels.json from ``source``)."""
    root.mkdir(parents=True)
    shutil.copyfile(source / "labels.json", root / "labels.json")
    with (root / "test.jsonl").open("w", encoding="utf-8") as fh:
        for item in items:
            row = {"id": item.id, "text": item.text, "label": item.label}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return root


def rerank_folder(items: Sequence[RankedQuery], source: Path, root: Path, split: str) -> Path:
    """A BEIR rerank folder (``source``'s corpus and queries) whose test split is exactly the
    queries of ``items``: their lines of ``split``'s qrels and top_ranked files."""
    keep = {item.id for item in items}
    (root / "qrels").mkdir(parents=True)
    (root / "top_ranked").mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        shutil.copyfile(source / name, root / name)
    header, *lines = (source / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.split("\t")[0] in keep]
    (root / "qrels" / "test.tsv").write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    ranked = (source / "top_ranked" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    chosen = [line for line in ranked if line.strip() and json.loads(line)["query-id"] in keep]
    (root / "top_ranked" / "test.jsonl").write_text("\n".join(chosen) + "\n", encoding="utf-8")
    return root


# ---- the replay ----------------------------------------------------------------------------
@dataclass
class Replay:
    """What the caller saw: one reply per item, in item order, and the wall time."""

    replies: list[Any] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def sampled(self) -> int:
        return sum(1 for r in self.replies if r.sampled)

    def request_ids(self) -> list[str]:
        return [str(r.request_id) for r in self.replies]


def _paced(count: int, rate: float | None) -> Iterator[int]:
    """Indexes 0..count-1, the i-th not before i / rate seconds (none: as fast as replies come)."""
    started = time.monotonic()
    for i in range(count):
        if rate:
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        yield i


def replay_classification(
    client: Client, task: str, items: Sequence[LabelledText], *, rate: float | None = None
) -> Replay:
    """Each item's text as one live request, then its label as feedback (every reply must be
    sampled: feedback is only taken for those)."""
    replay, started = Replay(), time.perf_counter()
    for i in _paced(len(items), rate):
        reply: Classification = client.classify(task, [items[i].text])
        if not reply.sampled or reply.request_id is None:
            raise AssertionError(f"item {i} was not sampled: {reply}")
        client.feedback(reply.request_id, label=items[i].label)
        replay.replies.append(reply)
    replay.seconds = time.perf_counter() - started
    return replay


def replay_rerank(
    client: Client, task: str, items: Sequence[RankedQuery], *, rate: float | None = None
) -> Replay:
    """Each query with its documents as one live request, then the relevant documents'
    indexes as feedback."""
    replay, started = Replay(), time.perf_counter()
    for i in _paced(len(items), rate):
        reply: Scores = client.rerank(task, items[i].query, items[i].documents)
        if not reply.sampled or reply.request_id is None:
            raise AssertionError(f"query {i} was not sampled: {reply}")
        client.feedback(reply.request_id, relevant=items[i].relevant)
        replay.replies.append(reply)
    replay.seconds = time.perf_counter() - started
    return replay


# ---- what the control plane made of it ----------------------------------------------------
def judged(reg: Registry, task: str, shadow: str, requests: int) -> AgreementSummary | None:
    """The agreement summary of ``shadow`` once all ``requests`` sampled requests have its
    outcome (answered, shed or failed); None while any is still pending."""
    summary = reg.agreement_summary(task, shadow=shadow)
    outcomes = summary.outcomes
    settled = sum(n for outcome, n in outcomes.items() if outcome != "pending")
    return summary if settled >= requests and not outcomes.get("pending") else None


def answered_by_shadow(reg: Registry, task: str, request_ids: Sequence[str]) -> set[str]:
    """The request ids among ``request_ids`` whose shadow copy was answered (outcome ok)."""
    ok = set()
    for request_id in request_ids:
        sample = reg.get_sample(request_id)
        if sample is not None and sample.shadow_outcome == "ok":
            ok.add(request_id)
    return ok


def live_runs(
    reg: Registry, task: str, candidates: Sequence[str], version: int | None = None
) -> dict[str, EvalRun] | None:
    """The live-split eval runs of ``candidates`` on the suite's newest version (or
    ``version``), once every one of them has one."""
    suite = reg.get_suite(reg.get_task(task).suite)
    if suite.live_split is None or (version is not None and suite.version != version):
        return None
    runs = {
        r.candidate: r
        for r in reg.list_eval_runs(task)
        if r.suite_fingerprint == suite.fingerprint and r.split == suite.live_split
    }
    return runs if set(candidates) <= set(runs) else None


def wait_for(probe: Callable[[], Any], timeout_s: float, every_s: float = 1.0) -> Any:
    return wait_until(probe, timeout_s=timeout_s, every_s=every_s)


# ---- offline, in-process ------------------------------------------------------------------
class Recording:
    """A candidate that keeps its last answer (predictions, or per-query document scores)
    while the harness scores it: the in-process answers beside the metric."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.output: Any = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in ("classify", "rerank", "retrieve"):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.output = attr(*args, **kwargs)
            return self.output

        return recorded


@dataclass
class Offline:
    """An offline eval of a registered candidate on a folder, with its in-process answers."""

    result: EvalResult
    output: Any  # ClassificationOutput | RetrievalOutput

    def labels(self) -> list[str]:
        return list(self.output.predictions)

    def scores(self, query: RankedQuery) -> np.ndarray:
        by_doc = self.output.results[query.id]
        return np.asarray([by_doc[d] for d in query.doc_ids], dtype=np.float64)


def offline_eval(
    reg: Registry, task: str, candidate: str, folder: Path, cache_dir: Path
) -> Offline:
    """``candidate`` as `taskfleet eval run` builds it, scored on ``folder``'s test split."""
    from evals.cache import EmbeddingCache
    from evals.runner import resolve_candidate

    kind = reg.get_task(task).kind
    spec = SuiteSpec(name=f"{task}-items", kind=kind, location=folder, test_split="test")
    cache = EmbeddingCache.in_dir(cache_dir)
    resolved = resolve_candidate(reg, reg.get_candidate(task, candidate), spec, cache)
    try:
        recording = Recording(resolved.candidate)
        result = evaluate(spec, "test", recording)
    finally:
        resolved.close()
        cache.close()
    return Offline(result, recording.output)


def label_agreement(champion: Sequence[str], shadow: Sequence[str]) -> float:
    """The share of inputs on which both gave the same label."""
    return float(np.mean([a == b for a, b in zip(champion, shadow, strict=True)]))


def top_overlap(champion: np.ndarray, shadow: np.ndarray, top: int) -> float:
    """The share of the champion's ``top`` best documents that are also the shadow's (ties:
    the lower index first, as the harness ranks)."""
    k = min(top, champion.shape[0])
    best = set(np.argsort(-champion, kind="stable")[:k])
    return len(best & set(np.argsort(-shadow, kind="stable")[:k])) / k
