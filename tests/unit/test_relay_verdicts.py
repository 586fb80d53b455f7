"""What the relay makes of RabbitMQ's answer for a batch: refused messages parked at once,
nacked ones retried with a doubling delay until they are out of attempts (no broker)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbox.config import RelayConfig
from outbox.message import OutboxMessage, StoredMessage
from outbox.publish_confirms import BatchResult
from outbox.relay_verdicts import judge

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CONFIG = RelayConfig(amqp_url="amqp://", max_attempts=3, retry_initial_s=1.0, retry_max_s=60.0)


def _row(row_id: int, attempts: int) -> StoredMessage:
    message = OutboxMessage(exchange="", routing_key="q", body=b"x")
    return StoredMessage(id=row_id, created_at=NOW, attempts=attempts, message=message)


def test_confirmed_messages_get_no_verdict_and_refused_ones_are_parked_at_once() -> None:
    result = BatchResult(published=[(1, None)], refused={(2, None): "unroutable: 312 NO_ROUTE"})
    verdicts = judge([_row(1, 0), _row(2, 0)], result, CONFIG, NOW)
    assert verdicts.parked == {(2, None): "unroutable: 312 NO_ROUTE"}
    assert verdicts.retry == {}
    assert verdicts.gave_up == 0


def test_a_nacked_message_is_retried_later_the_more_its_row_was_tried() -> None:
    result = BatchResult(nacked={(1, None): "nacked", (2, 4): "nacked"})
    verdicts = judge([_row(1, 0), _row(2, 1)], result, CONFIG, NOW)
    assert verdicts.retry == {
        (1, None): ("nacked", NOW + timedelta(seconds=1)),
        (2, 4): ("nacked", NOW + timedelta(seconds=2)),
    }
    assert verdicts.parked == {}


def test_a_nacked_message_out_of_attempts_is_parked_with_the_count() -> None:
    result = BatchResult(nacked={(1, None): "nacked"})
    verdicts = judge([_row(1, 2)], result, CONFIG, NOW)
    assert verdicts.parked == {(1, None): "nacked; gave up after 3 attempts"}
    assert verdicts.retry == {}
    assert verdicts.gave_up == 1
