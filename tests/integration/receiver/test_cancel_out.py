"""Cancel-out through the receiver log (DESIGN invariant 3), sequential and raced."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from condmsg.core.protocol import MessageKind
from tests.integration.cancel_out_race import run_cancel_out_race, send_compensation
from tests.integration.condmsg_helpers import publish_original
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def test_compensation_after_the_read_reaches_the_app_once(
    db_url: str, unique_name: str, make_either_receiver: Any, channel: Any
) -> None:
    receiver = make_either_receiver(db_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    cm_id = str(uuid.uuid4())
    publish_original(channel, queue, cm_id)
    first = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert first.kind is MessageKind.ORIGINAL
    send_compensation(channel, queue, cm_id)
    send_compensation(channel, queue, cm_id)  # a duplicate compensation is dropped
    second = wait_for(lambda: receiver.read(queue, timeout=0.5))
    assert (second.kind, second.cm_id, second.payload) == (
        MessageKind.COMPENSATION,
        cm_id,
        b"undo",
    )
    assert receiver.read(queue, timeout=0.5) is None
    assert receiver.stats.duplicates == 1


def test_compensation_before_the_read_cancels_both(
    db_url: str, unique_name: str, make_either_receiver: Any, channel: Any
) -> None:
    receiver = make_either_receiver(db_url)
    queue = f"{unique_name}.q"
    receiver._broker.ensure_queue(queue)
    cm_id = str(uuid.uuid4())
    publish_original(channel, queue, cm_id)
    send_compensation(channel, queue, cm_id)
    # The compensation's top priority makes it overtake the unread original.
    assert receiver.read(queue, timeout=1.0) is None
    assert receiver.stats.cancelled == 1
    assert receiver.stats.discards == 1
    assert receiver.stats.delivered == 0


def test_cancel_out_race_between_competing_consumers(
    pg_url: str, unique_name: str, make_either_receiver: Any, channel: Any
) -> None:
    """Two transactional consumers compete for a queue; every trial is steered to one of
    the race's endings (see ``cancel_out_race``) and the app must see exactly that story."""
    queue = f"{unique_name}.q"
    consumers = [
        make_either_receiver(pg_url, f"controller-{i}", poll_interval_s=0.005) for i in (1, 2)
    ]
    consumers[0]._broker.ensure_queue(queue)
    endings = run_cancel_out_race(consumers, queue, channel)
    assert endings == {"both": 10, "neither": 20}
