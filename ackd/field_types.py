"""AMQP floating-point header fields read as what they are.

pika decodes a double (``d``) and a float (``f``) field into its 64-bit integer type,
truncated (``long(1.5)`` is ``1``: pika issue #599), so a receiver on pika alone cannot
tell a header sent as the double ``1.5`` from the integer ``1``, and would take a
``condmsg-seq-pos`` of ``1.5`` for position 1. docs/protocol.md requires a receiver that
can know a field's type to refuse a floating-point field where an integer is required.

:func:`install` makes pika decode those two types into Python ``float`` and leaves every
other type to pika's own decoder. pika looks its value decoder up by name in
``pika.data`` for every table and array (``BasicProperties.decode`` ->
``decode_table`` -> ``decode_value``, and ``decode_value`` for nested values), and no
per-connection hook exists, so the replacement holds for the whole process: any pika
consumer in it then gets ``float`` for those fields instead of a truncated integer. The
two struct formats are AMQP 0-9-1's (big-endian IEEE 754, 8 and 4 bytes), the ones pika
itself reads before it truncates.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.data

_PIKA_DECODE_VALUE = pika.data.decode_value
_DOUBLE = struct.Struct(">d")
_FLOAT = struct.Struct(">f")


def decode_value(encoded: bytes, offset: int) -> tuple[Any, int]:
    """pika's ``decode_value``, but a double or float field is a ``float``."""
    kind = encoded[offset : offset + 1]
    if kind == b"d":
        return _DOUBLE.unpack_from(encoded, offset + 1)[0], offset + 1 + _DOUBLE.size
    if kind == b"f":
        return _FLOAT.unpack_from(encoded, offset + 1)[0], offset + 1 + _FLOAT.size
    return _PIKA_DECODE_VALUE(encoded, offset)


def install() -> None:
    """Decode floating-point header fields as ``float`` from now on (idempotent)."""
    if pika.data.decode_value is not decode_value:
        pika.data.decode_value = decode_value


def encodable(value: Any) -> Any:
    """``value`` with every ``float`` in it (nested in tables and arrays too) replaced by
    its text (``"1.5"``), which pika can write where it cannot write a float: a message
    copied to the invalid-message queue keeps such a header as text."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {name: encodable(item) for name, item in value.items()}
    if isinstance(value, list):
        return [encodable(item) for item in value]
    return value
