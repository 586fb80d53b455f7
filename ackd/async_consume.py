"""``AsyncReceiver.consume``: the sync consume loop's contract (:mod:`ackd.reader`) on an
aio-pika consumer, each delivery judged, decided and settled by the sync receiver's code
in a greenlet, the app's async handler awaited inside the transaction.

An outage of the store or of RabbitMQ ends the broker consumer (what it held goes back to
the queue), waits with backoff (``asyncio.sleep``: the loop goes on) until the one that
failed answers again, and starts a new consumer; the time it lasts is not idle time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, suppress
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.util import greenlet_spawn

from ackd.async_broker import AsyncBroker, InboxItem
from ackd.broker import Delivery
from ackd.message import Message
from ackd.outage import StoreUnavailable
from ackd.reader import Step, _Run, log_failed, log_handler_failed
from ackd.receiver import Receiver
from ackd.transaction import ReceiverTransaction
from condmsg.core.errors import BrokerAuthError, BrokerError
from condmsg.infra.backoff import Backoff
from condmsg.runtime.pausing import FIRST_RETRY_S, MAX_RETRY_S, Pause
from condmsg.sending.async_broker import CONNECTION_ERRORS

#: What ``consume`` hands each message to: ``await handler(message, session)``, with the
#: transaction's ``AsyncSession`` (its writes commit with the COMMIT ack), None for a
#: non-transactional consumer.
AsyncHandler = Callable[[Message, AsyncSession | None], Awaitable[None]]


class AsyncTransaction(Protocol):
    """What the consumer uses of an ``AsyncReceiverTransaction``: the app's session
    and the sync receiver's transaction it runs in."""

    session: AsyncSession
    sync: ReceiverTransaction


#: ``AsyncReceiver.transaction`` without arguments: a transaction on a session of its own.
Transactions = Callable[[], AbstractAsyncContextManager[AsyncTransaction]]

#: The sync consume loop's logger: a pause reads the same whichever receiver consumes.
log = logging.getLogger("ackd.reader")

#: How long the consumer waits for a delivery before an idle tick (seconds): owed acks
#: go out, held-back deliveries are given back, ``stop`` and the idle timeout are seen.
TICK_S = 0.1


#: One ``consume()`` call: the sync consume's record of it, with an async handler.
ConsumeRun = _Run[AsyncHandler]


class AsyncConsumer:
    """Runs one ``consume()`` of an :class:`~ackd.async_receiver.AsyncReceiver`."""

    def __init__(
        self,
        transactions: Transactions,
        core: Receiver,
        broker: AsyncBroker,
        stop: asyncio.Event | None,
    ) -> None:
        self._transactions = transactions
        self._stop = stop
        self._core = core
        self._broker = broker

    async def run(self, run: _Run[AsyncHandler], prefetch: int) -> int:
        activity = f"consuming {run.queue!r}"
        store = Pause(log, activity, "the receiver store")
        broker = Pause(log, activity, "RabbitMQ")
        backoff = Backoff(FIRST_RETRY_S, MAX_RETRY_S)
        while not run.stopped():
            try:
                if await self._consume_stream(run, prefetch, broker.ended):
                    break
            except StoreUnavailable as exc:
                store.failed(exc)
                if not await self._until_store_answers(store, backoff, run):
                    break
                backoff.reset()
            except BrokerAuthError:
                raise  # a wrong user or vhost: waiting does not mend it
            except (BrokerError, *CONNECTION_ERRORS) as exc:
                await greenlet_spawn(self._broker.close)  # RabbitMQ requeues what it held
                broker.failed(exc)
                if not await _sleep(backoff.next_delay(), self._stop):
                    break
            run.last = time.monotonic()
        return run.handled

    async def _until_store_answers(
        self, pause: Pause, backoff: Backoff, run: _Run[AsyncHandler]
    ) -> bool:
        while await _sleep(backoff.next_delay(), self._stop):
            try:
                async with self._transactions() as tx:
                    await tx.session.execute(sa.text("SELECT 1"))
            except Exception as exc:
                pause.failed(exc)
            else:
                pause.ended()
                return True
        return False

    async def _consume_stream(
        self, run: _Run[AsyncHandler], prefetch: int, working: Callable[[], None]
    ) -> bool:
        """Consume with one broker consumer until done (True) or an outage (raised)."""
        inbox: asyncio.Queue[InboxItem] = asyncio.Queue()
        await greenlet_spawn(self._broker.start_consuming, run.queue, prefetch, inbox.put_nowait)
        working()
        reader = self._core._reader
        try:
            while True:
                item = await _next(inbox)
                if isinstance(item, BaseException):
                    raise BrokerError(f"lost the connection to RabbitMQ: {item}") from item
                if reader.expiry_due():
                    await greenlet_spawn(reader.expire_incomplete)
                if item is None:
                    await greenlet_spawn(_idle_tick, self._broker)
                step = reader.next_step(run, item)
                if step is Step.DONE:
                    return True
                if step is Step.TAKE and await self._handle(run, item):
                    run.took_one()
        finally:
            # Shielded: a cancelled consume still cancels its consumer and settles.
            with suppress(BrokerError, *CONNECTION_ERRORS):
                await asyncio.shield(greenlet_spawn(self._broker.stop_consuming))

    async def _handle(self, run: _Run[AsyncHandler], delivery: Delivery | None) -> bool:
        """Hand the delivery (None: a complete sequence from the store) to the handler;
        whether the handler got a message."""
        reader = self._core._reader

        def take(tx: ReceiverTransaction | None) -> Message | None:
            # In the greenlet: taking it from the inbox may settle others with the broker.
            taken = None if delivery is None else self._broker.received(delivery)
            return reader.take(run.queue, taken, tx)

        message: Message | None
        if not run.transactional:
            try:
                message = await greenlet_spawn(take, None)
            except Exception as exc:
                await greenlet_spawn(reader.raise_if_store_lost, exc, delivery)
                raise
            if message is not None:
                try:
                    await run.handler(message, None)
                except Exception:
                    log_handler_failed()
            return message is not None
        try:
            async with self._transactions() as tx:
                message = await greenlet_spawn(take, tx.sync)
                if message is not None:
                    await run.handler(message, tx.session)
        except Exception as exc:
            await greenlet_spawn(reader.raise_if_store_lost, exc, delivery)
            if isinstance(exc, (BrokerError, *CONNECTION_ERRORS)):
                raise  # the broker failed, not the message: consuming pauses and reconnects
            log_failed(delivery)
            return False
        return message is not None


async def _next(inbox: asyncio.Queue[InboxItem]) -> InboxItem | None:
    """The next item of ``inbox``, or None after :data:`TICK_S` without one."""
    try:
        return inbox.get_nowait()  # no timer while deliveries keep coming
    except asyncio.QueueEmpty:
        pass
    try:
        return await asyncio.wait_for(inbox.get(), TICK_S)
    except TimeoutError:
        return None


def _idle_tick(broker: AsyncBroker) -> None:
    broker.release_due()
    broker.flush_acks()


async def _sleep(seconds: float, stop: asyncio.Event | None) -> bool:
    """Sleep ``seconds``, cut short by ``stop``; False if stopped."""
    if stop is None:
        await asyncio.sleep(seconds)
        return True
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return not stop.is_set()
