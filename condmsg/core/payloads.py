"""Payload encoding: what the application hands over, what travels, what it gets back.

``bytes`` travel as ``application/octet-stream``, ``str`` as UTF-8 ``text/plain``, anything
else as JSON (``application/json``). The receiver decodes by content type, so an
application gets back the type it sent.
"""

from __future__ import annotations

import json
from typing import Any

from condmsg.core.errors import ProtocolError

OCTET_STREAM = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def encode_payload(payload: object, content_type: str | None = None) -> tuple[bytes, str]:
    """``(body, content_type)`` for ``payload``; an explicit content type is kept as given."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), content_type or OCTET_STREAM
    if isinstance(payload, str):
        return payload.encode("utf-8"), content_type or TEXT
    try:
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(
            f"payload of type {type(payload).__name__} is neither bytes, str nor "
            f"JSON-serialisable ({exc})"
        ) from None
    return body.encode("utf-8"), content_type or JSON


def decode_payload(body: bytes, content_type: str | None) -> Any:
    """The object the sender passed, judged by content type (unknown types stay bytes).

    Raises :class:`ProtocolError` and nothing else for a body that does not decode: JSON
    nested deeper than the interpreter's recursion limit included.
    """
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    try:
        if kind == "application/json" or kind.endswith("+json"):
            return json.loads(body)
        if kind.startswith("text/"):
            return body.decode("utf-8")
    except RecursionError:
        raise ProtocolError(f"payload nests too deeply to decode as {kind}") from None
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"payload does not decode as {kind} ({exc})") from None
    return body
