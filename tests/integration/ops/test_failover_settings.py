"""Several broker addresses in one setting, and the destination queue type setting: parsing,
how they are shown (never with a password), and the first address that answers winning,
for the blocking connection and for the outbox publisher, on the main broker."""

from __future__ import annotations

import socket

import pytest

from condmsg.core.errors import ConfigError
from condmsg.infra.urls import broker_address, redact_url, split_urls
from condmsg.runtime.amqp import connect, connected_address, describe_url
from condmsg.runtime.settings import Settings
from condmsg.runtime.topology import destination_arguments
from outbox.errors import BrokerError
from outbox.publish_confirms import Publisher

TWO = "amqp://app:s3cret@rmq-1:5672/prod, amqp://app:s3cret@rmq-2:5673/prod"


def _dead_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_comma_separated_setting_is_split_in_order() -> None:
    assert split_urls(TWO) == [
        "amqp://app:s3cret@rmq-1:5672/prod",
        "amqp://app:s3cret@rmq-2:5673/prod",
    ]
    assert split_urls(["amqp://a/", "amqp://b/,amqp://c/"]) == [
        "amqp://a/",
        "amqp://b/",
        "amqp://c/",
    ]
    with pytest.raises(ValueError, match="no broker address"):
        split_urls(" , ")


def test_every_address_is_shown_without_its_password() -> None:
    for shown in (
        describe_url(TWO),
        broker_address(TWO),
        redact_url(TWO),
        repr(Settings(amqp_url=TWO)),
    ):
        assert "s3cret" not in shown
        assert "rmq-1:5672" in shown and "rmq-2:5673" in shown
    assert describe_url(TWO) == "amqp://rmq-1:5672/prod, amqp://rmq-2:5673/prod"


def test_the_destination_queue_type_setting() -> None:
    assert Settings.from_env({}).destination_queue_type == "classic"
    env = {"CONDMSG_DESTINATION_QUEUE_TYPE": "Quorum"}
    assert Settings.from_env(env).destination_queue_type == "quorum"
    with pytest.raises(ConfigError, match="CONDMSG_DESTINATION_QUEUE_TYPE must be one of"):
        Settings.from_env({"CONDMSG_DESTINATION_QUEUE_TYPE": "stream"})
    # Always explicit, so a vhost whose default type is quorum changes nothing.
    assert destination_arguments("classic") == {"x-queue-type": "classic", "x-max-priority": 10}
    assert destination_arguments("quorum") == {"x-queue-type": "quorum"}


@pytest.mark.rabbitmq
def test_connect_skips_an_address_that_does_not_answer(amqp_url: str) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{_dead_port()}/%2F"
    connection = connect(f"{dead},{amqp_url}")
    try:
        assert connected_address(connection) == "127.0.0.1:5672"
    finally:
        connection.close()


@pytest.mark.rabbitmq
def test_the_publisher_skips_an_address_that_does_not_answer(amqp_url: str) -> None:
    dead = f"amqp://guest:guest@127.0.0.1:{_dead_port()}/%2F"
    publisher = Publisher(f"{dead},{amqp_url}", connect_timeout_s=5).start()
    try:
        assert publisher.alive
        assert publisher.url == amqp_url
    finally:
        publisher.close()


def test_the_publisher_names_every_address_when_none_answers() -> None:
    urls = [f"amqp://guest:pw@127.0.0.1:{_dead_port()}/%2F" for _ in range(2)]
    with pytest.raises(BrokerError) as raised:
        Publisher(",".join(urls), connect_timeout_s=5).start()
    text = str(raised.value)
    assert all(broker_address(u) in text for u in urls) and "pw" not in text
