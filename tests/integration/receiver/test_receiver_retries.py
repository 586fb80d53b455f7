"""The receiver's retries of a failed attempt: after a bounded backoff, so a short hiccup
does not make a poison message, and a message that always fails is dead-lettered after its
maximum attempts in bounded time, even while the database cannot count them."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.tables import poison
from tests.integration.condmsg_helpers import (
    app_metadata,
    app_rows,
    get_all,
    handled_rows,
    invalid_reasons,
    publish_original,
    receiver_queue,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def test_a_half_second_hiccup_does_not_make_a_poison_message(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url, app_tables=app_metadata)  # default retry settings
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)
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
    assert app_rows(receiver.engine) == [(cm_id, "original")]
    assert get_all(channel, receiver.invalid_queue, settle_s=0.1) == []
    assert 2 <= len(attempts) < receiver.max_attempts
    pauses = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert all(b > a for a, b in itertools.pairwise(pauses)), pauses  # exponential


def test_a_message_that_always_fails_is_dead_lettered_after_max_attempts_in_bounded_time(
    db_url: str, unique_name: str, make_receiver: Any, channel: Any
) -> None:
    receiver = make_receiver(db_url)  # default retry settings
    queue = receiver_queue(receiver, unique_name)
    publish_original(channel, queue)
    attempts: list[float] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(time.monotonic())
        raise ValueError("cannot parse the meeting")

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
    assert len(attempts) == receiver.max_attempts
    # Bounded time: the message is held back only for the pauses its policy sets, each at
    # least as long as asked (the backoff paused between attempts), and their sum is a few
    # seconds (0.2 + 0.4 + 0.8 + 1.6 by default): after the last attempt it is dead-lettered.
    policy = receiver.config.retry
    asked = [policy.delay_s(n) for n in range(1, policy.max_attempts)]
    pauses = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert all(pause >= delay for pause, delay in zip(pauses, asked, strict=True)), pauses
    assert sum(asked) < 5
    reasons = invalid_reasons(channel, receiver)
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
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)

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
    queue = receiver_queue(receiver, unique_name)
    cm_id = publish_original(channel, queue)

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise sa.exc.OperationalError("UPDATE", {}, Exception("the database is restarting"))

    monkeypatch.setattr(receiver._attempts, "_write", unreachable)
    attempts: list[str] = []

    def handler(message: Any, session: Session | None) -> None:
        attempts.append(message.cm_id)
        raise ValueError("cannot parse the meeting")

    assert receiver.consume(queue, handler, idle_timeout_s=2.0) == 0
    assert attempts == [cm_id] * receiver.max_attempts
    reasons = invalid_reasons(channel, receiver)
    assert len(reasons) == 1
    assert "processing failed 5 times" in reasons[0]
