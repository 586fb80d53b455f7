"""A transactional ``Receiver.consume`` whose RabbitMQ connection is cut several times
while it works through a stream of originals, duplicates and bad messages.

Every delivery is settled by one ``Broker.dispose`` call: an original is left to the app's
transaction (acked once it commits), a duplicate is acked (deferred) once its RLOG row is
seen, a bad message is copied to the invalid queue with its reason and acked. A cut
leaves some of those settlements unsent; RabbitMQ redelivers what they covered, and the
receiver log must make the redeliveries harmless.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd import AsyncReceiver, Message, Receiver
from ackd.tables import RlogState, rlog
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.protocol import AckMessage
from outbox.message import OutboxMessage
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import (
    SECRET,
    app_metadata,
    copy_messages,
    get_all,
    handled_rows,
    publish,
    receiver_queue,
)
from tests.integration.receiver_kinds import KINDS, AsyncReceiverDriver
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ORIGINALS = 240
#: Every this many originals is published twice.
DUPLICATE_EVERY = 8
#: Bad messages of each kind: a forged token, a missing header, a body that is not JSON.
BAD_EACH = 20
PREFETCH = 20
#: Cut the receiver's broker connection once the app has committed this many originals.
CUT_AFTER = (40, 90, 140, 190)
#: What the invalid queue's reason says, by kind of bad message.
REASONS = {
    "forged": "bad token: the copy's HMAC does not verify",
    "headless": f"missing header {protocol.H_CM_ID}",
    "not-json": "payload does not decode as application/json",
}
#: The acks of the copies' sender ("s").
ACK_QUEUE = protocol.ack_queue("s")


def _copy(
    queue: str, *, content_type: str = "application/octet-stream", body: bytes = b"x"
) -> OutboxMessage:
    """The one message of a new CM's copy for ``queue``, signed with :data:`SECRET`."""
    (message,) = copy_messages(
        queue, body, content_type=content_type, pickup_within=timedelta(minutes=5)
    )
    return message


def _bad(kind: str, queue: str) -> OutboxMessage:
    if kind == "not-json":
        return _copy(queue, content_type="application/json", body=b"{not json")
    message = _copy(queue)
    headers = dict(message.headers or {})
    if kind == "forged":
        headers[protocol.H_TOKEN] = "ab" * 32
    else:
        del headers[protocol.H_CM_ID]
    return dataclasses.replace(message, headers=headers)


@dataclasses.dataclass
class Stream:
    """What is published to the queue, in order, and what each message should become."""

    messages: list[OutboxMessage]
    #: cm_id of each original.
    originals: set[str]
    #: message_id -> kind of each bad message.
    bad: dict[str, str]
    duplicated: int


def _stream(queue: str) -> Stream:
    originals = [_copy(queue) for _ in range(ORIGINALS)]
    bad = [(kind, _bad(kind, queue)) for kind in REASONS for _ in range(BAD_EACH)]
    messages = originals + originals[::DUPLICATE_EVERY] + [message for _, message in bad]
    random.Random(7).shuffle(messages)
    return Stream(
        messages=messages,
        originals={str((m.headers or {})[protocol.H_CM_ID]) for m in originals},
        bad={str(message.message_id): kind for kind, message in bad},
        duplicated=len(originals[::DUPLICATE_EVERY]),
    )


@dataclasses.dataclass
class Consumer:
    """A receiver that reaches RabbitMQ through ``proxy`` (its store directly), and the
    test's queue, declared as the receiver declares its queues."""

    receiver: Any  # a Receiver, or an AsyncReceiverDriver
    proxy: TcpProxy
    queue: str


@pytest.fixture(params=KINDS)
def consumer(
    request: pytest.FixtureRequest,
    pg_url: str,
    amqp_url: str,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[Consumer]:
    """The sync ``Receiver``, or the ``AsyncReceiver`` behind the same calls; the async
    one's sync twin declares the queue directly, so that only the consumer's connections
    pass the proxy."""
    caplog.set_level(logging.INFO, logger="ackd")
    proxy = TcpProxy()
    proxy.up()
    proxied = proxy.url(amqp_url)
    receiver: Any = Receiver(
        amqp_url=proxied if request.param == "sync" else amqp_url,
        db_url=pg_url,
        recipient="alice",
        receiver_id="rx-cut",
        secret=SECRET,
        invalid_queue=f"{unique_name}.invalid",
        create_schema=True,
    )
    app_metadata.create_all(receiver.engine)  # the app's own table, in the receiver's store
    queue = receiver_queue(receiver, unique_name)
    if request.param == "async":
        config = dataclasses.replace(receiver.config, amqp_url=proxied)
        receiver = AsyncReceiverDriver(receiver, AsyncReceiver(config, recipient="alice"))
    try:
        yield Consumer(receiver, proxy, queue)
    finally:
        receiver.close()
        receiver.engine.dispose()
        proxy.close()


def _record(message: Message, session: Session | None) -> None:
    """The app's work: one row per message it got, in the receiver's transaction."""
    assert session is not None
    kind = message.kind.value if message.kind is not None else "plain"
    session.execute(sa.insert(handled_rows).values(cm_id=message.cm_id, kind=kind))
    time.sleep(0.003)  # and a little time, so that the stream lasts while the cuts come


def _app_rows(receiver: Any) -> Counter[tuple[str, str]]:
    with receiver.engine.connect() as conn:
        return Counter(conn.execute(sa.select(handled_rows.c.cm_id, handled_rows.c.kind)).all())


def _consume(
    c: Consumer,
    handler: Callable[[Message, Session | None], None],
    *,
    prefetch: int,
    meanwhile: Callable[[], None],
) -> int:
    """Run ``consume()`` in a thread until the queue is worked off (nothing for a second)
    while this thread calls ``meanwhile``; what ``consume()`` returned. It must neither
    raise nor end before ``meanwhile`` returns."""
    handled: list[int] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            handled.append(
                c.receiver.consume(c.queue, handler, prefetch=prefetch, idle_timeout_s=1.0)
            )
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="consumer", daemon=True)
    thread.start()
    meanwhile()
    assert thread.is_alive(), failures
    thread.join(60)
    assert not thread.is_alive(), "consume() did not end once the queue was worked off"
    assert not failures, failures
    c.receiver.close()  # whatever the consumer still held goes back to the queue
    return handled[0]


def _consume_through_cuts(c: Consumer, channel: Any) -> Stream:
    """Publish the stream, and consume it while the broker connection is cut at each of
    :data:`CUT_AFTER` originals committed."""
    stream = _stream(c.queue)
    for message in stream.messages:
        publish(channel, message)

    def cuts() -> None:
        for after in CUT_AFTER:
            wait_for(
                lambda n=after: sum(_app_rows(c.receiver).values()) >= n,
                timeout=60,
                what=f"{after} originals committed",
            )
            c.proxy.cut()

    assert _consume(c, _record, prefetch=PREFETCH, meanwhile=cuts) == ORIGINALS
    return stream


def test_a_transactional_consumer_settles_every_delivery_across_broker_cuts(
    consumer: Consumer, channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _consume_through_cuts(consumer, channel)
    receiver, queue = consumer.receiver, consumer.queue

    # Every original reached the app once (its row committed once), each with one RLOG
    # row and one COMMIT ack; the duplicates and the bad messages never reached it.
    assert _app_rows(receiver) == {(cm_id, "original"): 1 for cm_id in stream.originals}
    outbox = outbox_table()
    with receiver.engine.connect() as conn:
        states = dict(conn.execute(sa.select(rlog.c.cm_id, rlog.c.state)).all())
        bodies = conn.scalars(sa.select(outbox.c.body).where(outbox.c.routing_key == ACK_QUEUE))
        acks = [AckMessage.from_json(body) for body in bodies]
    assert states == dict.fromkeys(stream.originals, RlogState.CONSUMED.value)
    assert Counter(ack.cm_id for ack in acks) == dict.fromkeys(stream.originals, 1)
    assert {ack.kind for ack in acks} == {AckKind.COMMIT}
    assert all(ack.committed_at is not None for ack in acks)
    assert receiver.stats.duplicates >= stream.duplicated

    # Every bad message is on the invalid queue with its reason and its queue (how many
    # times: see the next test), and nothing else is.
    moved = get_all(channel, receiver.invalid_queue)
    assert {str(props.message_id) for props, _ in moved} == set(stream.bad)
    for props, _ in moved:
        kind = stream.bad[str(props.message_id)]
        assert REASONS[kind] in props.headers[protocol.H_REASON], (kind, props.headers)
        assert props.headers["condmsg-original-queue"] == queue

    # Nothing left unsettled: with the receiver closed, the queue is empty.
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
    # The consumer said that RabbitMQ went away, and blamed no message for it.
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ackd")]
    paused = f"consuming {queue!r} paused: RabbitMQ cannot be reached"
    assert any(paused in line for line in lines), lines
    assert not any("poison" in line for line in lines), lines


def test_a_bad_message_is_copied_twice_only_by_a_cut_during_its_copy(
    consumer: Consumer, channel: Any
) -> None:
    """A delivery whose channel died is not moved (it comes again, and is moved then), so
    a bad message is copied twice only when a cut falls between its copy reaching
    RabbitMQ and the confirm coming back: once per cut at most."""
    stream = _consume_through_cuts(consumer, channel)
    moved = Counter(
        str(props.message_id) for props, _ in get_all(channel, consumer.receiver.invalid_queue)
    )
    assert set(moved) == set(stream.bad)
    twice = [m for m, n in moved.items() if n > 1]
    assert all(moved[m] == 2 for m in twice), moved
    assert len(twice) <= len(CUT_AFTER), twice


def test_each_broker_outage_is_logged_when_it_starts_and_when_it_ends(
    consumer: Consumer, channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Two outages, the second on the connection the receiver opened after the first:
    two lines when consuming pauses, two when it resumes (as for the store's outages:
    ``condmsg.runtime.pausing.Pause`` waits out both)."""
    for _ in range(60):
        publish(channel, _copy(consumer.queue))
    cut_on: list[int] = []

    def record_and_cut(message: Message, session: Session | None) -> None:
        _record(message, session)
        # Cut each connection the receiver opened, the first two of them, while it works.
        if len(cut_on) < 2 and consumer.proxy.accepted > len(cut_on):
            cut_on.append(consumer.proxy.accepted)
            consumer.proxy.cut()

    assert _consume(consumer, record_and_cut, prefetch=10, meanwhile=lambda: None) == 60
    assert cut_on == [1, 2]
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ackd")]
    queue = consumer.queue
    paused = [x for x in lines if f"consuming {queue!r} paused: RabbitMQ cannot be reached" in x]
    resumed = [x for x in lines if f"consuming {queue!r} resumes: RabbitMQ answers again" in x]
    assert (len(paused), len(resumed)) == (2, 2), lines
