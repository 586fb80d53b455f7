"""Publishing claimed rows to RabbitMQ with a window of publisher confirms in flight.

A :class:`Publisher` owns one pika ``SelectConnection`` and runs its I/O loop in a thread of
its own (pika objects are touched only by that thread; other threads hand work over with
``add_callback_threadsafe``). Batches are published back to back on one confirm-mode
channel and each resolves when the broker has answered for every message in it, so many
confirms are in flight at once instead of one blocking round trip per message. How a
batch's messages get onto the channel is a :class:`~outbox.publish_pika.Publishing` (the
outbox's own frames or pika's ``basic_publish``, by :func:`publishing_for`); the publisher
keeps the delivery tags.

Per message the broker answers with exactly one ack or nack, preceded by a ``basic.return``
when a ``mandatory`` message could not be routed. The return carries no delivery tag, so each
message carries its row id in the ``x-outbox-id`` header (also handy for consumer-side
de-duplication). A publish to a missing exchange would make RabbitMQ close the channel and
take the whole window down with it; exchanges are therefore checked once with a passive
declare on a side channel, and rows addressed to a missing one are refused without being
published.

When the connection or the channel breaks, every unresolved batch fails with
:class:`BrokerError` and the publisher is dead; the relay makes a new one, and publishes
the rows of those batches again (the receivers' de-duplication by row id makes a second
copy of a message that did reach the broker harmless).

``amqp_url`` may name several brokers, comma-separated (the nodes of a cluster): each
publisher tries them in order, one ``SelectConnection`` per address, until one opens; so
after its node is lost, the relay's next publisher lands on a node that answers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import pika
import pika.exceptions
from pika.adapters.select_connection import SelectConnection
from pika.channel import Channel
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from condmsg.infra.fastpaths.gate import use_fast
from condmsg.infra.urls import broker_address, split_urls
from outbox.errors import BrokerAuthError, BrokerError
from outbox.message import StoredMessage
from outbox.publish_frames import FramePublishing, pika_gate
from outbox.publish_pika import COPY_HEADER, ROW_ID_HEADER, MessageKey, PikaPublishing, Publishing

log = logging.getLogger(__name__)

#: ``RelayConfig.publishing`` by the path it chooses (see :mod:`condmsg.infra.fastpaths.gate`).
_MODES = {"auto": "auto", FramePublishing.name: "fast", PikaPublishing.name: "plain"}


def publishing_for(name: str) -> Publishing:
    """The :class:`Publishing` ``RelayConfig.publishing`` names: ``frames`` or ``pika``,
    or ``auto``: the frames where the pika imported is a release they were tested with
    (:func:`~outbox.publish_frames.pika_gate`), else pika's ``basic_publish``."""
    if name not in _MODES:
        raise ValueError(f"publishing must be one of {', '.join(_MODES)}, got {name!r}")
    fast = use_fast("outbox relay publishing", _MODES[name], pika_gate())
    return FramePublishing() if fast else PikaPublishing()


_NO_EXCHANGE = re.compile(r"no exchange '(?P<name>[^']*)'")


_REFUSALS = (pika.exceptions.ProbableAuthenticationError, pika.exceptions.ProbableAccessDeniedError)


def describe_connect_error(url: str, exc: BaseException) -> str:
    """An actionable sentence for a failed connection attempt (never shows the password)."""
    where = broker_address(url)
    if isinstance(
        exc, pika.exceptions.ProbableAuthenticationError | pika.exceptions.ProbableAccessDeniedError
    ):
        return (
            f"RabbitMQ at {where} refused the login or the vhost; "
            "check the user, password and vhost in the URL"
        )
    # pika wraps the socket error in workflow errors whose str() is often empty; their
    # repr() names the cause (ConnectionRefusedError, timeouts, DNS failures).
    text = str(exc) or repr(exc)
    detail = f"{text} {exc!r}"
    low = detail.lower()
    if "refused" in low:
        return f"cannot reach RabbitMQ at {where}: connection refused; is the broker running?"
    if "timed out" in low or "timeout" in low:
        return f"cannot reach RabbitMQ at {where}: connection timed out; is the host reachable?"
    if "name or service not known" in low or "gaierror" in low:
        return f"cannot reach RabbitMQ at {where}: unknown host; check the URL"
    return f"cannot reach RabbitMQ at {where}: {text}; is the broker running?"


@dataclass(slots=True, kw_only=True)
class BatchResult:
    """The broker's answer for a batch.

    Messages are keyed by (row id, copy number), the copy number None for a plain row.
    ``published``: confirmed (acked, routed). ``refused``: never publishable as addressed
    (unroutable ``basic.return``, missing exchange), reason per message. ``nacked``: the
    broker declined responsibility (reason per message); worth retrying. ``error`` set:
    the connection or channel broke and the fate of unconfirmed rows is unknown.
    """

    published: list[MessageKey] = field(default_factory=list)
    refused: dict[MessageKey, str] = field(default_factory=dict)
    nacked: dict[MessageKey, str] = field(default_factory=dict)
    error: BrokerError | None = None


@dataclass(slots=True, eq=False)
class PendingBatch:
    """A batch handed to the publisher; ``done`` is set once ``result`` is final."""

    rows: Sequence[StoredMessage]
    submitted_at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: BatchResult = field(default_factory=BatchResult)
    exchanges: frozenset[str] = frozenset()
    missing: set[str] = field(default_factory=set)
    outstanding: int = 0

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class Publisher:
    """One confirm-mode connection to RabbitMQ; see the module docstring."""

    def __init__(
        self,
        amqp_url: str,
        *,
        on_done: Callable[[], None] = lambda: None,
        connect_timeout_s: float = 10.0,
        connection_name: str = "outbox-relay",
        publishing: Publishing | None = None,
    ) -> None:
        self.amqp_url = amqp_url
        self._urls = split_urls(amqp_url)
        #: The address this publisher is connected to (or trying), for messages.
        self.url = self._urls[0]
        self._publishing = publishing if publishing is not None else publishing_for("auto")
        self._on_done = on_done
        self._connect_timeout_s = connect_timeout_s
        self._connection_name = connection_name
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._dead = False
        #: close() was called: no further address is tried.
        self._closing = False
        self.last_error: str | None = None
        #: The broker refused the login or the vhost (waiting does not mend that).
        self.refused = False
        self._thread: threading.Thread | None = None
        self._conn: SelectConnection | None = None
        self._channel: Channel | None = None
        self._check_channel: Channel | None = None
        # IO-thread state.
        self._batches: set[PendingBatch] = set()
        self._queue: deque[PendingBatch] = deque()
        self._known_exchanges: set[str] = {""}
        self._checking: str | None = None
        self._next_tag = 1
        self._tags: dict[int, tuple[PendingBatch, MessageKey]] = {}
        self._tag_order: deque[int] = deque()
        self._key_batch: dict[MessageKey, PendingBatch] = {}

    # -- caller side ----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._ready.is_set() and not self._dead

    def start(self) -> Publisher:
        """Connect; return when the channel is in confirm mode, or raise BrokerError."""
        self._thread = threading.Thread(target=self._run, name="outbox-publisher", daemon=True)
        self._thread.start()
        # Each address may take its whole connect timeout (a host that never answers).
        budget = self._connect_timeout_s * len(self._urls) + 5.0
        if not self._ready.wait(budget) or self._dead:
            self.close()
            raise (BrokerAuthError if self.refused else BrokerError)(
                self.last_error
                or f"cannot reach RabbitMQ at {broker_address(self.amqp_url)}: no answer "
                f"within {self._connect_timeout_s:g} s; is the broker running?"
            )
        return self

    def submit(self, rows: Sequence[StoredMessage]) -> PendingBatch:
        """Publish ``rows`` (in order, after every batch submitted before)."""
        exchanges = {r.message.exchange for r in rows}
        exchanges.update(c["exchange"] for r in rows for c in r.copies if "exchange" in c)
        batch = PendingBatch(rows, exchanges=frozenset(exchanges))
        with self._lock:
            dead = self._dead or self._conn is None
            if not dead:
                self._batches.add(batch)
        if dead:
            self._resolve_error(batch, self.last_error or "the RabbitMQ connection is closed")
            return batch
        try:
            assert self._conn is not None
            self._conn.ioloop.add_callback_threadsafe(partial(self._accept, batch))
        except Exception as exc:  # the loop is already closed
            self._shutdown(f"the RabbitMQ connection is closed ({exc})")
        return batch

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the connection; unresolved batches fail. Safe to call more than once."""
        self._closing = True
        conn = self._conn
        if conn is not None and not self._dead:
            with contextlib.suppress(Exception):
                conn.ioloop.add_callback_threadsafe(self._close_in_loop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._shutdown("the publisher was closed")

    def abort(self, reason: str) -> None:
        """Give up on this connection (e.g. confirms overdue): fail everything, close."""
        self.last_error = reason
        self.close()

    # -- resolution helpers (any thread) --------------------------------------------------

    def _resolve_error(self, batch: PendingBatch, reason: str) -> None:
        if batch.done.is_set():
            return
        batch.result.error = BrokerError(reason)
        batch.done.set()
        self._on_done()

    def _shutdown(self, reason: str) -> None:
        with self._lock:
            self._dead = True
            pending = list(self._batches)
            self._batches.clear()
        for batch in pending:
            self._resolve_error(batch, self.last_error or reason)
        self._ready.set()

    # -- IO thread --------------------------------------------------------------------------

    def _run(self) -> None:
        failures: list[str] = []
        refusals = 0
        try:
            for url in self._urls:
                self.url = url
                self.last_error = None
                self._connect(url)
                if self._ready.is_set() or self._closing:
                    return  # it opened (and has since closed), or the caller gave up
                failures.append(self.last_error or describe_connect_error(url, EOFError()))
                refusals += self.refused
            self.refused = refusals == len(self._urls)
            self.last_error = "; ".join(failures)
        except Exception as exc:
            # Whatever pika let through (a ValueError from a socket that broke while
            # connecting, a bug): this connection has failed, and the relay's next attempt,
            # after its backoff, makes a new one. The relay reports last_error, throttled.
            log.debug("outbox publisher I/O loop failed", exc_info=True)
            self.last_error = self.last_error or describe_connect_error(self.url, exc)
        finally:
            self._shutdown("the RabbitMQ connection closed")

    def _connect(self, url: str) -> None:
        """Run one connection to ``url`` until it fails to open or closes."""
        params = pika.URLParameters(url)
        params.connection_attempts = 1
        params.retry_delay = 0
        params.socket_timeout = self._connect_timeout_s
        params.stack_timeout = self._connect_timeout_s
        params.client_properties = {"connection_name": self._connection_name}
        self.refused = False
        self._conn = SelectConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self._conn.ioloop.start()

    def _on_open_error(self, conn: SelectConnection, exc: BaseException) -> None:
        self.last_error = describe_connect_error(self.url, exc)
        self.refused = isinstance(exc, _REFUSALS)
        conn.ioloop.stop()

    def _on_closed(self, conn: SelectConnection, exc: BaseException) -> None:
        if not isinstance(exc, pika.exceptions.ConnectionClosedByClient):
            self.last_error = self.last_error or (
                f"lost the connection to RabbitMQ at {broker_address(self.url)}: {exc}"
            )
        conn.ioloop.stop()

    def _close_in_loop(self) -> None:
        if self._conn is not None and self._conn.is_open:
            self._conn.close()
        elif self._conn is not None:
            self._conn.ioloop.stop()

    def _on_open(self, conn: SelectConnection) -> None:
        conn.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel: Channel) -> None:
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_mode)

    def _on_confirm_mode(self, _frame: Method[pika.spec.Confirm.SelectOk]) -> None:
        self._open_check_channel()

    def _open_check_channel(self) -> None:
        assert self._conn is not None
        self._conn.channel(on_open_callback=self._on_check_channel_open)

    def _on_check_channel_open(self, channel: Channel) -> None:
        self._check_channel = channel
        channel.add_on_close_callback(self._on_check_channel_closed)
        self._ready.set()
        self._pump()

    def _on_channel_closed(self, _channel: Channel, exc: BaseException) -> None:
        # The broker closes the channel for a publish it cannot take at all (e.g. 404 when
        # an exchange vanished after it was checked). Every unconfirmed message has an
        # unknown fate, so the whole window is given back and published again.
        if not isinstance(exc, pika.exceptions.ChannelClosedByBroker):
            return  # closed by us, or with the connection (_on_closed reports that)
        text = str(exc)
        match = _NO_EXCHANGE.search(text)
        if match:
            self._known_exchanges.discard(match.group("name"))
        self.last_error = f"RabbitMQ closed the publishing channel: {text}"
        if self._conn is not None and self._conn.is_open:
            self._conn.close()

    # -- exchange checks ------------------------------------------------------------------

    def _accept(self, batch: PendingBatch) -> None:
        if batch.done.is_set():
            return
        self._queue.append(batch)
        self._pump()

    def _pump(self) -> None:
        """Publish queued batches in order; pause while an exchange is being checked."""
        while self._queue:
            head = self._queue[0]
            unknown = head.exchanges - self._known_exchanges - head.missing
            if unknown:
                if self._checking is None and self._check_channel is not None:
                    self._check(min(unknown))
                return
            self._queue.popleft()
            self._publish(head)

    def _check(self, exchange: str) -> None:
        assert self._check_channel is not None
        self._checking = exchange
        self._check_channel.exchange_declare(
            exchange=exchange, passive=True, callback=partial(self._on_check_ok, exchange)
        )

    def _on_check_ok(self, exchange: str, _frame: object) -> None:
        self._known_exchanges.add(exchange)
        self._checking = None
        self._pump()

    def _on_check_channel_closed(self, _channel: Channel, exc: BaseException) -> None:
        self._check_channel = None
        exchange, self._checking = self._checking, None
        if exchange is not None:
            code = getattr(exc, "reply_code", None)
            for batch in self._queue:
                if exchange in batch.exchanges:
                    if code == 404:
                        batch.missing.add(exchange)
                    else:  # cannot tell (e.g. 403): let the broker decide on publish
                        self._known_exchanges.add(exchange)
        if self._conn is not None and self._conn.is_open:
            self._open_check_channel()

    # -- publishing and confirms ----------------------------------------------------------

    def _publish(self, batch: PendingBatch) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            self._fail_in_loop("the publishing channel is closed")
            return
        # The channel is in confirm mode: the broker numbers its publishes 1, 2, 3...
        for key, refusal in self._publishing.publish(channel, batch.rows, batch.missing):
            if refusal is not None:
                batch.result.refused[key] = refusal
                continue
            tag = self._next_tag
            self._next_tag += 1
            self._tags[tag] = (batch, key)
            self._tag_order.append(tag)
            self._key_batch[key] = batch
            batch.outstanding += 1
        if batch.outstanding == 0:
            self._finish(batch)

    def _on_return(
        self, _channel: Channel, method: Basic.Return, props: BasicProperties, _body: bytes
    ) -> None:
        headers = props.headers or {}
        row_id, copy = headers.get(ROW_ID_HEADER), headers.get(COPY_HEADER)
        key = (row_id, copy if isinstance(copy, int) else None)
        batch = self._key_batch.get(key) if isinstance(row_id, int) else None  # type: ignore[arg-type]
        if batch is None:
            log.warning("basic.return for an unknown message: %s", method.reply_text)
            return
        batch.result.refused[key] = (  # type: ignore[index]
            f"unroutable: {method.reply_code} {method.reply_text} "
            f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
        )

    def _on_confirm(self, frame: Method[Basic.Ack | Basic.Nack]) -> None:
        method = frame.method
        acked = isinstance(method, Basic.Ack)
        tag = method.delivery_tag
        if method.multiple:
            while self._tag_order and self._tag_order[0] <= tag:
                self._settle(self._tag_order.popleft(), acked)
        else:
            self._settle(tag, acked)
            # Keep the order deque short: drop tags already settled at its head.
            while self._tag_order and self._tag_order[0] not in self._tags:
                self._tag_order.popleft()

    def _settle(self, tag: int, acked: bool) -> None:
        entry = self._tags.pop(tag, None)
        if entry is None:
            return
        batch, key = entry
        self._key_batch.pop(key, None)
        result = batch.result
        if key not in result.refused:
            if acked:
                result.published.append(key)
            else:
                result.nacked[key] = "nacked by RabbitMQ (it could not take responsibility)"
        batch.outstanding -= 1
        if batch.outstanding == 0:
            self._finish(batch)

    def _finish(self, batch: PendingBatch) -> None:
        with self._lock:
            self._batches.discard(batch)
        batch.done.set()
        self._on_done()

    def _fail_in_loop(self, reason: str) -> None:
        self.last_error = self.last_error or reason
        if self._conn is not None and self._conn.is_open:
            self._conn.close()
        elif self._conn is not None:
            self._conn.ioloop.stop()
