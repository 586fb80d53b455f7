"""The virtual clock of the test kit: an instant that moves only when the test says so.

Every part of the kit reads time from one :class:`VirtualClock`: the sender's ``sent_at``,
the receivers' ``read_at`` and ``committed_at``, the evaluator's decision instants, the
in-memory broker's retry pauses and message expiries. A test that advances it by three
days has the three days pass at once, for all of them alike.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import as_utc

#: Where a kit's time starts unless told otherwise: a fixed instant, so that what a test
#: prints (reasons, instants) is the same on every run.
DEFAULT_START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


class VirtualClock:
    """A callable clock (``clock()`` is the current instant, aware UTC) that only
    :meth:`set` and :meth:`advance` move, and never backwards."""

    def __init__(self, start: datetime = DEFAULT_START) -> None:
        self._now = as_utc(start)
        self.start = self._now

    def __call__(self) -> datetime:
        return self._now

    def __repr__(self) -> str:
        return f"VirtualClock({self._now.isoformat()})"

    @property
    def elapsed(self) -> timedelta:
        """Virtual time since the clock started."""
        return self._now - self.start

    def monotonic(self) -> float:
        """Seconds since the clock started: what ``time.monotonic`` is to the services
        (the receivers time their pauses for Message Sequences with it)."""
        return self.elapsed.total_seconds()

    def set(self, instant: datetime) -> None:
        """Move to ``instant``; :class:`ConfigError` if it lies in the past (time that a
        decision has seen cannot be taken back)."""
        instant = as_utc(instant)
        if instant < self._now:
            raise ConfigError(
                f"the virtual clock cannot go back from {self._now.isoformat()} "
                f"to {instant.isoformat()}"
            )
        self._now = instant

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise ConfigError(f"cannot advance the virtual clock by a negative {delta}")
        self._now += delta
