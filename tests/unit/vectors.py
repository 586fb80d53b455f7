"""Shared vocabulary of the evaluation tests: time units, instants relative to the CM's
``sent_at``, ack builders, and the paper's Example 1 (DESIGN section 5)."""

from __future__ import annotations

from datetime import datetime, timedelta

from condmsg import Ack, AckKind
from condmsg.core.examples import example1
from condmsg.core.timeutil import RESOLUTION
from tests.unit.strategies import SENT_AT

US = RESOLUTION
SEC = timedelta(seconds=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

#: The paper's Example 1, the meeting notice, on queues qr1..qr4 with real days.
EXAMPLE_1 = example1()


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
