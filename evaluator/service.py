"""The evaluator service for one sender: ack intake, decisions, deadline sweeps, retention.

Threads and connections (pika's BlockingConnection is not thread-safe, so each thread owns
its own): the consuming thread reads the ack queue with manual acks and prefetch and cuts
the deliveries into batches; storing threads take them in, one database transaction each,
and the consuming thread acknowledges each batch, in delivery order, with one ``multiple``
ack once it is committed. An APScheduler interval job sweeps due CMs (timeouts) with its
own sessions; with a retention period, another one archives and deletes old decided CMs
(:mod:`evaluator.retention`). An in-process outbox relay publishes the outcomes, notices
and compensations. Several instances may run against one database and one ack queue.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pika.exceptions
import sqlalchemy as sa
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from condmsg import protocol as p
from condmsg import sender_tables as t
from condmsg.amqp import connect
from condmsg.db import make_engine
from condmsg.errors import BrokerError, CondmsgError, ConfigError
from condmsg.outcome import Outcome
from condmsg.sender import create_tables, store_secret
from condmsg.settings import DEFAULT_ACK_GRACE, DEFAULT_CLOCK_SKEW, DEFAULT_RETENTION_INTERVAL_S
from condmsg.timeutil import utcnow
from condmsg.topology import declare_service_queue
from evaluator import decisions, store
from evaluator.intake import dead_letter, describe, ingest
from evaluator.metrics import EvaluatorMetrics, batch_report
from evaluator.retention import DEFAULT_BATCH as DEFAULT_RETENTION_BATCH
from evaluator.retention import Archived, RetentionPolicy, retain
from evaluator.workers import IntakeWorkers, WorkerConfig
from outbox.enqueueing import enqueue_all
from outbox.relay import Relay

log = logging.getLogger(__name__)

#: The first retention pass runs this long after start (or one interval, if shorter): a
#: long interval must not be starved by restarts, and start-up is not slowed down.
RETENTION_FIRST_RUN_S = 60.0
#: How long stopping waits for intake workers to finish their batches before killing them
#: (within :meth:`Evaluator.stop`'s own default of 10 s).
WORKER_STOP_S = 5.0
#: Waits between tries while the database or the broker is unreachable: doubled from the
#: first to the last (at start, and before a batch that failed for that is handed back).
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0
#: How long a due CM that a sweep cannot judge waits before it is tried again.
PARK_S = 60.0


class Evaluator:
    """Decides the CMs of sender ``sender`` (its ack queue ``condmsg.<sender>.ack``).

    Acks are taken in ``batch_size`` at a time with ``prefetch`` deliveries outstanding;
    ``store_threads`` threads store and decide the batches, one transaction each, while
    the consuming thread takes in the next (see :class:`_Storing` and
    ``docs/evaluator.md``).

    With ``retention`` (and ``retention_archive``), CMs decided longer ago than that are
    archived to Parquet under ``retention_archive`` and deleted, every
    ``retention_interval_s`` seconds, ``retention_batch`` CMs per archive. Disabled by
    default: the store keeps everything.

    With ``freeze_gc``, :meth:`run` moves the objects the process holds by then (modules,
    SQLAlchemy metadata, pika and psycopg state...) to the garbage collector's permanent
    generation (``gc.freeze()``): intake allocates many short-lived objects, and each full
    collection would otherwise walk that whole heap again. It acts on the whole process,
    so it is off by default (an evaluator embedded in an application would freeze the
    application's objects too) and on in ``condmsg evaluator``, which is a process of its
    own.

    The constructor does not touch the database: :meth:`run` prepares the store (its
    tables, the secret) first, waiting with backoff while the database is unreachable, so
    a service started during a database outage waits for it instead of exiting.

    An ack whose times are off by more than ``clock_skew`` (read before its CM's
    ``sent_at``, or read or committed after its receipt) is a ``clock_skew`` anomaly.
    """

    def __init__(
        self,
        *,
        amqp_url: str,
        sender: str,
        db_url: str | None = None,
        engine: Engine | None = None,
        secret: bytes | None = None,
        ack_grace: timedelta = DEFAULT_ACK_GRACE,
        clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
        batch_size: int = 500,
        prefetch: int = 1000,
        store_threads: int = 2,
        sweep_interval_s: float = 1.0,
        sweep_batch: int = 500,
        relay: bool = True,
        instance: str | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], datetime] = utcnow,
        retention: timedelta | None = None,
        retention_archive: Path | None = None,
        retention_interval_s: float = DEFAULT_RETENTION_INTERVAL_S,
        retention_batch: int = DEFAULT_RETENTION_BATCH,
        freeze_gc: bool = False,
        intake_processes: int = 1,
        sweeps: bool = True,
        report: Callable[[dict[str, Any]], None] | None = None,
        create: bool = True,
    ) -> None:
        if engine is None and db_url is None:
            raise CondmsgError("Evaluator needs db_url (CONDMSG_DB_URL) or an engine")
        self.retention: RetentionPolicy | None = None
        if retention is not None:
            if retention_archive is None:
                raise ConfigError(
                    "retention needs an archive directory (--archive, CONDMSG_ARCHIVE_DIR)"
                )
            if retention_interval_s <= 0:
                raise ConfigError("the retention interval must be positive seconds")
            self.retention = RetentionPolicy(
                older_than=retention, archive=Path(retention_archive), batch=retention_batch
            )
        self.retention_interval_s = retention_interval_s
        self.freeze_gc = freeze_gc
        self.amqp_url = amqp_url
        self.sender = sender
        self.engine = engine if engine is not None else make_engine(str(db_url))
        self._create = create
        self._secret = secret or None
        self._prepared = threading.Event()
        self._preparing = threading.Lock()
        self.ack_grace = ack_grace
        if clock_skew < timedelta(0):
            raise ConfigError("the clock-skew tolerance must not be negative")
        self.clock_skew = clock_skew
        if store_threads < 1:
            raise ConfigError("store_threads must be at least 1")
        if intake_processes < 1:
            raise ConfigError("intake_processes must be at least 1")
        if intake_processes > 1 and self.engine.dialect.name != "postgresql":
            raise ConfigError(
                "several intake processes need PostgreSQL (SQLite takes one writer at a time)"
            )
        if intake_processes > 1 and db_url is None:
            # The workers connect themselves: an engine's options beyond its URL (connect
            # arguments, events, a creator) cannot follow them, so the URL must be given.
            raise ConfigError("several intake processes need db_url (the workers connect to it)")
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.store_threads = store_threads
        self.sweep_interval_s = sweep_interval_s
        self.sweep_batch = sweep_batch
        self.instance = instance or f"{socket.gethostname()}:{os.getpid()}"
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = EvaluatorMetrics(self.registry)
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retries = _Backoff(self._stop)
        self._relay = (
            Relay(
                self.engine,
                amqp_url,
                registry=self.registry,
                connection_name=f"evaluator-relay-{sender}",
            )
            if relay
            else None
        )
        self._report = report
        self.workers = (
            IntakeWorkers(
                intake_processes - 1,
                WorkerConfig(
                    amqp_url=amqp_url,
                    db_url=str(db_url),
                    sender=sender,
                    secret_hex="",  # known once the store is prepared (see run)
                    ack_grace_ms=ack_grace.total_seconds() * 1000,
                    clock_skew_ms=clock_skew.total_seconds() * 1000,
                    batch_size=batch_size,
                    prefetch=prefetch,
                    store_threads=store_threads,
                    instance=self.instance,
                ),
                self.metrics.observe_report,
            )
            if intake_processes > 1
            else None
        )
        self._scheduler = BackgroundScheduler(timezone="UTC")
        if sweeps:
            self._scheduler.add_job(
                self._sweep_job,
                "interval",
                seconds=sweep_interval_s,
                id="sweep",
                max_instances=1,  # a slow sweep is never run twice at once
                coalesce=True,  # missed runs collapse into one
            )

    # -- the store ----------------------------------------------------------------------

    @property
    def secret(self) -> bytes:
        """The key of the copies' tokens: the one given, else the store's."""
        if self._secret is None:
            self.prepare()
        assert self._secret is not None
        return self._secret

    def prepare(self) -> None:
        """Make the store ready once (its tables, the secret); raises if the database
        cannot be reached (:meth:`run` retries)."""
        if self._prepared.is_set():  # every batch asks: no lock once it is done
            return
        with self._preparing:
            if self._prepared.is_set():
                return
            if self._create:
                create_tables(self.engine)
            elif not sa.inspect(self.engine).has_table(t.cms.name):
                raise ConfigError(f"no sender store at {self._db_name()} (its tables are missing)")
            if self._secret is None:
                self._secret = store_secret(self.engine)
            if self.workers is not None:
                self.workers.config = dataclasses.replace(
                    self.workers.config, secret_hex=self._secret.hex()
                )
            self._prepared.set()

    def wait_until_prepared(self, stop: threading.Event | None = None) -> bool:
        """:meth:`prepare`, retried with backoff while the database is unreachable (each
        wait logged); False if the service was stopped (or ``stop`` set) meanwhile. A
        configuration error (:class:`ConfigError`) is raised: no retry mends it."""
        retries = _Backoff(self._stop)
        while True:
            try:
                self.prepare()
                return True
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                if self._stop.is_set() or (stop is not None and stop.is_set()):
                    return False
                log.warning(
                    "waiting for the database at %s: %s; retrying in %.1fs",
                    self._db_name(),
                    _first_line(exc.orig if exc.orig is not None else exc),
                    retries.next_delay,
                )
                retries.wait(stop)

    def _db_name(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> Evaluator:
        """Run in background threads until :meth:`stop`."""
        self._thread = threading.Thread(
            target=self.run, name=f"evaluator-{self.sender}", daemon=True
        )
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the service thread started by :meth:`start` is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> Evaluator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self) -> None:
        """Consume the ack queue in this thread until :meth:`stop` (or SIGTERM in the CLI)."""
        if self.freeze_gc:
            gc.collect()
            gc.freeze()
        backoff = 0.2
        try:
            try:
                if not self.wait_until_prepared():
                    return
            except ConfigError as exc:
                log.error("the evaluator cannot start: %s", exc)
                return
            self._schedule_retention()
            if self.workers is not None:
                self.workers.start()
            if self._relay is not None:
                self._relay.start()
            if self._scheduler.get_jobs():  # an intake worker has none
                self._scheduler.start()
            while not self._stop.is_set():
                try:
                    self._consume()
                    backoff = 0.2
                except (BrokerError, pika.exceptions.AMQPError) as exc:
                    log.warning("ack queue unavailable (%s); retrying in %.1fs", exc, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            if self.workers is not None:
                self.workers.stop(timeout_s=WORKER_STOP_S)
            if self._scheduler.running:
                self._scheduler.shutdown(wait=True)
            if self._relay is not None:
                self._relay.stop()

    # -- intake -------------------------------------------------------------------------

    def _consume(self) -> None:
        connection = connect(self.amqp_url, name=f"condmsg-evaluator-{self.sender}")
        storing: _Storing | None = None
        try:
            channel = connection.channel()
            queue = p.ack_queue(self.sender)
            declare_service_queue(channel, queue)
            declare_service_queue(channel, p.dead_letter_queue(self.sender))
            declare_service_queue(channel, p.outcome_queue(self.sender))
            channel.basic_qos(prefetch_count=self.prefetch)
            storing = _Storing(self, connection, channel, self.store_threads)
            batch: list[tuple[int, bytes]] = []
            for method, _props, body in channel.consume(queue, inactivity_timeout=0.02):
                if method is not None:
                    batch.append((int(method.delivery_tag or 0), body or b""))
                if batch and (method is None or len(batch) >= self.batch_size):
                    storing.put(batch[-1][0], [body for _, body in batch])
                    batch = []
                if self._stop.is_set():
                    break
            # Store what was handed over, then send the acks it left to this thread.
            storing.finish()
            storing = None
            connection.process_data_events(time_limit=0)
            if batch:  # stopped mid-batch: hand them back for another instance
                channel.basic_nack(batch[-1][0], multiple=True, requeue=True)
            channel.cancel()
        finally:
            if storing is not None:  # the connection failed: what was not stored is redelivered
                storing.abort()
            if connection.is_open:
                connection.close()

    def _store(self, bodies: list[bytes]) -> bool:
        """Store and decide one batch (in the storing thread); False if it must be handed
        back: the database or the broker is unreachable (a transient failure).

        Any other failure is tied to the batch's contents: the batch is split in halves,
        each stored in its own transaction, down to the one message that fails, which is
        dead-lettered. Every message is then resolved (stored or dead-lettered) within
        log2(batch) + 1 tries, and a poison message never holds back good ones.
        """
        try:
            decided = self._store_parts(bodies)
        except Exception as exc:  # transient: _store_parts resolves the others
            log.warning(
                "batch of %d acks not stored (%s); handed back after %.1fs",
                len(bodies),
                _first_line(exc),
                self._retries.next_delay,
            )
            return False
        self._retries.reset()
        if decided and self._relay is not None:
            self._relay.wake()
        return True

    def _store_parts(self, bodies: list[bytes]) -> int:
        """:meth:`process_bodies`, split on a failure that is not transient (those are
        raised: no message is to blame for them)."""
        try:
            return self.process_bodies(bodies)
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
            return self._store_parts(bodies[:half]) + self._store_parts(bodies[half:])

    def _dead_letter(self, body: bytes, exc: Exception) -> None:
        """Dead-letter the one message whose batch fails, in a transaction of its own."""
        reason = f"could not be stored: {describe(exc)}"
        log.error("ack dead-lettered (%s): %r", reason, body[:200])
        try:
            with Session(self.engine) as session, session.begin():
                enqueue_all(session, [dead_letter(body, self.sender, reason)])
        except Exception:
            # Not even the outbox takes the dead letter: the batch is handed back (and
            # retried with backoff) rather than the ack dropped.
            log.exception("could not dead-letter an ack; its batch is handed back")
            raise
        report = {"acks": 0, "dead": 1, "anomalies": {}, "decisions": {}, "lateness_s": []}
        self.metrics.observe_report(report)
        self._send_report(report)

    def process_bodies(self, bodies: list[bytes]) -> int:
        """Ingest ack bodies and decide what they settle; returns how many CMs were decided."""
        self.prepare()
        with Session(self.engine) as session, session.begin():
            intake = ingest(
                session,
                bodies,
                sender=self.sender,
                secret=self.secret,
                clock=self._clock,
                clock_skew=self.clock_skew,
            )
            now = intake.now  # read once the batch's CM rows were locked
            result = decisions.judge(
                session,
                intake.touched,
                now=now,
                ack_grace=self.ack_grace,
                instance=self.instance,
                secret=self.secret,
                acks=intake.acks,
                copies=intake.copies,
            )
        report = batch_report(intake, result.outcomes)
        self.metrics.observe_report(report)
        self._send_report(report)
        return len(result.outcomes)

    def _send_report(self, report: dict[str, Any]) -> None:
        if self._report is not None:
            try:  # the batch is committed: a lost report must not send it back
                self._report(report)
            except Exception:
                log.exception("could not report a stored batch")

    # -- deadline sweeps ------------------------------------------------------------------

    def _sweep_job(self) -> None:
        try:
            self.sweep()
        except Exception:
            log.exception("deadline sweep failed; the next run retries")

    def sweep(self) -> int:
        """Decide or reschedule every CM whose next check is due; returns decisions made."""
        self.prepare()
        decided = 0
        while True:
            with Session(self.engine) as session, session.begin():
                ids = store.claim_due(session, self._clock(), self.sweep_batch)
                if not ids:
                    break
                # The decision instant once the rows are claimed (locked): an intake
                # batch that committed acks for them meanwhile stamped them earlier.
                now = self._clock()
                try:
                    with session.begin_nested():
                        outcomes = self._judge_due(session, ids, now)
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    outcomes = self._judge_due_apart(session, ids, now, exc)
            self.metrics.observe_decisions(outcomes)
            decided += len(outcomes)
            if len(ids) < self.sweep_batch:
                break
        if decided and self._relay is not None:
            self._relay.wake()
        return decided

    def _judge_due(self, session: Session, ids: list[str], now: datetime) -> list[Outcome]:
        result = decisions.judge(
            session,
            store.load_cms(session, ids),
            now=now,
            ack_grace=self.ack_grace,
            instance=self.instance,
            secret=self.secret,
        )
        return result.outcomes

    def _judge_due_apart(
        self, session: Session, ids: list[str], now: datetime, failure: Exception
    ) -> list[Outcome]:
        """Judge claimed CMs one at a time (each in a SAVEPOINT) after their batch failed:
        a CM that cannot be judged (a stored condition that no longer decodes, a bug) is
        parked for :data:`PARK_S` and logged, so that it never holds back the CMs due with
        it."""
        log.warning("sweep of %d due CMs failed (%s); judging them one by one", len(ids), failure)
        outcomes: list[Outcome] = []
        for cm_id in ids:
            try:
                with session.begin_nested():
                    outcomes += self._judge_due(session, [cm_id], now)
            except Exception as exc:
                if is_transient(exc):
                    raise
                log.error(
                    "CM %s cannot be judged (%s); looked at again in %.0f s",
                    cm_id,
                    describe(exc),
                    PARK_S,
                )
                store.set_next_checks(session, [(cm_id, now + timedelta(seconds=PARK_S))])
                self.metrics.parked.inc()
        return outcomes

    # -- retention ------------------------------------------------------------------------

    def _schedule_retention(self) -> None:
        if self.retention is None:
            return
        first = min(self.retention_interval_s, RETENTION_FIRST_RUN_S)
        self._scheduler.add_job(
            self._retention_job,
            "interval",
            seconds=self.retention_interval_s,
            id="retention",
            # Added when the scheduler starts, so that this instant is not already past.
            next_run_time=utcnow() + timedelta(seconds=first),
            max_instances=1,  # a long pass is never run twice at once in one process
            coalesce=True,
        )

    def _retention_job(self) -> None:
        try:
            self.retain()
        except Exception:
            self.metrics.retention_failures.inc()
            log.exception(
                "retention pass failed (its failed batch is rolled back); the next run retries"
            )

    def retain(self) -> int:
        """One retention pass now (archive, then delete, CMs decided before ``now -
        retention``); returns the rows archived and deleted. Stops between batches when
        the service stops."""
        if self.retention is None:
            raise ConfigError("retention is not configured (--retention, CONDMSG_RETENTION)")
        archived = retain(
            self.engine,
            self.retention,
            clock=self._clock,
            instance=self.instance,
            should_stop=self._stop.is_set,
            on_archived=self._archived,
        )
        return sum(a.total for a in archived)

    def _archived(self, archived: Archived) -> None:
        self.metrics.observe_archived(archived)
        log.info(
            "retention: archived and deleted %d rows in %s", archived.total, archived.directory
        )


class _Storing:
    """Threads that store and decide the batches the consuming thread hands over.

    While a storing thread waits on the database (statements, the commit's disk flush),
    the other one and the consuming thread do their Python work: the broker, the database
    and the interpreter overlap instead of taking turns. At most one batch waits for a
    free thread, so no more than ``prefetch`` deliveries are ever held.

    Batches may commit out of order, but they are settled with the broker in delivery
    order: each batch is acknowledged with one ``multiple`` ack (or nacked for requeue if
    it failed) only once it and every earlier batch are done, so a multiple ack never
    covers a batch that is not stored. The consuming thread owns the channel (pika is not
    thread-safe): the storing threads hand it their results with
    ``add_callback_threadsafe``.
    """

    def __init__(self, service: Evaluator, connection: Any, channel: Any, threads: int) -> None:
        self._service = service
        self._connection = connection
        self._channel = channel
        self._queue: queue.Queue[tuple[int, list[bytes]] | None] = queue.Queue(maxsize=1)
        self._aborted = threading.Event()
        self._order = InOrder()
        self._threads = [
            threading.Thread(
                target=self._run, name=f"evaluator-store-{service.sender}-{i}", daemon=True
            )
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def put(self, last_tag: int, bodies: list[bytes]) -> None:
        """Hand a batch over (waits while another one is still waiting for a thread)."""
        seq = self._order.open(last_tag)
        self._queue.put((seq, bodies))

    def finish(self) -> None:
        """Store what was handed over, then end the threads."""
        self._end()

    def abort(self) -> None:
        """End the threads without storing what is still queued (it is never acked, so the
        broker redelivers it once the channel is gone)."""
        self._aborted.set()
        self._end()

    def _end(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._aborted.is_set():
                continue
            seq, bodies = item
            stored = self._service._store(bodies)
            if not stored:
                # Held, not handed back at once: redelivered at once, it would fail again
                # at once while the database or the broker is away.
                self._service._retries.wait(self._aborted)
            try:
                self._connection.add_callback_threadsafe(
                    functools.partial(self._finished, seq, stored)
                )
            except (pika.exceptions.AMQPError, RuntimeError) as exc:
                # The connection is gone: the batch is redelivered (its acks then count as
                # duplicates if it was stored).
                log.warning("could not acknowledge a batch (%s)", exc)

    def _finished(self, seq: int, stored: bool) -> None:
        """In the consuming thread: settle every batch whose predecessors are settled."""
        for last_tag, ok in self._order.finished(seq, stored):
            if ok:
                self._channel.basic_ack(last_tag, multiple=True)
            else:
                self._channel.basic_nack(last_tag, multiple=True, requeue=True)


class InOrder:
    """Batches finish in any order but are settled with the broker in delivery order.

    :meth:`open` numbers a batch (by its last delivery tag); :meth:`finished` records its
    result and returns the (last tag, stored) of every batch that can now be settled: this
    one and the finished ones after it, once every earlier batch is settled. A
    ``multiple`` ack of a returned tag therefore covers only stored batches.
    """

    def __init__(self) -> None:
        self._next = 0
        self._open: collections.deque[tuple[int, int]] = collections.deque()
        self._done: dict[int, bool] = {}

    def open(self, last_tag: int) -> int:
        seq, self._next = self._next, self._next + 1
        self._open.append((seq, last_tag))
        return seq

    def finished(self, seq: int, stored: bool) -> list[tuple[int, bool]]:
        self._done[seq] = stored
        ready: list[tuple[int, bool]] = []
        while self._open and self._open[0][0] in self._done:
            first, last_tag = self._open.popleft()
            ready.append((last_tag, self._done.pop(first)))
        return ready

    @property
    def unsettled(self) -> int:
        return len(self._open)


def is_transient(exc: BaseException) -> bool:
    """Is ``exc`` about the database or the broker (unreachable, busy, or not the schema
    the evaluator expects) rather than about the acks being stored? Such a failure is
    retried later with the same batch: splitting it would blame, and dead-letter, every
    genuine ack in turn.

    What the acks can cause is a data exception (SQLSTATE class 22: a value too long, a
    character a column cannot hold) or an integrity violation (23), or an error raised in
    Python while decoding or judging them (also one SQLAlchemy wraps while binding a
    value, a ``StatementError``); everything else the database reports (a lost
    connection, a deadlock, a missing column or table, a refused permission, a shutdown)
    is the environment's, and so are SQLAlchemy's own errors about connections and
    sessions (a pool that times out, a session that must be rolled back) and operating
    system errors. A driver error without a SQLSTATE is the environment's when it is an
    operational or interface error (no server answered), else the data's (psycopg refuses
    some values before sending them).
    """
    if isinstance(exc, (BrokerError, pika.exceptions.AMQPError, OSError)):
        return True
    if not isinstance(exc, sa.exc.SQLAlchemyError):
        return False
    if not isinstance(exc, sa.exc.DBAPIError):
        return not isinstance(exc, sa.exc.StatementError)
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:
        return isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
    return str(sqlstate)[:2] not in _DATA_SQLSTATE_CLASSES


#: The SQLSTATE classes an ack's own values can cause: data exceptions, integrity
#: constraint violations.
_DATA_SQLSTATE_CLASSES = frozenset({"22", "23"})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _Backoff:
    """Waits that double from :data:`FIRST_RETRY_S` to :data:`MAX_RETRY_S` while
    failures follow each other; cut short when ``stop`` is set."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        self._lock = threading.Lock()
        self.next_delay = FIRST_RETRY_S

    def wait(self, also: threading.Event | None = None) -> None:
        """Wait the next delay (or until stopped, or ``also`` is set), then double it."""
        with self._lock:
            delay = self.next_delay
            self.next_delay = min(delay * 2, MAX_RETRY_S)
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(left, 0.1)) or (also is not None and also.is_set()):
                return

    def reset(self) -> None:
        with self._lock:
            self.next_delay = FIRST_RETRY_S
