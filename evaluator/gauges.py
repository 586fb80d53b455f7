"""Gauges an evaluator reads from its store and its broker, refreshed by a scheduled job:
the pending CMs, the overdue ones, and the messages ready in the sender's ack queue.

The refresh is also how the service learns, between sweeps and batches, whether it can
reach the database and RabbitMQ: its last result is what ``/readyz`` reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pika.exceptions
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from condmsg import tables
from condmsg.core import protocol
from condmsg.infra.repeated_failures import RepeatedFailures, reason_of
from condmsg.runtime.amqp import connect
from condmsg.runtime.topology import NOT_FOUND
from evaluator.config import EvaluatorConfig
from evaluator.metrics import EvaluatorMetrics

log = logging.getLogger(__name__)

_PENDING = tables.CmState.PENDING.value


class ServiceGauges:
    """Refreshes the store and ack-queue gauges of ``metrics`` (:meth:`refresh`, one
    thread at a time) and keeps what stopped the last refresh (``store_problem``,
    ``broker_problem``: None after a good one; "not checked yet" before the first);
    ``on_broker_ok`` is called after each refresh that reached the ack queue.

    A CM is overdue when it is pending and its next check is due since longer than one
    sweep interval: the sweeps are behind, or failing.
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        engine: Engine,
        metrics: EvaluatorMetrics,
        *,
        clock: Callable[[], datetime],
        on_broker_ok: Callable[[], None] | None = None,
    ) -> None:
        self._config = config
        self._engine = engine
        self._metrics = metrics
        self._clock = clock
        self._on_broker_ok = on_broker_ok
        self._queue = protocol.ack_queue(config.sender)
        self._connection: Any = None
        self.store_problem: str | None = "not checked yet"
        self.broker_problem: str | None = "not checked yet"
        #: When the broker last answered (monotonic seconds; 0: never).
        self.broker_ok_at = 0.0
        #: Pending and overdue CMs at the last refresh of the store (None: it failed).
        self.pending: int | None = None
        self.overdue: int | None = None
        self._store_failures = RepeatedFailures(
            log,
            "reading the store gauges",
            on_failure=metrics.refresh_failures.labels(source="store").inc,
        )
        self._broker_failures = RepeatedFailures(
            log,
            f"reading the depth of {self._queue}",
            on_failure=metrics.refresh_failures.labels(source="broker").inc,
        )

    def refresh(self) -> None:
        """Both refreshes; a failure of either is logged once per change and counted."""
        self.refresh_store()
        self.refresh_broker()

    def refresh_store(self) -> None:
        cms = tables.cms.c
        overdue_before = self._clock() - timedelta(seconds=self._config.sweep_interval_s)
        # One pass over the partial index on next_check_at, which holds the pending CMs only.
        query = sa.select(
            sa.func.count(),
            sa.func.coalesce(
                sa.func.sum(sa.case((cms.next_check_at < overdue_before, 1), else_=0)), 0
            ),
        ).where(cms.state == _PENDING)
        try:
            with self._engine.connect() as connection:
                pending, overdue = connection.execute(query).one()
        except Exception as exc:
            self.pending = self.overdue = None
            self.store_problem = f"the store does not answer: {reason_of(exc)}"
            self._store_failures.failed(exc, level=logging.WARNING)
            return
        self.pending, self.overdue = int(pending), int(overdue)
        self._metrics.pending_cms.set(self.pending)
        self._metrics.overdue_cms.set(self.overdue)
        self.store_problem = None
        self._store_failures.succeeded()

    def refresh_broker(self) -> None:
        try:
            ready = self._ready_messages()
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != NOT_FOUND:
                self._broker_failed(exc)
                return
            # Not declared yet: the consumer declares it when it connects (and asks for a
            # refresh then), and says itself why it cannot. Nothing to log here.
            self._metrics.ack_backlog.set(0)
            self.broker_problem = f"{self._queue} is not declared yet"
            return
        except Exception as exc:
            self._broker_failed(exc)
            return
        self._metrics.ack_backlog.set(ready)
        self.broker_problem = None
        self.broker_ok_at = time.monotonic()
        self._broker_failures.succeeded()
        if self._on_broker_ok is not None:
            self._on_broker_ok()

    def _broker_failed(self, exc: Exception) -> None:
        self.close()  # the next refresh starts with a fresh connection
        self.broker_problem = f"cannot read {self._queue}: {reason_of(exc)}"
        self._broker_failures.failed(exc, level=logging.WARNING)

    def _ready_messages(self) -> int:
        if self._connection is None or not self._connection.is_open:
            # The connection is kept between refreshes; its heartbeat is only answered
            # while a refresh runs, so it is set to outlast the pause between two.
            heartbeat = int(max(30.0, 3 * self._config.gauge_interval_s))
            self._connection = connect(
                self._config.amqp_url,
                name=f"condmsg-evaluator-gauges-{self._config.sender}",
                heartbeat=heartbeat,
            )
        channel = self._connection.channel()
        try:
            # Passive: only asks for the counts; a missing queue is an error, not created.
            frame = channel.queue_declare(self._queue, passive=True)
            return int(frame.method.message_count)
        finally:
            if channel.is_open:
                channel.close()

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception as exc:  # closing a broken connection: nothing left to do
                log.debug("closing the gauge connection: %s", exc)
