"""The long measurements behind `reports/` (`make bench`), each run from the repository root as
``python -m benchmarks.NAME`` (``--help`` says what it measures and writes).

Importing the package first sets what every benchmark needs before any model library loads:
no Hugging Face download at run time (the weights come from a package, the data from
``../shared``). What the benchmarks share with the tests (a local fleet, separate-process
machines, tiny models, the fault kit) is in ``testbed``; nothing here imports ``tests``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
