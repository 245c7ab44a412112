"""`taskfleet artifacts ...`: the artifact source (NATS object store or S3 bucket) seen from the
control plane's side. Wire with ``app.add_typer(artifacts_app, name="artifacts")``."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import typer

from taskfleet.cli_fleet import artifact_source, fail, nats_call, nats_target_or_none
from taskfleet.console import console
from taskfleet.context import open_registry

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from serving.artifact_source import Collected

artifacts_app = typer.Typer(
    help="Models and adapters in the artifact source (what workers fetch).", no_args_is_help=True
)
out = console()


@artifacts_app.command("gc")
def gc(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only say what would be removed; remove nothing."
    ),
    min_age_min: float = typer.Option(
        10.0,
        "--min-age-min",
        min=0,
        help="Leave objects younger than this many minutes (an upload may be in progress).",
    ),
) -> None:
    """Remove from the artifact source every model and adapter no candidate uses, and every
    file no kept artifact names. What any candidate uses stays (a rollback may need it again);
    manifests go before their files, so a worker never sees half an artifact."""
    from serving.artifact_source import collect_garbage
    from serving.artifact_source_s3 import bucket_for
    from serving.nats_layout import ensure_layout

    source = artifact_source()
    referenced = open_registry().artifact_digests()
    min_age = timedelta(minutes=min_age_min)
    url = nats_target_or_none()
    if url is None:
        raise fail("no NATS URL: set TASKFLEET_NATS_URL (or run `taskfleet up` on this home)")

    async def collect(nc: NATS) -> Collected:
        layout = await ensure_layout(nc.jetstream())
        bucket = bucket_for(source, layout.artifacts)
        return await collect_garbage(bucket, referenced, min_age=min_age, dry_run=dry_run)

    try:
        done = nats_call(url, collect)
    except (OSError, TimeoutError) as exc:
        raise fail(f"artifact source unreachable: {exc}") from None
    except Exception as exc:  # NATS client errors have no common base worth naming here
        raise fail(f"artifact gc failed: {exc}") from None
    verb = "would remove" if dry_run else "removed"
    out.print(
        f"kept {len(done.kept)} artifact(s) candidates use; {verb} {len(done.manifests)} "
        f"artifact(s) and {len(done.files)} file(s), {done.bytes_freed / 2**20:.1f} MiB"
        + (f"; {done.too_young} newer than {min_age_min:g} min left" if done.too_young else "")
    )
