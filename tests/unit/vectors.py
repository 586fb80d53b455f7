"""Shared vocabulary of the evaluation tests: time units, instants relative to the CM's
``sent_at``, ack builders, and the paper's Example 1 (DESIGN section 5)."""

from __future__ import annotations

from datetime import datetime, timedelta

from condmsg import Ack, AckKind, Destination, DestinationSet
from condmsg.timeutil import RESOLUTION
from tests.unit.strategies import SENT_AT

US = RESOLUTION
SEC = timedelta(seconds=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

#: Meeting notice: all four read within 2 days; qr3 processes within 3 days; at least two
#: of qr1, qr2, qr4 process within 7 days (the default evaluation deadline).
EXAMPLE_1 = DestinationSet(
    Destination("qr3", process_within=3 * DAY),
    DestinationSet(
        Destination("qr1"),
        Destination("qr2"),
        Destination("qr4"),
        process_within=7 * DAY,
        min_process=2,
    ),
    pickup_within=2 * DAY,
)


def t(offset: timedelta) -> datetime:
    """An instant relative to the CM's ``sent_at``."""
    return SENT_AT + offset


def read(destination: str, at: timedelta, recipient: str | None = None) -> Ack:
    """A non-transactional read's ack."""
    return Ack(destination=destination, kind=AckKind.READ, read_at=t(at), recipient=recipient)


def commit(
    destination: str, read_at: timedelta, committed_at: timedelta, recipient: str | None = None
) -> Ack:
    """A transactional read's ack, emitted when its transaction commits."""
    return Ack(
        destination=destination,
        kind=AckKind.COMMIT,
        read_at=t(read_at),
        committed_at=t(committed_at),
        recipient=recipient,
    )
