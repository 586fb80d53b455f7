"""PostgreSQL LISTEN/NOTIFY wake-ups for the relay.

The table's trigger notifies ``outbox_<md5(schema.table)>`` when an inserting transaction
commits. A :class:`Listener` holds one autocommit connection that LISTENs on that channel and
calls ``wake()`` for every notification. Wake-ups are hints only: a spurious one costs one
empty claim, and a missed one (listener reconnecting) is covered by the relay's polling.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from condmsg.infra.backoff import Backoff
from condmsg.infra.repeated_failures import RepeatedFailures

log = logging.getLogger(__name__)


class Listener:
    """Calls ``wake`` on every NOTIFY on ``channel``; reconnects with backoff on errors."""

    def __init__(
        self,
        engine: Engine,
        channel: str,
        wake: Callable[[], None],
        *,
        check_interval_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._engine = engine
        self._channel = channel
        self._wake = wake
        self._check_interval_s = check_interval_s
        self._max_backoff_s = max_backoff_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-listener", daemon=True)
        self.listening = threading.Event()
        # A database outage is the relay's own line; this one says once that wake-ups
        # stopped (no traceback: psycopg's message spans lines and links), then a
        # reminder a minute, then that they work again.
        self._failures = RepeatedFailures(
            log, "outbox LISTEN connection (the relay polls meanwhile)", traceback=False
        )

    def start(self) -> Listener:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        backoff = Backoff(0.2, self._max_backoff_s, stop=self._stop)
        while not self._stop.is_set():
            try:
                self._listen()
                backoff.reset()
            except Exception as exc:  # any driver error: the relay polls meanwhile
                self.listening.clear()
                self._failures.failed(exc, level=logging.WARNING)
                if not backoff.wait():
                    return

    def _listen(self) -> None:
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # The channel is our own md5-derived identifier, safe to splice in.
            conn.execute(sa.text(f'LISTEN "{self._channel}"'))
            driver: Any = conn.connection.driver_connection
            self.listening.set()
            self._failures.succeeded()
            # Anything committed while we were not listening: wake once after (re)connect.
            self._wake()
            while not self._stop.is_set():
                # psycopg 3: yields notifications, returns after `timeout` seconds of quiet.
                for _note in driver.notifies(timeout=self._check_interval_s, stop_after=64):
                    self._wake()
            self.listening.clear()
