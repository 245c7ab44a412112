"""Classification candidates: predict one label per text (the ``classification`` suite kind).

- ``MajorityClass`` — the most frequent training label for everything (the floor);
- ``TfidfLogisticRegression`` — the lexical baseline: TF-IDF over word 1-2 grams (sublinear tf)
  and a class-balanced logistic regression, fitted on the suite's training split at eval time;
- ``ModelClassifier`` — an embedding model with a ``classify`` head (logistic regression on
  frozen embeddings, or a fine-tuned LoRA + head), through serving/runtime's ``Classifier``:
  what is evaluated is what is served.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from evals.classification_data import ClassificationSplit
from evals.errors import CandidateError
from evals.harness import ClassificationOutput
from evals.retrievers import ProgressFn, measured_cost, no_progress

if TYPE_CHECKING:
    from serving.runtime.encoder import ModelSpec


class MajorityClass:
    needs_training_split = True

    def classify(
        self,
        data: ClassificationSplit,
        train: ClassificationSplit | None,
        progress: ProgressFn = no_progress,
    ) -> ClassificationOutput:
        assert train is not None
        counts = Counter(train.labels)
        # Ties go to the label declared first, so the baseline does not depend on row order.
        best = max(train.label_names, key=lambda label: counts[label])
        progress("items", len(data.ids), len(data.ids))
        return ClassificationOutput([best] * len(data.ids), cost={})


class TfidfLogisticRegression:
    needs_training_split = True

    def __init__(self, *, c: float = 1.0, seed: int = 0) -> None:
        self.c = c
        self.seed = seed

    def classify(
        self,
        data: ClassificationSplit,
        train: ClassificationSplit | None,
        progress: ProgressFn = no_progress,
    ) -> ClassificationOutput:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        assert train is not None
        pipeline = make_pipeline(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
            LogisticRegression(
                C=self.c, class_weight="balanced", max_iter=2000, random_state=self.seed
            ),
        )
        started = time.perf_counter()
        pipeline.fit(train.texts, train.labels)
        fit_seconds = time.perf_counter() - started
        started = time.perf_counter()
        predictions = [str(p) for p in pipeline.predict(data.texts)]
        seconds = time.perf_counter() - started
        progress("items", len(data.ids), len(data.ids))
        cost = {
            "items_per_s": len(data.ids) / seconds if seconds > 0 else 0.0,
            "fit_seconds": fit_seconds,
        }
        return ClassificationOutput(predictions, cost=cost)


class ModelClassifier:
    needs_training_split = False

    def __init__(self, spec: ModelSpec, *, max_batch_tokens: int | None = None) -> None:
        self.spec = spec
        self.max_batch_tokens = max_batch_tokens
        self._classifier: Any = None

    def classifier(self) -> Any:
        from serving.runtime.classifier import Classifier
        from serving.runtime.encoder import Encoder
        from serving.runtime.heads import load_head, with_head_limit

        if self._classifier is None:
            assert self.spec.adapter_path is not None
            spec = with_head_limit(self.spec)  # the length the head was trained with
            encoder = Encoder(spec, max_batch_tokens=self.max_batch_tokens)
            self._classifier = Classifier(encoder, load_head(self.spec.adapter_path))
        return self._classifier

    def classify(
        self,
        data: ClassificationSplit,
        train: ClassificationSplit | None,
        progress: ProgressFn = no_progress,
    ) -> ClassificationOutput:
        from serving.runtime.encoder import EncodeStats

        classifier = self.classifier()
        labels = list(classifier.labels)
        if set(labels) != set(data.label_names):
            raise CandidateError(
                f"the classifier's labels ({', '.join(labels)}) are not the suite's "
                f"({', '.join(data.label_names)})"
            )
        stats = EncodeStats()
        total = len(data.ids)
        probabilities = classifier.predict_proba(
            data.texts, stats, lambda n: progress("items", n, total)
        )
        predictions = [labels[i] for i in np.argmax(probabilities, axis=1)]
        return ClassificationOutput(predictions, cost=measured_cost(stats))
