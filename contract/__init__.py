"""The rules Python and the Rust sidecar share, read from the one declared file ``shared.toml``.

Task names, the NATS objects (streams, the per-task consumer, KV buckets, object stores,
subjects), the headers of queue messages, the workers' runtime start timeout and the error
codes with their HTTP status and retryability are declared there, not here: this module reads
the file once, at import, into frozen records, and refuses it whole (an unknown key, a missing
one, a wrong type) so a typo fails every process and every test at once instead of one role
quietly disagreeing.

It imports nothing of taskfleet: the registry, httpapi, serving and the clients all read it.
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from functools import cached_property
from importlib import resources
from typing import Any, TypeVar

SOURCE = "contract/shared.toml"


class ContractError(ValueError):
    """``shared.toml`` does not hold what this module expects."""


@dataclass(frozen=True)
class TaskNameRule:
    """Lowercase ASCII letters and digits plus ``also``, a letter or digit first, at most
    ``max_chars``."""

    max_chars: int
    also: str
    examples_valid: tuple[str, ...]
    examples_invalid: tuple[str, ...]

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        rest = "a-z0-9" + re.escape(self.also)
        return re.compile(rf"[a-z0-9][{rest}]{{0,{self.max_chars - 1}}}")

    def allows(self, name: str) -> bool:
        return self.pattern.fullmatch(name) is not None

    def describe(self) -> str:
        """The rule in words, for refusals."""
        also = ", ".join(f"'{c}'" for c in self.also)
        return (
            f"lowercase letters, digits and {also}, starting with a letter or digit, at most "
            f"{self.max_chars} characters"
        )


@dataclass(frozen=True)
class StreamRule:
    name: str
    subject_prefix: str
    retention: str  # the server's names: "workqueue", "limits"
    storage: str  # "file", "memory"
    max_age_s: float
    duplicate_window_s: float | None = None
    discard: str | None = None  # "old", "new"; None: the server's default (old)
    max_msgs_per_subject: int | None = None  # None: unbounded
    discard_new_per_subject: bool = False
    allow_msg_ttl: bool = False  # messages may carry their own TTL (`Nats-TTL`)


@dataclass(frozen=True)
class ConsumerRule:
    name_prefix: str
    ack_policy: str  # the server's names: "explicit"
    ack_wait_s: float
    max_deliver: int


@dataclass(frozen=True)
class ControlConsumers:
    """The leading control plane's durable consumers of SAMPLES and FEEDBACK."""

    samples: str
    feedback: str
    ack_policy: str
    ack_wait_s: float
    max_ack_pending: int


@dataclass(frozen=True)
class BucketRule:
    bucket: str
    history: int
    ttl_s: float | None = None


@dataclass(frozen=True)
class ObjectStoreRule:
    bucket: str
    ttl_s: float | None = None


@dataclass(frozen=True)
class Streams:
    tasks: StreamRule
    dlq: StreamRule
    shadow: StreamRule
    samples: StreamRule
    feedback: StreamRule


@dataclass(frozen=True)
class KeyValues:
    placements: BucketRule
    workers: BucketRule
    leader: BucketRule
    directory: BucketRule


@dataclass(frozen=True)
class ObjectStores:
    payloads: ObjectStoreRule
    artifacts: ObjectStoreRule


@dataclass(frozen=True)
class Nats:
    replicas: int
    reply_subject_prefix: str
    shadow_key_suffix: str
    streams: Streams
    task_consumer: ConsumerRule
    kv: KeyValues
    object_stores: ObjectStores
    shadow_consumer: ConsumerRule
    production_consumers: ControlConsumers


@dataclass(frozen=True)
class Headers:
    msg_id: str
    request_id: str
    reply: str
    deadline: str
    priority: str
    min_epoch: str
    key: str
    error: str


@dataclass(frozen=True)
class Worker:
    runtime_start_timeout_s: float


@dataclass(frozen=True)
class CodeRule:
    status: int
    retryable: bool
    meaning: str
    socket: bool = False  # a code the runtime answers with on the socket protocol


R = TypeVar("R")


def _build(cls: type[R], table: Any, where: str) -> R:
    """A record from a TOML table: every field present (or defaulted), nothing else."""
    if not isinstance(table, dict):
        raise ContractError(f"{SOURCE}: [{where}] must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - names)
    if unknown:
        raise ContractError(f"{SOURCE}: [{where}] has unknown key(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in table:
            if f.default is MISSING:
                raise ContractError(f"{SOURCE}: [{where}] lacks {f.name!r}")
            continue
        values[f.name] = _value(hints[f.name], table[f.name], f"{where}.{f.name}")
    return cls(**values)


def _value(tp: Any, value: Any, where: str) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType):  # `X | None`: absent in the file means None
        tp = args[0]
    if is_dataclass(tp):
        return _build(typing.cast(type[Any], tp), value, where)
    if typing.get_origin(tp) is tuple:
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ContractError(f"{SOURCE}: {where} must be a list of strings")
        return tuple(value)
    # TOML has no int/float distinction a writer keeps in mind ("ttl_s = 15"): ints are floats
    # where a float is declared. A boolean is never a number.
    accepted = (int, float) if tp is float else (tp,)
    if not isinstance(value, accepted) or (isinstance(value, bool) and tp is not bool):
        raise ContractError(f"{SOURCE}: {where} must be {tp.__name__}, got {value!r}")
    return float(value) if tp is float else value


@dataclass(frozen=True)
class Contract:
    """The whole declared file."""

    task_name: TaskNameRule
    nats: Nats
    headers: Headers
    worker: Worker
    error_codes: dict[str, CodeRule]  # in the file's order (the order docs/protocol.md lists)


def read(text: str) -> Contract:
    """The contract a TOML text declares; :class:`ContractError` names what is wrong."""
    try:
        declared = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContractError(f"{SOURCE}: {exc}") from exc
    sections = {"task_name", "nats", "headers", "worker", "error_codes"}
    if set(declared) != sections:
        raise ContractError(f"{SOURCE}: sections {sorted(declared)}, expected {sorted(sections)}")
    codes = declared["error_codes"]
    if not isinstance(codes, dict) or not codes:
        raise ContractError(f"{SOURCE}: [error_codes] must be a table of codes")
    return Contract(
        task_name=_build(TaskNameRule, declared["task_name"], "task_name"),
        nats=_build(Nats, declared["nats"], "nats"),
        headers=_build(Headers, declared["headers"], "headers"),
        worker=_build(Worker, declared["worker"], "worker"),
        error_codes={
            code: _build(CodeRule, rule, f"error_codes.{code}") for code, rule in codes.items()
        },
    )


def declared_text() -> str:
    """The text of ``shared.toml`` as installed with this package."""
    return resources.files(__name__).joinpath("shared.toml").read_text("utf-8")


DECLARED = read(declared_text())
TASK_NAME: TaskNameRule = DECLARED.task_name
NATS: Nats = DECLARED.nats
HEADERS: Headers = DECLARED.headers
WORKER: Worker = DECLARED.worker
ERROR_CODES: dict[str, CodeRule] = DECLARED.error_codes
SOCKET_CODES: frozenset[str] = frozenset(c for c, rule in ERROR_CODES.items() if rule.socket)
