"""Unit tests of the outbox's pure parts: message validation, AMQP properties, errors."""

from __future__ import annotations

import math
import threading
import time

import pika.exceptions
import pytest

from condmsg.infra.backoff import Backoff, retry_delay_s
from condmsg.infra.urls import broker_address, redact_url
from outbox import OutboxError, OutboxMessage, OutboxTypeError, OutboxValueError
from outbox.message import Fanout
from outbox.publish_confirms import describe_connect_error
from outbox.publish_pika import ROW_ID_HEADER, pika_properties
from outbox.table import notify_channel


def msg(**kw: object) -> OutboxMessage:
    fields: dict[str, object] = {"exchange": "x", "routing_key": "k", "body": b"b"}
    fields.update(kw)
    return OutboxMessage(**fields)  # type: ignore[arg-type]


def test_str_body_is_rejected_with_a_hint() -> None:
    with pytest.raises(OutboxTypeError, match=r"body must be bytes, got str; encode it"):
        msg(body="hello")


def test_type_errors_are_both_outbox_errors_and_type_errors() -> None:
    with pytest.raises(TypeError):
        msg(body=123)
    with pytest.raises(OutboxError):
        msg(body=None)


def test_bytearray_and_memoryview_become_bytes() -> None:
    assert msg(body=bytearray(b"ab")).body == b"ab"
    assert msg(body=memoryview(b"cd")).body == b"cd"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("priority", 256, OutboxValueError),
        ("priority", -1, OutboxValueError),
        ("priority", True, OutboxValueError),
        ("expiration_ms", -5, OutboxValueError),
        ("expiration_ms", 1.5, OutboxValueError),
        ("exchange", "e" * 256, OutboxValueError),
        ("routing_key", None, OutboxTypeError),
        ("message_id", 7, OutboxTypeError),
        ("headers", {"a": b"bytes"}, OutboxTypeError),
        ("headers", {"a": {1: "x"}}, OutboxTypeError),
        ("headers", {"a": math.nan}, OutboxValueError),
        ("headers", ["not", "a", "dict"], OutboxTypeError),
        ("persistent", "yes", OutboxTypeError),
    ],
)
def test_bad_fields_are_rejected(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=field):
        msg(**{field: value})


def test_valid_message_keeps_every_property() -> None:
    m = msg(
        message_id="m1",
        correlation_id="c1",
        reply_to="r",
        content_type="application/json",
        content_encoding="utf-8",
        message_type="notice",
        headers={"n": 1, "nested": {"l": [1, "a", None, 2.5, True]}},
        priority=9,
        expiration_ms=1500,
        persistent=False,
        mandatory=False,
    )
    props = pika_properties(42, m)
    assert props.delivery_mode == 1
    assert props.expiration == "1500"
    assert props.priority == 9
    assert props.message_id == "m1"
    assert props.correlation_id == "c1"
    assert props.reply_to == "r"
    assert props.content_type == "application/json"
    assert props.content_encoding == "utf-8"
    assert props.type == "notice"
    assert props.headers == {"n": 1, "nested": {"l": [1, "a", None, 2.5, True]}, ROW_ID_HEADER: 42}
    assert m.headers is not None
    assert ROW_ID_HEADER not in m.headers  # the message itself is not modified


def test_persistent_by_default() -> None:
    props = pika_properties(1, msg())
    assert props.delivery_mode == 2
    assert props.expiration is None


def test_connect_errors_are_actionable_and_hide_the_password() -> None:
    url = "amqp://user:s3cret@127.0.0.1:5999/%2F"
    refused = pika.exceptions.AMQPConnectionError(ConnectionRefusedError(111, "Connection refused"))
    text = describe_connect_error(url, refused)
    assert text == (
        "cannot reach RabbitMQ at amqp://127.0.0.1:5999: connection refused; is the broker running?"
    )
    auth = describe_connect_error(url, pika.exceptions.ProbableAuthenticationError("x"))
    assert "check the user, password and vhost" in auth
    assert "s3cret" not in text + auth


def test_redact_url() -> None:
    assert redact_url("amqp://u:pw@h:1/v") == "amqp://u:***@h:1/v"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert broker_address("amqp://u:pw@h/v") == "amqp://h:5672"


def test_retry_delays_double_up_to_the_maximum() -> None:
    delays = [retry_delay_s(a, initial_s=1.0, maximum_s=10.0) for a in range(1, 7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    backoff = Backoff(0.2, 1.0)
    got = [backoff.next_delay() for _ in range(6)]
    assert all(0.15 <= d <= 1.0 for d in got)
    backoff.reset()
    assert backoff.next_delay() <= 0.2
    assert backoff.upcoming_s == 0.4  # the next one's ceiling, for a log line
    assert retry_delay_s(10**6, initial_s=0.2, maximum_s=5.0) == 5.0  # no overflow


def test_a_backoff_wait_ends_when_stopped() -> None:
    stopped = threading.Event()
    stopped.set()
    spent: list[float] = []  # a stopped wait spends no slice of its 30 s
    assert not Backoff(30.0, 30.0, stop=stopped).wait(idle=spent.append)
    assert not Backoff(30.0, 30.0).wait(also=stopped, idle=spent.append)
    assert spent == []
    slices: list[float] = []

    def idle(seconds: float) -> None:  # a caller that services a connection meanwhile
        slices.append(seconds)
        time.sleep(seconds)

    assert Backoff(0.05, 0.05).wait(idle=idle)
    assert slices and all(s <= 0.1 for s in slices)


def test_notify_channel_is_a_short_stable_identifier_per_schema_and_table() -> None:
    a = notify_channel("public", "condmsg_outbox")
    assert a == notify_channel("public", "condmsg_outbox")
    assert a != notify_channel("t_1", "condmsg_outbox")
    assert a != notify_channel("public", "other")
    assert len(a) <= 63
    assert a.isidentifier()


def test_a_fanout_validates_its_copies_like_messages() -> None:
    base = msg(headers={"shared": 1})
    fanout = Fanout(base, ({"routing_key": "a", "headers": {"own": "x"}}, {"priority": 3}))
    first, second = fanout.messages()
    assert (first.routing_key, dict(first.headers or {})) == ("a", {"shared": 1, "own": "x"})
    assert (second.routing_key, second.priority, second.body) == ("k", 3, b"b")
    with pytest.raises(OutboxValueError, match=r"priority must be an int in 0\.\.255"):
        Fanout(base, ({"priority": 256},))
    with pytest.raises(OutboxValueError, match="routing_key is longer than 255 bytes"):
        Fanout(base, ({"routing_key": "r" * 256},))
    with pytest.raises(OutboxTypeError, match="must hold JSON values"):
        Fanout(base, ({"headers": {"when": object()}},))
    with pytest.raises(OutboxTypeError, match="cannot set 'body'"):
        Fanout(base, ({"body": b"other"},))
    with pytest.raises(OutboxValueError, match="at least one copy"):
        Fanout(base, ())
    with pytest.raises(OutboxValueError, match="set headers"):
        Fanout(msg(), ({"headers": {"own": "x"}},))


def test_redact_url_masks_credentials_in_the_query_string() -> None:
    assert (
        redact_url("postgresql+psycopg://u@h/db?password=s3cret&sslmode=require&SSLPassword=k")
        == "postgresql+psycopg://u@h/db?password=***&sslmode=require&SSLPassword=***"
    )
    assert redact_url("amqp://u:p@[::1]:5672/%2F?heartbeat=10") == (
        "amqp://u:***@[::1]:5672/%2F?heartbeat=10"
    )
    assert redact_url("sqlite:///x.db?password=y") == "sqlite:///x.db?password=***"
    assert redact_url("sqlite:///x.db") == "sqlite:///x.db"
