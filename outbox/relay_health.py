"""What a relay tells about itself: its counters (:class:`RelayStats`, kept by
:class:`RelayCounts` beside the metrics they mirror) and what keeps it from working
(:class:`RelayProblems`): the broker's and the database's failures, counted,
logged once per outage, and kept for its readiness check.

A relay retries both with backoff; an outage makes a line when it starts or its text
changes, a reminder a minute and one line when it is over, never one line per retry.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from condmsg.infra.repeated_failures import RepeatedFailures
from outbox.metrics import RelayMetrics
from outbox.store import OutboxStatus

log = logging.getLogger("outbox.relay")

#: Where a failure came from: RabbitMQ or the outbox table's database.
Source = Literal["broker", "store"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayStats:
    """Counters since the relay was created, and the last table snapshot.

    ``published``: confirmed and deleted. ``failed``: parked by this relay. ``retried``:
    given back for another attempt (nacks and broker failures). ``in_flight``: messages
    awaiting a confirm now. ``status``: the last :class:`OutboxStatus` read (``None`` until
    the first refresh). ``last_error``: the most recent broker or database problem.
    """

    published: int
    failed: int
    retried: int
    reconnects: int
    in_flight: int
    connected: bool
    last_error: str | None
    status: OutboxStatus | None


class RelayCounts:
    """The counters of :class:`RelayStats`, each counted in the same call as its metric.

    Plain attributes, read without a lock by :meth:`Relay.stats` from any thread.
    """

    def __init__(self, metrics: RelayMetrics) -> None:
        self._metrics = metrics
        self.published = 0
        self.failed = 0
        self.retried = 0
        self.reconnects = 0

    def settled(self, *, published: int, refused: int, parked: int, retried: int) -> None:
        """A batch settled in the table: ``published`` rows deleted, ``parked`` rows parked
        (``refused`` of them unroutable; the rest, nacked out of attempts, are counted in
        the metrics as they are found), ``retried`` nacked rows due again later."""
        self.published += published
        self._metrics.published.inc(published)
        self.failed += parked
        self._metrics.failed_refused.inc(refused)
        self.retried += retried
        self._metrics.retried_nacked.inc(retried)

    def given_back(self, messages: int) -> None:
        """A batch's ``messages`` went back to pending after a broker failure."""
        self.retried += messages
        self._metrics.retried_broker.inc(messages)

    def reconnected(self) -> None:
        """A RabbitMQ connection opened after the first."""
        self.reconnects += 1
        self._metrics.reconnects.inc()


class RelayProblems:
    """The failures a relay met, by :data:`Source`.

    ``broker`` and ``store`` hold what keeps the relay from working now (None: nothing);
    plain attributes, read without a lock by a health endpoint's thread. ``last`` is the
    most recent failure of either, for the relay's stats.
    """

    def __init__(self, metrics: RelayMetrics) -> None:
        self._metrics = metrics
        self.broker: str | None = None
        self.store: str | None = None
        self.last: str | None = None
        # One log per source and operation (the text before the first colon, e.g. "cannot
        # read the outbox status in ..."), whose failures alternate during one outage.
        self._logs: dict[tuple[Source, str], RepeatedFailures] = {}

    def failed(self, message: str, source: Source) -> None:
        """A failure of ``source``: counted every time, logged when it starts or its text
        changes and as a reminder a minute."""
        if source == "broker":
            self._metrics.broker_errors.inc()
            self.broker = message
        else:
            self._metrics.store_errors.inc()
            self.store = message
        key = (source, message.split(":", 1)[0])
        if key not in self._logs:
            what = "RabbitMQ" if source == "broker" else "the database"
            self._logs[key] = RepeatedFailures(log, f"outbox relay: {what}")
        self._logs[key].failed(message, level=logging.WARNING)
        self.last = message

    def answered(self, source: Source) -> None:
        """``source`` works again: each of its failure logs says so once."""
        if (self.broker if source == "broker" else self.store) is None:
            return  # nothing failed (the relay says so after every claim)
        if source == "broker":
            self.broker = None
        else:
            self.store = None
        for (which, _), failures in list(self._logs.items()):
            if which == source:
                failures.succeeded()
