"""Messages <-> msgpack maps: a typed frozen dataclass is written field by field, in field order,
and read back with every field's type checked.

Field order *is* the msgpack map key order, so that the Rust sidecar (serde struct field order)
produces byte-identical encodings; the golden vectors under ``tests/vectors/`` pin this down.
Constant fields (``op``, ``ok``, ``v``) are ordinary fields with a literal default so that they
sit in their documented position. Maps keyed by data (``queue_depth``, ``epochs``) are written
with sorted keys, as a Rust ``BTreeMap`` would be, so the bytes never depend on insertion order.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal, TypeVar, Union

import msgpack

from serving.protocol.codes import ProtocolError

M = TypeVar("M")


def to_wire(message: Any) -> dict[str, Any]:
    """The msgpack-ready map of a message, keys in field order."""
    return {f.name: _to_wire_value(getattr(message, f.name)) for f in fields(message)}


def _to_wire_value(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return to_wire(value)
    if isinstance(value, list):
        return [_to_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire_value(value[k]) for k in sorted(value)}
    return value


def from_wire(cls: type[M], obj: Any) -> M:
    """Build and type-check a message from a decoded map; raises :class:`ProtocolError`."""
    return typing.cast(M, _from_map(cls, obj, cls.__name__))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        # The wire fields only: class constants (ClassVar) are not part of a message.
        _HINTS[cls] = {f.name: hints[f.name] for f in fields(cls)}
    return _HINTS[cls]


def _from_map(cls: type[Any], obj: Any, where: str) -> Any:
    if not isinstance(obj, dict):
        raise ProtocolError(f"{where}: expected a map, got {type(obj).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(obj) - set(hints))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    values: dict[str, Any] = {}
    for name, tp in hints.items():
        if name in obj:
            values[name] = _check(obj[name], tp, f"{where}.{name}")
        elif _has_default(cls, name):
            pass  # a field added later (``background``): a sender that predates it means this
        elif not _allows_none(tp):
            raise ProtocolError(f"{where}: missing field {name!r}")
        else:
            values[name] = None
    return cls(**values)


def _has_default(cls: type[Any], name: str) -> bool:
    return any(f.name == name and f.default is not MISSING for f in fields(cls))


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            allowed = ", ".join(repr(a) for a in args)
            raise ProtocolError(f"{where}: expected one of {allowed}, got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _check(value, arm, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError("; ".join(errors))
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
        return {
            _check(k, args[0], f"{where} key"): _check(v, args[1], f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if is_dataclass(tp):
        return _from_map(typing.cast(type[Any], tp), value, where)
    # bool is an int subclass in Python but a distinct type on the wire.
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    return value


def pack(message: Any) -> bytes:
    """msgpack bytes of a message (dataclass) or a plain map."""
    obj = to_wire(message) if is_dataclass(message) else message
    return typing.cast(bytes, msgpack.packb(obj, use_bin_type=True))


def unpack(data: bytes) -> Any:
    """Decode msgpack bytes; undecodable content raises :class:`ProtocolError`."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"frame body is not valid msgpack: {exc}") from exc
