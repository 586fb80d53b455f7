"""The evaluator against poison: an ack it cannot take (undecodable, over-long fields, or
one that fails its batch for any reason) is dead-lettered alone, with a reason, and never
holds back the good acks batched beside it; a batch that fails because the database is
unreachable is handed back after a backoff, neither split nor dead-lettered; a due CM that
cannot be judged is parked without holding back the others."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator import store as evaluator_store
from evaluator.config import EvaluatorConfig
from evaluator.failures import is_transient
from evaluator.service import Evaluator
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import SECRET, get_all
from tests.integration.evaluator import test_evaluator_intake as intake_tests
from tests.integration.evaluator.test_evaluator_intake import Store, ack
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres]


# The intake tests' stores (a sender, its engine and a settable clock).
make_store = intake_tests.make_store
store = intake_tests.store


NESTED = b'{"v":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _dead_letters(s: Store) -> list[Any]:
    outbox = outbox_table()
    return s.rows(outbox, outbox.c.routing_key == protocol.dead_letter_queue(s.name))


@pytest.mark.rabbitmq
def test_poison_acks_never_hold_back_the_genuine_ones(
    pg_url: str, make_store: Any, amqp_url: str
) -> None:
    """A deeply nested body and acks with an over-long id and destination, published among
    genuine acks: every genuine ack is stored and its CM decided at once, the poison ones
    are in the dead-letter queue with a reason, and the service keeps taking acks."""
    s = make_store(pg_url)
    q = s.queue
    s.clock.at = utcnow()
    quick = Destination(q, pickup_within=timedelta(minutes=5))
    cms = [s.sender.send(b"x", quick) for _ in range(40)]
    now = s.clock.at
    poison = [
        NESTED,
        ack(cms[0], q, now, ack_id="a" * 65),
        ack(cms[1], "d" * 300, now),
    ]
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=s.name,
            secret=SECRET,
            batch_size=20,
            prefetch=40,
            sweep_interval_s=3600,
        ),
        engine=s.engine,
        clock=s.clock,
    )
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(s.name))
        declare_service_queue(channel, protocol.dead_letter_queue(s.name))
        channel.queue_declare(q)
        bodies = [ack(c, q, now) for c in cms]
        for i, body in enumerate(poison):  # spread over the first batches
            bodies.insert(7 * i + 3, body)
        for body in bodies:
            channel.basic_publish("", protocol.ack_queue(s.name), body)
        with service:

            def satisfied() -> float | None:
                return service.registry.get_sample_value(
                    "condmsg_evaluator_decisions_total", {"verdict": "satisfied"}
                )

            wait_for(lambda: satisfied() == len(cms), timeout=30)
            dead: list[tuple[Any, bytes]] = []

            def dead_lettered() -> bool:
                dead.extend(get_all(channel, protocol.dead_letter_queue(s.name), settle_s=0.1))
                return len(dead) >= len(poison)

            wait_for(dead_lettered, timeout=30)
            assert service.running
            # Still taking acks: a CM sent now is decided by its ack.
            later = s.sender.send(b"x", quick)
            channel.basic_publish("", protocol.ack_queue(s.name), ack(later, q, s.clock.at))
            wait_for(lambda: satisfied() == len(cms) + 1, timeout=30)
        remaining = channel.queue_declare(protocol.ack_queue(s.name), passive=True).method
        assert remaining.message_count == 0
    reasons = {body: props.headers[protocol.H_REASON] for props, body in dead}
    assert set(reasons) == set(poison)
    assert reasons[NESTED]  # the codec's words (or "undecodable: RecursionError...")
    assert "'ack_id'" in reasons[poison[1]] and "64" in reasons[poison[1]]
    assert "'destination'" in reasons[poison[2]] and "255" in reasons[poison[2]]
    assert {r.state for r in s.rows(tables.cms)} == {"satisfied"}
    assert len(s.rows(tables.acks)) == len(cms) + 1


def test_a_batch_failing_for_one_message_is_stored_in_halves(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure not tied to any one message by the store (here the batch INSERT raises
    whenever one particular ack is in it): the batch is split down to that message, which
    is dead-lettered with the exception as its reason, and every other ack is stored."""
    s = store
    q = s.queue
    sent = s.clock.at
    quick = Destination(q, pickup_within=timedelta(seconds=10))
    cms = [s.sender.send(b"x", quick) for _ in range(16)]
    s.clock.at = sent + timedelta(seconds=1)
    bodies = [ack(c, q, sent + timedelta(milliseconds=500)) for c in cms]
    poisoned = protocol.AckMessage.from_json(bodies[5]).ack_id
    evaluator = s.evaluator()
    insert = evaluator.store.decisions.insert_acks
    tries: list[int] = []

    def failing_insert(session: Any, rows: Any) -> set[str]:
        if any(row["ack_id"] == poisoned for row in rows):
            tries.append(len(rows))
            raise ValueError("this row breaks the statement")
        return insert(session, rows)

    monkeypatch.setattr(evaluator.store.decisions, "insert_acks", failing_insert)
    assert evaluator.batches.store(bodies)
    assert len(tries) <= 5  # log2(16) + 1: 16, 8, 4, 2, 1
    states = {r.cm_id: r.state for r in s.rows(tables.cms)}
    assert [c for c in cms if states[c] != "satisfied"] == [cms[5]]
    (dead,) = _dead_letters(s)
    assert dead.body == bodies[5]
    assert dead.headers[protocol.H_REASON] == (
        "could not be stored: ValueError: this row breaks the statement"
    )
    sample = evaluator.registry.get_sample_value
    assert sample("condmsg_evaluator_dead_letters_total") == 1
    assert sample("condmsg_evaluator_decisions_total", {"verdict": "satisfied"}) == 15


def test_a_batch_failing_because_the_database_is_away_is_retried_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost connection says nothing about the acks: the batch is handed back whole
    (neither split nor dead-lettered), after a wait that doubles while it lasts."""
    s = store
    q = s.queue
    sent = s.clock.at
    quick = Destination(q, pickup_within=timedelta(seconds=10))
    cms = [s.sender.send(b"x", quick) for _ in range(4)]
    s.clock.at = sent + timedelta(seconds=1)
    bodies = [ack(c, q, sent + timedelta(milliseconds=500)) for c in cms]
    evaluator = s.evaluator()
    insert = evaluator.store.decisions.insert_acks
    outages = [2]
    tries: list[int] = []

    def blinking_insert(session: Any, rows: Any) -> set[str]:
        tries.append(len(rows))
        if outages[0]:
            outages[0] -= 1
            raise sa.exc.OperationalError(
                "INSERT", {}, ConnectionResetError("server closed the connection"), True
            )
        return insert(session, rows)

    monkeypatch.setattr(evaluator.store.decisions, "insert_acks", blinking_insert)
    first_delay = evaluator.batches.retries.upcoming_s
    assert not evaluator.batches.store(bodies)
    evaluator.batches.retries.wait()  # what the storing thread does before handing it back
    assert evaluator.batches.retries.upcoming_s == 2 * first_delay
    assert not evaluator.batches.store(bodies)
    assert tries == [4, 4]  # never split
    assert evaluator.batches.store(bodies)
    assert evaluator.batches.retries.upcoming_s == first_delay
    assert not _dead_letters(s)
    assert {r.state for r in s.rows(tables.cms)} == {"satisfied"}


def test_what_counts_as_transient() -> None:
    invalidated = sa.exc.OperationalError("x", {}, Exception("gone"), True)
    assert is_transient(invalidated)
    assert is_transient(sa.exc.OperationalError("x", {}, Exception("refused")))
    assert is_transient(pika.exceptions.AMQPConnectionError())
    assert not is_transient(sa.exc.DataError("x", {}, Exception("value too long")))
    assert not is_transient(RecursionError())

    class Truncated(Exception):
        sqlstate = "22001"

    class Deadlock(Exception):
        sqlstate = "40P01"

    class UndefinedColumn(Exception):
        sqlstate = "42703"

    class Duplicate(Exception):
        sqlstate = "23505"

    assert not is_transient(sa.exc.OperationalError("x", {}, Truncated()))
    assert not is_transient(sa.exc.IntegrityError("x", {}, Duplicate()))
    assert is_transient(sa.exc.OperationalError("x", {}, Deadlock()))
    # A schema that is not what the evaluator expects is no ack's fault: dead-lettering
    # every ack in turn would lose them all, so the batch waits for the operator.
    assert is_transient(sa.exc.ProgrammingError("x", {}, UndefinedColumn()))
    # SQLAlchemy's own errors about connections and sessions, and the operating system's.
    assert is_transient(sa.exc.TimeoutError("QueuePool limit reached"))
    assert is_transient(sa.exc.PendingRollbackError("roll back first"))
    assert is_transient(ConnectionResetError())
    # A value that could not be bound is the ack's.
    assert not is_transient(sa.exc.StatementError("x", "INSERT", {}, ValueError("bad")))


@pytest.mark.parametrize(
    ("name", "value", "limit"),
    [
        ("ack_id", "a" * 65, 64),
        ("cm_id", None, 36),
        ("destination", "d" * 256, 255),
        ("recipient", "r" * 256, 255),
        ("receiver", "x" * 256, 255),
    ],
)
def test_an_over_long_ack_field_is_dead_lettered_naming_it(
    store: Store, name: str, value: str | None, limit: int
) -> None:
    """Each ack field is checked against its column before the INSERT: an over-long one
    is dead-lettered with a reason naming the field, and the batch's other acks count."""
    s = store
    q = s.queue
    sent = s.clock.at
    quick = Destination(q, pickup_within=timedelta(seconds=10))
    good, target = s.sender.send(b"x", quick), s.sender.send(b"x", quick)
    s.clock.at = sent + timedelta(seconds=1)
    read = sent + timedelta(milliseconds=500)
    fields: dict[str, Any] = {"cm_id": target, "destination": q, "recipient": None}
    fields[name] = value if value is not None else target + "-x"  # None: the CM id
    token = protocol.copy_token(SECRET, fields["cm_id"], fields["destination"], fields["recipient"])
    extra = {k: v for k, v in fields.items() if k not in ("cm_id", "destination")}
    bad = ack(fields["cm_id"], fields["destination"], read, token=token, **extra)
    assert s.evaluator().process_bodies([ack(good, q, read), bad]) == 1
    (dead,) = _dead_letters(s)
    assert dead.body == bad
    assert (
        f"{name!r}" in dead.headers[protocol.H_REASON]
        and str(limit) in dead.headers[protocol.H_REASON]
    )
    assert [r.cm_id for r in s.rows(tables.acks)] == [good]


def test_a_due_cm_that_cannot_be_judged_never_holds_back_the_others(store: Store) -> None:
    """A stored condition that no longer decodes (written by an older, laxer release, or
    by hand) fails its sweep batch: the batch is judged again CM by CM, the others are
    decided, and the bad one is parked for later and counted."""
    s = store
    q = s.queue
    sent = s.clock.at
    timeout = Destination(q, pickup_within=timedelta(seconds=1))
    good = [s.sender.send(b"x", timeout) for _ in range(3)]
    bad = s.sender.send(b"x", timeout)
    with s.engine.begin() as conn:
        conn.execute(
            sa.update(tables.cms)
            .where(tables.cms.c.cm_id == bad)
            .values(condition_json='{"schema": 1}')
        )
    evaluator_store.parse_condition.cache_clear()
    s.clock.at = sent + timedelta(seconds=5)
    evaluator = s.evaluator()
    assert evaluator.sweep() == len(good)
    states = {r.cm_id: r for r in s.rows(tables.cms)}
    assert {cm: states[cm].state for cm in good} == dict.fromkeys(good, "violated")
    assert states[bad].state == "pending"
    parked_until = states[bad].next_check_at
    assert parked_until is not None
    assert parked_until.replace(tzinfo=UTC) > s.clock.at  # not due again at once
    assert evaluator.metrics.parked._value.get() == 1
