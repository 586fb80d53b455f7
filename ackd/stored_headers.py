"""A sequence part's AMQP headers as the receiver store keeps them (``headers_json``).

The column is a JSON object (RFC 8259) so that a receiver in any language can take a
sequence another one stored (docs/protocol.md, *The receiver store*). The ``condmsg-*``
headers of a valid part are strings and integers, which JSON holds exactly; any other
value is written as JSON holds it, and a value JSON cannot hold as text, by one rule at
every depth (a byte string nested in a table is written as one at the top level is).
"""

from __future__ import annotations

import json
import math
from typing import Any


def to_json(headers: dict[str, Any]) -> str:
    """``headers`` as the text of ``headers_json``. Raises ``RecursionError`` for tables
    nested deeper than the interpreter's recursion limit (the part is then invalid)."""
    return json.dumps(_json_value(headers), allow_nan=False)


def _json_value(value: Any) -> Any:
    """``value`` as JSON holds it: a byte string (an AMQP ``x``, or a long string pika
    could not decode from UTF-8) as its UTF-8 decoding with U+FFFD in place of each
    ill-formed sequence; a float that is not a number JSON can write (NaN, an infinity)
    as Python's text of it (``"nan"``, ``"inf"``); a decimal as its digits (``"1.50"``),
    a timestamp as Python's text of it (``"2026-11-21 22:13:41+00:00"``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_name(name): _json_value(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if value is None or isinstance(value, str | int):  # bool is an int; pika's long too
        return value
    return str(value)


def _json_name(name: object) -> str:
    """A table's field name (pika hands one that is not UTF-8 over as bytes)."""
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def from_json(headers_json: str) -> dict[str, Any]:
    """Stored headers read back for the invalid-message queue; none if they cannot be
    decoded (the message still goes there, with its body and its reason)."""
    try:
        headers = json.loads(headers_json)
    except (ValueError, RecursionError):
        return {}
    return headers if isinstance(headers, dict) else {}
