"""The receiver across a crash: a success notice or a compensation taken in a transaction
reaches the app once even when the process dies before its broker ack, and a message held
back when consuming stops goes back to its queue."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg.core import protocol
from tests.integration.condmsg_helpers import (
    app_metadata,
    app_rows,
    handled_rows,
    publish_compensation,
    publish_notice,
    publish_original,
    receiver_queue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def _success_notice(channel: Any, queue: str, cm_id: str) -> None:
    publish_notice(
        channel,
        protocol.MessageKind.SUCCESS,
        queue=queue,
        cm_id=cm_id,
        destination=queue,
        sender="s",
        body=b"it worked",
    )


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
    receiver = make_receiver(db_url, app_tables=app_metadata)
    queue = receiver_queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _success_notice(channel, queue, cm_id)

    first = _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    assert first.kind is protocol.MessageKind.SUCCESS

    # RabbitMQ requeued the unacked notice; a competing consumer of the same store reads.
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert other.stats.duplicates == 1
    assert app_rows(receiver.engine) == [(cm_id, "success")]


def test_a_success_notice_with_an_rlog_row_reaches_the_app_once_across_a_crash(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(db_url, app_tables=app_metadata)
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)
    assert _read_all_transactionally(receiver, queue) == [(cm_id, "original")]
    _success_notice(channel, queue, cm_id)

    _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert app_rows(receiver.engine) == [(cm_id, "original"), (cm_id, "success")]


def test_a_notice_redelivered_after_its_original_was_consumed_is_a_duplicate(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The notice came first (no RLOG row), the original is still deliverable afterwards,
    and the notice's redelivery after that is still recognised."""
    receiver = make_receiver(db_url, app_tables=app_metadata)
    queue = receiver_queue(receiver, unique_name)
    cm_id = str(uuid.uuid4())
    _success_notice(channel, queue, cm_id)
    _crash_before_the_broker_ack(receiver, queue, monkeypatch)

    other = make_receiver(db_url)
    publish_original(channel, queue, cm_id)
    assert _read_all_transactionally(other, queue) == [(cm_id, "original")]
    assert other.stats.duplicates == 1  # the notice's redelivery
    assert sorted(app_rows(receiver.engine)) == [(cm_id, "original"), (cm_id, "success")]


def test_a_compensation_reaches_the_app_once_across_a_crash(
    db_url: str,
    unique_name: str,
    make_receiver: Any,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver = make_receiver(db_url, app_tables=app_metadata)
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)
    assert _read_all_transactionally(receiver, queue) == [(cm_id, "original")]
    publish_compensation(
        channel, queue=queue, cm_id=cm_id, destination=queue, sender="s", body=b"undo"
    )
    _crash_before_the_broker_ack(receiver, queue, monkeypatch)
    other = make_receiver(db_url)
    assert _read_all_transactionally(other, queue) == []
    assert app_rows(receiver.engine) == [(cm_id, "original"), (cm_id, "compensation")]


def test_a_message_held_back_when_consuming_stops_goes_back_to_its_queue(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    """Nothing of a stopped consumer would return a held-back message later, and while it
    is held no other consumer gets it: stopping returns it at once."""
    receiver = make_receiver(
        db_url, retry_backoff=timedelta(seconds=60), retry_backoff_max=timedelta(seconds=60)
    )
    queue = receiver_queue(receiver, unique_name)
    publish_original(channel, queue)
    stop = threading.Event()

    def handler(message: Any, session: Session | None) -> None:
        stop.set()
        raise RuntimeError("the app failed")

    assert receiver.consume(queue, handler, stop=stop, idle_timeout_s=10) == 0
    returned = wait_for(lambda: channel.basic_get(queue, auto_ack=True)[0], timeout=5)
    assert returned is not None and returned.redelivered
