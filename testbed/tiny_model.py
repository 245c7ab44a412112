"""Build tiny random-initialised BERT sentence-transformers models (and LoRA adapters) for tests.

Real enough to exercise every code path (tokeniser, transformer, pooling, normalisation, peft)
yet small enough to load in well under a second on a CPU. Deterministic given the seed, so two
builds with the same arguments produce identical weights.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
GERMAN_WORDS = (
    "der die das und ist nicht ein eine zu von mit für auf dem den des im recht gesetz gericht "
    "vertrag miete mieter vermieter kündigung frist haftung schaden ersatz pflicht verschulden "
    "klage urteil berufung revision anspruch eigentum besitz kauf käufer verkäufer mangel "
    "gewährleistung grundschuld hypothek erbe erben testament ehe scheidung unterhalt arbeit "
    "arbeitnehmer arbeitgeber lohn urlaub steuer behörde bescheid widerspruch frage antwort "
    "miet ##vertrag ##frist was wer wie wann warum welche regelt gilt kann muss darf § bgb stgb "
    "zpo absatz satz nummer "
    "straße haus wohnung geld jahr monat tag woche über unter nach vor bei aus gegen ohne"
)
ENGLISH_WORDS = (
    "the a an and or of to in on for with is are was be not this that what who how when why "
    "law court contract rent tenant landlord notice period liability damage claim judgment "
    "appeal property sale buyer seller defect mortgage will marriage divorce work employee "
    "employer wage tax office question answer query passage document search model test"
)
PIECES = "##s ##e ##en ##er ##n ##t ##st ##ung ##ing ##ed ##es ##lich ##keit ##heit ##ig"


def tiny_vocab() -> list[str]:
    """Special tokens, whole words, sub-word pieces, then single characters as a fallback."""
    vocab = list(SPECIAL_TOKENS)
    for token in (*GERMAN_WORDS.split(), *ENGLISH_WORDS.split(), *PIECES.split()):
        if token not in vocab:
            vocab.append(token)
    for ch in "abcdefghijklmnopqrstuvwxyzäöüß0123456789.,;:!?-()'\"/":
        for token in (ch, f"##{ch}"):
            if token not in vocab:
                vocab.append(token)
    return vocab


def build_tiny_model(
    path: Path,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_seq_length: int = 64,
    normalize: bool = True,
    max_position_embeddings: int | None = None,
) -> Path:
    """Write a sentence-transformers folder (Transformer + mean Pooling [+ Normalize]) to ``path``.

    Loadable with ``SentenceTransformer(str(path), local_files_only=True)``.
    ``max_position_embeddings`` below ``max_seq_length`` builds a misconfigured model whose
    forward pass fails on long inputs: a real "poison input" for fault tests.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizer

    path = Path(path)
    hf_dir = path / "_hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    # strip_accents=False keeps umlauts, which the vocabulary spells out.
    tokenizer = BertTokenizer(
        vocab={token: i for i, token in enumerate(vocab)},
        do_lower_case=True,
        strip_accents=False,
        model_max_length=max_seq_length,
    )
    tokenizer.save_pretrained(str(hf_dir))

    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        max_position_embeddings=max_position_embeddings or max(128, max_seq_length),
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(str(hf_dir))

    transformer = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")]
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    shutil.rmtree(hf_dir)
    return path


def build_tiny_adapter(
    base_path: Path,
    path: Path,
    seed: int = 1,
    rank: int = 4,
    alpha: int = 8,
    target_modules: tuple[str, ...] = ("query", "value"),
    **lora: Any,
) -> Path:
    """Write a peft LoRA adapter for a tiny base with random, nonzero A *and* B weights.

    Default LoRA init sets B to zero (the adapter would be a no-op); ``init_lora_weights=False``
    makes it change the outputs, which is what tests need to tell adapters apart. ``lora``
    passes further ``LoraConfig`` fields (``use_dora``, ``use_rslora``, ...).
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(base_path), device="cpu", local_files_only=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        init_lora_weights=False,
        **lora,
    )
    torch.manual_seed(seed)
    transformer: Any = model[0]
    peft_model = get_peft_model(transformer.auto_model, config)
    peft_model.save_pretrained(str(path))
    return Path(path)


def build_tiny_head(
    base_path: Path,
    path: Path,
    *,
    kind: str = "classify",
    labels: tuple[str, ...] = ("miete", "kauf", "erbe"),
    seed: int = 3,
    lora: bool = True,
    max_seq_length: int | None = None,
    window_stride: int | None = None,
    max_windows: int = 1,
) -> Path:
    """An adapter folder with a random task head (and a random LoRA unless ``lora=False``):
    a tiny cross-encoder (``kind="score"``) or classifier (``kind="classify"``), optionally
    one that reads long texts as windows (``window_stride``, serving/runtime/windows.py)."""
    import torch
    from sentence_transformers import SentenceTransformer

    from serving.runtime.heads import HeadSpec, new_head, save_head
    from serving.runtime.model_folder import embedding_dimension

    if lora:
        build_tiny_adapter(base_path, path, seed=seed)
    dims = embedding_dimension(
        SentenceTransformer(str(base_path), device="cpu", local_files_only=True)
    )
    spec = HeadSpec(
        kind=kind,  # type: ignore[arg-type]
        dims=int(dims or 0),
        labels=labels if kind == "classify" else (),
        max_seq_length=max_seq_length,
        window_stride=window_stride,
        max_windows=max_windows,
    )
    layer = new_head(spec, seed=seed)
    with torch.no_grad():  # a random head with real spread, so scores tell inputs apart
        layer.weight.mul_(8.0)
        layer.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(seed))
    save_head(Path(path), spec, layer)
    return Path(path)
