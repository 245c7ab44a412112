"""Builders for eval tests: a small deterministic BEIR folder, a tiny random sentence-transformers
model over its vocabulary, and a LoRA adapter for that model. No network, a few seconds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = {
    "miete": "mieter vermieter wohnung kaution kündigung nebenkosten mietvertrag",
    "kauf": "käufer verkäufer kaufpreis sache mangel gewährleistung rücktritt",
    "erbe": "erbe erblasser testament pflichtteil nachlass erbschein vermächtnis",
    "ehe": "ehegatte scheidung unterhalt zugewinn ehevertrag trennung sorgerecht",
    "arbeit": "arbeitnehmer arbeitgeber lohn urlaub kündigungsschutz zeugnis überstunden",
    "schaden": "schadensersatz haftung verschulden unfall schmerzensgeld fahrlässigkeit",
}
FILLER = ["der", "die", "das", "und", "oder", "nicht", "mit", "bei", "für", "von", "ist"]


def _words(rng: random.Random, topic: str, n: int) -> list[str]:
    vocab = TOPICS[topic].split()
    return [rng.choice(vocab) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(n)]


def build_beir(
    root: Path,
    *,
    docs_per_topic: int = 6,
    queries: dict[str, int] | None = None,
    seed: int = 7,
) -> Path:
    """Write corpus.jsonl, queries.jsonl, qrels/<split>.tsv under root; returns root.

    Each query is drawn from one topic and judged relevant to 1-2 documents of that topic,
    one of which shares some of its words, so lexical and dense retrieval both have signal.
    """
    queries = queries or {"test": 24, "dev": 12}
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    docs: dict[str, tuple[str, str]] = {}  # id -> (topic, text)
    for topic in TOPICS:
        for i in range(docs_per_topic):
            docs[f"§ {topic}-{i}"] = (topic, " ".join(_words(rng, topic, 30)).capitalize() + ".")
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for doc_id, (topic, text) in docs.items():
            row = {"_id": doc_id, "title": topic.capitalize(), "text": text}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as qfh:
        for split, count in queries.items():
            lines = ["query-id\tcorpus-id\tscore"]
            for n in range(count):
                qid = f"{split}-{n:04d}"
                topic = rng.choice(list(TOPICS))
                same = [d for d, (t, _) in docs.items() if t == topic]
                relevant = rng.sample(same, rng.choice([1, 1, 2]))
                borrowed = rng.sample(docs[relevant[0]][1].rstrip(".").lower().split(), 5)
                text = " ".join(borrowed + _words(rng, topic, 10)) + "?"
                qfh.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
                lines += [f"{qid}\t{d}\t1" for d in relevant]
            (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root


def fixture_vocab() -> list[str]:
    words = sorted({w for v in TOPICS.values() for w in v.split()} | set(FILLER))
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *sorted(TOPICS)]


def build_tiny_model(root: Path, *, seed: int = 0, hidden: int = 32) -> Path:
    """A random-initialised 2-layer BERT as a sentence-transformers folder (mean pooling)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizer

    bert_dir = root / "bert"
    bert_dir.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(fixture_vocab())}
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True, strip_accents=False)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(fixture_vocab()),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(str(bert_dir))
    tokenizer.save_pretrained(str(bert_dir))
    transformer = models.Transformer(str(bert_dir), max_seq_length=64)
    pooling = models.Pooling(hidden, pooling_mode="mean")
    out = root / "model"
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


def build_lora_adapter(model_dir: Path, out: Path, *, seed: int = 1, rank: int = 4) -> Path:
    """A peft LoRA adapter for the tiny model with non-zero (random) B so it changes vectors."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BertModel

    torch.manual_seed(seed)
    base = BertModel.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=rank, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, config)
    peft_model.save_pretrained(str(out))
    return out
