"""Consuming the ack queue: deliveries cut into batches, stored by a few threads, settled
with the broker in delivery order.

pika's BlockingConnection is not thread-safe, so the consuming thread owns the connection
and its channel: it reads the ack queue with manual acks and prefetch, hands the batches
to :class:`StoringThreads`, and acknowledges each batch with one ``multiple`` ack once it
and every earlier batch are committed (:class:`InOrder`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pika.exceptions
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from condmsg.core import protocol
from condmsg.core.errors import CondmsgError
from condmsg.runtime.amqp import connect
from condmsg.runtime.topology import declare_outcome_queue, declare_service_queue, queue_exists
from evaluator.batches import AckBatches
from evaluator.config import EvaluatorConfig
from evaluator.store_setup import check_new_sender
from evaluator.tracing import TracedBody

log = logging.getLogger(__name__)

#: A partial batch is handed over once this long passed without a delivery ...
BATCH_WAIT_S = 0.01
#: ... or once its first ack has waited this long (see :func:`consume_acks`).
BATCH_MAX_AGE_S = 0.05
#: An ack that finds the evaluator quiet (nothing buffered, nothing being stored, no batch
#: handed over for this long) is handed over at once.
QUIET_S = 0.05


def consume_acks(
    config: EvaluatorConfig,
    batches: AckBatches,
    stop: threading.Event,
    consuming: Callable[[], None] = lambda: None,
    new_sender: Callable[[], None] = lambda: None,
) -> None:
    """Consume the sender's ack queue until ``stop`` is set; raises when the connection
    fails (what was not stored is then redelivered). ``consuming()`` is called once the
    consumer is set up (an outage before it is over). ``new_sender()`` is called before
    the sender's queues are declared for the first time; it raises to refuse (a mistyped
    sender name must not create queues).

    A batch is handed over when it is full, when :data:`BATCH_WAIT_S` passed without a
    delivery, or when its first ack has waited :data:`BATCH_MAX_AGE_S` (a steady stream
    is cut into batches of that age rather than held until ``batch_size``). An ack that
    finds the evaluator quiet (:data:`QUIET_S`) goes at once: nothing is gained by
    waiting for company that is not coming. Cutting at every lull in pika's buffer under
    load instead would make a batch, a decision transaction and a relay wake-up of nearly
    every ack, which costs the pipeline far more throughput than the wait costs latency.
    """
    connection = connect(config.amqp_url, name=f"condmsg-evaluator-{config.sender}")
    storing: StoringThreads | None = None
    try:
        channel = connection.channel()
        ack_queue = protocol.ack_queue(config.sender)
        if not queue_exists(connection, ack_queue):
            new_sender()
        declare_service_queue(channel, ack_queue)
        declare_service_queue(channel, protocol.dead_letter_queue(config.sender))
        declare_outcome_queue(connection, protocol.outcome_queue(config.sender))
        channel.basic_qos(prefetch_count=config.prefetch)
        storing = StoringThreads(batches, connection, channel, config)
        consuming()
        batch: list[tuple[int, bytes]] = []
        first_at = handed_at = 0.0
        for method, _props, body in channel.consume(ack_queue, inactivity_timeout=BATCH_WAIT_S):
            if method is not None:
                if not batch:
                    first_at = time.monotonic()
                taken = TracedBody.of(body or b"", _props.headers if _props else None)
                batch.append((int(method.delivery_tag or 0), taken))
            now = time.monotonic()
            if batch and (
                method is None
                or len(batch) >= config.batch_size
                or now - first_at >= BATCH_MAX_AGE_S
                or (
                    now - handed_at >= QUIET_S
                    and channel.get_waiting_message_count() == 0
                    and storing.idle
                )
            ):
                storing.put(batch[-1][0], [body for _, body in batch])
                batch = []
                handed_at = now
            if stop.is_set():
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


def refuse_unknown_sender(config: EvaluatorConfig, engine: Engine) -> None:
    """:class:`ConfigError` if ``config.sender`` looks mistyped: its ack queue does not
    exist and the store serves other senders only (:func:`check_new_sender`).
    A broker or a store that does not answer (or has no schema yet) is no answer: the
    service asks again before it declares the queues, and says what it waits for."""
    try:
        connection = connect(config.amqp_url, name=f"condmsg-evaluator-{config.sender}")
    except CondmsgError:
        return
    try:
        if queue_exists(connection, protocol.ack_queue(config.sender)):
            return
    except pika.exceptions.AMQPError:
        return
    finally:
        if connection.is_open:
            connection.close()
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        check_new_sender(engine, config.sender)


class StoringThreads:
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

    def __init__(
        self, batches: AckBatches, connection: Any, channel: Any, config: EvaluatorConfig
    ) -> None:
        self._batches = batches
        self._connection = connection
        self._channel = channel
        self._queue: queue.Queue[tuple[int, list[bytes]] | None] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._unfinished = 0  # batches handed over and not yet stored
        self._aborted = threading.Event()
        self._order = InOrder()
        self._threads = [
            threading.Thread(
                target=self._run, name=f"evaluator-store-{config.sender}-{i}", daemon=True
            )
            for i in range(config.store_threads)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def idle(self) -> bool:
        """Whether no batch is being stored or waiting for a thread."""
        with self._lock:
            return self._unfinished == 0

    def put(self, last_tag: int, bodies: list[bytes]) -> None:
        """Hand a batch over (waits while another one is still waiting for a thread)."""
        seq = self._order.open(last_tag)
        with self._lock:
            self._unfinished += 1
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
            try:
                self._store(*item)
            finally:
                with self._lock:
                    self._unfinished -= 1

    def _store(self, seq: int, bodies: list[bytes]) -> None:
        if self._aborted.is_set():
            return
        stored = self._batches.store(bodies)
        if not stored:
            # Held, not handed back at once: redelivered at once, it would fail again
            # at once while the database or the broker is away.
            self._batches.retries.wait(self._aborted)
        try:
            self._connection.add_callback_threadsafe(functools.partial(self._finished, seq, stored))
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
