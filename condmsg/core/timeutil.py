"""UTC time helpers shared by the model, the wire protocol and the services.

All instants in condmsg are timezone-aware UTC datetimes; durations are ``timedelta`` in
Python and integer milliseconds on the wire.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import overload

#: The smallest step of a Python datetime. A processing deadline ``D`` counts as missed at
#: ``D + RESOLUTION`` (an ack committed exactly at ``D`` is in time).
RESOLUTION = timedelta(microseconds=1)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utcnow() -> datetime:
    """The current instant, timezone-aware UTC."""
    return datetime.now(UTC)


def is_aware(value: datetime) -> bool:
    return value.tzinfo is not None and value.tzinfo.utcoffset(value) is not None


def as_utc(value: datetime) -> datetime:
    """``value`` converted to UTC; raises ``ValueError`` for a naive datetime."""
    if not is_aware(value):
        raise ValueError("naive datetime (timezone-aware UTC required)")
    return value.astimezone(UTC)


def to_ms(value: timedelta) -> int:
    """A duration as whole milliseconds (the duration must be a whole number of them)."""
    return value // timedelta(milliseconds=1)


def from_ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


def is_whole_ms(value: timedelta) -> bool:
    return value % timedelta(milliseconds=1) == timedelta(0)


def to_epoch_us(value: datetime) -> int:
    """An aware datetime as integer microseconds since the Unix epoch (lossless)."""
    return (as_utc(value) - _EPOCH) // RESOLUTION


def from_epoch_us(value: int) -> datetime:
    return _EPOCH + value * RESOLUTION


def iso(value: datetime) -> str:
    """Compact ISO-8601 rendering in UTC with millisecond precision (for messages)."""
    if value.tzinfo is not UTC:  # most instants here are UTC already: no conversion
        value = as_utc(value)
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@overload
def stored_instant(value: datetime) -> datetime: ...
@overload
def stored_instant(value: None) -> None: ...
def stored_instant(value: datetime | None) -> datetime | None:
    """An instant read back from a store, as an aware UTC datetime (None for a NULL column):
    SQLite hands back naive datetimes and psycopg the session's time zone, and everything
    condmsg stores is UTC (the evaluation is quickest on ``datetime.UTC`` itself). The one
    helper that makes a stored instant UTC, for every store of the project."""
    if value is None:
        return None
    return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)


def parse_cli_instant(text: str) -> datetime:
    """An instant given on a command line (``--since``, ``--until``): ISO 8601, UTC where
    it has no offset. Raises ``argparse.ArgumentTypeError`` (argparse's usage error)."""
    import argparse  # the command lines' helper; the rest of this module does not need it

    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from None
    return stored_instant(value)


def describe_duration(value: timedelta) -> str:
    """``2d``, ``20s``, ``1.5s``, ``250ms``: a short human rendering of a duration."""
    ms = to_ms(value)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    if ms >= 1000:
        return f"{ms / 1000:g}s"
    return f"{ms}ms"
