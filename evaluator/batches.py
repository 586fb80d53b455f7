"""Storing and deciding batches of acks, one transaction each, with poison isolation.

A batch that fails for a reason tied to its contents is split in halves, each stored in
its own transaction, down to the one message that fails, which is dead-lettered: every
message is then resolved (stored or dead-lettered) within log2(batch) + 1 tries, and a
poison message never holds back good ones. A batch that fails because the database or
the broker is away (:func:`evaluator.failures.is_transient`) is handed back whole.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from condmsg.core.wording import first_line
from condmsg.infra.backoff import Backoff
from condmsg.infra.repeated_failures import RepeatedFailures
from evaluator import decisions
from evaluator.config import EvaluatorConfig
from evaluator.failures import FIRST_RETRY_S, MAX_RETRY_S, is_transient
from evaluator.intake import dead_letter, dead_letter_anomaly, describe, ingest
from evaluator.metrics import EvaluatorMetrics, batch_report
from evaluator.store_setup import SenderStore
from outbox.enqueueing import enqueue_all

log = logging.getLogger(__name__)

#: What a batch did, as the metrics and an intake worker's report line carry it.
Report = dict[str, Any]


class AckBatches:
    """Stores and decides the batches of ack bodies the storing threads hand over.

    ``on_decided`` is called after a batch decided CMs (to wake the outbox relay);
    ``report``, if given, receives what each committed batch did. ``retries`` paces the
    batches handed back while the database or the broker is away.
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        store: SenderStore,
        *,
        instance: str,
        metrics: EvaluatorMetrics,
        clock: Callable[[], datetime],
        stop: threading.Event,
        on_decided: Callable[[], None],
        report: Callable[[Report], None] | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._instance = instance
        self._metrics = metrics
        self._clock = clock
        self._on_decided = on_decided
        self._report = report
        self.retries = Backoff(FIRST_RETRY_S, MAX_RETRY_S, stop=stop)
        # Every batch fails the same way while the database is away: said once, then a
        # reminder a minute, as every service says a failure it retries.
        self._failures = RepeatedFailures(log, "storing ack batches", traceback=False)

    def store(self, bodies: list[bytes]) -> bool:
        """Store and decide one batch (in a storing thread); False if it must be handed
        back: the database or the broker is unreachable (a transient failure)."""
        try:
            decided = self._store_in_halves(bodies)
        except Exception as exc:  # transient: _store_in_halves resolves the others
            self._failures.failed(
                f"{first_line(exc)} (each batch is handed back after a backoff)",
                level=logging.WARNING,
            )
            return False
        self._failures.succeeded()
        self.retries.reset()
        if decided:
            self._on_decided()
        return True

    def _store_in_halves(self, bodies: list[bytes]) -> int:
        """:meth:`process`, split on a failure that is not transient (those are raised:
        no message is to blame for them)."""
        try:
            return self.process(bodies)
        except Exception as exc:
            if is_transient(exc):
                raise
            if len(bodies) == 1:
                self._dead_letter(bodies[0], exc)
                return 0
            log.warning(
                "batch of %d acks failed (%s); storing it in halves", len(bodies), describe(exc)
            )
            half = len(bodies) // 2
            return self._store_in_halves(bodies[:half]) + self._store_in_halves(bodies[half:])

    def _dead_letter(self, body: bytes, exc: Exception) -> None:
        """Dead-letter the one message whose batch fails, in a transaction of its own."""
        reason = f"could not be stored: {describe(exc)}"
        log.error("ack dead-lettered (%s): %r", reason, body[:200])
        try:
            with Session(self._store.engine) as session, session.begin():
                message = dead_letter(body, self._config.sender, reason)
                enqueue_all(session, [message])
                anomaly = dead_letter_anomaly(message, self._clock())
                self._store.decisions.record_anomalies(session, [anomaly])
        except Exception:
            # Not even the outbox takes the dead letter: the batch is handed back (and
            # retried with backoff) rather than the ack dropped.
            log.exception("could not dead-letter an ack; its batch is handed back")
            raise
        self._observe({"acks": 0, "dead": 1, "anomalies": {}, "decisions": {}, "lateness_s": []})

    def process(self, bodies: list[bytes]) -> int:
        """Ingest ack bodies and decide what they settle; returns how many CMs were decided."""
        self._store.prepare()
        secret = self._store.secret
        with Session(self._store.engine) as session, session.begin():
            intake = ingest(
                session,
                bodies,
                store=self._store.decisions,
                sender=self._config.sender,
                secret=secret,
                clock=self._clock,
                clock_skew=self._config.clock_skew,
            )
            now = intake.now  # read once the batch's CM rows were locked
            result = decisions.judge(
                session,
                intake.touched,
                store=self._store.decisions,
                now=now,
                ack_grace=self._config.ack_grace,
                instance=self._instance,
                secret=secret,
                acks=intake.acks,
                copies=intake.copies,
            )
        self._observe(batch_report(intake, result.outcomes, result.spheres))
        return len(result.outcomes)

    def _observe(self, report: Report) -> None:
        self._metrics.observe_report(report)
        if self._report is not None:
            try:  # the batch is committed: a lost report must not send it back
                self._report(report)
            except Exception:
                log.exception("could not report a stored batch")
