"""The shell's part of production: what the leading control plane makes of live traffic.

``serving/production_consumer.py`` consumes the streams; this module gives it the judge that knows
suites and models (:class:`SuiteJudge`), and runs beside it the loop that acts on what was kept
(:class:`ProductionTicker`), each tick, per task:

1. samples past their task's retention are deleted (the stream drops their inputs by TTL);
2. when ``live_every`` labelled items wait, a live version of the suite is cut
   (``taskfleet/live_split.py``): a new suite version, so the pairings' evidence goes stale;
3. each full window (``drift_window`` inputs the champion answered) is compared with the
   suite's test inputs (``evals/drift.py``); a window that drifts is flagged (dashboard,
   ``taskfleet_production_drifted``, the alert rule in ``deploy/``) and cuts a live version of
   the items waiting, so the re-evaluation below runs on the live split that includes them;
4. the stale pairings (champion, shadow, best challengers) are queued, and the oldest queued
   re-evaluation runs, one at a time, as a ``taskfleet eval run`` subprocess (its own memory,
   its own crash), recorded like any run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from nats.aio.client import Client as NATS

from evals import agreement as ag
from evals import drift
from evals.classification_data import ClassificationSplit
from evals.readers import SuiteData
from evals.runner import EvalPaths
from registry import RegistryError
from registry import entities as e
from registry.store import AbstractStore
from serving import protocol as p
from serving.sample_records import ChampionSample, Feedback

if TYPE_CHECKING:
    from serving.control import ControlLoop
    from taskfleet.settings import Settings

log = logging.getLogger("taskfleet.production")

TICK_S = 2.0
# Re-evaluations slower than this are stopped and recorded as failed (bounded work).
REEVAL_TIMEOUT_S = 3600.0


def texts_of(payload: p.TaskPayload) -> list[str]:
    """The inputs a sample's features and feedback index into: a rerank request's query is its
    one input."""
    if isinstance(payload, p.ScorePayload):
        return [payload.query]
    inputs = payload.inputs
    if isinstance(inputs, p.PayloadRef):
        raise p.ProtocolError("a sample's inputs must be inline")
    return list(inputs)


class SuiteJudge:
    """Features, agreement and live items, from the task's suite and the candidates' models."""

    def __init__(self, registry: AbstractStore, paths: EvalPaths) -> None:
        self.registry = registry
        self.paths = paths
        self._corpus: dict[tuple[str, str], tuple[list[str], np.ndarray]] = {}
        self._corpus_ids: dict[str, set[str]] = {}

    # ---- the sample row ----------------------------------------------------------------
    def sample(self, record: ChampionSample) -> e.SampleCreate:
        payload, reply = record.inputs(), record.answer()
        texts = texts_of(payload)
        predicted = vectors = dims = None
        if isinstance(reply, p.ClassifyReplyOk):
            rows = reply.matrix()
            predicted = [reply.labels[int(np.argmax(row))] for row in rows]
        elif isinstance(reply, p.ReplyOk) and getattr(payload, "kind", None) == "query":
            matrix = reply.matrix()
            vectors, dims = p.floats_to_bytes(matrix), int(matrix.shape[1])
        return e.SampleCreate(
            task=record.task,
            request_id=record.request_id,
            received_at=_utc(record.ts_ms),
            inputs=len(texts),
            champion=record.candidate,
            champion_model_key=reply.model_key,
            champion_epoch=reply.epoch,
            champion_ms=record.latency_ms,
            shadow=record.shadow,
            lengths=[drift.words(t) for t in texts],
            predicted=predicted,
            vectors=vectors,
            dims=dims,
        )

    # ---- agreement ---------------------------------------------------------------------
    def agreement(
        self, record: ChampionSample, shadow: p.AnyReplyOk
    ) -> tuple[list[float], dict[str, list[float]]]:
        champion = record.answer()
        if isinstance(champion, p.ClassifyReplyOk) and isinstance(shadow, p.ClassifyReplyOk):
            pairs = ag.classification(
                champion.matrix(), champion.labels, shadow.matrix(), shadow.labels
            )
            return [a.value for a in pairs], {
                "mean_abs_dp": [a.extra["mean_abs_dp"] for a in pairs]
            }
        if isinstance(champion, p.ScoreReplyOk) and isinstance(shadow, p.ScoreReplyOk):
            one = ag.rerank(champion.array(), shadow.array())
            return [one.value], {"kendall_tau": [one.extra["kendall_tau"]]}
        if isinstance(champion, p.ReplyOk) and isinstance(shadow, p.ReplyOk):
            if getattr(record.inputs(), "kind", None) != "query" or record.shadow is None:
                return [], {}  # passage vectors rank nothing: no agreement to measure
            _, mine = self.corpus_vectors(record.task, record.candidate)
            _, theirs = self.corpus_vectors(record.task, record.shadow)
            values = [
                ag.retrieval(q, mine, s, theirs).value
                for q, s in zip(champion.matrix(), shadow.matrix(), strict=True)
            ]
            return values, {}
        raise ValueError(
            f"the shadow answered a {type(shadow).__name__} to a {type(champion).__name__}"
        )

    def corpus_vectors(self, task: str, candidate: str) -> tuple[list[str], np.ndarray]:
        """A retrieval candidate's vectors of its task's suite corpus, from the eval cache (or
        encoded once into it), kept in memory per suite version."""
        suite = self.registry.get_suite(self.registry.get_task(task).suite)
        key = (candidate, suite.fingerprint)
        if key not in self._corpus:
            data = self._split(task, suite.test_split)
            corpus = _corpus(data)
            ids = list(corpus)
            texts = [corpus[d] for d in ids]
            self._corpus[key] = (ids, self._embed(task, candidate, texts, "passage"))
        return self._corpus[key]

    def _embed(self, task: str, candidate: str, texts: Sequence[str], kind: str) -> np.ndarray:
        from evals.cache import EmbeddingCache
        from evals.retrievers import DenseRetriever
        from evals.runner import resolve_candidate, task_suite
        from serving.runtime.encoder import EncodeStats

        cache = EmbeddingCache.in_dir(self.paths.cache_dir)
        suite = task_suite(self.registry, task, self.paths)
        resolved = resolve_candidate(
            self.registry, self.registry.get_candidate(task, candidate), suite, cache
        )
        try:
            retriever = resolved.candidate
            if not isinstance(retriever, DenseRetriever):
                raise ValueError(f"candidate {candidate!r} has no vectors to rank a corpus with")
            matrix, _ = retriever.embed(list(texts), kind, EncodeStats(), lambda *_: None)  # type: ignore[arg-type]
            return matrix
        finally:
            resolved.close()
            cache.close()

    def _split(self, task: str, split: str) -> SuiteData:
        from evals.runner import task_suite

        spec = task_suite(self.registry, task, self.paths)
        return spec.load(split, self.paths.data_root)

    # ---- live items --------------------------------------------------------------------
    def live_item(self, record: ChampionSample, feedback: Feedback) -> e.LiveItemCreate:
        payload, reply = record.inputs(), record.answer()
        texts = texts_of(payload)
        if not 0 <= feedback.index < len(texts):
            raise ValueError(f"input {feedback.index} is outside the request's {len(texts)}")
        item: dict[str, object]
        if isinstance(reply, p.ClassifyReplyOk):
            if feedback.label is None or feedback.label not in reply.labels:
                raise ValueError(f"label {feedback.label!r} is not one of the task's labels")
            item = {"text": texts[feedback.index], "label": feedback.label}
        elif isinstance(payload, p.ScorePayload):
            documents = payload.documents
            if isinstance(documents, p.PayloadRef) or feedback.relevant is None:
                raise ValueError("rerank feedback names the relevant documents by index")
            if any(not 0 <= k < len(documents) for k in feedback.relevant):
                raise ValueError("a relevant document index is outside the request's documents")
            item = {
                "query": payload.query,
                "documents": list(documents),
                "relevant": sorted(set(feedback.relevant)),
            }
        else:
            if getattr(payload, "kind", None) != "query" or feedback.relevant_ids is None:
                raise ValueError("retrieval feedback is about a query: relevant_ids")
            known = self._known_ids(record.task)
            unknown = [d for d in feedback.relevant_ids if d not in known]
            if unknown:
                raise ValueError(f"relevant_ids not in the suite's corpus: {unknown[:5]}")
            item = {"query": texts[feedback.index], "relevant_ids": list(feedback.relevant_ids)}
        return e.LiveItemCreate(
            record.task, record.request_id, feedback.index, item, key=feedback.key
        )

    def _known_ids(self, task: str) -> set[str]:
        suite = self.registry.get_suite(self.registry.get_task(task).suite)
        if suite.fingerprint not in self._corpus_ids:
            data = self._split(task, suite.test_split)
            self._corpus_ids[suite.fingerprint] = set(_corpus(data))
        return self._corpus_ids[suite.fingerprint]

    # ---- drift -------------------------------------------------------------------------
    def drift_reference(self, task: str, champion: str) -> drift.Reference:
        """The champion's view of the suite's test split: input lengths, its predicted labels
        (classification, from its eval run), its query vectors (retrieval)."""
        suite = self.registry.get_suite(self.registry.get_task(task).suite)
        data = self._split(task, suite.test_split)
        if isinstance(data, ClassificationSplit):
            texts = list(data.texts)
            run = self._test_run(task, champion, suite)
            labels = list(data.label_names)
            predicted = None
            if run is not None and run.details and "pred" in run.details:
                index = {label: i for i, label in enumerate(labels)}
                predicted = np.asarray(
                    [index.get(label, len(labels)) for label in run.details["pred"].values()]
                )
            return drift.Reference(
                lengths=np.asarray([drift.words(t) for t in texts], dtype=np.float64),
                labels=labels,
                predicted=predicted,
            )
        queries = list(data.queries.values())
        lengths = np.asarray([drift.words(t) for t in queries], dtype=np.float64)
        if suite.kind == "retrieval":
            return drift.Reference(lengths, vectors=self._embed(task, champion, queries, "query"))
        return drift.Reference(lengths)

    def _test_run(self, task: str, candidate: str, suite: e.Suite) -> e.EvalRun | None:
        for run in self.registry.list_eval_runs(task, candidate):
            if run.suite_fingerprint == suite.fingerprint and run.split == suite.test_split:
                return run
        return None


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _corpus(data: SuiteData) -> dict[str, str]:
    if isinstance(data, ClassificationSplit):
        raise ValueError("a classification suite has no corpus")
    return data.corpus


@dataclass(frozen=True)
class ShellPaths:
    """What a re-evaluation subprocess and a live cut need to know of the shell."""

    home: Path
    database_url: str
    data_root: Path | None
    eval_paths: EvalPaths


class ProductionTicker:
    """The leader's production loop (the module docstring's steps), every ``tick_s``."""

    def __init__(
        self,
        registry: AbstractStore,
        judge: SuiteJudge,
        paths: ShellPaths,
        *,
        tick_s: float = TICK_S,
        reevaluate: bool = True,
    ) -> None:
        self.registry = registry
        self.judge = judge
        self.paths = paths
        self.tick_s = tick_s
        self.reevaluate = reevaluate
        self._stop = asyncio.Event()
        self._references: dict[tuple[str, str, str], drift.Reference] = {}
        self._running: tuple[e.Reevaluation, asyncio.subprocess.Process, float] | None = None

    def stop(self) -> None:
        self._stop.set()

    async def run(self, nc: NATS | None = None) -> None:
        if self.reevaluate:
            with contextlib.suppress(RegistryError):
                await asyncio.to_thread(self.registry.requeue_interrupted)
        try:
            while not self._stop.is_set():
                try:
                    await asyncio.to_thread(self.tick)
                    if self.reevaluate:
                        await self._step_reevaluation()
                except RegistryError as exc:
                    log.warning("production: %s; trying again", exc)
                await self._sleep(self.tick_s)
        finally:
            if self._running is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._running[1].kill()

    def tick(self) -> None:
        """Steps 1-4 (queueing) for every task; blocking (run in a thread). One task's
        failure (a live cut its suite's reader refuses, data that moved) is a warning for that
        task, tried again next tick: it must not stop the loop for every task."""
        from evals.errors import EvalError

        self.registry.prune_samples()
        for task in self.registry.list_tasks():
            try:
                self._task_tick(task)
            except (RegistryError, EvalError, OSError, ValueError) as exc:
                log.warning("production, task %s: %s", task.name, exc)

    def _task_tick(self, task: e.Task) -> None:
        from evals.errors import EvalError

        settings = self.registry.production_settings(task.name)
        _, pending = self.registry.live_counts(task.name)
        if pending >= settings.live_every:
            self.cut(task.name)
        try:
            window = self.measure_drift(task.name, settings)
        except EvalError as exc:
            log.warning("drift of %s not measured: %s", task.name, exc)
            window = None
        if window is not None and window.drifted and self.registry.live_counts(task.name)[1]:
            self.cut(task.name)
        if self.reevaluate:
            self.registry.queue_stale(task.name)

    def cut(self, task: str) -> e.Suite:
        from taskfleet.live_split import cut_live_version

        version, created = cut_live_version(
            self.registry, task, self.paths.home, data_root=self.paths.data_root
        )
        if created:
            log.info("live version %s@%d cut for %s", version.name, version.version, task)
        return version

    def measure_drift(self, task: str, settings: e.ProductionSettings) -> e.DriftWindow | None:
        """The next full window of samples the champion answered, compared with the suite's
        test inputs; None while the window is not full."""
        champion = self.registry.champion(task)
        if champion is None:
            return None
        windows = self.registry.drift_windows(task, limit=1)
        after = windows[0].last_sample_id if windows else 0
        samples = [
            s
            for s in self.registry.list_samples(task, after_id=after, limit=settings.drift_window)
            if s.champion == champion.name
        ]
        size, taken = 0, []
        for sample in samples:
            taken.append(sample)
            size += sample.inputs
            if size >= settings.drift_window:
                break
        if size < settings.drift_window:
            return None
        suite = self.registry.get_suite(task_suite_name(self.registry, task))
        key = (task, champion.name, suite.fingerprint)
        if key not in self._references:
            self._references[key] = self.judge.drift_reference(task, champion.name)
        report = drift.window_report(
            self._references[key], window_of(taken), alpha=settings.drift_alpha, seed=taken[0].id
        )
        return self.registry.record_drift_window(
            e.DriftWindowCreate(
                task=task,
                first_sample_id=taken[0].id,
                last_sample_id=taken[-1].id,
                size=report.size,
                champion=champion.name,
                suite_version=suite.version,
                signals=[
                    {"name": s.name, "statistic": s.statistic, "p_value": s.p_value}
                    for s in report.signals
                ],
                p_min=report.p_min,
                alpha=settings.drift_alpha,
                drifted=report.drifted,
            )
        )

    async def _step_reevaluation(self) -> None:
        """Finish the running re-evaluation when its process has ended; else start the next."""
        if self._running is not None:
            job, process, started = self._running
            elapsed = asyncio.get_running_loop().time() - started
            if process.returncode is None and elapsed < REEVAL_TIMEOUT_S:
                return
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            self._running = None
            _, err = await process.communicate()
            await asyncio.to_thread(
                self._finish, job, process.returncode, err.decode(errors="replace")
            )
            return
        queued = await asyncio.to_thread(self.registry.next_reevaluation)
        if queued is None:
            return
        job = queued
        process = await asyncio.create_subprocess_exec(
            *self._command(job),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "TASKFLEET_ACTOR": "system:reevaluation"},
        )
        log.info("re-evaluating %s/%s on %s (%s)", job.task, job.candidate, job.split, job.reason)
        self._running = (job, process, asyncio.get_running_loop().time())

    def _command(self, job: e.Reevaluation) -> list[str]:
        command = [
            sys.executable, "-m", "taskfleet", "--home", str(self.paths.home),
            "--database-url", self.paths.database_url,
            "eval", "run", job.task, "-c", job.candidate, "--split", job.split,
            "--runtime", job.runtime or "torch",
        ]  # fmt: skip
        if self.paths.data_root is not None:
            command += ["--data-dir", str(self.paths.data_root)]
        if not self.paths.eval_paths.mlflow_uri:
            command.append("--no-mlflow")
        return command

    def _finish(self, job: e.Reevaluation, code: int | None, stderr: str) -> None:
        run_id = None
        if code == 0:
            for run in self.registry.list_eval_runs(job.task, job.candidate):
                if (run.suite_fingerprint, run.split) == (job.suite_fingerprint, job.split):
                    run_id = run.id
                    break
        error = None if run_id is not None else (_last_line(stderr) or f"exit code {code}")
        self.registry.finish_reevaluation(job.id, eval_run_id=run_id, error=error)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


def task_suite_name(registry: AbstractStore, task: str) -> str:
    return registry.get_task(task).suite


def window_of(samples: list[e.Sample]) -> drift.Window:
    lengths = np.asarray([n for s in samples for n in s.lengths], dtype=np.float64)
    predicted = None
    if all(s.predicted is not None for s in samples):
        predicted = [label for s in samples for label in s.predicted or []]
    vectors = None
    if all(s.vectors is not None and s.dims for s in samples):
        vectors = np.concatenate(
            [np.frombuffer(s.vectors or b"", dtype="<f4").reshape(-1, s.dims or 1) for s in samples]
        )
    return drift.Window(lengths=lengths, predicted=predicted, vectors=vectors)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


def production_loops(
    registry: AbstractStore,
    nats_url: object,
    paths: ShellPaths,
    *,
    tick_s: float = TICK_S,
    reevaluate: bool = True,
) -> Callable[[], list[ControlLoop]]:
    """What ``ControlLoops(extra_loops=...)`` runs on the leader, fresh every term: the stream
    consumer and the ticker, sharing one judge."""
    from serving.production_consumer import ProductionConsumer

    def loops() -> list[ControlLoop]:
        judge = SuiteJudge(registry, paths.eval_paths)
        return [
            ProductionConsumer(registry, nats_url, judge),  # type: ignore[arg-type]
            ProductionTicker(registry, judge, paths, tick_s=tick_s, reevaluate=reevaluate),
        ]

    return loops


def shell_paths(settings: Settings, *, home: Path | None = None) -> ShellPaths:
    """The paths of the running shell (``taskfleet serve``/``up``)."""
    home = home or settings.resolved_home
    return ShellPaths(
        home=home,
        database_url=settings.resolved_database_url,
        data_root=settings.data_dir,
        eval_paths=EvalPaths(
            cache_dir=home / "cache",
            mlflow_uri=settings.resolved_mlflow_uri,
            data_root=settings.data_dir,
        ),
    )
