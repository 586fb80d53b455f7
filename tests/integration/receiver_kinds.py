"""Both receivers behind one face, so that one fault test body runs against each.

:class:`AsyncReceiverDriver` gives an :class:`~ackd.AsyncReceiver` the sync receiver's
calls (``read``, ``transaction``, ``consume`` with a ``threading.Event`` stop) by running
it on an event loop of its own thread, as an asyncio app would run it in a process of its
own; the test's threads call in and wait for the result. A sync handler of a test runs
inside the async transaction on its ``AsyncSession``'s sync facade (``run_sync``: its
statements await the async driver), so a test's handler serves both receivers.
The queue is declared, and the store looked at, through a sync receiver of the same
settings (``sync``): what the test inspects is the same database and broker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from ackd import AsyncReceiver, Message, Receiver
from ackd.async_receiver import AsyncReceiverTransaction
from tests.async_helpers import LoopStalled, _StallRecorder

T = TypeVar("T")

#: The parameters of a fault test run against both receivers.
KINDS = ["sync", "async"]
#: The stall limit of a driver's loop (seconds). A fault test runs two receivers' loops,
#: the TCP proxy's pumps and its own polling in one process: a callback's wall time there
#: includes waits for the GIL, which on a loaded machine ``SLOW_CALLBACK_S`` would take
#: for stalls. A blocking connect, sleep or timeout in
#: condmsg still shows.
SHARED_GIL_SLOW_CALLBACK_S = 0.25


class _Transaction:
    """An async transaction scope with the sync one's ``read``."""

    def __init__(self, driver: AsyncReceiverDriver, tx: AsyncReceiverTransaction) -> None:
        self._driver = driver
        self._tx = tx

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        return self._driver.call(self._tx.read(queue, timeout))


class AsyncReceiverDriver:
    """An :class:`AsyncReceiver` on a loop of its own thread, called like a ``Receiver``."""

    def __init__(self, sync: Receiver, receiver: AsyncReceiver) -> None:
        self.sync = sync
        self.engine = sync.engine
        self._broker = sync._broker  # declares the test's queues as the receivers do
        self.invalid_queue = sync.invalid_queue
        self._receiver = receiver
        self._loop = asyncio.new_event_loop()
        # Under the stall check, as every async test (tests/async_helpers.py): a callback
        # that holds this loop longer than the limit fails the test at close().
        self._loop.set_debug(True)
        self._loop.slow_callback_duration = SHARED_GIL_SLOW_CALLBACK_S
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stalls: _StallRecorder | None = None
        started = threading.Event()
        self._started = started
        self._thread.start()
        started.wait(10)
        self.call(receiver.start())

    def _run(self) -> None:
        self._stalls = _StallRecorder(threading.get_ident())
        logging.getLogger("asyncio").addHandler(self._stalls)
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            logging.getLogger("asyncio").removeHandler(self._stalls)

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the receiver's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def stats(self) -> Any:
        return self._receiver.stats

    def read(self, queue: str, timeout: float = 5.0) -> Message | None:
        return self.call(self._receiver.read(queue, timeout))

    @contextmanager
    def transaction(self) -> Iterator[_Transaction]:
        scope = self._receiver.transaction()
        tx = self.call(scope.__aenter__())
        try:
            yield _Transaction(self, tx)
        except BaseException as exc:
            if not self.call(scope.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.call(scope.__aexit__(None, None, None))

    def consume(
        self,
        queue: str,
        handler: Callable[[Message, Any], None],
        *,
        stop: threading.Event | None = None,
        **options: Any,
    ) -> int:
        async def run_handler(message: Message, session: AsyncSession | None) -> None:
            if session is None:
                handler(message, None)
            else:
                await session.run_sync(lambda sync_session: handler(message, sync_session))

        async def consume() -> int:
            stopped = asyncio.Event()
            watch = asyncio.create_task(_bridge(stop, stopped)) if stop is not None else None
            try:
                return await self._receiver.consume(queue, run_handler, stop=stopped, **options)
            finally:
                if watch is not None:
                    watch.cancel()

        return self.call(consume())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self.call(self._receiver.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self.sync.close()
        stalls = self._stalls.stalls if self._stalls is not None else []
        if stalls:
            listed = "; ".join(f"{s.callback} took {s.took_s * 1000:.0f} ms" for s in stalls)
            raise LoopStalled(f"the async receiver's loop was held: {listed}")


async def _bridge(stop: threading.Event, stopped: asyncio.Event) -> None:
    """Set ``stopped`` once the test's ``stop`` is set (looked at every 50 ms)."""
    while not stop.is_set():
        await asyncio.sleep(0.05)
    stopped.set()
