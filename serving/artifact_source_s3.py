"""An S3-compatible bucket as the artifact source: ``s3://bucket/prefix``.

The control plane uploads the same ``tree-v1`` objects as into the NATS object store, under the
prefix (``<prefix>/file.<sha256>``, ``<prefix>/tree.<sha256>``, the manifest last); workers read
them with signed GETs (``sidecar/src/s3.rs``). Credentials, region and endpoint come from the
standard AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` for MinIO, Ceph
or moto), the same variables the sidecar reads. With an endpoint the bucket is addressed by path,
as S3-compatible servers expect. The bucket must exist: taskfleet never creates or deletes one.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js.object_store import ObjectStore

from serving.artifact_source import ArtifactBucket, NatsBucket, StoredObject

S3_SCHEME = "s3://"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class ArtifactSourceError(ValueError):
    """An artifact source URL or its configuration that cannot work."""


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # without leading or trailing '/'; may be empty

    @classmethod
    def parse(cls, url: str) -> S3Location:
        if not url.startswith(S3_SCHEME):
            raise ArtifactSourceError(f"artifact source {url!r} is not an s3://bucket/prefix URL")
        bucket, _, prefix = url[len(S3_SCHEME) :].partition("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise ArtifactSourceError(f"{url!r}: {bucket!r} is not an S3 bucket name")
        return cls(bucket, prefix.strip("/"))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}" if self.prefix else S3_SCHEME + self.bucket


def endpoint_url() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class S3Bucket:
    """``ArtifactBucket`` over boto3 (its calls block, so each runs in a thread)."""

    def __init__(self, url: str, client: Any | None = None) -> None:
        self.location = S3Location.parse(url)
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:  # pragma: no cover - boto3 is a dependency
                raise ArtifactSourceError("an s3:// artifact source needs boto3") from None
            endpoint = endpoint_url()
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                config=Config(
                    s3={"addressing_style": "path" if endpoint else "auto"},
                    retries={"max_attempts": 3, "mode": "standard"},
                ),
            )
        self.client = client

    def describe(self) -> str:
        return str(self.location)

    async def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.location.bucket, Key=self.location.key(name))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise OSError(f"{self.describe()}: {exc}") from None
            return True

        return await asyncio.to_thread(head)

    async def put_file(self, name: str, path: Path) -> None:
        await asyncio.to_thread(
            self._call, "upload_file", str(path), self.location.bucket, self.location.key(name)
        )

    async def put_bytes(self, name: str, data: bytes) -> None:
        await asyncio.to_thread(
            self._call,
            "put_object",
            Bucket=self.location.bucket,
            Key=self.location.key(name),
            Body=data,
        )

    async def list_objects(self) -> dict[str, StoredObject]:
        def listing() -> dict[str, StoredObject]:
            prefix = self.location.key("")
            found: dict[str, StoredObject] = {}
            pages = self._call("get_paginator", "list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(prefix) :]
                    if "/" not in name:  # deeper keys belong to another prefix
                        found[name] = StoredObject(obj["Size"], obj["LastModified"])
            return found

        try:
            return await asyncio.to_thread(listing)
        except OSError:
            raise
        except Exception as exc:  # botocore errors surface while paging
            raise OSError(f"{self.describe()}: {exc}") from None

    async def get_bytes(self, name: str) -> bytes:
        def read() -> bytes:
            body = self._call(
                "get_object", Bucket=self.location.bucket, Key=self.location.key(name)
            )["Body"]
            return bytes(body.read())

        return await asyncio.to_thread(read)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(
            self._call, "delete_object", Bucket=self.location.bucket, Key=self.location.key(name)
        )

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # S3 errors become OSError: the publisher reports the placement and retries it.
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(*args, **kwargs)
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            raise OSError(f"{self.describe()}: {exc}") from None


def check_source(url: str | None) -> str | None:
    """The artifact source as given (None or '' or 'nats': the NATS object store), refused
    early with a clear message when it cannot work."""
    if not url or url == "nats":
        return None
    S3Location.parse(url)
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        raise ArtifactSourceError(
            f"artifact source {url} needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
            "environment (and AWS_ENDPOINT_URL for an S3-compatible server)"
        )
    return url


def bucket_for(source: str | None, nats_store: ObjectStore) -> ArtifactBucket:
    """The bucket artifacts go to: an S3 bucket URL, else the NATS object store."""
    return S3Bucket(source) if source and source != "nats" else NatsBucket(nats_store)
