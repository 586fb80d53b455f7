"""The evaluator service for one sender: ack intake, decisions, deadline sweeps, retention.

Threads and connections (pika's BlockingConnection is not thread-safe, so each thread owns
its own): the consuming thread reads the ack queue and cuts the deliveries into batches
(:mod:`evaluator.consume`); storing threads take them in, one database transaction each
(:mod:`evaluator.batches`), and the consuming thread acknowledges each batch, in delivery
order, once it is committed. Scheduled jobs sweep due CMs (timeouts) and, with a retention
period, archive and delete old decided CMs (:mod:`evaluator.jobs`). An in-process outbox
relay publishes the outcomes, notices and compensations. Several instances may run
against one database and one ack queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine

from condmsg.core.errors import BrokerAuthError, CondmsgError, ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.infra.backoff import Backoff
from condmsg.infra.repeated_failures import RepeatedFailures, reason_of
from condmsg.runtime.db import make_engine
from condmsg.runtime.migrate import SchemaError
from evaluator.batches import AckBatches, Report
from evaluator.config import EvaluatorConfig
from evaluator.consume import consume_acks
from evaluator.gauges import ServiceGauges
from evaluator.jobs import ScheduledJobs
from evaluator.metrics import EvaluatorMetrics
from evaluator.store import DecisionStore
from evaluator.store_setup import SenderStore, check_new_sender
from evaluator.workers import IntakeWorkers, WorkerConfig
from outbox.config import RelayConfig
from outbox.errors import AUTH_REFUSALS_BEFORE_GIVING_UP
from outbox.relay import Relay

log = logging.getLogger(__name__)

#: How long stopping waits for intake workers to finish their batches before killing them
#: (within :meth:`Evaluator.stop`'s own default of 10 s).
WORKER_STOP_S = 5.0
#: Waits between reconnections to the ack queue, doubled from the first to the last.
FIRST_RECONNECT_S = 0.2
MAX_RECONNECT_S = 10.0


class Evaluator:
    """Decides the CMs of the sender ``config.sender`` (see :class:`EvaluatorConfig`).

    ``engine`` is the sender store's (default: one made from ``config.db_url``);
    ``decisions`` reads and writes it (default: the adapter for the engine's database);
    ``registry`` receives the metrics; ``clock`` gives the decision instants; ``report``,
    if given, receives what each stored batch did (an intake worker's report line).

    The constructor does not touch the database: :meth:`run` prepares the store (its
    tables, the secret) first, waiting with backoff while the database is unreachable, so
    a service started during a database outage waits for it instead of exiting.
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        *,
        engine: Engine | None = None,
        decisions: DecisionStore | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], datetime] = utcnow,
        report: Callable[[Report], None] | None = None,
    ) -> None:
        if engine is None and config.db_url is None:
            raise CondmsgError("Evaluator needs db_url (CONDMSG_DB_URL) or an engine")
        self.config = config
        self.engine = engine if engine is not None else make_engine(str(config.db_url))
        self.instance = config.instance or f"{socket.gethostname()}:{os.getpid()}"
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = EvaluatorMetrics(self.registry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prepared = False
        #: Why the service ended on its own (configuration: a store it cannot use,
        #: credentials refused for good); None while it runs or after :meth:`stop`.
        self.fatal: str | None = None
        # The consumer's last failure (monotonic seconds, reason), for readiness.
        self._consume_failed: tuple[float, str] | None = None
        self._consume_failures = RepeatedFailures(log, "consuming the ack queue")
        self.store = SenderStore(
            self.engine,
            secret=config.secret,
            create=config.create,
            stop=self._stop,
            decisions=decisions,
        )
        self._relay = self._make_relay() if config.relay else None
        self.batches = AckBatches(
            config,
            self.store,
            instance=self.instance,
            metrics=self.metrics,
            clock=clock,
            stop=self._stop,
            on_decided=self._wake_relay,
            report=report,
        )
        # The instance that sweeps reports the store's gauges (an intake worker does not).
        self.gauges = (
            ServiceGauges(
                config, self.engine, self.metrics, clock=clock, on_broker_ok=self._broker_answers
            )
            if config.sweeps
            else None
        )
        self.jobs = ScheduledJobs(
            config,
            self.store,
            instance=self.instance,
            metrics=self.metrics,
            clock=clock,
            stop=self._stop,
            on_decided=self._wake_relay,
            gauges=self.gauges,
        )
        self.workers = self._make_workers() if config.intake_processes > 1 else None

    def _make_relay(self) -> Relay:
        relay_config = RelayConfig(
            amqp_url=self.config.amqp_url,
            connection_name=f"evaluator-relay-{self.config.sender}",
        )
        return Relay(self.engine, relay_config, registry=self.registry)

    def _make_workers(self) -> IntakeWorkers:
        config = self.config
        worker_config = WorkerConfig(
            amqp_url=config.amqp_url,
            db_url=str(config.db_url),
            sender=config.sender,
            secret_hex="",  # known once the store is prepared (see run)
            ack_grace_ms=config.ack_grace.total_seconds() * 1000,
            clock_skew_ms=config.clock_skew.total_seconds() * 1000,
            batch_size=config.batch_size,
            prefetch=config.prefetch,
            store_threads=config.store_threads,
            instance=self.instance,
            log_level=config.log_level,
            log_format=config.log_format,
        )
        return IntakeWorkers(
            config.intake_processes - 1, worker_config, self.metrics.observe_report
        )

    def _broker_answers(self) -> None:
        # The gauges reached the ack queue: the consumer's next retry (within its backoff)
        # reaches it too, so a consumer outage is over as far as the log is concerned.
        self._consume_failures.succeeded()

    def _wake_relay(self) -> None:
        if self._relay is not None:
            self._relay.wake()

    # -- lifecycle ----------------------------------------------------------------------

    def wait_until_prepared(self, stop: threading.Event | None = None) -> bool:
        """Make the store ready (its tables, the secret), retried with backoff while the
        database is unreachable; False if the service was stopped (or ``stop`` set)
        meanwhile. A configuration error (:class:`ConfigError`) is raised: no retry
        mends it."""
        return self.store.wait_until_prepared(stop)

    def start(self) -> Evaluator:
        """Run in background threads until :meth:`stop`."""
        self._thread = threading.Thread(
            target=self.run, name=f"evaluator-{self.config.sender}", daemon=True
        )
        self._thread.start()
        return self

    @property
    def prepared(self) -> bool:
        """Whether the store is ready and the service at work (its helpers started)."""
        return self._prepared

    @property
    def running(self) -> bool:
        """Whether the service thread started by :meth:`start` is alive."""
        return self._thread is not None and self._thread.is_alive()

    def liveness(self) -> str | None:
        """None while the service's threads run (the consuming thread, the scheduler once
        the store is ready, the in-process relay), else which one ended: ``/healthz``."""
        if not self.running:
            return "the evaluator's service thread is not running"
        if self._prepared and not self.jobs.running:
            return "the evaluator's scheduler is not running"
        if self._prepared and self._relay is not None:
            return self._relay.liveness()
        return None

    def readiness(self) -> str | None:
        """None while the service can do its work (the store ready and answering, the ack
        queue and the relay connected to RabbitMQ), else why not, in one line:
        ``/readyz``. What the gauges know is as old as their last refresh."""
        if not self.running:
            return "the evaluator is not running"
        if not self._prepared:
            return f"waiting for the database at {self.store.name}"
        failed = self._consume_failed
        gauges = self.gauges
        if failed is not None and (gauges is None or gauges.broker_ok_at < failed[0]):
            return f"the ack queue is not consumed: {failed[1]}"
        if gauges is not None and gauges.store_problem is not None:
            return gauges.store_problem
        if gauges is not None and gauges.broker_problem is not None:
            return gauges.broker_problem
        return self._relay.readiness() if self._relay is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> Evaluator:
        """Start, after checking the store once: a store without its schema (or behind,
        ahead, changed) raises :class:`~condmsg.runtime.migrate.SchemaError` here, naming
        the command that creates it, rather than letting the block run with no outcome
        ever coming. A database that cannot be reached yet is waited for, as by
        :meth:`run`."""
        with contextlib.suppress(sa.exc.OperationalError, sa.exc.InterfaceError):
            self.store.prepare()  # unreachable: the service waits for it and says so
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        """Consume the ack queue in this thread until :meth:`stop` (or SIGTERM in the CLI)."""
        if self.config.freeze_gc:
            gc.collect()
            gc.freeze()
        try:
            try:
                if not self.wait_until_prepared():
                    return
            except (ConfigError, SchemaError) as exc:
                self.fatal = f"cannot start: {exc}"
                log.error("the evaluator %s", self.fatal)
                return
            self._prepared = True
            self._start_helpers()
            self._consume_until_stopped()
        finally:
            if self.workers is not None:
                self.workers.stop(timeout_s=WORKER_STOP_S)
            self.jobs.stop()
            if self._relay is not None:
                self._relay.stop()

    def _start_helpers(self) -> None:
        """The intake workers (with the store's secret), the relay and the scheduled jobs."""
        if self.workers is not None:
            self.workers.config = dataclasses.replace(
                self.workers.config, secret_hex=self.store.secret.hex()
            )
            self.workers.start()
        if self._relay is not None:
            self._relay.start()
        self.jobs.start()

    def _consume_until_stopped(self) -> None:
        backoff = Backoff(FIRST_RECONNECT_S, MAX_RECONNECT_S, stop=self._stop)
        refused = 0

        def consuming() -> None:
            # The consumer is back: an outage is over (said once), the next one starts
            # its backoff afresh.
            nonlocal refused
            backoff.reset()
            refused = 0
            self._consume_failed = None
            self._consume_failures.succeeded()
            # The ack queue exists now: /readyz need not wait for the next refresh.
            self.jobs.refresh_gauges_now()

        def new_sender() -> None:
            check_new_sender(self.engine, self.config.sender)

        while not self._stop.is_set():
            try:
                consume_acks(self.config, self.batches, self._stop, consuming, new_sender)
            except ConfigError as exc:
                # A mistyped sender name: its queues are not created, and no retry mends it.
                self.fatal = str(exc)
                log.error("the evaluator stops: %s", self.fatal)
                return
            except BrokerAuthError as exc:
                # A broker restart does not refuse credentials; a wrong URL does, for ever.
                refused += 1
                if refused >= AUTH_REFUSALS_BEFORE_GIVING_UP:
                    self.fatal = f"{exc} (refused {refused} times)"
                    log.error("the evaluator stops: %s", self.fatal)
                    return
                self._consume_failures.failed(exc, level=logging.WARNING)
                backoff.wait()
            except Exception as exc:
                # A broker that is away, or anything the client library raised while the
                # network failed (pika lets a ValueError or an OSError through from a
                # socket that broke mid-handshake): retried with backoff, logged once per
                # change of failure (with its traceback when it is not one of ours).
                self._consume_failed = (time.monotonic(), reason_of(exc))
                self._consume_failures.failed(exc, level=logging.WARNING)
                backoff.wait()

    # -- one step at a time (tests, tools) ------------------------------------------------

    def process_bodies(self, bodies: list[bytes]) -> int:
        """Ingest ack bodies and decide what they settle; returns how many CMs were decided."""
        return self.batches.process(bodies)

    def sweep(self) -> int:
        """Decide or reschedule every CM whose next check is due; returns decisions made."""
        return self.jobs.sweep()

    def retain(self) -> int:
        """One retention pass now (archive, then delete, CMs decided before ``now -
        retention``); returns the rows archived and deleted. Stops between batches when
        the service stops."""
        return self.jobs.retain()
