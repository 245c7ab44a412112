"""The shared GerLayQA data (`../shared/data`, next to the repository): where it lies and its
first passages, for the tests and benchmarks that embed real German legal text."""

from __future__ import annotations

import json
import os
from pathlib import Path

# The data root the suites read: TASKFLEET_DATA_DIR, else ../shared/data next to the checkout.
SHARED_DATA = Path(
    os.environ.get("TASKFLEET_DATA_DIR")
    or Path(__file__).resolve().parent.parent.parent / "shared" / "data"
)
GERLAYQA = SHARED_DATA / "gerlayqa" / "beir"


def gerlayqa_passages(n: int = 256) -> list[str]:
    """The corpus's first ``n`` passages, title and text."""
    texts = []
    with (GERLAYQA / "corpus.jsonl").open() as lines:
        for line in lines:
            row = json.loads(line)
            texts.append((row.get("title", "") + " " + row["text"]).strip())
            if len(texts) == n:
                break
    return texts
