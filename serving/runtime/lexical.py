"""The lexical baselines as servable models: TF-IDF + logistic regression, and BM25.

Both are plain numpy over what their artifact holds (serving/runtime/baseline_artifact.py reads
it), so the eval harness and the runtime server run this same code on the same numbers: what is
evaluated is what is served.

- ``TfidfLogReg`` classifies: word 1-2 grams of the lowercased text (scikit-learn's default
  ``(?u)\\b\\w\\w+\\b`` tokens), sublinear tf times the fitted idf, L2-normalised, then a linear
  layer and a softmax over the labels. ``evals/baselines.py`` fits it with scikit-learn and
  exports the vocabulary, idf and coefficients; ``features`` reproduces
  ``TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True).transform`` (a test holds them equal).
- ``Bm25`` scores documents for a query: Lucene BM25 (k1, b) with the document frequencies,
  document count and mean length of the corpus it was fitted on, over ``tokenize_words`` (the
  retrieval baseline's tokenizer: lowercase ``\\w+`` runs minus a stopword list). A document's tf
  and length come from its own text, so it scores documents the corpus never held; for corpus
  documents the scores are bm25s's (its "lucene" method).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

# scikit-learn's default token pattern: runs of two or more word characters.
SKLEARN_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize_words(text: str, stopwords: Collection[str]) -> list[str]:
    """Lowercase runs of Unicode word characters (umlauts and ß kept, '§' dropped), minus
    ``stopwords``: the tokenizer of the BM25 baselines, retrieval and rerank alike."""
    return [w for w in _WORD.findall(text.lower()) if w not in stopwords]


def word_ngrams(text: str, max_n: int) -> list[str]:
    """scikit-learn's word analyzer (lowercase, default token pattern, n-grams 1..max_n joined
    by one space, in its order)."""
    tokens = SKLEARN_TOKEN.findall(text.lower())
    grams = list(tokens)
    for n in range(2, min(max_n, len(tokens)) + 1):
        grams.extend(" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return grams


def softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return np.asarray(exp / exp.sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class TfidfLogReg:
    labels: tuple[str, ...]
    vocabulary: dict[str, int]  # term -> feature column
    idf: np.ndarray  # (features,) float64
    weights: np.ndarray  # (labels, features) float64
    bias: np.ndarray  # (labels,) float64
    max_ngram: int = 2

    @property
    def memory_bytes(self) -> int:
        arrays = self.idf.nbytes + self.weights.nbytes + self.bias.nbytes
        # A dict entry with its string costs about 100 bytes in CPython beyond the text.
        return int(arrays + sum(len(t) + 100 for t in self.vocabulary))

    def features(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values) of the text's L2-normalised TF-IDF row; unknown terms dropped."""
        counts = Counter(g for g in word_ngrams(text, self.max_ngram) if g in self.vocabulary)
        if not counts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        columns = np.fromiter((self.vocabulary[g] for g in counts), dtype=np.int64)
        tf = np.fromiter(counts.values(), dtype=np.float64)
        values = (1.0 + np.log(tf)) * self.idf[columns]
        norm = float(np.sqrt(np.dot(values, values)))
        return columns, values / norm if norm > 0 else values

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), len(self.labels)), dtype=np.float64)
        for row, text in enumerate(texts):
            columns, values = self.features(text)
            out[row] = self.weights[:, columns] @ values + self.bias
        return out

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), len(labels)) float32 probabilities: computed in float64, handed out in
        the float32 the protocol carries, so the eval scores exactly what a caller receives."""
        return softmax64(self.logits(texts)).astype(np.float32)


@dataclass(frozen=True)
class Bm25:
    k1: float
    b: float
    documents: int  # corpus size N
    mean_length: float  # mean document length in tokens
    vocabulary: dict[str, int]  # term -> row of ``idf``
    idf: np.ndarray  # (terms,) float64, Lucene: ln(1 + (N - df + 0.5) / (df + 0.5))
    stopwords: frozenset[str]

    @property
    def memory_bytes(self) -> int:
        words = sum(len(t) + 100 for t in self.vocabulary) + sum(
            len(w) + 60 for w in self.stopwords
        )
        return int(self.idf.nbytes + words)

    def score(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """One float32 score per document, in order (0 where no query term occurs)."""
        words = tokenize_words(query, self.stopwords)
        terms = [self.vocabulary[w] for w in words if w in self.vocabulary]
        scores = np.zeros(len(documents), dtype=np.float64)
        if not terms:
            return scores.astype(np.float32)
        query_counts = Counter(terms)
        for row, document in enumerate(documents):
            tokens = tokenize_words(document, self.stopwords)
            if not tokens:
                continue
            norm = self.k1 * ((1.0 - self.b) + self.b * len(tokens) / self.mean_length)
            tf = Counter(self.vocabulary.get(t, -1) for t in tokens)
            total = 0.0
            # Every occurrence of a query term adds its part (bm25s sums over query tokens).
            for term, times in query_counts.items():
                f = tf.get(term, 0)
                if f:
                    total += times * float(self.idf[term]) * f / (norm + f)
            scores[row] = total
        return scores.astype(np.float32)


def lucene_idf(document_frequency: np.ndarray, documents: int) -> np.ndarray:
    df = document_frequency.astype(np.float64)
    return np.log(1.0 + (documents - df + 0.5) / (df + 0.5))


def bm25_statistics(
    corpus: Sequence[str], stopwords: Collection[str]
) -> tuple[dict[str, int], np.ndarray, float]:
    """(term -> row, document frequency per row, mean document length) of a corpus."""
    vocabulary: dict[str, int] = {}
    frequency: list[int] = []
    total = 0
    for text in corpus:
        tokens = tokenize_words(text, stopwords)
        total += len(tokens)
        for term in set(tokens):
            row = vocabulary.setdefault(term, len(vocabulary))
            if row == len(frequency):
                frequency.append(0)
            frequency[row] += 1
    if not corpus or total == 0:
        raise ValueError("BM25 needs a corpus with at least one word that is not a stopword")
    return vocabulary, np.asarray(frequency, dtype=np.int64), total / len(corpus)
