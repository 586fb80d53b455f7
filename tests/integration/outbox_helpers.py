"""Helpers for the outbox integration tests: a real consumer, declared queues, messages."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pika

from outbox import ROW_ID_HEADER, OutboxMessage
from tests.waiting import wait_for


def declare_queues(amqp_url: str, names: Iterable[str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        for name in names:
            channel.queue_declare(name, durable=True)
    finally:
        conn.close()


def delete_queues(amqp_url: str, names: Iterable[str], exchanges: Iterable[str] = ()) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)
        for exchange in exchanges:
            channel.exchange_delete(exchange)
    finally:
        conn.close()


class Collector:
    """A real consumer in a thread: records every delivery per queue, in arrival order.

    ``ids(queue)`` lists the ``x-outbox-id`` of each delivery (duplicates included).
    """

    def __init__(self, amqp_url: str, queues: Iterable[str]) -> None:
        self.deliveries: dict[str, list[tuple[int, Any, bytes]]] = {q: [] for q in queues}
        self._lock = threading.Lock()
        params = pika.URLParameters(amqp_url)
        self._conn = pika.BlockingConnection(params)
        channel = self._conn.channel()
        channel.basic_qos(prefetch_count=500)
        for queue in self.deliveries:
            channel.basic_consume(queue, self._make_handler(queue))
        self._channel = channel
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _make_handler(self, queue: str) -> Callable[..., None]:
        def handle(ch: Any, method: Any, props: Any, body: bytes) -> None:
            row_id = int((props.headers or {})[ROW_ID_HEADER])
            with self._lock:
                self.deliveries[queue].append((row_id, props, body))
            ch.basic_ack(method.delivery_tag)

        return handle

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # the connection is closed by close()
            self._channel.start_consuming()

    def ids(self, queue: str | None = None) -> list[int]:
        with self._lock:
            if queue is not None:
                return [d[0] for d in self.deliveries[queue]]
            return [d[0] for ds in self.deliveries.values() for d in ds]

    def wait_for(self, expected: Iterable[int], timeout: float = 30.0) -> None:
        want = set(expected)
        wait_for(lambda: want <= set(self.ids()), timeout, f"{len(want)} ids delivered")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.add_callback_threadsafe(self._channel.stop_consuming)
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._conn.close()


#: The body every message of the fan-out tests shares.
FANOUT_BODY = b"\x00shared body\xff"


def fanout(*routing_keys: str, **shared: Any) -> list[OutboxMessage]:
    """One message per routing key: shared body and headers, each with its own id/header."""
    return [
        OutboxMessage(
            exchange="",
            routing_key=rk,
            body=FANOUT_BODY,
            message_id=f"m-{i}",
            correlation_id="cm-1",
            reply_to="acks",
            headers={"cm": "cm-1", "dest": rk, "n": i, "flag": i == 1},
            priority=3 if i == 2 else None,
            **shared,
        )
        for i, rk in enumerate(routing_keys)
    ]


def message_fields(m: OutboxMessage) -> dict[str, Any]:
    names = ("exchange", "routing_key", "body", "message_id", "correlation_id", "reply_to")
    names += ("content_type", "message_type", "priority", "expiration_ms", "persistent")
    return {n: getattr(m, n) for n in names} | {"headers": dict(m.headers or {})}
