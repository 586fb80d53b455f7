"""The one exponential backoff of the project: waits that double from a first delay up to
a cap while failures follow each other, each shortened by up to a quarter at random so that
services restarted together do not retry in lock step.

The relay reconnects and re-publishes nacked rows with it, the evaluator and the services
above the outbox wait out an unreachable database or broker with it, and the receiver
spaces the attempts of a failing message with :func:`retry_delay_s`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

#: A wait is cut into slices of at most this many seconds, so that a stop is seen.
_SLICE_S = 0.1
#: Doublings past this many change nothing (any cap is reached) and would overflow a float.
_MAX_DOUBLINGS = 1000


def retry_delay_s(attempt: int, *, initial_s: float, maximum_s: float) -> float:
    """Delay in seconds before try number ``attempt + 1`` (``attempt`` >= 1), no jitter:
    ``initial_s`` doubled ``attempt - 1`` times, at most ``maximum_s``."""
    doublings = min(max(0, attempt - 1), _MAX_DOUBLINGS)
    return float(min(maximum_s, initial_s * 2.0**doublings))


class Backoff:
    """Delays ``initial_s``, doubling up to ``maximum_s``, each shortened by up to 25 % at
    random; :meth:`reset` after a success. Safe to share between threads.

    :meth:`wait` sleeps the next delay, cut short when ``stop`` (given here) or the event
    passed to it is set.
    """

    def __init__(
        self,
        initial_s: float = 0.2,
        maximum_s: float = 10.0,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.attempt = 0
        self._stop = stop
        self._lock = threading.Lock()

    @property
    def upcoming_s(self) -> float:
        """The longest the next delay can be (for a log line that announces it)."""
        return retry_delay_s(self.attempt + 1, initial_s=self.initial_s, maximum_s=self.maximum_s)

    def next_delay(self) -> float:
        """The next delay in seconds (one more failure counted)."""
        with self._lock:
            self.attempt += 1
            attempt = self.attempt
        delay = retry_delay_s(attempt, initial_s=self.initial_s, maximum_s=self.maximum_s)
        return delay * (0.75 + 0.25 * random.random())

    def reset(self) -> None:
        with self._lock:
            self.attempt = 0

    def wait(
        self,
        also: threading.Event | None = None,
        *,
        idle: Callable[[float], None] | None = None,
    ) -> bool:
        """Wait the next delay; False if stopped first (``stop`` or ``also`` set).
        ``idle(seconds)`` spends each slice of it where the caller must keep something
        serviced meanwhile (a broker connection), else the wait sleeps."""
        deadline = time.monotonic() + self.next_delay()
        while (left := deadline - time.monotonic()) > 0:
            if self._stopped(also):
                return False
            step = min(left, _SLICE_S)
            if idle is not None:
                idle(step)
            elif self._stop is not None:
                self._stop.wait(step)
            else:
                time.sleep(step)
        return not self._stopped(also)

    def _stopped(self, also: threading.Event | None) -> bool:
        return (self._stop is not None and self._stop.is_set()) or (
            also is not None and also.is_set()
        )
