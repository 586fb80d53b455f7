"""One log line per change of state for an operation that is retried while it fails.

A service retries what fails (a sweep every second, a probe every few seconds); while the
database or the broker is away, logging each failure with its traceback would bury
everything else and say nothing new. :class:`RepeatedFailures` logs the first failure
(with its traceback), a failure whose text differs, a reminder at most once per
``remind_s`` while the same one goes on, and one line when the operation succeeds again,
with how many tries failed meanwhile.

It lives in the shared infrastructure, below the outbox, so that the relay logs its
outages the same way as the services above it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from condmsg.core.errors import CondmsgError

#: At most one reminder per this many seconds while the same failure goes on.
REMIND_S = 60.0


def reason_of(exc: BaseException) -> str:
    """The first line of an error's text, after its type (drivers append SQL, parameters
    and hints below it, which change from try to try without saying anything new)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class RepeatedFailures:
    """The log of one retried operation, ``what`` (e.g. "deadline sweep"), on ``logger``.

    Call :meth:`failed` after each failed try and :meth:`succeeded` after each good one;
    ``on_failure`` (e.g. a counter's ``inc``) is called for every failure, logged or not.
    Without ``traceback``, the first line of a failure is its reason only (for a failure
    that another line already explains). Thread-safe.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        on_failure: Callable[[], None] | None = None,
        remind_s: float = REMIND_S,
        clock: Callable[[], float] = time.monotonic,
        traceback: bool = True,
    ) -> None:
        self._log = logger
        self._what = what
        self._on_failure = on_failure
        self._remind_s = remind_s
        self._clock = clock
        self._traceback = traceback
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._since = 0.0
        self._count = 0
        self._logged_at = 0.0
        self._unlogged = 0

    @property
    def failing(self) -> str | None:
        """The reason of the failure going on, or None after a success."""
        return self._reason

    def failed(self, exc: BaseException | str, *, level: int = logging.ERROR) -> None:
        """One more failed try: ``exc``, or its reason already said in one line."""
        if self._on_failure is not None:
            self._on_failure()
        reason = exc if isinstance(exc, str) else reason_of(exc)
        now = self._clock()
        with self._lock:
            if self._reason is None:
                self._since, self._count = now, 0
            self._count += 1
            changed = reason != self._reason
            self._reason = reason
            if changed:
                self._logged_at, self._unlogged = now, 0
            elif now - self._logged_at >= self._remind_s:
                self._logged_at, repeats, self._unlogged = now, self._unlogged + 1, 0
            else:
                self._unlogged += 1
                return
        if changed:
            self._log.log(
                level,
                "%s failed: %s; retrying quietly until it changes",
                self._what,
                reason,
                # condmsg's own errors already say what failed and what to do; the
                # traceback is for the unexpected ones.
                exc_info=None
                if isinstance(exc, str | CondmsgError) or not self._traceback
                else exc,
            )
        else:
            self._log.log(
                level,
                "%s still failing (%d times since the last line): %s",
                self._what,
                repeats,
                reason,
            )

    def succeeded(self) -> None:
        if self._reason is None:  # the common case, read without the lock
            return
        with self._lock:
            was, count, since, self._reason = self._reason, self._count, self._since, None
        if was is not None:  # another thread may have logged it meanwhile
            self._log.info(
                "%s works again after %d failed tries in %.0f s",
                self._what,
                count,
                self._clock() - since,
            )
