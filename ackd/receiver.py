"""``Receiver``: read conditional messages and acknowledge them automatically.

- ``read(queue)`` (non-transactional): the RLOG row and the READ ack's outbox row commit in
  one local transaction, then the AMQP message is acked, then the app gets it.
- ``transaction()``: the app's own SQLAlchemy session; ``tx.read(queue)`` takes a message
  unacked; the app's writes, the RLOG row and the COMMIT ack's outbox row commit together,
  and only then is the AMQP message acked. On an exception: rollback, the message is
  requeued after a pause that doubles with each failed attempt (``retry_backoff`` up to
  ``retry_backoff_max``), and after ``max_attempts`` failed attempts it goes to the
  invalid-message queue.
- ``consume(queue, handler)``: the same, event-driven, for competing consumers.

Plain (non-conditional) messages pass through the same API with no ack. Messages with
malformed condmsg headers, a bad token or an undecodable payload go to the invalid-message
queue with the reason in a header; the app never sees them. So does a message on which
judging it raised anything else (a codec bug): it costs that message, never the reader.
A failure of the receiver store or the broker is not the message's fault: it propagates,
and the message goes back to its queue.

Exactly once for a transactional app: an original or compensation is recorded by its
RLOG row, a success notice by its inbox row, each committed with the app's transaction;
a redelivery after a crash before the broker ack finds the row and is dropped. Plain
messages have no such row: like any AMQP consumer's, they are at least once.

Where the work is done, in the order a message meets it: the read and consume loops in
:mod:`ackd.reader`; the checks that accept a delivery or move it to the invalid queue in
:mod:`ackd.acceptance` (the header, token and payload checks in :mod:`ackd.validation`);
Message Sequences in :mod:`ackd.sequences`; the RLOG decision, in or beside the app's
transaction, in :mod:`ackd.rlog`; commit and rollback in :mod:`ackd.settlement` (failed
attempts in :mod:`ackd.attempts`). What these parts share is one
:class:`~ackd.context.ReceiveContext`; the settings are in :mod:`ackd.receiver_config`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from ackd import fastpath
from ackd.acceptance import Acceptance
from ackd.ack_watch import AckWatch
from ackd.attempts import AttemptCounts
from ackd.broker import Broker
from ackd.context import ReceiveContext, ReceiverStats
from ackd.identity import checked_name, default_receiver_id
from ackd.message import Message
from ackd.outage import StoreUnavailable, is_store_outage
from ackd.reader import Handler, Reader
from ackd.receiver_config import ReceiverConfig
from ackd.receiver_store import ReceiverStore, SqlAlchemyReceiverStore
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from ackd.rlog import RlogDecisions
from ackd.sequences import SequenceReassembly
from ackd.settlement import Settlement
from ackd.tables import metadata
from ackd.transaction import ReceiverTransaction
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.infra import backends
from condmsg.infra.repeated_failures import reason_of
from condmsg.runtime import migrate
from condmsg.runtime.db import describe_db_url, make_engine
from condmsg.runtime.relaying import OwnsOutbox
from condmsg.runtime.settings import Settings

__all__ = ["Handler", "Receiver", "ReceiverConfig", "ReceiverStats", "ReceiverTransaction"]


class Receiver(OwnsOutbox):
    """The receiving side for one final recipient identity (``recipient``).

    Its settings are a :class:`ReceiverConfig` (``config``), or that config's fields as
    keywords (``Receiver(amqp_url=..., db_url=..., recipient=...)``), which also override
    the fields of a given ``config``. ``engine``, when given, is the receiver's database
    instead of ``db_url``; ``store``, when given, is how the receiver writes to it (else
    the adapter for the engine's database and driver, see :mod:`ackd.receiver_store`);
    ``clock`` gives the read and commit times of its acks; ``broker``, when given, is
    its side of RabbitMQ instead of one connecting to ``amqp_url`` (the test kit's
    in-memory broker, :mod:`condmsg.testing`), and ``monotonic`` (seconds) what times
    its pauses for Message Sequences (the kit's virtual clock).

    ``secret``, when given (or ``CONDMSG_SECRET``), makes the receiver verify each copy's
    token and reject forged copies; without it the evaluator still rejects their acks.
    How a message whose processing failed is retried: :class:`ReceiverConfig`.
    """

    def __init__(
        self,
        config: ReceiverConfig | None = None,
        *,
        recipient: str,
        engine: Engine | None = None,
        store: ReceiverStore | None = None,
        clock: Callable[[], datetime] = utcnow,
        registry: CollectorRegistry | None = None,
        broker: Broker | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        **settings: Any,
    ) -> None:
        config = ReceiverConfig(**settings) if config is None else replace(config, **settings)
        if engine is None and config.db_url is None:
            raise ConfigError("Receiver needs db_url (CONDMSG_DB_URL) or an engine")
        self.config = config
        self.recipient = checked_name(recipient, "recipient identity")
        self.receiver_id = checked_name(
            config.receiver_id or default_receiver_id(recipient), "receiver id"
        )
        #: Read by :class:`OwnsOutbox` (the receiver's in-process relay).
        self.amqp_url = config.amqp_url
        # No pre-ping: it would add a round trip to every transaction. A connection that
        # died is found on use instead; that transaction rolls back, its message is
        # requeued, and the pool replaces the connection.
        self.engine = (
            engine if engine is not None else make_engine(str(config.db_url), pool_pre_ping=False)
        )
        self.store: ReceiverStore = (
            store
            if store is not None
            # The fast path only where psycopg is a release it was tested with.
            else PsycopgReceiverStore()
            if backends.uses_psycopg(self.engine) and fastpath.chosen()
            else SqlAlchemyReceiverStore()
        )
        self._traits = self.store.attach(self.engine)
        self.max_attempts = config.max_attempts
        self.invalid_queue = config.invalid_queue
        self.stats = ReceiverStats()
        self._attempts = AttemptCounts(self.engine)
        self._broker = (
            broker
            if broker is not None
            else Broker(
                config.amqp_url,
                name=f"condmsg-receiver-{recipient}",
                invalid_queue=config.invalid_queue,
            )
        )
        #: The connection the app's transactions run on (see ``_bind``) and its thread.
        self._thread_connection: Connection | None = None
        self._thread_connection_owner: int | None = None
        migrate.ensure(self.engine, "receiver", models=[metadata], create=config.create_schema)
        #: Whether this receiver's acks leave its store (a relay publishes its outbox):
        #: warned about at start and while reading; gauges in ``registry`` if given.
        self.store_name = describe_db_url(str(self.engine.url))
        self.ack_watch = AckWatch(self.engine, store_name=self.store_name, registry=registry)
        self.ack_watch.check(now=True)
        self._monotonic = monotonic
        self._assemble(clock)

    def _assemble(self, clock: Callable[[], datetime]) -> None:
        """Build the parts that do the work, around one context they share."""
        context = ReceiveContext(
            engine=self.engine,
            store=self.store,
            row_locks=self._traits.row_locks,
            broker=self._broker,
            attempts=self._attempts,
            config=self.config,
            recipient=self.recipient,
            receiver_id=self.receiver_id,
            clock=clock,
            store_lost=self._store_lost,
            stats=self.stats,
            monotonic=self._monotonic,
        )
        decisions = RlogDecisions(context)
        sequences = SequenceReassembly(context, decisions)
        acceptance = Acceptance(context, decisions, sequences)
        self._settlement = Settlement(context)
        self._reader = Reader(
            context,
            acceptance,
            sequences,
            open_transaction=self.transaction,
            probe_store=self._probe_store,
        )

    @classmethod
    def from_env(cls, *, recipient: str, **overrides: Any) -> Receiver:
        options = Settings.from_env().endpoint_options() | overrides
        return cls(recipient=recipient, **options)

    # -- public API -----------------------------------------------------------------

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` (non-transactional: READ ack), None on timeout."""
        self.ack_watch.check()
        return self._reader.next_message(queue, timeout, None)

    @contextmanager
    def transaction(self) -> Iterator[ReceiverTransaction]:
        """Commits on a clean exit (then acks), rolls back and requeues on an exception."""
        self.ack_watch.check()
        try:
            bind = self._bind()
        except sa.exc.SQLAlchemyError as exc:
            raise self._unavailable(exc) from exc
        session = Session(bind)
        session.begin()
        tx = ReceiverTransaction(session, self._reader.next_message)
        try:
            yield tx
        except BaseException as exc:
            self._settlement.rollback(tx, exc)
            self._raise_if_lost(exc)
            raise
        else:
            try:
                self._settlement.commit(tx)  # rolls back itself if the commit fails
            except Exception as exc:
                self._raise_if_lost(exc)
                raise
        finally:
            session.close()

    def consume(
        self,
        queue: str,
        handler: Handler,
        *,
        transactional: bool = True,
        prefetch: int = 50,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Handle messages of ``queue`` until ``stop`` is set, ``max_messages`` were handled
        or nothing came for ``idle_timeout_s``; returns how many the handler got.

        ``handler(message, session)`` gets the transaction's session when
        ``transactional`` (its writes commit with the COMMIT ack), else None. A handler
        exception rolls the transaction back and requeues the message after its backoff;
        consuming goes on meanwhile (nothing sleeps: the message is held unacked), and
        ``idle_timeout_s`` does not end it while a message waits for another attempt.
        """
        return self._reader.consume(
            queue,
            handler,
            transactional=transactional,
            prefetch=prefetch,
            max_messages=max_messages,
            idle_timeout_s=idle_timeout_s,
            stop=stop,
        )

    def close(self) -> None:
        self._broker.close()
        connection, self._thread_connection = self._thread_connection, None
        if connection is not None:
            with suppress(sa.exc.SQLAlchemyError):
                connection.close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _relay_name(self) -> str:
        return f"condmsg-receiver-relay-{self.recipient}"

    def _bind(self) -> Engine | Connection:
        """What the app's transactions run on: on a database server one connection this
        receiver keeps (for the thread that uses it), not a pool checkout and return per
        message (``StoreTraits.keep_connection``).

        A connection that failed (SQLAlchemy invalidates it on a disconnect) is replaced
        at the next transaction.
        """
        if not self._traits.keep_connection:
            return self.engine
        me = threading.get_ident()
        owner = self._thread_connection_owner
        if owner is not None and owner != me:
            return self.engine  # another thread: the pool, as usual
        connection = self._thread_connection
        if connection is None or connection.closed or connection.invalidated or _broken(connection):
            if connection is not None:
                with suppress(sa.exc.SQLAlchemyError):
                    connection.close()
                self._thread_connection = None
            connection = self._thread_connection = self.engine.connect()
            self._thread_connection_owner = me
        return connection

    def _store_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` came from an outage of the store rather than from the message.

        Besides what the error says (:func:`is_store_outage`), the kept connection itself
        tells: statements sent past SQLAlchemy (the psycopg adapter's) report a broken
        connection as a plain database error, and SQLAlchemy never learns of it. A lost
        connection is dropped here, so that the next transaction opens a new one.
        """
        connection = self._thread_connection
        broken = connection is not None and not connection.closed and _broken(connection)
        if broken:
            assert connection is not None
            with suppress(Exception):
                connection.invalidate()
        return broken or is_store_outage(exc)

    def _raise_if_lost(self, exc: BaseException) -> None:
        """Raise :class:`StoreUnavailable` from ``exc`` if it came from an outage of the
        store: the one error an app catches for "the store is away", whichever statement
        (the app's or the receiver's) met it."""
        lost = isinstance(exc, Exception) and not isinstance(exc, StoreUnavailable)
        if lost and self._store_lost(exc):
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"the receiver store at {self.store_name} cannot be reached: {reason_of(exc)}"
        )

    def _probe_store(self) -> None:
        """One round trip on the connection the next transaction will use; raises while
        the store cannot be reached."""
        bind = self._bind()
        with Session(bind) as session, session.begin():
            session.execute(sa.text("SELECT 1"))


def _broken(connection: Connection) -> bool:
    """Whether the driver knows ``connection`` to be lost (psycopg's ``broken``; any
    driver's ``closed``), without a round trip."""
    try:
        raw = connection.connection.dbapi_connection
    except sa.exc.SQLAlchemyError:
        return True
    return bool(getattr(raw, "broken", False) or getattr(raw, "closed", False))
