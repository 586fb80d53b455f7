"""A TCP forwarder a test can break, in front of RabbitMQ or PostgreSQL: ``cut()`` kills
every open connection (a network failure mid-batch); ``down()`` refuses new ones (a service
that is not running); ``up()`` accepts again; ``hold()`` makes it a black hole: it accepts and
takes every byte but never answers (a hung server, a route that drops packets while the
kernel in between still acknowledges them) until ``release()``. It listens only once ``up()``
is called."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from urllib.parse import urlsplit


class TcpProxy:
    """A forwarder to ``target`` (RabbitMQ's port by default) on :attr:`port`; tests
    connect through :meth:`url`."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5672)) -> None:
        self.target = target
        self.port = _port_outside_the_ephemeral_range()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.accepted = 0
        self.holding = False

    @classmethod
    def to(cls, url: str) -> TcpProxy:
        """A proxy (not listening yet) to the host and port ``url`` names, a database's
        (5432 by default) or RabbitMQ's (5672)."""
        parts = urlsplit(url)
        default = 5432 if parts.scheme.startswith("postgresql") else 5672
        return cls((parts.hostname or "127.0.0.1", parts.port or default))

    def url(self, url: str) -> str:
        """``url`` (AMQP or a database's) with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        credentials, _, _ = parts.netloc.rpartition("@")
        here = f"127.0.0.1:{self.port}"
        return parts._replace(netloc=f"{credentials}@{here}" if credentials else here).geturl()

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

    def hold(self) -> None:
        """From now on, swallow what either side sends and accept without forwarding."""
        self.holding = True

    def release(self) -> None:
        """Forward again; the connections held (their streams broken) are cut."""
        self.holding = False
        self.cut()

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
            if self.holding:
                with self._lock:
                    self._conns.append(client)
                    self.accepted += 1
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
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

    def _swallow(self, client: socket.socket) -> None:
        client.settimeout(None)
        with contextlib.suppress(OSError):
            while client.recv(65536):
                pass

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.holding:
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
