"""JSON codec for condition trees, with a schema version.

Document shape (``schema`` is required and must be a supported version)::

    {"schema": 1,
     "condition": {"type": "set", "pickup_within_ms": 172800000,
                   "members": [{"type": "destination", "name": "qr3",
                                "process_within_ms": 259200000}, ...]}}

Durations are integer milliseconds in keys ending ``_ms``; unset attributes are omitted.
Unknown fields, wrong types and a missing or unsupported schema raise
:class:`ConditionError` naming the node's path (``root[1][0]``) and the field.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from condmsg.conditions import Condition, Destination, DestinationSet
from condmsg.errors import ConditionError
from condmsg.timeutil import from_ms, to_ms

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


def condition_to_dict(condition: Condition) -> dict[str, Any]:
    """The versioned document for ``condition`` (validated as a root first)."""
    condition.validate()
    return {"schema": SCHEMA_VERSION, "condition": _node_to_dict(condition)}


def condition_to_json(condition: Condition) -> str:
    return json.dumps(condition_to_dict(condition), separators=(",", ":"), sort_keys=True)


def condition_from_json(document: str | bytes) -> Condition:
    try:
        data = json.loads(document)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConditionError(f"condition JSON: not valid JSON ({exc})") from None
    return condition_from_dict(data)


def condition_from_dict(data: object) -> Condition:
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
    condition = _node_from_dict(data["condition"], "root")
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


def _node_from_dict(data: object, path: str) -> Condition:
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
            options[attr] = from_ms(_int(data[key], path, key))
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
        members = [_node_from_dict(m, f"{path}[{i}]") for i, m in enumerate(members_raw)]
        return DestinationSet(*members, **options)
    except ConditionError as exc:
        text = str(exc)
        if text.startswith(path):
            raise
        raise ConditionError(f"{path} {text}") from None


def _int(value: object, path: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConditionError(f"{path}: {key} must be an integer, got {value!r}")
    return value
