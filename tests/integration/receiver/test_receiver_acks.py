"""Automatic READ and COMMIT acks, on SQLite and PostgreSQL receiver stores (real RabbitMQ)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Destination
from condmsg.core.acks import AckKind
from condmsg.core.protocol import MessageKind, verify_token
from tests.integration.condmsg_helpers import SECRET, acks_in, get_all, receiver_queue, sender_name
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

app_metadata = sa.MetaData()
calendar = sa.Table(
    "app_calendar",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
)


def _setup(db_url: str, unique_name: str, make_sender: Any, make_receiver: Any) -> Any:
    name = sender_name(unique_name)
    sender = make_sender(db_url, name)
    receiver = make_receiver(db_url, "alice", app_tables=app_metadata)
    return sender, receiver, name, f"{unique_name}.q"


def _send_and_relay(sender: Any, queue: str, **condition: Any) -> str:
    cm_id = sender.send(b"meeting at 10", Destination(queue, **condition))
    with sender.relay() as relay:
        relay.drain(10)
    return str(cm_id)


def _app_rows(receiver: Any) -> list[str]:
    with Session(receiver.engine) as s:
        return [r.cm_id for r in s.execute(sa.select(calendar.c.cm_id))]


def _relay_acks(receiver: Any) -> None:
    with receiver.relay() as relay:
        relay.drain(10)


def test_non_transactional_read_emits_exactly_one_read_ack(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, pickup_within=timedelta(seconds=30))

    message = receiver.read(queue, timeout=5)
    assert message is not None
    assert (message.kind, message.cm_id, message.payload) == (
        MessageKind.ORIGINAL,
        cm_id,
        b"meeting at 10",
    )
    assert receiver.read(queue, timeout=0.2) is None
    _relay_acks(receiver)

    acks = acks_in(channel, name)
    assert len(acks) == 1
    ack = acks[0]
    assert (ack.cm_id, ack.destination, ack.kind, ack.recipient) == (
        cm_id,
        queue,
        AckKind.READ,
        "alice",
    )
    assert ack.read_at == message.read_at
    assert ack.committed_at is None
    assert verify_token(SECRET, ack.token, cm_id, queue, None)


def test_committed_transaction_emits_one_commit_ack_with_the_apps_row(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, process_within=timedelta(seconds=30))

    with receiver.transaction() as tx:
        message = tx.read(queue, timeout=5)
        assert message is not None
        tx.session.execute(sa.insert(calendar).values(cm_id=message.cm_id))
        if not db_url.startswith("sqlite"):  # SQLite: the open writer would block the probe
            assert _app_rows(receiver) == []  # nothing visible before the commit
    assert _app_rows(receiver) == [cm_id]
    _relay_acks(receiver)

    acks = acks_in(channel, name)
    assert [a.kind for a in acks] == [AckKind.COMMIT]
    assert acks[0].read_at == message.read_at
    assert acks[0].committed_at is not None
    assert acks[0].read_at <= acks[0].committed_at
    assert get_all(channel, queue, settle_s=0.1) == []  # the copy was acked


def test_a_read_after_the_apps_own_statements_joins_its_transaction(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    """The app writes first, then reads: the claim runs inside the begun transaction and
    everything commits together, with one COMMIT ack."""
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, process_within=timedelta(seconds=30))

    with receiver.transaction() as tx:
        tx.session.execute(sa.insert(calendar).values(cm_id="before the read"))
        message = tx.read(queue, timeout=5)
        assert message is not None
        tx.session.execute(sa.insert(calendar).values(cm_id=message.cm_id))
    assert sorted(_app_rows(receiver)) == sorted(["before the read", cm_id])
    _relay_acks(receiver)
    assert [a.kind for a in acks_in(channel, name)] == [AckKind.COMMIT]
    assert get_all(channel, queue, settle_s=0.1) == []


def test_rolled_back_transaction_emits_no_ack_and_the_message_is_read_again(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, process_within=timedelta(seconds=30))

    def fail_in_transaction() -> None:
        with receiver.transaction() as tx:
            first = tx.read(queue, timeout=5)
            assert first is not None
            tx.session.execute(sa.insert(calendar).values(cm_id=first.cm_id))
            raise RuntimeError("calendar full")

    with pytest.raises(RuntimeError, match="calendar full"):
        fail_in_transaction()
    assert _app_rows(receiver) == []
    _relay_acks(receiver)
    assert acks_in(channel, name) == []

    with receiver.transaction() as tx:
        again = tx.read(queue, timeout=5)
        assert again is not None
        assert again.cm_id == cm_id
        assert again.redelivered
        tx.session.execute(sa.insert(calendar).values(cm_id=again.cm_id))
    assert _app_rows(receiver) == [cm_id]
    _relay_acks(receiver)
    assert [a.kind for a in acks_in(channel, name)] == [AckKind.COMMIT]


def test_crash_between_commit_and_amqp_ack_never_delivers_the_copy_twice(
    db_url: str,
    unique_name: str,
    make_sender: Any,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, process_within=timedelta(seconds=30))
    broker = receiver._broker
    # The "crash": the connection drops after the database commit, before the AMQP ack.
    monkeypatch.setattr(broker, "ack", lambda delivery, **_: broker.drop_connection())
    with receiver.transaction() as tx:
        message = tx.read(queue, timeout=5)
        assert message is not None
        tx.session.execute(sa.insert(calendar).values(cm_id=message.cm_id))
    monkeypatch.undo()

    # RabbitMQ requeues the unacked copy; a competing consumer of the same store gets it.
    other = make_receiver(db_url, "alice")
    with other.transaction() as tx:
        assert tx.read(queue, timeout=1.0) is None
    assert other.stats.duplicates == 1
    assert _app_rows(receiver) == [cm_id]
    assert get_all(channel, queue, settle_s=0.1) == []
    _relay_acks(receiver)
    assert [a.kind for a in acks_in(channel, name)] == [AckKind.COMMIT]


def test_plain_messages_pass_through_without_an_ack(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    _, receiver, name, _ = _setup(db_url, unique_name, make_sender, make_receiver)
    queue = receiver_queue(receiver, unique_name)
    channel.basic_publish("", queue, b"just a message")
    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert message.kind is None
    assert message.payload == b"just a message"
    assert not message.is_conditional
    _relay_acks(receiver)
    assert acks_in(channel, name) == []


def test_transactional_consume_runs_the_handler_in_the_acks_transaction(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    sender, receiver, name, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_ids = [
        sender.send({"n": i}, Destination(queue, process_within=timedelta(seconds=30)))
        for i in range(5)
    ]
    with sender.relay() as relay:
        relay.drain(10)
    seen: list[int] = []
    failures: list[int] = []

    def handler(message: Any, session: Session | None) -> None:
        assert session is not None
        if message.payload["n"] == 2 and not failures:
            failures.append(2)
            raise ValueError("first attempt at n=2 fails")
        seen.append(message.payload["n"])
        session.execute(sa.insert(calendar).values(cm_id=message.cm_id))

    handled = receiver.consume(queue, handler, max_messages=5, idle_timeout_s=5)
    assert handled == 5
    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert failures == [2]
    assert receiver.stats.rolled_back == 1
    assert sorted(_app_rows(receiver)) == sorted(cm_ids)
    _relay_acks(receiver)
    acks = acks_in(channel, name)
    assert sorted(a.cm_id for a in acks) == sorted(cm_ids)
    assert {a.kind for a in acks} == {AckKind.COMMIT}


def test_a_poison_message_goes_to_the_invalid_queue_after_max_attempts(
    db_url: str, unique_name: str, make_sender: Any, make_receiver: Any, channel: Any
) -> None:
    sender, receiver, _, queue = _setup(db_url, unique_name, make_sender, make_receiver)
    cm_id = _send_and_relay(sender, queue, process_within=timedelta(seconds=30))
    attempts: list[str] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(message.cm_id)
        raise ValueError("cannot parse the meeting")

    assert receiver.consume(queue, handler, idle_timeout_s=1.0) == 0
    assert attempts == [cm_id] * receiver.max_attempts
    moved = get_all(channel, receiver.invalid_queue)
    assert len(moved) == 1
    props, body = moved[0]
    assert body == b"meeting at 10"
    assert "poison message: processing failed 5 times" in props.headers["condmsg-reason"]
    assert "cannot parse the meeting" in props.headers["condmsg-reason"]


@pytest.mark.postgres
def test_a_plain_poison_message_with_a_long_id_is_counted_too(
    pg_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """AMQP allows message ids of 255 characters; the redelivery counts key a longer one
    than their column holds by its digest, so it is counted and dead-lettered as any."""
    receiver = make_receiver(pg_url)
    queue = receiver_queue(receiver, unique_name)
    props = pika.BasicProperties(message_id="x" * 255)
    channel.basic_publish("", queue, b"plain", props)
    attempts: list[bytes] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(message.payload)
        raise ValueError("cannot parse it")

    assert receiver.consume(queue, handler, idle_timeout_s=1.0) == 0
    assert attempts == [b"plain"] * receiver.max_attempts
    moved = get_all(channel, receiver.invalid_queue)
    assert [body for _, body in moved] == [b"plain"]
    assert "poison message: processing failed 5 times" in moved[0][0].headers["condmsg-reason"]
