"""A receiver's settings: the recipient identities its acks could carry, retry settings
that can work, and a ``ReceiverConfig`` that says the same as the keywords."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from ackd.attempts import RetryPolicy
from ackd.receiver import Receiver, ReceiverConfig
from ackd.receiver_config import DEFAULT_POLL_INTERVAL_S
from condmsg.core import protocol
from condmsg.core.errors import ConfigError


@pytest.mark.parametrize(
    ("recipient", "says"),
    [
        ("x" * (protocol.MAX_NAME_CHARS + 1), "longer than 255"),
        ("alice\x00", "NUL"),
        ("bob\x1f", "control character"),
    ],
)
def test_a_recipient_no_ack_could_carry_is_refused(recipient: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Receiver(
            amqp_url="amqp://unused", db_url="sqlite://", create_schema=True, recipient=recipient
        )


def test_a_receiver_id_no_ack_could_carry_is_refused() -> None:
    with pytest.raises(ConfigError, match="receiver id is longer than 255"):
        Receiver(
            amqp_url="amqp://unused",
            db_url="sqlite://",
            create_schema=True,
            recipient="r",
            receiver_id="x" * 256,
        )


def test_the_default_receiver_id_fits_an_ack_whatever_the_recipient() -> None:
    recipient = "r" * protocol.MAX_NAME_CHARS
    rx = Receiver(
        amqp_url="amqp://unused", db_url="sqlite://", create_schema=True, recipient=recipient
    )
    try:
        assert len(rx.receiver_id) <= protocol.MAX_NAME_CHARS
        short = Receiver(
            amqp_url="amqp://unused", db_url="sqlite://", create_schema=True, recipient="alice"
        )
        assert short.receiver_id.endswith(":alice")
        short.close()
    finally:
        rx.close()


def test_keywords_and_a_config_are_the_same_settings() -> None:
    config = ReceiverConfig(
        amqp_url="amqp://unused", db_url="sqlite://", max_attempts=3, create_schema=True
    )
    from_config = Receiver(config, recipient="alice", poll_interval_s=0.5)
    from_keywords = Receiver(
        amqp_url="amqp://unused",
        db_url="sqlite://",
        create_schema=True,
        recipient="alice",
        max_attempts=3,
    )
    assert from_config.config == replace(config, poll_interval_s=0.5)
    assert from_config.config.retry == from_keywords.config.retry == RetryPolicy(max_attempts=3)
    assert from_keywords.config.poll_interval_s == DEFAULT_POLL_INTERVAL_S


def test_from_env_reads_the_connection_settings_and_keeps_the_secret_out_of_the_repr() -> None:
    secret = "s3cret-0f9e8d7c6b5a4f3e2d1c0b9a8f7e"
    environ = {"CONDMSG_DB_URL": "sqlite://", "CONDMSG_SECRET": secret}
    config = ReceiverConfig.from_env(environ, invalid_queue="rejects")
    assert (config.db_url, config.secret, config.invalid_queue) == (
        "sqlite://",
        secret.encode(),
        "rejects",
    )
    assert secret not in repr(config)


@pytest.mark.parametrize("secret", [b"changeme", b"s3cret", b"0123" * 10])
def test_a_weak_secret_is_refused(secret: bytes) -> None:
    with pytest.raises(ConfigError, match=r"the receiver's secret .*condmsg secret new"):
        ReceiverConfig(amqp_url="amqp://unused", secret=secret)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"retry_backoff": timedelta(seconds=10)}, "retry_backoff"),
        ({"retry_backoff": timedelta(seconds=-1)}, "retry_backoff"),
    ],
)
def test_retry_settings_that_cannot_work_are_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        ReceiverConfig(amqp_url="amqp://unused", **settings)


def test_a_receiver_needs_a_store() -> None:
    with pytest.raises(ConfigError, match="db_url"):
        Receiver(amqp_url="amqp://unused", recipient="alice")
