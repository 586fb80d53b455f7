"""When the deadline sweeps run: when the earliest pending CM is due, and at least every
``sweep_interval_s``.

Each sweep ends knowing the earliest next check of the pending CMs (one read of the
first entry of the partial index that its claims use), and the next sweep starts then
rather than at the next tick of a fixed interval: a timeout is decided milliseconds after
it falls due, while an idle store is asked no more often than the interval says. The
interval still bounds two things: how long a CM sent since the last sweep may go unseen
(so only a CM whose deadline plus ack grace is shorter than the interval can be decided
later than it falls due), and how soon a CM another instance holds is looked at again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

#: The least time between the starts of two sweeps (seconds): CMs falling due within it
#: are decided by one sweep, not one each, which bounds what a stream of deadlines costs
#: to one sweep per this period.
MIN_GAP_S = 0.02


class SweepTimer:
    """Calls ``sweep`` in a thread of its own, first one ``interval_s`` after
    :meth:`start`, then again at the instant it returns (an aware datetime on ``clock``'s
    time line; None: nothing is scheduled), but no later than ``interval_s`` after it
    returned and no sooner than :data:`MIN_GAP_S` after it started. ``sweep`` handles its
    own failures."""

    def __init__(
        self,
        sweep: Callable[[], datetime | None],
        *,
        interval_s: float,
        clock: Callable[[], datetime],
        name: str,
    ) -> None:
        self._sweep = sweep
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Wait for a running sweep to finish, then end the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def delay_s(self, due: datetime | None, took_s: float = 0.0) -> float:
        """Seconds from the end of a sweep that took ``took_s`` to the next, given the
        earliest next check ``due``."""
        if due is None:
            return self._interval_s
        until_due = (due - self._clock()).total_seconds()
        return min(self._interval_s, max(MIN_GAP_S - took_s, until_due, 0.0))

    def _run(self) -> None:
        delay = self._interval_s
        while not self._stop.wait(delay):
            started = time.monotonic()
            due = self._sweep()
            delay = self.delay_s(due, time.monotonic() - started)
