"""Outages of the receiver's store and broker, told apart from a message's own failure.

A message whose processing fails is tried again after a backoff and, after
``max_attempts`` failures, dead-lettered as poison. A store that cannot be reached is not
the message's fault: counting it would dead-letter good messages during an outage, and
handing each delivery back at once would burn through the prefetch window while nothing
can succeed. So an outage gives the messages back uncounted and pauses consumption until
the store answers again (:class:`Pause`), with one log line when it starts and one when it
ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import sqlalchemy as sa

from condmsg.repeated_failures import REMIND_S, reason_of
from outbox.backoff import Backoff
from outbox.errors import StoreError

#: The waits between two looks at a store (or broker) that is away: doubling, capped.
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0

#: SQLSTATEs of a server that cannot serve anyone right now: connection exceptions (08),
#: insufficient resources such as too many connections (53), shutdowns and start-ups.
_OUTAGE_CLASSES = frozenset({"08", "53"})
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03"})


class StoreUnavailable(StoreError):
    """The receiver store cannot be reached: nothing the message did, and nothing a retry
    of the same message mends before the store is back."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_store_outage(exc: BaseException) -> bool:
    """Is ``exc`` (or an error it was raised from) a lost or refused connection to the
    store, rather than a failure of the statements a message led to?

    A lost connection is what SQLAlchemy invalidates on, a pool that hands out none, or a
    PostgreSQL error of the connection (SQLSTATE 08), of the server's resources (53) or of
    its shutdown; psycopg reports a connection that never opened or broke under it as an
    operational or interface error without a SQLSTATE. A SQLite error without one
    ("database is locked") is not an outage: the file is there.
    """
    for error in _chain(exc):
        if isinstance(error, StoreUnavailable | sa.exc.DisconnectionError | sa.exc.TimeoutError):
            return True
        if not isinstance(error, sa.exc.DBAPIError):
            continue
        if error.connection_invalidated:
            return True
        if not hasattr(error.orig, "sqlstate"):
            continue  # not PostgreSQL's driver
        state = getattr(error.orig, "sqlstate", None)
        if state is None:
            if isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError):
                return True
        elif state[:2] in _OUTAGE_CLASSES or state in _OUTAGE_STATES:
            return True
    return False


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
        self._stop = stop
        self._backoff = Backoff(initial_s=FIRST_RETRY_S, maximum_s=MAX_RETRY_S)
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
        """The next backoff delay, in slices so that ``stop`` is seen; False if stopped."""
        deadline = time.monotonic() + self._backoff.next_delay()
        while (left := deadline - time.monotonic()) > 0:
            if self._stop is not None and self._stop.is_set():
                return False
            self._idle(min(left, 0.1))
        return not (self._stop is not None and self._stop.is_set())
