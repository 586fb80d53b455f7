"""``AsyncReceiver.stream``: the consume loop as an ``async for``.

::

    async with receiver.stream("orders") as stream:
        async for item in stream:
            async with item:  # commits on a clean exit, rolls back on an exception
                await handle(item.message, item.session)

It is ``consume`` turned inside out, not a second loop: a consumer task runs
:class:`~ackd.async_consume.AsyncConsumer` (outages, sequences, poison handling and the
cancel-out race all as ``consume`` has them), and its handler hands each message over to
the iterating task and waits until that task's ``async with item:`` block ends; the
transaction then commits (or rolls back) in the consumer task, and the block's exit
returns once it has. One message is in the app's hands at a time, as with ``consume``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextlib import suppress
from types import TracebackType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from ackd.async_consume import AsyncConsumer, ConsumeRun
from ackd.broker import Delivery
from ackd.message import Message
from condmsg.core.errors import ConfigError

#: What a stream starts its consumer with: ``consume``'s body, given the run and the
#: consumer class to run it with.
StartConsumer = Callable[[ConsumeRun, Callable[..., AsyncConsumer]], Coroutine[Any, Any, int]]


class StreamItem:
    """One message of a stream, in its transaction: ``message`` for the app, ``session``
    the transaction's ``AsyncSession`` (the app's writes commit with the COMMIT ack).
    ``async with item:`` is the processing: a clean exit commits, an exception rolls back
    (the message comes again after its backoff, as a failing ``consume`` handler's does)."""

    def __init__(self, message: Message, session: AsyncSession, stream: MessageStream) -> None:
        self.message = message
        self.session = session
        #: Whether the transaction committed (set when ``async with item:`` has ended).
        self.committed = False
        self._stream = stream
        loop = asyncio.get_running_loop()
        #: The app's verdict: its block's exception, or None for a clean exit.
        self._processed: asyncio.Future[None] = loop.create_future()
        #: Set by the consumer once the transaction has settled.
        self._settled = asyncio.Event()
        self._entered = False

    async def __aenter__(self) -> StreamItem:
        if self._entered or self._processed.done():
            raise ConfigError("a stream item is processed once, in one `async with item:`")
        self._entered = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._processed.set_result(None)
        elif isinstance(exc, Exception):
            self._processed.set_exception(exc)
        else:
            # Cancelled (or interrupted): the stream ends, giving this message back
            # uncounted, as a cancelled ``consume`` does.
            self._stream._abandon()
            return
        await self._settled.wait()

    @property
    def settled(self) -> bool:
        return self._settled.is_set()


class MessageStream:
    """``async with receiver.stream(queue) as stream: async for item in stream:``; see the
    module's docstring. Leaving the ``async with`` (or ``break``) ends the consumer: the
    deliveries it prefetched go back to the queue."""

    def __init__(
        self,
        start: StartConsumer,
        queue: str,
        *,
        max_messages: int | None,
        idle_timeout_s: float | None,
    ) -> None:
        self._start = start
        self._run = ConsumeRun(queue, self._hand_over, True, max_messages, idle_timeout_s, None)
        self._handoff: asyncio.Queue[StreamItem | None] = asyncio.Queue(maxsize=1)
        self._task: asyncio.Task[int] | None = None
        self._current: StreamItem | None = None

    @property
    def handled(self) -> int:
        """How many messages the stream handed over."""
        return self._run.handled

    async def __aenter__(self) -> MessageStream:
        if self._task is not None:
            raise ConfigError("a stream is entered once")
        self._task = asyncio.create_task(self._start(self._run, self._consumer))
        self._task.add_done_callback(lambda _: self._handoff.put_nowait(None))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task = self._task
        if task is None:
            return
        # Cancelling ends the consumer: a message handed over but not processed (an
        # exception before ``async with item:``) goes back uncounted, as the prefetched do.
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> StreamItem:
        task = self._task
        if task is None:
            raise ConfigError("use the stream as `async with receiver.stream(queue) as s:`")
        current = self._current
        if current is not None and not current.settled:
            self._abandon()
            raise ConfigError("process each stream item in `async with item:` before the next")
        item = await self._handoff.get()
        if item is None:
            self._handoff.put_nowait(None)  # the stream stays ended for further calls
            if task.cancelled():
                raise StopAsyncIteration
            error = task.exception()
            if error is not None:
                raise error
            raise StopAsyncIteration
        self._current = item
        return item

    def _abandon(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _consumer(self, *args: Any) -> AsyncConsumer:
        return _StreamConsumer(self, *args)

    async def _hand_over(self, message: Message, session: AsyncSession | None) -> None:
        """The consumer's handler: give the message to the iterating task, and return (or
        raise) as that task's ``async with item:`` block does."""
        assert session is not None  # a stream is transactional
        item = StreamItem(message, session, self)
        await self._handoff.put(item)
        await item._processed

    def _settle(self, committed: bool) -> None:
        item = self._current
        if item is not None and not item.settled:
            item.committed = committed
            item._settled.set()


class _StreamConsumer(AsyncConsumer):
    """The consumer of a stream: tells the item in hand when its transaction settled."""

    def __init__(self, stream: MessageStream, *args: Any) -> None:
        super().__init__(*args)
        self._stream = stream

    async def _handle(self, run: ConsumeRun, delivery: Delivery | None) -> bool:
        committed = False
        try:
            committed = await super()._handle(run, delivery)
            return committed
        finally:
            self._stream._settle(committed)
