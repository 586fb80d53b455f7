"""The receiver against bad input and failures: one bad message never reaches the app
nor stops a read or a consume loop (it goes to the invalid queue with a reason); a success
notice reaches a transactional app once across a crash before its broker ack; a failed
attempt is retried after a bounded backoff, so a short hiccup does not make a poison
message."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd import intake as intake_module
from ackd import rlog, sequence
from ackd.broker import Delivery
from ackd.tables import poison
from condmsg import Destination, protocol
from condmsg.copies import notice_message, plan_copies

from .condmsg_helpers import (
    SECRET,
    get_all,
    publish,
    publish_compensation,
    publish_copy,
    wait_for,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

#: Nested deeper than any recursion limit of ``json.loads``.
DEEP_JSON = b"[" * 200_000 + b"]" * 200_000

app_metadata = sa.MetaData()
handled_rows = sa.Table(
    "app_handled",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
)


def _queue(receiver: Any, unique_name: str) -> str:
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    return queue


def _original(
    channel: Any,
    queue: str,
    cm_id: str,
    body: bytes = b"original",
    *,
    content_type: str = "application/octet-stream",
    part_bytes: int = 1 << 20,
) -> None:
    publish_copy(
        channel,
        cm_id=cm_id,
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        body=body,
        content_type=content_type,
        part_bytes=part_bytes,
    )


def _success_notice(channel: Any, queue: str, cm_id: str) -> None:
    publish(
        channel,
        notice_message(
            kind=protocol.MessageKind.SUCCESS,
            cm_id=cm_id,
            destination=queue,
            recipient=None,
            sender="s",
            sent_at=datetime.now(UTC),
            exchange="",
            routing_key=queue,
            body=b"it worked",
            content_type="application/octet-stream",
            secret=SECRET,
        ),
    )


def _reasons(channel: Any, receiver: Any) -> list[str]:
    return [
        str(props.headers[protocol.H_REASON])
        for props, _ in get_all(channel, receiver.invalid_queue)
    ]


def _app_rows(engine: Any) -> list[tuple[str, str]]:
    with Session(engine) as s:
        return [(r.cm_id, r.kind) for r in s.execute(sa.select(handled_rows))]


# -- nothing a message holds reaches the app as an exception --------------------


def test_a_deeply_nested_json_payload_goes_to_the_invalid_queue_and_reading_goes_on(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = _queue(receiver, unique_name)
    poisoned, good = str(uuid.uuid4()), str(uuid.uuid4())
    _original(channel, queue, poisoned, DEEP_JSON, content_type="application/json")
    channel.basic_publish(
        "", queue, DEEP_JSON, pika.BasicProperties(content_type="application/json")
    )
    _original(channel, queue, good, b'{"ok": true}', content_type="application/json")

    message = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert (message.cm_id, message.payload) == (good, {"ok": True})
    assert receiver.read(queue, timeout=0.3) is None
    reasons = _reasons(channel, receiver)
    assert len(reasons) == 2
    assert all(reasons), reasons
    assert receiver.stats.invalid == 2


def test_a_deeply_nested_reassembled_sequence_goes_to_the_invalid_queue(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)
    queue = _queue(receiver, unique_name)
    poisoned, good = str(uuid.uuid4()), str(uuid.uuid4())
    _original(
        channel, queue, poisoned, DEEP_JSON, content_type="application/json", part_bytes=150_000
    )
    _original(channel, queue, good)

    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5))
        assert message.cm_id == good
    with receiver.transaction() as tx:
        assert tx.read(queue, timeout=0.5) is None
    moved = get_all(channel, receiver.invalid_queue)
    assert [body for _, body in moved] == [DEEP_JSON]
    assert moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 1


def test_any_exception_while_judging_a_message_dead_letters_it_alone(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last resort: a codec bug (here a KeyError out of the payload check) costs the
    message it happened on, never the reader or the consume loop."""
    receiver = make_receiver(db_url)
    queue = _queue(receiver, unique_name)
    real_check = intake_module.check_payload

    def buggy_check(body: bytes, content_type: str | None) -> None:
        if body == b"trigger":
            raise KeyError("codec bug")
        real_check(body, content_type)

    monkeypatch.setattr(intake_module, "check_payload", buggy_check)
    bad, good = str(uuid.uuid4()), str(uuid.uuid4())
    _original(channel, queue, bad, b"trigger")
    _original(channel, queue, good)
    seen: list[str] = []

    def handler(message: Any, session: Session | None) -> None:
        seen.append(message.cm_id)

    assert receiver.consume(queue, handler, max_messages=1, idle_timeout_s=5) == 1
    assert seen == [good]
    assert _reasons(channel, receiver) == ["undecodable: KeyError: 'codec bug'"]


def test_a_database_failure_is_not_the_messages_fault(
    pg_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failing receiver store propagates to the caller; the message is given back to the
    queue (never dead-lettered) and read once the store works again."""
    receiver = make_receiver(pg_url)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    real_claim = rlog.claim_original

    def failing_claim(*args: Any, **kwargs: Any) -> bool:
        raise sa.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(rlog, "claim_original", failing_claim)
    with pytest.raises(sa.exc.OperationalError), receiver.transaction() as tx:
        wait_for(lambda: tx.read(queue, timeout=0.5))
    monkeypatch.setattr(rlog, "claim_original", real_claim)
    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5), timeout=15)
        assert message.cm_id == cm_id
    assert get_all(channel, receiver.invalid_queue, settle_s=0.1) == []


# -- every control message exactly once for a transactional app -----------------


def _crash_before_the_broker_ack(receiver: Any, queue: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Read one message in a committed transaction whose broker ack never goes out."""
    broker = receiver._broker
    monkeypatch.setattr(broker, "ack", lambda delivery, **_: broker.drop_connection())
    with receiver.transaction() as tx:
        message = wait_for(lambda: tx.read(queue, timeout=0.5))
        tx.session.execute(
            sa.insert(handled_rows).values(cm_id=message.cm_id, kind=message.kind.value)
        )
    monkeypatch.undo()
    return message


def _read_all_transactionally(receiver: Any, queue: str) -> list[tuple[str, str]]:
    got: list[tuple[str, str]] = []
    while True:
        with receiver.transaction() as tx:
            message = tx.read(queue, timeout=1.0)
            if message is None:
                return got
            got.append((message.cm_id, message.kind.value))
            tx.session.execute(
                sa.insert(handled_rows).values(cm_id=message.cm_id, kind=message.kind.value)
            )


def test_a_success_notice_without_an_rlog_row_reaches_the_app_once_across_a_crash(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(db_url)
    app_metadata.create_all(receiver.engine)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _success_notice(channel, queue, cm_id)

    first = _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    assert first.kind is protocol.MessageKind.SUCCESS

    # RabbitMQ requeued the unacked notice; a competing consumer of the same store reads.
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert other.stats.duplicates == 1
    assert _app_rows(receiver.engine) == [(cm_id, "success")]


def test_a_success_notice_with_an_rlog_row_reaches_the_app_once_across_a_crash(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(db_url)
    app_metadata.create_all(receiver.engine)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    assert _read_all_transactionally(receiver, queue) == [(cm_id, "original")]
    _success_notice(channel, queue, cm_id)

    _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert _app_rows(receiver.engine) == [(cm_id, "original"), (cm_id, "success")]


def test_a_notice_redelivered_after_its_original_was_consumed_is_a_duplicate(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notice came first (no RLOG row), the original is still deliverable afterwards,
    and the notice's redelivery after that is still recognised."""
    receiver = make_receiver(db_url)
    app_metadata.create_all(receiver.engine)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _success_notice(channel, queue, cm_id)
    _crash_before_the_broker_ack(receiver, queue, monkeypatch)

    other = make_receiver(db_url)
    _original(channel, queue, cm_id)
    assert _read_all_transactionally(other, queue) == [(cm_id, "original")]
    assert other.stats.duplicates == 1  # the notice's redelivery
    assert sorted(_app_rows(receiver.engine)) == [(cm_id, "original"), (cm_id, "success")]


def test_a_compensation_reaches_the_app_once_across_a_crash(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(db_url)
    app_metadata.create_all(receiver.engine)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    assert _read_all_transactionally(receiver, queue) == [(cm_id, "original")]
    publish_compensation(
        channel, queue=queue, cm_id=cm_id, destination=queue, sender="s", body=b"undo"
    )
    _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert _app_rows(receiver.engine) == [(cm_id, "original"), (cm_id, "compensation")]


# -- retry with backoff, attempts counted -------------------------------------


def test_a_message_held_back_when_consuming_stops_goes_back_to_its_queue(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Nothing of a stopped consumer would return a held-back message later, and while it
    is held no other consumer gets it: stopping returns it at once."""
    receiver = make_receiver(
        db_url, retry_backoff=timedelta(seconds=60), retry_backoff_max=timedelta(seconds=60)
    )
    queue = _queue(receiver, unique_name)
    _original(channel, queue, str(uuid.uuid4()))
    stop = threading.Event()

    def handler(message: Any, session: Session | None) -> None:
        stop.set()
        raise RuntimeError("the app failed")

    assert receiver.consume(queue, handler, stop=stop, idle_timeout_s=10) == 0
    returned = wait_for(lambda: channel.basic_get(queue, auto_ack=True)[0], timeout=5)
    assert returned is not None and returned.redelivered


def test_a_half_second_hiccup_does_not_make_a_poison_message(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)  # default retry settings
    app_metadata.create_all(receiver.engine)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    hiccup_until: list[float] = []
    attempts: list[float] = []

    def handler(message: Any, session: Session | None) -> None:
        assert session is not None
        now = time.monotonic()
        attempts.append(now)
        if not hiccup_until:
            hiccup_until.append(now + 0.5)
        if now < hiccup_until[0]:
            raise sa.exc.OperationalError("INSERT", {}, Exception("the database is restarting"))
        session.execute(sa.insert(handled_rows).values(cm_id=message.cm_id, kind="original"))

    assert receiver.consume(queue, handler, max_messages=1, idle_timeout_s=10) == 1
    assert _app_rows(receiver.engine) == [(cm_id, "original")]
    assert get_all(channel, receiver.invalid_queue, settle_s=0.1) == []
    assert 2 <= len(attempts) < receiver.max_attempts
    pauses = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert all(b > a for a, b in itertools.pairwise(pauses)), pauses  # exponential


def test_a_message_that_always_fails_is_dead_lettered_after_max_attempts_in_bounded_time(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)  # default retry settings
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)
    attempts: list[float] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(time.monotonic())
        raise ValueError("cannot parse the meeting")

    started = time.monotonic()
    stop = threading.Event()

    def stop_when_dead_lettered() -> None:
        while not stop.is_set() and receiver.stats.invalid == 0:
            time.sleep(0.02)
        stop.set()

    watcher = threading.Thread(target=stop_when_dead_lettered, daemon=True)
    watcher.start()
    receiver.consume(queue, handler, stop=stop, idle_timeout_s=30)
    stop.set()
    watcher.join(5)
    elapsed = time.monotonic() - started
    assert len(attempts) == receiver.max_attempts
    assert attempts[-1] - attempts[0] >= 1.0  # the backoff paused between attempts
    assert elapsed < 15
    reasons = _reasons(channel, receiver)
    assert len(reasons) == 1
    assert "poison message: processing failed 5 times" in reasons[0]
    assert "cannot parse the meeting" in reasons[0]
    with Session(receiver.engine) as s:
        assert s.execute(sa.select(sa.func.count()).select_from(poison)).scalar_one() == 0


def test_a_rolled_back_read_waits_before_the_message_comes_back(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Explicit transactions too: the message is held back for the backoff (no immediate
    redelivery for an app that retries in a loop), then read again."""
    receiver = make_receiver(
        db_url, retry_backoff=timedelta(milliseconds=600), retry_backoff_max=timedelta(seconds=5)
    )
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)

    def fail_in_transaction() -> None:
        with receiver.transaction() as tx:
            assert wait_for(lambda: tx.read(queue, timeout=0.5)).cm_id == cm_id
            raise RuntimeError("the app failed")

    with pytest.raises(RuntimeError):
        fail_in_transaction()
    failed_at = time.monotonic()
    with receiver.transaction() as tx:
        assert tx.read(queue, timeout=0.3) is None  # held back
        again = tx.read(queue, timeout=5)
        assert again is not None and again.cm_id == cm_id and again.redelivered
    assert time.monotonic() - failed_at >= 0.6


def test_an_attempt_is_counted_in_memory_while_the_database_cannot_count_it(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(
        db_url, retry_backoff=timedelta(milliseconds=20), retry_backoff_max=timedelta(seconds=1)
    )
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _original(channel, queue, cm_id)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("UPDATE", {}, Exception("the database is restarting"))

    monkeypatch.setattr(receiver._attempts, "_write", unreachable)
    attempts: list[str] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(message.cm_id)
        raise ValueError("cannot parse the meeting")

    assert receiver.consume(queue, handler, idle_timeout_s=2.0) == 0
    assert attempts == [cm_id] * receiver.max_attempts
    reasons = _reasons(channel, receiver)
    assert len(reasons) == 1
    assert "processing failed 5 times" in reasons[0]


# -- reassembled sequences are judged by their token too ---------------------------------


def test_a_stored_sequence_with_a_forged_token_is_refused_by_a_receiver_with_the_secret(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Parts stored by a receiver without the secret (or before it had one) are judged
    again when assembled: the sequence must carry a verifying copy token."""
    receiver = make_receiver(db_url, secret=SECRET)
    queue = _queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    (plan,) = plan_copies(
        cm_id=cm_id,
        condition=Destination(queue, pickup_within=timedelta(seconds=30)),
        sender="s",
        sent_at=datetime.now(UTC),
        secret=b"not the deployment secret",
        body=b"x" * 300,
        content_type="application/octet-stream",
        app_headers={},
        part_bytes=100,
    )
    assert len(plan.messages) == 3
    with Session(receiver.engine) as session, session.begin():
        for position, message in enumerate(plan.messages):
            properties = pika.BasicProperties(
                message_id=message.message_id,
                reply_to=message.reply_to,
                content_type=message.content_type,
                headers=dict(message.headers or {}),
            )
            delivery = Delivery(queue, position + 1, False, properties, message.body)
            row = sequence.part_row(
                delivery, seq_id=plan.message_id, position=position, size=3, now=datetime.now(UTC)
            )
            receiver.store.store_part(session, row)

    assert receiver.read(queue, timeout=1.0) is None
    moved = get_all(channel, receiver.invalid_queue)
    assert [body for _, body in moved] == [b"x" * 300]
    assert "token" in moved[0][0].headers[protocol.H_REASON]
    assert receiver.stats.invalid == 1
