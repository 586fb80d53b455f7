"""JSON codec for condition trees, with a schema version.

Document shape (``schema`` is required and must be a supported version)::

    {"schema": 1,
     "condition": {"type": "set", "pickup_within_ms": 172800000,
                   "members": [{"type": "destination", "name": "qr3",
                                "process_within_ms": 259200000}, ...]}}

Durations are integer milliseconds in keys ending ``_ms``; unset attributes are omitted.
Unknown fields, wrong types and a missing or unsupported schema raise
:class:`ConditionError` naming the node's path (``root[1][0]``) and the field.

Limits (``docs/conditions.md``): a document of at most :data:`MAX_DOCUMENT_BYTES`, a tree
of at most ``MAX_DEPTH`` levels and ``MAX_NODES`` nodes, durations of at most
``MAX_DURATION``, names within the store's columns and free of control characters
(:mod:`condmsg.core.conditions`, :mod:`condmsg.core.limits`). Decoding raises
:class:`ConditionError` and nothing else, whatever the input.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from condmsg.core.conditions import (
    MAX_DEPTH,
    MAX_DURATION,
    MAX_NODES,
    Condition,
    Destination,
    DestinationSet,
)
from condmsg.core.errors import ConditionError
from condmsg.core.timeutil import from_ms, to_ms

SCHEMA_VERSION = 1
SUPPORTED_SCHEMAS = frozenset({1})

_DURATIONS = {
    "pickup_within_ms": "pickup_within",
    "process_within_ms": "process_within",
    "expiry_ms": "expiry",
    "evaluation_timeout_ms": "evaluation_timeout",
}
_INTS = ("min_pickup", "max_pickup", "min_process", "max_process", "priority")
_COMMON = {"type", *_DURATIONS, *_INTS, "persistent"}
_DESTINATION = _COMMON | {"name", "recipient", "exchange", "routing_key"}
_SET = _COMMON | {"members"}
#: Longest condition document read (bytes, before parsing): MAX_NODES nodes with long
#: names fit in well under it.
MAX_DOCUMENT_BYTES = 1_048_576
_MAX_DURATION_MS = to_ms(MAX_DURATION)


def condition_to_dict(condition: Condition) -> dict[str, Any]:
    """The versioned document for ``condition`` (validated as a root first)."""
    condition.validate()
    return {"schema": SCHEMA_VERSION, "condition": _node_to_dict(condition)}


def condition_to_json(condition: Condition) -> str:
    """The versioned JSON document (validated as a root first), compact and key-sorted."""
    return json.dumps(condition_to_dict(condition), separators=(",", ":"), sort_keys=True)


def condition_from_json(document: str | bytes) -> Condition:
    """Decode and validate a document made by :func:`condition_to_json`; raises
    :class:`ConditionError` only."""
    if not isinstance(document, str | bytes | bytearray):
        raise ConditionError(f"condition JSON: a str or bytes, not {type(document).__name__}")
    if len(document) > MAX_DOCUMENT_BYTES:
        raise ConditionError(
            f"condition JSON: the document is longer than {MAX_DOCUMENT_BYTES} bytes"
        )
    try:
        data = json.loads(document)
    except RecursionError:
        raise ConditionError(
            f"condition JSON: nested too deeply (a tree has at most {MAX_DEPTH} levels)"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise ConditionError(f"condition JSON: not valid JSON ({exc})") from None
    return condition_from_dict(data)


def condition_from_dict(data: object) -> Condition:
    """Validate a decoded condition document; raises :class:`ConditionError` only."""
    try:
        return _document_from_dict(data)
    except ConditionError:
        raise
    except Exception as exc:
        # A bug in the checks must cost one document, never the service reading it.
        raise ConditionError(
            f"condition JSON: could not be read ({type(exc).__name__}: {exc})"
        ) from exc


def _document_from_dict(data: object) -> Condition:
    if not isinstance(data, dict):
        raise ConditionError("condition JSON: the document must be an object")
    unknown = set(data) - {"schema", "condition"}
    if unknown:
        raise ConditionError(f"condition JSON: unknown field(s) {sorted(unknown)}")
    if "schema" not in data:
        raise ConditionError("condition JSON: missing schema version ('schema')")
    schema = data["schema"]
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise ConditionError(f"condition JSON: schema must be an int, got {schema!r}")
    if schema not in SUPPORTED_SCHEMAS:
        raise ConditionError(
            f"condition JSON: unsupported schema version {schema} "
            f"(supported: {sorted(SUPPORTED_SCHEMAS)})"
        )
    if "condition" not in data:
        raise ConditionError("condition JSON: missing 'condition'")
    condition = _node_from_dict(data["condition"], "root", 1, _Count())
    try:
        condition.validate()
    except ConditionError as exc:
        raise ConditionError(f"condition JSON: {exc}") from None
    return condition


def _node_to_dict(node: Condition) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, attr in _DURATIONS.items():
        value: timedelta | None = getattr(node, attr)
        if value is not None:
            out[key] = to_ms(value)
    for attr in _INTS:
        if getattr(node, attr) is not None:
            out[attr] = getattr(node, attr)
    if node.persistent is not None:
        out["persistent"] = node.persistent
    if isinstance(node, Destination):
        out["type"] = "destination"
        out["name"] = node.name
        for attr in ("recipient", "exchange", "routing_key"):
            if getattr(node, attr) is not None:
                out[attr] = getattr(node, attr)
    else:
        out["type"] = "set"
        out["members"] = [_node_to_dict(m) for m in node.members]
    return out


class _Count:
    """Nodes decoded so far in one document."""

    __slots__ = ("nodes",)

    def __init__(self) -> None:
        self.nodes = 0


def _node_from_dict(data: object, path: str, level: int, count: _Count) -> Condition:
    # Checked while descending, before a deeper call: recursion stays within MAX_DEPTH.
    if level > MAX_DEPTH:
        raise ConditionError(f"{path}: the tree is deeper than {MAX_DEPTH} levels")
    count.nodes += 1
    if count.nodes > MAX_NODES:
        raise ConditionError(f"{path}: the tree has more than {MAX_NODES} nodes")
    if not isinstance(data, dict):
        raise ConditionError(f"{path}: a node must be an object, got {type(data).__name__}")
    kind = data.get("type")
    allowed = (
        {"destination": _DESTINATION, "set": _SET}.get(kind) if isinstance(kind, str) else None
    )
    if allowed is None:
        raise ConditionError(f"{path}: type must be 'destination' or 'set', got {kind!r}")
    unknown = set(data) - allowed
    if unknown:
        raise ConditionError(f"{path}: unknown field(s) {sorted(unknown)}")
    options: dict[str, Any] = {}
    for key, attr in _DURATIONS.items():
        if key in data:
            options[attr] = from_ms(_duration_ms(data[key], path, key))
    for attr in _INTS:
        if attr in data:
            options[attr] = _int(data[attr], path, attr)
    if "persistent" in data:
        if not isinstance(data["persistent"], bool):
            raise ConditionError(f"{path}: persistent must be a boolean")
        options["persistent"] = data["persistent"]
    try:
        if kind == "destination":
            for attr in ("name", "recipient", "exchange", "routing_key"):
                if attr in data and not isinstance(data[attr], str):
                    raise ConditionError(f"{path}: {attr} must be a string")
            if "name" not in data:
                raise ConditionError(f"{path}: a destination needs 'name'")
            return Destination(
                data["name"],
                recipient=data.get("recipient"),
                exchange=data.get("exchange"),
                routing_key=data.get("routing_key"),
                **options,
            )
        members_raw = data.get("members")
        if not isinstance(members_raw, list):
            raise ConditionError(f"{path}: members must be a list")
        if len(members_raw) > MAX_NODES:
            raise ConditionError(f"{path}: members has more than {MAX_NODES} entries")
        members = [
            _node_from_dict(m, f"{path}[{i}]", level + 1, count) for i, m in enumerate(members_raw)
        ]
        return DestinationSet(*members, **options)
    except ConditionError as exc:
        text = str(exc)
        if text.startswith(path):
            raise
        raise ConditionError(f"{path} {text}") from None


def _int(value: object, path: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConditionError(f"{path}: {key} must be an integer, got {_shown(value)}")
    return value


def _duration_ms(value: object, path: str, key: str) -> int:
    """Milliseconds within MAX_DURATION (10**30 would overflow a timedelta)."""
    ms = _int(value, path, key)
    if ms < -_MAX_DURATION_MS:  # the model says why a small one is wrong (not positive)
        raise ConditionError(f"{path}: {key} must be positive, got {_shown(ms)}")
    if ms > _MAX_DURATION_MS:
        raise ConditionError(
            f"{path}: {key} must be at most {_MAX_DURATION_MS} ms "
            f"({MAX_DURATION.days} days), got {_shown(ms)}"
        )
    return ms


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a very large integer"  # repr() refuses ints of more than 4300 digits
    text = repr(value) if isinstance(value, str | int | float | bool | None) else None
    if text is None:
        return type(value).__name__
    return text if len(text) <= 60 else f"{text[:57]}..."
