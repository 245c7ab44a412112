"""One leader among the control planes: a lock in NATS KV ``leader``, no home-made consensus.

The lock is one key. Taking it is a create (only when the key is absent); keeping it is an
update that names the revision the holder last wrote (compare-and-set), a few times per TTL;
the bucket's TTL (``LEADER_TTL_S``) removes a key nobody renews, so a killed or cut-off leader
loses the lock at most one TTL after its last renewal and a standby takes it. A leader that
shuts down cleanly deletes the key (again naming its revision), so a standby takes over at once.

A leader also steps down on its own when it could not renew for most of a TTL (it may be cut
off from NATS while the others are not). Whatever it publishes is safe to publish twice anyway:
placements are written compare-and-set by epoch and the directory by content, so a moment with
two leaders costs duplicate work, never a wrong value.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass

import msgpack
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

log = logging.getLogger("taskfleet.leader")

LEADER_KEY = "control-plane"


def new_holder_id() -> str:
    """Who holds the lock: host, process and a random part (a restarted process is another)."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaderRecord:
    """The value under the lock key: who leads, since when (ms since the epoch)."""

    holder: str
    since_ms: int

    def pack(self) -> bytes:
        return msgpack.packb({"holder": self.holder, "since_ms": self.since_ms})

    @classmethod
    def unpack(cls, data: bytes | None) -> LeaderRecord | None:
        try:
            obj = msgpack.unpackb(data or b"", raw=False)
            return cls(str(obj["holder"]), int(obj["since_ms"]))
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            return None


class LeaderLock:
    """The lock as one holder sees it. NATS errors propagate: the caller retries."""

    def __init__(self, kv: KeyValue, holder: str) -> None:
        self.kv = kv
        self.record = LeaderRecord(holder, int(time.time() * 1000))
        self.revision: int | None = None

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def acquire(self) -> bool:
        """Take the lock if nobody holds it; True when this holder holds it now."""
        if self.revision is not None:
            return await self.renew()
        try:
            self.revision = await self.kv.create(LEADER_KEY, self.record.pack())
            return True
        except KeyWrongLastSequenceError:
            pass
        # Held. By us, when an earlier create was stored but its answer lost: adopt it; a
        # value that is no record at all (written by hand) is taken over.
        current = await self._entry()
        if current is None:
            return False  # expired or deleted in between: the next attempt creates it
        record, revision = current
        if record is not None and record.holder != self.record.holder:
            return False
        self.revision = revision
        return await self.renew()

    async def renew(self) -> bool:
        """Write again over our own revision; False (and not held) when someone else's
        revision is there or the key expired: the lock was lost."""
        if self.revision is None:
            return False
        try:
            self.revision = await self.kv.update(LEADER_KEY, self.record.pack(), last=self.revision)
            return True
        except KeyWrongLastSequenceError:
            self.revision = None
            return False

    async def release(self) -> None:
        """Delete the key if it is still ours, so a standby need not wait for the TTL."""
        if self.revision is None:
            return
        revision, self.revision = self.revision, None
        with contextlib.suppress(KeyWrongLastSequenceError):  # not ours any more
            await self.kv.delete(LEADER_KEY, last=revision)

    async def current(self) -> LeaderRecord | None:
        """Who holds the lock now; None when nobody does."""
        entry = await self._entry()
        return entry[0] if entry is not None else None

    async def _entry(self) -> tuple[LeaderRecord | None, int] | None:
        try:
            entry = await self.kv.get(LEADER_KEY)
        except NotFoundError:  # absent, deleted or expired
            return None
        if entry.revision is None:
            return None
        return LeaderRecord.unpack(entry.value), entry.revision
