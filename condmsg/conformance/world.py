"""What a conformance run sets up around the receiver under test: a real sender and
evaluator (on the harness's own store), a relay for the acks the receiver writes to its
store's outbox, the broker objects, and the receiver's process, which it can kill and
start again."""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pika
from sqlalchemy.engine import Engine

from ackd.tables import metadata as receiver_metadata
from condmsg import Condition, CondmsgError, Sender, Verdict
from condmsg.conformance import app_table
from condmsg.conformance.config import ConformanceConfig
from condmsg.conformance.receiver_process import ReceiverProcess
from condmsg.core import protocol
from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine
from condmsg.runtime.topology import declare_destination, declare_service_queue
from condmsg.sending.copies import plan_copies
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from outbox.config import RelayConfig
from outbox.message import OutboxMessage
from outbox.relay import Relay

T = TypeVar("T")

#: Bodies larger than this travel as Message Sequences in the harness's sends.
PART_BYTES = 4096
#: The header naming the queue a message was moved from (docs/protocol.md).
ORIGINAL_QUEUE = "condmsg-original-queue"


class NotMet(CondmsgError):
    """A scenario's expectation did not hold; the message says what was seen."""


class TimedOut(NotMet):
    """What a scenario waited for did not come in time."""


class ReceiverEnded(NotMet):
    """The receiver process under test ended when it should have been reading."""


class Stopped(NotMet):
    """The run stopped (at another scenario's failure) before this one was judged."""

    def __init__(self) -> None:
        super().__init__("not judged: the run stopped at the first failure (--fail-fast)")


@dataclass(frozen=True, slots=True)
class Received:
    kind: str
    cm_id: str | None
    message_id: str | None
    body: bytes


@dataclass(frozen=True, slots=True)
class Invalid:
    headers: dict[str, Any]
    message_id: str | None
    body: bytes

    @property
    def cm_id(self) -> str | None:
        value = self.headers.get(protocol.H_CM_ID)
        return value.decode() if isinstance(value, bytes) else value

    @property
    def reason(self) -> str:
        return _text(self.headers.get(protocol.H_REASON, ""))

    @property
    def original_queue(self) -> str | None:
        value = self.headers.get(ORIGINAL_QUEUE)
        return None if value is None else _text(value)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class World:
    """The harness's side of a run (see the module docstring). Its broker calls share one
    connection under a lock, so scenarios may run in threads."""

    def __init__(self, config: ConformanceConfig, workdir: Path) -> None:
        self.config = config
        self.scale = config.scale
        self.secret = config.secret.encode()
        self.sender_name = f"conformance-{uuid.uuid4().hex[:8]}"
        self.void_queue = f"{config.queue}.conformance-void"
        sender_url = config.sender_db_url or f"sqlite:///{workdir / 'sender.db'}"
        self.sender = Sender(
            amqp_url=config.amqp_url,
            db_url=sender_url,
            name=self.sender_name,
            secret=self.secret,
            create_schema=True,
            part_bytes=PART_BYTES,
        )
        self._send_lock = threading.Lock()
        self.evaluator = Evaluator(
            EvaluatorConfig(
                amqp_url=config.amqp_url,
                sender=self.sender_name,
                secret=self.secret,
                sweep_interval_s=0.1,
                ack_grace=timedelta(milliseconds=100),
                create=True,
            ),
            engine=self.sender.engine,
        )
        self.store: Engine = make_engine(config.store_url)
        migrate.ensure(self.store, "receiver", models=[receiver_metadata], create=True)
        app_table.create(self.store)
        self.relay = Relay(
            self.store,
            RelayConfig(amqp_url=config.amqp_url, connection_name="condmsg-conformance-acks"),
        )
        self._broker_lock = threading.Lock()
        self._connection = pika.BlockingConnection(pika.URLParameters(config.amqp_url))
        self._channel = self._connection.channel()
        self._invalid: list[Invalid] = []
        #: Set to stop every scenario's waiting at once (the run stops at a failure).
        self.abort = threading.Event()
        log_path = Path(config.log_path) if config.log_path else workdir / "receiver.log"
        self.receiver_log_path = log_path
        self._log = log_path.open("ab")
        self.receiver = ReceiverProcess(config, self._log)

    # -- setup and teardown ------------------------------------------------------------

    def prepare(self) -> None:
        declare_destination(self._connection, self.config.queue)
        declare_destination(self._connection, self.void_queue)
        declare_service_queue(self._channel, self.config.invalid)
        self._channel.queue_purge(self.config.queue)
        self._channel.queue_purge(self.config.invalid)
        self.evaluator.start()
        self.relay.start()

    def close(self) -> None:
        self.receiver.stop()
        self.relay.stop()
        self.evaluator.stop()
        with self._broker_lock:
            try:
                # The sender's quorum queues are this run's alone: left behind, every run
                # would add three Raft groups to the broker.
                name = self.sender_name
                sender_queues = (protocol.ack_queue(name), protocol.outcome_queue(name))
                for queue in (self.void_queue, *sender_queues, protocol.dead_letter_queue(name)):
                    self._channel.queue_delete(queue)
                self._connection.close()
            except pika.exceptions.AMQPError:
                pass  # the broker went away: nothing left to tidy
        self.sender.engine.dispose()
        self.store.dispose()
        self._log.close()

    # -- the receiver under test -------------------------------------------------------

    def start_receiver(self) -> None:
        """Start it and wait until it hands over a plain message (it is reading)."""
        self.receiver.start()
        try:
            self.probe(timeout_s=60.0)
        except ReceiverEnded as exc:
            raise NotMet(f"{exc} before it was ready") from None

    def kill_receiver(self) -> None:
        """SIGKILL the receiver's process group now, wherever it is, and reap it."""
        self.receiver.kill()

    def wait_receiver_exit(self, timeout_s: float) -> int:
        code = self.wait_for(self.receiver.exited, self.scaled(timeout_s), "the receiver to exit")
        return int(code) if code is not None else 0

    def probe(self, timeout_s: float = 15.0) -> None:
        """Publish a plain message and wait for the app to get it: the receiver has read
        (or is reading) what was queued before it. A receiver process that has ended
        fails the wait at once, with its exit status."""
        marker = f"probe-{uuid.uuid4().hex}"
        self.publish_plain(marker.encode(), message_id=marker)

        def arrived() -> bool:
            code = self.receiver.exited()
            if code is not None:
                raise ReceiverEnded(f"the receiver process ended with status {code}")
            return any(r.message_id == marker for r in self.received(kind="plain"))

        self.wait_for(
            arrived,
            self.scaled(timeout_s),
            "a plain probe message to reach the app (is the receiver under test running?)",
        )

    def settle(self, extra_s: float = 0.5) -> None:
        """Let the receiver finish what is queued, for expectations that something did
        not happen: a probe behind it, then a short grace."""
        self.probe()
        if self.abort.wait(self.scaled(extra_s)):
            raise Stopped()

    def wait_for(self, predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """:func:`wait_for`, cut short by :attr:`abort`."""
        return wait_for(predicate, timeout_s, what, self.abort)

    # -- sending -----------------------------------------------------------------------

    def send(self, payload: bytes, condition: Condition, **options: Any) -> str:
        with self._send_lock:
            return self.sender.send(payload, condition, **options)

    @contextmanager
    def sphere(self, *, timeout: float) -> Iterator[Any]:
        """An open Dependency-Sphere of the harness's sender (committed on leaving)."""
        with self._send_lock, self.sender.sphere(timeout=timeout) as sphere:
            yield sphere

    def sphere_verdict(self, sphere_id: str, timeout_s: float) -> Verdict | None:
        outcome = self.sender.sphere_outcome(sphere_id, timeout=self.scaled(timeout_s))
        return None if outcome is None else outcome.verdict

    def bind_topic(self, routing_key: str) -> None:
        """Subscribe the receiver's queue to ``amq.topic`` with ``routing_key``."""
        with self._broker_lock:
            self._channel.queue_bind(self.config.queue, "amq.topic", routing_key)

    def unbind_topic(self, routing_key: str) -> None:
        with self._broker_lock:
            self._channel.queue_unbind(self.config.queue, "amq.topic", routing_key)

    def outcome(self, cm_id: str, timeout_s: float) -> Verdict | None:
        """The CM's verdict, waiting up to ``timeout_s`` (scaled) for it; None if none."""
        deadline = time.monotonic() + self.scaled(timeout_s)
        while True:
            left = deadline - time.monotonic()
            outcome = self.sender.outcome(cm_id, timeout=max(0.0, min(left, 0.5)))
            if outcome is not None:
                return outcome.verdict
            if left <= 0:
                return None
            if self.abort.is_set():
                raise Stopped()

    def publish(self, message: OutboxMessage) -> None:
        """Publish as the relay would (persistent, the message's own properties)."""
        headers: dict[str, Any] = dict(message.headers or {})
        props = pika.BasicProperties(
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            content_type=message.content_type,
            type=message.message_type,
            headers=headers,
            priority=message.priority,
            delivery_mode=2,
        )
        with self._broker_lock:
            self._channel.basic_publish(message.exchange, message.routing_key, message.body, props)

    def publish_raw(self, body: bytes, properties: pika.BasicProperties) -> None:
        """Publish ``body`` to the queue under test with ``properties`` exactly as given."""
        with self._broker_lock:
            self._channel.basic_publish("", self.config.queue, body, properties)

    def publish_plain(self, body: bytes, *, message_id: str) -> None:
        self.publish(
            OutboxMessage(
                exchange="",
                routing_key=self.config.queue,
                body=body,
                message_id=message_id,
                content_type="application/octet-stream",
            )
        )

    def copies(
        self,
        cm_id: str,
        condition: Condition,
        body: bytes,
        content_type: str = "application/octet-stream",
    ) -> list[OutboxMessage]:
        """The messages of a CM's copies as the sender would publish them (not recorded in
        the sender store: for scenarios that reorder, repeat or tamper with them)."""
        return [
            message
            for plan in plan_copies(
                cm_id=cm_id,
                condition=condition,
                sender=self.sender_name,
                sent_at=datetime.now(UTC),
                secret=self.secret,
                body=body,
                content_type=content_type,
                app_headers={},
                part_bytes=PART_BYTES,
            )
            for message in plan.messages
        ]

    # -- observing ---------------------------------------------------------------------

    def received(self, *, cm_id: str | None = None, kind: str | None = None) -> list[Received]:
        rows = [
            Received(r.kind, r.cm_id, r.message_id, bytes(r.body))
            for r in app_table.rows(self.store)
        ]
        return [
            r
            for r in rows
            if (cm_id is None or r.cm_id == cm_id) and (kind is None or r.kind == kind)
        ]

    def count_received(self, kind: str) -> int:
        """How many rows of ``kind`` the app table holds (cheaper than :meth:`received`)."""
        return app_table.count(self.store, kind)

    def kinds(self, cm_id: str) -> list[str]:
        return sorted(r.kind for r in self.received(cm_id=cm_id))

    def invalid(self) -> list[Invalid]:
        """Every message the receiver moved to its invalid-message queue so far."""
        with self._broker_lock:
            while True:
                method, props, body = self._channel.basic_get(self.config.invalid, auto_ack=True)
                if method is None or props is None or body is None:
                    break
                self._invalid.append(Invalid(dict(props.headers or {}), props.message_id, body))
            return list(self._invalid)

    def invalid_of(self, cm_id: str) -> list[Invalid]:
        return [m for m in self.invalid() if m.cm_id == cm_id]

    def dead_acks(self) -> list[Invalid]:
        """The acks the evaluator refused as malformed (its dead-letter queue)."""
        found: list[Invalid] = []
        with self._broker_lock:
            queue = protocol.dead_letter_queue(self.sender_name)
            while True:
                method, props, body = self._channel.basic_get(queue, auto_ack=True)
                if method is None or props is None or body is None:
                    return found
                found.append(Invalid(dict(props.headers or {}), props.message_id, body))

    def scaled(self, seconds: float) -> float:
        return seconds * self.scale


def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    abort: threading.Event | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; :class:`TimedOut` naming
    ``what`` after ``timeout_s`` seconds, :class:`Stopped` as soon as ``abort`` is set."""
    deadline = time.monotonic() + timeout_s
    abort = abort or threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout_s:.1f}s waiting for {what}")
        if abort.wait(0.05):
            raise Stopped()


@contextmanager
def world(config: ConformanceConfig) -> Iterator[World]:
    """A prepared :class:`World` in a temporary directory, closed afterwards."""
    with tempfile.TemporaryDirectory(prefix="condmsg-conformance-") as tmp:
        made = World(config, Path(tmp))
        try:
            made.prepare()
            yield made
        finally:
            made.close()
