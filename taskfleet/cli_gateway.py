"""`taskfleet call` (one request through the gateway) and `taskfleet gateway` (the gateway alone).

Wire them with ``app.command("call")(call)`` and ``app.command("gateway")(gateway)``.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from taskfleet.console import console
from taskfleet.context import get_settings
from taskfleet.server_options import FORWARDED_ALLOW_IPS, INSECURE, server_edge

DEFAULT_GATEWAY_PORT = 8700
DEFAULT_GATEWAY_URL = f"http://127.0.0.1:{DEFAULT_GATEWAY_PORT}"

out = console()
err = console(stderr=True)


def call(
    task: str = typer.Argument(..., help="Task name, e.g. german-legal-retrieval."),
    text: list[str] = typer.Option(
        ..., "--text", "-t", help="A text (a document for --query); repeat for more."
    ),
    kind: str = typer.Option("query", help="query or passage (selects the model's prefix)."),
    query: str | None = typer.Option(
        None, "--query", "-q", help="Rerank task: score the --text documents against this query."
    ),
    classify: bool = typer.Option(
        False, "--classify", help="Classification task: label probabilities per --text."
    ),
    url: str = typer.Option(DEFAULT_GATEWAY_URL, "--url", help="Gateway base URL."),
    api_key: str | None = typer.Option(None, "--api-key", help="API key with role caller."),
    timeout_ms: int | None = typer.Option(None, "--timeout-ms", help="Deadline of the request."),
) -> None:
    """Call a task through the gateway and print what it answered and what served it:
    embeddings (shape, norms), rerank scores (--query) or label probabilities (--classify)."""
    import httpx

    from serving.client import Client, TaskfleetError

    if kind not in ("query", "passage"):
        raise typer.BadParameter("must be 'query' or 'passage'", param_hint="--kind")
    if query is not None and classify:
        raise typer.BadParameter("give --query (rerank) or --classify, not both")
    try:
        with Client(url, api_key=api_key) as client:
            if query is not None:
                scores = client.rerank(task, query, text, timeout_ms=timeout_ms)
                _print_scores(task, text, scores)
                return
            if classify:
                _print_labels(task, text, client.classify(task, text, timeout_ms=timeout_ms))
                return
            result = client.embed_with_info(
                task,
                text,
                kind=kind,  # type: ignore[arg-type]  # checked above
                timeout_ms=timeout_ms,
            )
    except TaskfleetError as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False)
        raise typer.Exit(1) from exc
    except httpx.HTTPError as exc:
        err.print(f"error: cannot reach the gateway at {url}: {exc}", style="red", markup=False)
        raise typer.Exit(1) from exc
    vectors = result.vectors
    out.print(
        f"{task}: {vectors.shape[0]} x {vectors.shape[1]} float32, served by model "
        f"{result.model_key} at placement epoch {result.epoch} (request {result.request_id})",
        markup=False,
        highlight=False,
    )
    import numpy as np

    table = Table("#", "text", "norm", "first values")
    for i, (t, row) in enumerate(zip(text, vectors, strict=True)):
        shown = t if len(t) <= 40 else t[:37] + "..."
        head = ", ".join(f"{v:+.4f}" for v in row[:4])
        table.add_row(str(i), shown, f"{float(np.linalg.norm(row)):.4f}", head)
    out.print(table)


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def _served(task: str, what: str, result: Any) -> None:
    out.print(
        f"{task}: {what}, served by model {result.model_key} at placement epoch "
        f"{result.epoch} (request {result.request_id})",
        markup=False,
        highlight=False,
    )


def _print_scores(task: str, documents: list[str], scores: Any) -> None:
    _served(task, f"{len(documents)} scores", scores)
    import numpy as np

    table = Table("rank", "#", "document", "score")
    order = np.argsort(-scores.scores, kind="stable")
    for rank, i in enumerate(order, start=1):
        table.add_row(str(rank), str(i), _shown(documents[i]), f"{scores.scores[i]:+.4f}")
    out.print(table)


def _print_labels(task: str, texts: list[str], result: Any) -> None:
    _served(task, f"{len(texts)} x {len(result.labels)} probabilities", result)
    import numpy as np

    table = Table("#", "text", "label", "probability")
    for i, (t, row) in enumerate(zip(texts, result.probabilities, strict=True)):
        best = int(np.argmax(row))
        table.add_row(str(i), _shown(t), result.labels[best], f"{row[best]:.4f}")
    out.print(table)


def gateway(
    nats_url: str | None = typer.Option(
        None,
        "--nats-url",
        help="NATS server URL(s), comma-separated for a cluster (env TASKFLEET_NATS_URL); "
        "credentials and TLS: see `taskfleet --help`.",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(DEFAULT_GATEWAY_PORT, help="Port to bind."),
    auth: bool = typer.Option(
        True, "--auth/--no-auth", help="Require API keys (turn off only on a trusted laptop)."
    ),
    insecure: bool = INSECURE,
    forwarded_allow_ips: str | None = FORWARDED_ALLOW_IPS,
    metrics_token: str | None = typer.Option(
        None,
        "--metrics-token",
        help="Bearer token /metrics requires (default: TASKFLEET_METRICS_TOKEN, which keeps it "
        "off the command line). Without one, /metrics answers only with --no-auth.",
        show_default=False,
    ),
) -> None:
    """Run the public gateway alone (POST /v1/tasks/{task}, /v1/embeddings, /metrics with a
    --metrics-token).

    It needs NATS only, no database: API keys and tasks come from what the leading control
    plane (`taskfleet serve` or `up`) publishes to NATS, placements and live workers from
    NATS KV. Run as many as you like behind a load balancer; /readyz says when one is ready.
    """
    import uvicorn

    from serving.gateway import GatewaySettings, create_gateway

    edge = server_edge(host, auth=auth, insecure=insecure, forwarded_allow_ips=forwarded_allow_ips)
    settings = get_settings()
    url = settings.nats_options(nats_url)
    if url is None:
        raise typer.BadParameter(
            "the gateway needs a NATS server: give --nats-url or set TASKFLEET_NATS_URL",
            param_hint="--nats-url",
        )
    from serving.httpserver import http_config

    token = metrics_token or settings.metrics_token or None  # empty: none
    app = create_gateway(url, GatewaySettings(require_auth=auth, metrics_token=token))
    config = http_config(app, host, port, "info", forwarded_allow_ips=edge.forwarded_allow_ips)
    uvicorn.Server(config).run()
