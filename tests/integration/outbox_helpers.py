"""Helpers for the outbox integration tests: a real consumer, a fault-injecting TCP proxy."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pika

from outbox import ROW_ID_HEADER, OutboxMessage

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
    """Poll ``predicate`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        time.sleep(0.01)


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
        wait_until(lambda: want <= set(self.ids()), timeout, f"{len(want)} ids delivered")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.add_callback_threadsafe(self._channel.stop_consuming)
        self._thread.join(5)
        with contextlib.suppress(Exception):
            self._conn.close()


class TcpProxy:
    """A TCP forwarder to RabbitMQ that a test can break: ``cut()`` kills every open
    connection (a network failure mid-batch); ``down()`` refuses new ones (a broker that is
    not running); ``up()`` accepts again."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5672)) -> None:
        self.target = target
        self.port = _port_outside_the_ephemeral_range()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.accepted = 0

    def url(self, amqp_url: str) -> str:
        return amqp_url.replace("127.0.0.1:5672", f"127.0.0.1:{self.port}")

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.settimeout(0.1)
        self._listener = listener
        self._accepting = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepting.start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            # The port is free only once the thread waiting in accept() has let go of it.
            if self._accepting is not None:
                self._accepting.join(5)
        self.cut()

    def cut(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                # Closed with a reset, as a network failure gives: no TIME_WAIT is left on
                # the proxy's port, which would keep up() from listening on it again.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked on it
            conn.close()

    def close(self) -> None:
        self._closed = True
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _port_outside_the_ephemeral_range() -> int:
    """A free port below Linux's ephemeral range (32768 and up). A client that keeps
    reconnecting to a port nobody listens on can be given that very port as its own and
    connect to itself (TCP simultaneous open); the port is then taken, and the proxy
    cannot listen on it again."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32000 for the proxy")


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
