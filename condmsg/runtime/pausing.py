"""Waiting out an outage of the store or the broker: one log line when work pauses, a
reminder a minute, one line when it resumes, and a doubling wait between two looks.

A consumer that meets an outage gives back what it holds and pauses instead of failing
every message in turn (DESIGN invariant 8); the receiver, ``condmsg consume`` and the
sender's outcome stream share this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from condmsg.infra.backoff import Backoff
from condmsg.infra.repeated_failures import REMIND_S, reason_of

#: The waits between two looks at a store (or broker) that is away: doubling, capped.
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0


class Pause:
    """Waits, after an outage of ``what`` (the receiver store, RabbitMQ) during
    ``activity``, until ``probe`` succeeds. Logged once when it starts, with a reminder
    every :data:`REMIND_S` while it lasts, and once when it ends.

    ``idle(seconds)`` spends a wait (the receiver keeps its broker connection serviced
    meanwhile); ``stop`` cuts it short.
    """

    def __init__(
        self,
        logger: logging.Logger,
        activity: str,
        what: str,
        *,
        idle: Callable[[float], None] = time.sleep,
        stop: threading.Event | None = None,
    ) -> None:
        self._log = logger
        self._activity = activity
        self._what = what
        self._idle = idle
        self._backoff = Backoff(FIRST_RETRY_S, MAX_RETRY_S, stop=stop)
        #: When the outage began and was last told of (``time.monotonic()``), or None.
        self._since: float | None = None
        self._told = 0.0

    def failed(self, exc: BaseException) -> None:
        """One more failed try; the first of an outage is logged, later ones remind."""
        now = time.monotonic()
        if self._since is None:
            self._since = self._told = now
            self._log.warning(
                "%s paused: %s cannot be reached (%s); retrying with backoff",
                self._activity,
                self._what,
                reason_of(exc),
            )
            self._log.debug("the failure that paused %s", self._activity, exc_info=exc)
        elif now - self._told >= REMIND_S:
            self._told = now
            self._log.warning(
                "%s still paused after %.0f s: %s cannot be reached (%s)",
                self._activity,
                now - self._since,
                self._what,
                reason_of(exc),
            )

    def ended(self) -> None:
        """The last try worked: the outage, if any, is over."""
        self._backoff.reset()
        if self._since is None:
            return
        self._log.info(
            "%s resumes: %s answers again after %.1f s",
            self._activity,
            self._what,
            time.monotonic() - self._since,
        )
        self._since = None

    def until(self, probe: Callable[[], object]) -> bool:
        """Wait with backoff until ``probe()`` returns without raising; False if stopped
        first. Each failed probe is one failed try of the outage going on."""
        while True:
            if not self.wait():
                return False
            try:
                probe()
            except Exception as exc:
                self.failed(exc)
            else:
                self.ended()
                return True

    def wait(self) -> bool:
        """The next backoff delay, spent in ``idle`` slices so that ``stop`` is seen; False
        if stopped."""
        return self._backoff.wait(idle=self._idle)
