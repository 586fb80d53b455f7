"""A receiver refuses a recipient identity that its acks could not carry."""

from __future__ import annotations

import pytest

from ackd.receiver import Receiver
from condmsg import protocol as p
from condmsg.errors import ConfigError


@pytest.mark.parametrize(
    ("recipient", "says"),
    [
        ("x" * (p.MAX_NAME_CHARS + 1), "longer than 255"),
        ("alice\x00", "NUL"),
        ("bob\x1f", "control character"),
    ],
)
def test_a_recipient_no_ack_could_carry_is_refused(recipient: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Receiver(amqp_url="amqp://unused", db_url="sqlite://", recipient=recipient)


def test_a_receiver_id_no_ack_could_carry_is_refused() -> None:
    with pytest.raises(ConfigError, match="receiver id is longer than 255"):
        Receiver(amqp_url="amqp://unused", db_url="sqlite://", recipient="r", receiver_id="x" * 256)


def test_the_default_receiver_id_fits_an_ack_whatever_the_recipient() -> None:
    recipient = "r" * p.MAX_NAME_CHARS
    rx = Receiver(amqp_url="amqp://unused", db_url="sqlite://", recipient=recipient)
    try:
        assert len(rx.receiver_id) <= p.MAX_NAME_CHARS
        short = Receiver(amqp_url="amqp://unused", db_url="sqlite://", recipient="alice")
        assert short.receiver_id.endswith(":alice")
        short.close()
    finally:
        rx.close()
