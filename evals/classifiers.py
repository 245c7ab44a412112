"""Classification candidates: predict one label per text (the ``classification`` suite kind).

- ``MajorityClass`` — the most frequent training label for everything (the floor);
- ``BaselineClassifier`` — the lexical baseline: a fitted ``tfidf-lr`` artifact (TF-IDF over
  word 1-2 grams, sublinear tf, and a class-balanced logistic regression; evals/baselines.py fits
  it on the suite's training split) run by serving/runtime/lexical.py, as the runtime serves it;
  ``TfidfLogisticRegression`` fits one at eval time for a candidate registered without one;
- ``ModelClassifier`` — an embedding model with a ``classify`` head (logistic regression on
  frozen embeddings, or a fine-tuned LoRA + head), through serving/runtime's ``Classifier``:
  what is evaluated is what is served.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evals.classification_data import ClassificationSplit
from evals.cost import metered
from evals.errors import CandidateError
from evals.harness import ClassificationOutput
from evals.retrievers import ProgressFn, measured_cost, no_progress

if TYPE_CHECKING:
    from serving.runtime.model_folder import ModelSpec


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


class BaselineClassifier:
    """A fitted ``tfidf-lr`` artifact folder, loaded and run by serving/runtime's code: the
    probabilities the eval scores are the ones the runtime's ``classify`` answers."""

    needs_training_split = False

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def classify(
        self,
        data: ClassificationSplit,
        train: ClassificationSplit | None,
        progress: ProgressFn = no_progress,
    ) -> ClassificationOutput:
        from serving.runtime.baseline_artifact import BaselineError, load_baseline
        from serving.runtime.lexical import TfidfLogReg

        with metered() as usage:
            try:
                model = load_baseline(self.folder)
            except BaselineError as exc:
                raise CandidateError(str(exc)) from None
            if not isinstance(model, TfidfLogReg):
                raise CandidateError(f"{self.folder} is not a tfidf-lr artifact")
            unknown = sorted(set(model.labels) - set(data.label_names))
            if unknown:
                raise CandidateError(
                    f"the tfidf-lr artifact predicts label(s) the suite does not declare: "
                    f"{', '.join(unknown)}"
                )
            started = time.perf_counter()
            probabilities = model.predict_proba(data.texts)
            seconds = time.perf_counter() - started
        progress("items", len(data.ids), len(data.ids))
        predictions = [model.labels[i] for i in np.argmax(probabilities, axis=1)]
        cost = {"items_per_s": len(data.ids) / seconds if seconds > 0 else 0.0}
        cost.update(usage.figures(len(data.ids)))
        return ClassificationOutput(predictions, cost=cost)


class TfidfLogisticRegression:
    """The lexical baseline of a candidate registered without an artifact: fitted on the
    suite's training split at eval time into a temporary artifact, then scored as
    ``BaselineClassifier`` (the same code a placed artifact runs)."""

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
        from evals.baselines import fit_tfidf_lr

        assert train is not None
        with tempfile.TemporaryDirectory(prefix="taskfleet-tfidf-") as tmp:
            manifest = fit_tfidf_lr(train, Path(tmp) / "tfidf-lr", c=self.c, seed=self.seed)
            output = BaselineClassifier(Path(tmp) / "tfidf-lr").classify(data, None, progress)
        output.cost["fit_seconds"] = float(manifest["fitted_on"]["fit_seconds"])
        return output


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
