"""mteb's full retrieval path over a local suite split: a custom ``AbsTaskRetrieval`` fed from
our loaded files (no hub), run with mteb's own search and scoring.

The harness itself encodes through serving/runtime (cache, token batching, cost) and scores with
mteb's metric functions; this module exists so a test, or a sceptical user, can check that both
routes give the same numbers for the same model and data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evals.beir import RetrievalSplit
from evals.ranking_metrics import parse_metric
from evals.suites import SuiteSpec


def make_task(suite: SuiteSpec, data: RetrievalSplit) -> Any:
    """An mteb AbsTaskRetrieval whose only split is ``data`` (already validated by us)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    k_values = tuple(sorted({parse_metric(m)[1] for m in suite.metrics} | {1}))
    metadata = TaskMetadata(
        name=f"Local{suite.name.title().replace('-', '')}",
        description=suite.description or f"Local BEIR suite {suite.name}",
        reference=None,
        dataset={"path": "local", "revision": suite.version},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=[data.split],
        eval_langs=["deu-Latn"],
        main_score=suite.main_metric,
        date=None,
        domains=None,
        task_subtypes=None,
        license=None,
        annotations_creators=None,
        dialect=None,
        sample_creation=None,
        bibtex_citation=None,
    )
    split_data: Any = {
        "corpus": Dataset.from_list(
            [{"id": d, "text": t, "title": ""} for d, t in data.corpus.items()]
        ),
        "queries": Dataset.from_list([{"id": q, "text": t} for q, t in data.queries.items()]),
        "relevant_docs": {q: dict(docs) for q, docs in data.qrels.items()},
        "top_ranked": None,
    }

    class LocalRetrievalTask(AbsTaskRetrieval):
        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            self.dataset = {"default": {data.split: split_data}}
            self.data_loaded = True

    LocalRetrievalTask.metadata = metadata
    LocalRetrievalTask.k_values = k_values
    return LocalRetrievalTask()


def evaluate_with_mteb(
    suite: SuiteSpec, data: RetrievalSplit, model_path: Path, *, batch_size: int = 32
) -> dict[str, float]:
    """mteb's scores for a local sentence-transformers folder (no prefixes, cosine similarity)."""
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    task = make_task(suite, data)
    scores = task.evaluate(
        SentenceTransformerEncoderWrapper(model),
        split=data.split,
        encode_kwargs={"batch_size": batch_size, "show_progress_bar": False},
    )
    flat = scores["default"]
    return {m: float(flat[m]) for m in suite.metrics}
