"""``AsyncReceiver``: the :class:`~ackd.receiver.Receiver` for asyncio applications.

One correctness core: everything that judges a delivery and decides what becomes of it
(validation, the RLOG claim and cancel-out, Message Sequences, failed attempts, the ack
rows, commit and rollback with their acks) is the sync receiver's own code, run unchanged
in a greenlet on the event loop's thread (SQLAlchemy's ``greenlet_spawn``, as
``AsyncSession.run_sync`` does). Only the I/O differs: each database round trip awaits
the async driver (psycopg's ``AsyncConnection``, aiosqlite) through SQLAlchemy's asyncio
extension, and each broker call awaits aio-pika (:class:`~ackd.async_broker.AsyncBroker`).
No thread, no second SQL, and the event loop serves other tasks during every round trip.

On an async connection the store's portable adapter applies: the psycopg fast path
(:mod:`ackd.fastpath`) drives psycopg's blocking connection, which an async engine does
not have (:func:`condmsg.infra.backends.uses_psycopg`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.util import greenlet_spawn

from ackd.async_broker import AsyncBroker
from ackd.async_consume import AsyncConsumer, AsyncHandler, ConsumeRun
from ackd.async_stream import MessageStream, StreamItem
from ackd.message import Message
from ackd.outage import StoreUnavailable
from ackd.receiver import Receiver
from ackd.receiver_config import ReceiverConfig
from ackd.receiver_store import SqlAlchemyReceiverStore
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from ackd.transaction import ReceiverTransaction
from condmsg.core.errors import ConfigError
from condmsg.core.timeutil import utcnow
from condmsg.runtime.async_start import AsyncStart
from condmsg.sending.async_sender import make_async_engine

__all__ = [
    "AsyncHandler",
    "AsyncReceiver",
    "AsyncReceiverTransaction",
    "MessageStream",
    "StreamItem",
]


class _Core(Receiver):
    """The sync receiver on the async engine's sync facade, its broker the aio-pika one.
    Built, and used, only inside greenlets (see the module's docstring)."""

    def _assemble(self, clock: Callable[[], datetime]) -> None:
        if isinstance(self.store, PsycopgReceiverStore):
            raise ConfigError("the async receiver takes the portable store adapter")
        self._broker = AsyncBroker(
            self.config.amqp_url,
            name=f"condmsg-receiver-{self.recipient}",
            invalid_queue=self.config.invalid_queue,
        )
        super()._assemble(clock)

    def _store_lost(self, exc: BaseException) -> bool:
        # A cancelled task (a shutdown, a timeout around the app's code) is no fault of
        # the message either: what its transaction took goes back at once, uncounted,
        # exactly as on an outage of the store.
        return isinstance(exc, asyncio.CancelledError) or super()._store_lost(exc)

    @property
    def broker(self) -> AsyncBroker:
        assert isinstance(self._broker, AsyncBroker)
        return self._broker


class AsyncReceiverTransaction:
    """One transactional read scope: ``session`` is the app's ``AsyncSession``, ``read``
    takes messages within its transaction."""

    def __init__(self, receiver: AsyncReceiver, session: AsyncSession, tx: ReceiverTransaction):
        self.session = session
        self._receiver = receiver
        #: The sync receiver's scope on the session's sync facade: what settles.
        self.sync = tx

    async def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` within this transaction, or None on timeout."""
        return await self._receiver._poll(queue, timeout, self.sync)


class AsyncReceiver(AsyncStart[_Core]):
    """The receiving side for one final recipient identity, for asyncio applications:
    the arguments and guarantees of :class:`~ackd.receiver.Receiver`, every call
    awaitable. ``engine`` is an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on the
    receiver store (else one is made from ``db_url``); ``transaction(session=...)`` takes
    an ``AsyncSession`` on it.

    Use it as ``async with AsyncReceiver(...) as receiver:`` (or ``await
    receiver.start()`` and ``await receiver.close()``): starting checks the store's
    schema without blocking the loop.
    """

    def __init__(
        self,
        config: ReceiverConfig | None = None,
        *,
        recipient: str,
        engine: AsyncEngine | None = None,
        clock: Callable[[], datetime] = utcnow,
        registry: CollectorRegistry | None = None,
        **settings: Any,
    ) -> None:
        config = ReceiverConfig(**settings) if config is None else replace(config, **settings)
        if engine is None and config.db_url is None:
            raise ConfigError("AsyncReceiver needs db_url (CONDMSG_DB_URL) or an engine")
        super().__init__()
        self.config = config
        self.recipient = recipient
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else make_async_engine(str(config.db_url))
        self._clock = clock
        self._registry = registry
        #: The connection this receiver's own transactions run on (a database server's).
        self._kept: AsyncConnection | None = None
        #: Whether a transaction runs on it now (tasks of one loop may open several).
        self._kept_busy = False
        self._consuming = False

    @classmethod
    def from_env(cls, *, recipient: str, **overrides: Any) -> AsyncReceiver:
        """The connection settings and secret from the environment (``CONDMSG_AMQP_URL``,
        ``CONDMSG_DB_URL``, ``CONDMSG_SECRET``), as :meth:`Receiver.from_env`."""
        return cls(ReceiverConfig.from_env(**overrides), recipient=recipient)

    # -- life ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the broker connection (owed acks sent, held-back deliveries given back),
        the kept connection, and the engine if the receiver made it."""
        core = self._core
        if core is not None:
            await greenlet_spawn(core.broker.close)
        await self._drop_kept()
        if self._owns_engine:
            await self.engine.dispose()

    async def _build(self) -> _Core:
        # The schema check and the ack watch's first look await the async driver.
        return await greenlet_spawn(
            _Core,
            self.config,
            recipient=self.recipient,
            engine=self.engine.sync_engine,
            store=SqlAlchemyReceiverStore(),
            clock=self._clock,
            registry=self._registry,
        )

    @property
    def receiver_id(self) -> str:
        return self._started_core().receiver_id

    @property
    def stats(self) -> Any:
        """The counters of :class:`~ackd.context.ReceiverStats` (after the start)."""
        return self._started_core().stats

    def _started_core(self) -> _Core:
        if self._core is None:
            raise ConfigError("the async receiver has not started yet")
        return self._core

    # -- reading ------------------------------------------------------------------------

    async def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        """The next message of ``queue`` (non-transactional: READ ack), None on timeout."""
        await self._check_acks()
        return await self._poll(queue, timeout, None)

    @asynccontextmanager
    async def transaction(
        self, session: AsyncSession | None = None
    ) -> AsyncIterator[AsyncReceiverTransaction]:
        """``async with receiver.transaction(session=...) as tx``: commits on a clean exit
        (then acks), rolls back and requeues on an exception; a cancelled task gives what
        it took back at once, uncounted. ``session`` is the app's ``AsyncSession`` on the
        receiver store (else one of the receiver's own): the app's writes, the RLOG rows
        and the COMMIT acks commit together."""
        core = await self._check_acks()
        owned = session is None
        kept = False
        if session is None:
            try:
                bind = await self._bind()
            except sa.exc.SQLAlchemyError as exc:
                await self._drop_kept()
                raise core._unavailable(exc) from exc
            kept = bind is self._kept
            session = AsyncSession(bind)
        tx = ReceiverTransaction(session.sync_session, core._reader.next_message)
        try:
            yield AsyncReceiverTransaction(self, session, tx)
        except BaseException as exc:
            await greenlet_spawn(core._settlement.rollback, tx, exc)
            self._raise_if_lost(core, exc)
            raise
        else:
            try:
                await greenlet_spawn(core._settlement.commit, tx)
            except Exception as exc:
                self._raise_if_lost(core, exc)
                raise
        finally:
            if owned:
                await session.close()
            if kept:
                self._kept_busy = False

    def _raise_if_lost(self, core: _Core, exc: BaseException) -> None:
        lost = isinstance(exc, Exception) and not isinstance(exc, StoreUnavailable)
        if lost and core._store_lost(exc):
            self._kept_lost()
            raise core._unavailable(exc) from exc

    async def _poll(
        self, queue: str, timeout: float, tx: ReceiverTransaction | None
    ) -> Message | None:
        """The sync reader's one look (``timeout`` 0: the store's complete sequences, then
        one ``basic.get``), repeated between asyncio sleeps until ``timeout`` passes."""
        core = await self._started()
        deadline = time.monotonic() + timeout
        while True:
            message = await greenlet_spawn(core._reader.next_message, queue, 0.0, tx)
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(self.config.poll_interval_s, remaining))

    async def _check_acks(self) -> _Core:
        core = await self._started()
        await greenlet_spawn(core.ack_watch.check)
        return core

    # -- the kept connection ------------------------------------------------------------

    async def _bind(self) -> AsyncEngine | AsyncConnection:
        """On a database server one connection this receiver keeps for its own
        transactions, not a pool checkout per message (as the sync receiver's)."""
        core = await self._started()
        if not core._traits.keep_connection or self._kept_busy:
            return self.engine  # a transaction of another task has it: the pool, as usual
        # Taken before the first await: another task must not open a second one meanwhile.
        self._kept_busy = True
        kept = self._kept
        try:
            if kept is None or kept.closed or kept.invalidated:
                await self._drop_kept()
                kept = self._kept = await self.engine.connect()
        except BaseException:
            self._kept_busy = False
            raise
        return kept

    def _kept_lost(self) -> None:
        """The store failed: the next transaction opens a new connection (the old one
        may be broken without SQLAlchemy knowing)."""
        kept = self._kept
        if kept is not None and kept.sync_connection is not None and not kept.invalidated:
            with suppress(Exception):
                kept.sync_connection.invalidate()

    async def _drop_kept(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            with suppress(Exception):
                await kept.close()

    # -- consuming ----------------------------------------------------------------------

    async def consume(
        self,
        queue: str,
        handler: AsyncHandler,
        *,
        transactional: bool = True,
        prefetch: int = 50,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
        stop: asyncio.Event | None = None,
    ) -> int:
        """Handle messages of ``queue`` until ``stop`` is set, ``max_messages`` were
        handled or nothing came for ``idle_timeout_s``; returns how many the handler got.
        The contract of :meth:`Receiver.consume`, with an async handler:
        ``await handler(message, session)`` gets the transaction's ``AsyncSession`` when
        ``transactional``, else None. Cancelling the task stops it too: the message in
        hand is rolled back and given back uncounted, the prefetched ones are requeued.
        """
        run = ConsumeRun(queue, handler, transactional, max_messages, idle_timeout_s, stop)
        return await self._consume(run, AsyncConsumer, prefetch=prefetch)

    def stream(
        self,
        queue: str,
        *,
        prefetch: int = 50,
        max_messages: int | None = None,
        idle_timeout_s: float | None = None,
    ) -> MessageStream:
        """The messages of ``queue`` as an ``async for``, each in its transaction::

            async with receiver.stream(queue) as stream:
                async for item in stream:
                    async with item:  # commits on a clean exit, rolls back on an error
                        await handle(item.message, item.session)

        ``consume``'s guarantees and arguments (see :mod:`ackd.async_stream`); it ends
        when the ``async with`` is left, after ``max_messages`` or when idle for
        ``idle_timeout_s``.
        """
        start = partial(self._consume, prefetch=prefetch)
        return MessageStream(start, queue, max_messages=max_messages, idle_timeout_s=idle_timeout_s)

    async def _consume(
        self, run: ConsumeRun, consumer: Callable[..., AsyncConsumer], *, prefetch: int
    ) -> int:
        if self._consuming:
            # One broker consumer per receiver: its channel's prefetch window and the
            # books of what it holds are the consumer's.
            raise ConfigError("this AsyncReceiver consumes already; make one per consumer")
        self._consuming = True
        try:
            core = await self._started()
            return await consumer(self.transaction, core, core.broker, run.stop).run(run, prefetch)
        finally:
            self._consuming = False
