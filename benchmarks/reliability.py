"""Reliability soak: a long stream of counted calls through the real fleet under each fault,
a hostile but authorised caller, the bad-input catalogue, and long property-test ("fuzz")
sessions. Writes reports/reliability/README.md and reports/reliability/results.json, and the
hostile caller's section to reports/reliability/hostile.md (alone: ``--only-hostile``).

Fleet: nats-server, registry (SQLite), gateway, publisher + watcher, two real sidecars each with
a PyTorch runtime; loopback only. Every answer is compared with the in-process vector of that
very text (testbed/faults/reference.py). Models are random-initialised tiny BERTs built on the fly
(32 dims; 384 dims for the 2048-input limit) so the soak measures the fleet, not the model.

    .venv/bin/python -m benchmarks.reliability [--calls 600] [--concurrency 32]
        [--hypothesis-profile bench] [--proptest-cases 20000] [--skip-fuzz] [--only-hostile]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import REPO
from evals.report import machine_description
from testbed.faults import scenarios as sc
from testbed.faults.bad_inputs import catalogue, send_all
from testbed.faults.injectors import runtime_pid
from testbed.faults.reference import Reference
from testbed.fleet import LocalFleet, register_served_task, unique_task, wait_until
from testbed.tiny_model import build_tiny_model

REPORT_DIR = REPO / "reports" / "reliability"
SIDECAR_ARGS = ["--heartbeat-ms", "300", "--nak-delay-ms", "200", "--max-batch-wait-ms", "2"]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_models(root: Path) -> dict[str, Path]:
    poison = build_tiny_model(root / "poison", max_seq_length=256, max_position_embeddings=64)
    config = poison / "sentence_bert_config.json"
    data = json.loads(config.read_text())
    data["max_seq_length"] = 256  # claims more than its position table holds: long inputs fail
    config.write_text(json.dumps(data))
    return {
        "tiny": build_tiny_model(root / "tiny", seed=0),
        "other": build_tiny_model(root / "other", seed=7),
        "wide": build_tiny_model(root / "wide", hidden=384, layers=1, heads=2),
        "poison": poison,
    }


def counter(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def run_faults(root: Path, models: dict[str, Path], load: sc.Load) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    references = {name: Reference(path) for name, path in models.items()}
    for name in ("tiny", "other", "poison"):
        references[name].prepare(load.texts())
    fleet = LocalFleet(root / "fleet", workers=2, sidecar_args=SIDECAR_ARGS).start()
    try:

        def measured(run: Any) -> None:
            row = run() if callable(run) else run
            rows.append(row)
            log(f"{row['fault']}: {json.dumps({k: v for k, v in row.items() if k != 'fault'})}")

        def fault_row(make: Any) -> dict[str, Any]:
            before = counter(fleet.gateway_metrics(), "taskfleet_gateway_duplicate_replies_total")
            result = make()
            row = result.row()
            after = counter(fleet.gateway_metrics(), "taskfleet_gateway_duplicate_replies_total")
            row["duplicate_replies_dropped"] = int(after - before)
            return row

        tiny = references["tiny"]

        measured(fault_row(lambda: sc.no_fault(fleet, sc.serve(fleet, models["tiny"]), tiny, load)))
        measured(
            fault_row(
                lambda: sc.kill_sidecar_under_load(
                    fleet, sc.serve(fleet, models["tiny"]), tiny, load
                )
            )
        )
        measured(
            fault_row(
                lambda: sc.kill_runtime_under_load(
                    fleet, sc.serve(fleet, models["tiny"]), tiny, load
                )
            )
        )
        measured(
            fault_row(
                lambda: sc.restart_nats_under_load(
                    fleet, sc.serve(fleet, models["tiny"]), tiny, load
                )
            )
        )

        def promotion() -> sc.FaultRun:
            task = sc.serve(fleet, models["tiny"])
            name = f"b-{task}"
            fleet.reg.add_model(name, path=models["other"])
            candidate = fleet.reg.add_candidate(task, base=name)
            keyed = {
                sc.served_model_key(fleet, f"m-{task}"): tiny,
                sc.served_model_key(fleet, name): references["other"],
            }
            return sc.promote_with_control_plane_restart(
                fleet, task, candidate.name, tiny, keyed, load
            )

        measured(fault_row(promotion))
        measured(
            fault_row(
                lambda: sc.poison_inputs(
                    fleet,
                    sc.serve(fleet, models["poison"], prefix="poison"),
                    references["poison"],
                    load,
                )
            )
        )
        limit_load = sc.Load(calls=max(40, load.calls // 4), concurrency=8)
        references["wide"].prepare(limit_load.texts())
        measured(
            fault_row(
                lambda: sc.at_the_limit(
                    fleet, sc.serve(fleet, models["wide"]), references["wide"], limit_load
                )
            )
        )
    finally:
        fleet.stop()

    # A worker whose memory budget holds one model, with traffic for two lazy ones.
    fleet = LocalFleet(
        root / "fleet-memory", workers=1, memory_budget_bytes=200_000, sidecar_args=SIDECAR_ARGS
    ).start()
    try:
        memory_load = sc.Load(calls=max(48, load.calls // 4), concurrency=4)
        tasks: dict[str, Reference] = {}
        keys: dict[str, str] = {}
        for name in ("tiny", "other"):
            task = unique_task("mem")
            register_served_task(fleet.reg, task, models[name], pinned=False)
            references[name].prepare(memory_load.texts())
            tasks[task], keys[task] = references[name], sc.served_model_key(fleet, f"m-{task}")
        wait_until(
            lambda: all(
                t in getattr(fleet.heartbeats().get(fleet.sidecars[0].worker_id), "queue_depth", {})
                for t in tasks
            ),
            timeout_s=60,
        )
        row = sc.memory_pressure(fleet, tasks, keys, memory_load).row()
        rows.append(row)
        log(f"{row['fault']}: {json.dumps(row)}")
    finally:
        fleet.stop()
    return rows


# The hostile caller's key: its token burst holds FLOOD_INPUTS texts as long as the tiny model
# reads (64 tokens), its rate two such floods a second; ATTACKER_RATE requests a second.
FLOOD_INPUTS = 64
FLOOD_TOKENS = FLOOD_INPUTS * 64
ATTACKER_RATE = 10
RSS_SETTLE_S = 60


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_hostile(root: Path, models: dict[str, Path], calls: int) -> dict[str, Any]:
    """A normal key's stream alone, then while a hostile key at its quota (two connections per
    attack, its own process) sends a minimum epoch far ahead, a 4 MB text, floods of the most
    inputs its token burst allows (each alone, then all three); then floods of 2048 inputs
    from a key without a quota, the fleet's behaviour before token quotas. The runtime's RSS
    before, right after, and RSS_SETTLE_S after the attacks."""
    load = sc.Load(calls=calls, concurrency=4, protocols=("msgpack",), timeout_ms=20_000)
    reference = Reference(models["tiny"])
    reference.prepare(load.texts())
    fleet = LocalFleet(
        root / "fleet-hostile", workers=1, sidecar_args=SIDECAR_ARGS, require_auth=True
    ).start()
    try:
        task = sc.serve(fleet, models["tiny"], prefix="hostile")
        _, normal = fleet.reg.create_api_key("normal-app", roles=["caller"])
        _, quota = fleet.reg.create_api_key(
            "greedy-app", roles=["caller"], rate_limit_per_s=ATTACKER_RATE,
            rate_burst=ATTACKER_RATE, token_rate_per_s=2 * FLOOD_TOKENS,
            token_burst=FLOOD_TOKENS,
        )  # fmt: skip
        _, unbounded = fleet.reg.create_api_key("unbounded-app", roles=["caller"])

        def accepted() -> bool:
            return all(
                httpx.post(
                    f"{fleet.gateway_url}/v1/tasks/{task}",
                    json={"inputs": ["hallo"]},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=30,
                ).status_code
                == 200
                for key in (normal, quota, unbounded)
            )

        wait_until(accepted, timeout_s=30)
        runtime = runtime_pid(fleet.sidecars[0])
        rows = []
        baseline = sc.no_fault(fleet, task, reference, load, api_key=normal).row()
        rows.append({**baseline, "attacker_key": "-", "load_average": os.getloadavg()[0]})
        log(f"hostile baseline: {json.dumps(baseline)}")
        rss_before = rss_bytes(runtime)
        for attacks in [(kind,) for kind in sc.ATTACKS] + [sc.ATTACKS]:
            attack = sc.hostile_caller(
                fleet, task, reference, load, attacks=attacks, normal_key=normal,
                attacker_key=quota, flood_inputs=FLOOD_INPUTS,
            )  # fmt: skip
            label = f"{' + '.join(attacks)}, at its quota"
            load_now = os.getloadavg()[0]
            rows.append({**attack.row(), "attacker_key": label, "load_average": load_now})
            log(f"hostile, {label}: {json.dumps(rows[-1])}")
        rss_after = rss_bytes(runtime)
        time.sleep(RSS_SETTLE_S)
        rss_settled = rss_bytes(runtime)
        # Shorter: behind floods of 2048 inputs each normal call waits seconds.
        short = dataclasses.replace(load, calls=min(60, load.calls))
        floods = sc.hostile_caller(
            fleet, task, reference, short, attacks=("flood",), normal_key=normal,
            attacker_key=unbounded, flood_inputs=sc.LIMIT,
        )  # fmt: skip
        rows.append(
            {
                **floods.row(),
                "attacker_key": "no quota (floods of 2048 inputs)",
                "load_average": os.getloadavg()[0],
            }
        )
        log(f"hostile, no token quota: {json.dumps(rows[-1])}")
    finally:
        fleet.stop()
    return {
        "load": {"calls": load.calls, "concurrency": load.concurrency},
        "quota": {"token_rate_per_s": 2 * FLOOD_TOKENS, "token_burst": FLOOD_TOKENS},
        "rows": rows,
        "runtime_rss": {"before": rss_before, "after": rss_after, "settled": rss_settled},
    }


def write_hostile(hostile: dict[str, Any], command: str) -> Path:
    """reports/reliability/hostile.md: the normal caller's figures with and without attack."""
    rss = hostile["runtime_rss"]
    quota = hostile["quota"]
    base = hostile["rows"][0]["p99_all_s"]
    lines = [
        "# A hostile but authorised caller",
        "",
        "One worker (a tiny random BERT, 64 tokens), auth on. A normal key sends "
        f"{hostile['load']['calls']} one-text calls, {hostile['load']['concurrency']} in "
        "flight, alone and then while another key keeps two connections per attack busy (each "
        "attack alone, then all three): "
        "`X-Taskfleet-Min-Epoch: 999999` with a 60 s timeout, one 4 MB text, and floods of the "
        f"most inputs its token burst allows ({FLOOD_INPUTS} texts longer than the model reads), "
        f"at its quota ({ATTACKER_RATE} requests/s, {quota['token_rate_per_s']} tokens/s, "
        f"token burst {quota['token_burst']}: it honours Retry-After), from a process of its "
        "own. The last row (a shorter stream) is a key without a quota sending floods of 2048 "
        "inputs: what any key could do before token quotas. The machine's load average is "
        "given per row: latencies on a shared 2-core machine are noisy.",
        "",
        "| attacker | normal: sent | answered | lost | p99 | p99 / baseline | attacker got | "
        "slowest refusal | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in hostile["rows"]:
        ok = row.get("attacker", {}).get("200", 0)
        codes = row.get("attacker_codes", {}).items()
        got = ", ".join([f"200 {ok}"] * bool(ok) + [f"{c} {n}" for c, n in codes]) or "-"
        slowest = row.get("slowest_refusal_s") if row.get("attacker_codes") else None
        label = row["fault"] if row["attacker_key"] == "-" else row["attacker_key"]
        cells = [
            label,
            row["sent"],
            row["answered"],
            row["lost"] + row["wrong"] + row["gave_up"],
            f"{row['p99_all_s']:.3f} s",
            f"{row['p99_all_s'] / base:.1f}x" if base else "-",
            got,
            f"{slowest} s" if slowest is not None else "-",
            f"{row['load_average']:.1f}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    mib = 1 << 20
    back = rss["settled"] <= 1.2 * rss["before"]
    lines += [
        "",
        f"Runtime RSS: {rss['before'] / mib:.0f} MiB before the attack, "
        f"{rss['after'] / mib:.0f} MiB right after, {rss['settled'] / mib:.0f} MiB "
        f"{RSS_SETTLE_S} s later ({'within' if back else 'NOT within'} 20% of before).",
        "",
        "```",
        command,
        ".venv/bin/pytest -q tests/faults/test_hostile.py   # the same, shorter, in make test",
        "```",
        "",
    ]
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    path = REPORT_DIR / "hostile.md"
    path.write_text("\n".join(lines))
    return path


def run_bad_inputs(root: Path, models: dict[str, Path]) -> dict[str, Any]:
    fleet = LocalFleet(root / "fleet-bad", workers=1, sidecar_args=SIDECAR_ARGS).start()
    try:
        task = sc.serve(fleet, models["tiny"])
        with httpx.Client(timeout=60) as http:
            counts = send_all(http, fleet.gateway_url, task, catalogue())
        dlq = counter(fleet.gateway_metrics(), "taskfleet_queue_dead_letters")
        served = counter(fleet.sidecar_metrics(), "taskfleet_sidecar_replies_total")
    finally:
        fleet.stop()
    return {
        "families": {
            family: {
                "sent": c.sent,
                "as_documented": c.as_documented,
                "internal_errors": c.internal_errors,
                "mismatches": c.mismatches,
            }
            for family, c in counts.items()
        },
        "reached_a_worker": int(served),
        "dead_letters": int(dlq),
    }


def run_hypothesis(profile: str, root: Path) -> dict[str, Any]:
    counts_file = root / "hypothesis-counts.json"
    env = {
        **os.environ,
        "HYPOTHESIS_PROFILE": profile,
        "TASKFLEET_HYPOTHESIS_COUNTS": str(counts_file),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/test_decoders_hypothesis.py"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    return {
        "command": f"HYPOTHESIS_PROFILE={profile} {' '.join(command[2:])}",
        "passed": done.returncode == 0,
        "summary": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr,
        "examples": json.loads(counts_file.read_text()) if counts_file.is_file() else {},
        "seconds": round(time.monotonic() - started, 1),
    }


def run_proptest(cases: int) -> dict[str, Any]:
    command = ["cargo", "test", "--release", "--locked", "--lib", "fuzz_"]
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=REPO / "sidecar",
        env={**os.environ, "PROPTEST_CASES": str(cases)},
        capture_output=True,
        text=True,
    )
    names = re.findall(r"^test (\S*fuzz_\S+) \.\.\. ok$", done.stdout, flags=re.MULTILINE)
    passed = re.search(r"test result: ok\. (\d+) passed", done.stdout)
    return {
        "command": f"cd sidecar && PROPTEST_CASES={cases} {' '.join(command)}",
        "passed": done.returncode == 0 and passed is not None,
        "properties": sorted(names),
        "cases_per_property": cases,
        "cases": cases * len(names),
        "seconds": round(time.monotonic() - started, 1),
        "tail": "" if done.returncode == 0 else (done.stdout + done.stderr)[-2000:],
    }


def write_report(results: dict[str, Any]) -> Path:
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    (REPORT_DIR / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    load = results["load"]
    lines = [
        "# Reliability under faults",
        "",
        f"Measured {results['date']} on {results['machine']} (shared with other work; "
        "latencies are noisy, compare each p99 with the baseline row of the same run).",
        "",
        "Fleet: real nats-server, gateway, placement publisher and fleet watcher, two real "
        "sidecars each with its PyTorch runtime, loopback only. Each fault row is one stream of "
        f"{load['calls']} calls with {load['concurrency']} in flight (msgpack, JSON and the "
        "OpenAI route in turn; one text per call unless noted), the fault injected once while "
        "it runs. Every answer is compared with the in-process vector of that very text; "
        "retryable errors (503/429/504-retryable) are retried after Retry-After.",
        "",
        "**lost** = a call that ended with no answer and no retryable error (e.g. a 504 that "
        "says `retryable: false`); **wrong** = vectors other than in-process; **duplicated** = "
        "one answer given to two calls; **500s** = internal errors. *dup. replies dropped* "
        "counts second replies the gateway discarded (a redelivered message answered again "
        "after a crash): work done twice, answered once.",
        "",
        "| fault | sent | answered | expected errors | retryable errors | gave up | lost | "
        "duplicated | wrong | 500s | dup. replies dropped | p99 during fault | p99 all | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["faults"]:
        notes = ", ".join(
            f"{k} {v}" for k, v in row.items() if k in ("evictions", "epochs")
        ) or ", ".join(f"{c} {n}" for c, n in row["codes"].items())
        cells = [
            row["fault"],
            *(row[k] for k in ("sent", "answered", "expected", "retryable_errors", "gave_up")),
            *(row[k] for k in ("lost", "duplicated", "wrong", "internal_errors")),
            row.get("duplicate_replies_dropped", "-"),
            f"{row['p99_fault_s']:.2f} s",
            f"{row['p99_all_s']:.2f} s",
            notes,
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += [
        "",
        "Notes on the rows: *poison* sends every 10th call with a text the model's forward pass "
        "fails on (its config claims 256 tokens, its position table holds 64); those end with "
        "`INFER_FAILED` (502, dead-lettered after `max_deliver`), the others are answered - "
        "a failing batch is re-run request by request. *limit* mixes calls of exactly 2048 "
        "inputs of 384 dims (3 MiB replies, through the object store) into the stream. "
        "*memory budget* runs one worker whose budget holds one of two lazy models while calls "
        "alternate between their tasks.",
        "",
        "## Bad input, by family",
        "",
        "Each case is sent once to a live fleet; *as documented* = exactly the status and code "
        "docs/protocol.md promises, in the one error shape.",
        "",
        "| family | sent | as documented | 500s |",
        "|---|---|---|---|",
    ]
    bad = results["bad_inputs"]
    for family, c in bad["families"].items():
        lines.append(f"| {family} | {c['sent']} | {c['as_documented']} | {c['internal_errors']} |")
    sent = sum(c["sent"] for c in bad["families"].values())
    documented = sum(c["as_documented"] for c in bad["families"].values())
    lines += [
        f"| **all** | {sent} | {documented} | "
        f"{sum(c['internal_errors'] for c in bad['families'].values())} |",
        "",
        f"Bad requests that reached a worker: {bad['reached_a_worker']}.",
        "",
        "## A hostile caller",
        "",
        "A normal key's p99 while another key sends the worst requests it may (minimum epoch "
        "far ahead, texts above the limit, floods at its token quota): "
        "[hostile.md](hostile.md).",
        "",
        "## Bad input by machine",
        "",
    ]
    hyp = results.get("hypothesis")
    if hyp:
        total = sum(hyp["examples"].values())
        lines += [
            f"Hypothesis ({'passed' if hyp['passed'] else 'FAILED'}, {hyp['seconds']} s): "
            f"{total} examples over {len(hyp['examples'])} properties - "
            + "; ".join(f"{k}: {v}" for k, v in sorted(hyp["examples"].items()))
            + ".",
            "",
        ]
    prop = results.get("proptest")
    if prop:
        lines += [
            f"proptest on the sidecar's frame and envelope decoders "
            f"({'passed' if prop['passed'] else 'FAILED'}, {prop['seconds']} s): "
            f"{prop['cases']} cases = {len(prop['properties'])} properties x "
            f"{prop['cases_per_property']} (" + ", ".join(prop["properties"]) + ").",
            "",
        ]
    lines += [
        "## Commands",
        "",
        "```",
        results["command"],
        "make bench            # runs this among the other benchmarks",
        ".venv/bin/pytest -q tests/faults   # the same scenarios, seconds-long, in make test",
    ]
    if hyp:
        lines.append(hyp["command"])
    if prop:
        lines.append(prop["command"])
    lines += ["```", ""]
    path = REPORT_DIR / "README.md"
    path.write_text("\n".join(lines))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600, help="calls per fault stream")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight")
    parser.add_argument("--hypothesis-profile", default="bench")
    parser.add_argument("--proptest-cases", type=int, default=20_000)
    parser.add_argument("--skip-fuzz", action="store_true", help="no hypothesis/proptest run")
    parser.add_argument(
        "--only-hostile",
        action="store_true",
        help="only the hostile caller (writes reports/reliability/hostile.md)",
    )
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so every fleet started here is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load = sc.Load(calls=args.calls, concurrency=args.concurrency)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_description(),
        "load": {"calls": load.calls, "concurrency": load.concurrency},
        "command": "  ".join([".venv/bin/python -m benchmarks.reliability", *sys.argv[1:]]).strip(),
    }
    with tempfile.TemporaryDirectory(prefix="tf-reliability-") as tmp:
        root = Path(tmp)
        log("building models")
        models = build_models(root / "models")
        log("a hostile caller")
        hostile = run_hostile(root, models, max(120, load.calls // 2))
        log(f"wrote {write_hostile(hostile, results['command'])}")
        hostile_broken = any(r["lost"] or r["wrong"] for r in hostile["rows"][:2])
        if args.only_hostile:
            return 1 if hostile_broken else 0
        results["hostile"] = hostile
        log("fault streams")
        results["faults"] = run_faults(root, models, load)
        log("bad inputs")
        results["bad_inputs"] = run_bad_inputs(root, models)
        if not args.skip_fuzz:
            log(f"hypothesis ({args.hypothesis_profile} profile)")
            results["hypothesis"] = run_hypothesis(args.hypothesis_profile, root)
            log(f"proptest ({args.proptest_cases} cases per property)")
            results["proptest"] = run_proptest(args.proptest_cases)
    path = write_report(results)
    broken = [
        r["fault"]
        for r in results["faults"]
        if r["lost"] or r["wrong"] or r["duplicated"] or r["internal_errors"]
    ]
    log(f"wrote {path}")
    if hostile_broken:
        broken.append("a hostile caller")
    if broken:
        log(f"PROMISE BROKEN under: {', '.join(broken)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
