"""Contract tests of the outbox store, run against SQLite and the real PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxMessage, OutboxStore, OutboxTypeError, OutboxValueError, StoreError
from outbox.enqueueing import enqueue_all, enqueue_fanouts
from outbox.message import Fanout
from outbox.notify import Listener
from tests.integration.outbox_helpers import fanout, message_fields
from tests.waiting import wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url)
    outbox.create_tables(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: sa.Engine) -> OutboxStore:
    return OutboxStore(engine)


def add(engine: sa.Engine, n: int, **kw: object) -> list[int]:
    with Session(engine) as s, s.begin():
        return outbox.enqueue_many(
            s,
            [
                OutboxMessage(exchange="", routing_key="q", body=f"{i}".encode(), **kw)  # type: ignore[arg-type]
                for i in range(n)
            ],
        )


def test_enqueue_commits_only_with_the_callers_transaction(
    engine: sa.Engine, store: OutboxStore
) -> None:
    with Session(engine) as s:
        s.begin()
        outbox.enqueue(s, exchange="", routing_key="q", body=b"x")
        s.rollback()
    assert store.status().pending == 0
    with Session(engine) as s:
        s.begin()
        outbox.enqueue(s, exchange="", routing_key="q", body=b"x")
        assert store.status().pending == 0 or engine.dialect.name == "sqlite"
        s.commit()
    assert store.status().pending == 1


def test_business_row_and_outbox_row_share_one_transaction(engine: sa.Engine) -> None:
    md = sa.MetaData()
    orders = sa.Table("orders", md, sa.Column("id", sa.Integer, primary_key=True))
    md.create_all(engine)

    def failing_business_transaction() -> None:
        with Session(engine) as s, s.begin():
            s.execute(orders.insert().values(id=1))
            outbox.enqueue(s, exchange="", routing_key="q", body=b"order 1")
            raise RuntimeError("business failure")

    with pytest.raises(RuntimeError):
        failing_business_transaction()
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(orders)) == 0
    with Session(engine) as s, s.begin():
        s.execute(orders.insert().values(id=2))
        outbox.enqueue(s, exchange="", routing_key="q", body=b"order 2")
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(orders)) == 1
    assert OutboxStore(engine).status().pending == 1


def test_own_metadata_gets_the_table_and_trigger(db_url: str) -> None:
    eng = sa.create_engine(db_url)
    md = sa.MetaData()
    table = outbox.outbox_table("their_outbox", metadata=md)
    md.create_all(eng)
    with Session(eng) as s, s.begin():
        outbox.enqueue(s, exchange="", routing_key="q", body=b"x", table_name=table.name)
    assert OutboxStore(eng, table_name="their_outbox").status().pending == 1
    assert not sa.inspect(eng).has_table(outbox.DEFAULT_TABLE_NAME)
    eng.dispose()


def test_bad_body_is_rejected_before_anything_is_written(
    engine: sa.Engine, store: OutboxStore
) -> None:
    with Session(engine) as s, s.begin():
        with pytest.raises(OutboxTypeError, match="body must be bytes"):
            outbox.enqueue(s, exchange="", routing_key="q", body="text")  # type: ignore[arg-type]
        outbox.enqueue(s, exchange="", routing_key="q", body=b"fine")
    assert store.status().pending == 1


def test_enqueue_many_returns_ids_in_order_and_claim_round_trips_properties(
    engine: sa.Engine, store: OutboxStore
) -> None:
    messages = [
        OutboxMessage(
            exchange="ex",
            routing_key=f"rk{i}",
            body=bytes([i, 0, 255]),
            message_id=f"m{i}",
            correlation_id="c",
            reply_to="r",
            content_type="application/octet-stream",
            content_encoding="identity",
            message_type="t",
            headers={"i": i, "nested": {"a": [1, 2]}},
            priority=i,
            expiration_ms=1000 + i,
            persistent=i % 2 == 0,
            mandatory=i % 3 == 0,
        )
        for i in range(5)
    ]
    with Session(engine) as s, s.begin():
        ids = outbox.enqueue_many(s, messages)
        assert outbox.enqueue_many(s, []) == []
    assert ids == sorted(ids)
    assert len(set(ids)) == 5
    claim = store.claim(10)
    assert [r.id for r in claim.rows] == ids
    assert [r.message for r in claim.rows] == messages
    assert all(r.attempts == 0 and r.created_at.tzinfo is not None for r in claim.rows)
    store.release(claim)


def test_claim_respects_limit_cursor_and_order(engine: sa.Engine, store: OutboxStore) -> None:
    ids = add(engine, 10)
    first = store.claim(4)
    assert [r.id for r in first.rows] == ids[:4]
    store.release(first)
    after = store.claim(4, after_id=ids[5])
    assert [r.id for r in after.rows] == ids[6:10]
    store.release(after)


def test_settle_deletes_parks_and_defers(engine: sa.Engine, store: OutboxStore) -> None:
    ids = add(engine, 4)
    claim = store.claim(10)
    later = datetime.now(UTC) + timedelta(hours=1)
    store.settle(
        claim,
        published=ids[:2],
        parked={ids[2]: "unroutable: 312 NO_ROUTE"},
        retry={ids[3]: ("nacked", later)},
    )
    status = store.status()
    assert (status.pending, status.failed) == (1, 1)
    assert status.oldest_pending_id == ids[3]
    assert status.oldest_pending_age_s is not None and status.oldest_pending_age_s >= 0
    assert store.claim(10).rows == []  # the deferred row is not due yet
    [failed] = store.failed_rows()
    assert (failed.id, failed.attempts, failed.last_error) == (
        ids[2],
        1,
        "unroutable: 312 NO_ROUTE",
    )
    assert failed.failed_at is not None and failed.failed_at.tzinfo is not None
    assert store.requeue_failed() == 1
    claim = store.claim(10)
    assert [(r.id, r.attempts) for r in claim.rows] == [(ids[2], 0)]
    store.settle(claim, published=[], parked={ids[2]: "again"})
    assert store.delete_failed(batch=1) == 1
    assert store.status().failed == 0


def test_release_gives_rows_back(engine: sa.Engine, store: OutboxStore) -> None:
    ids = add(engine, 3)
    claim = store.claim(10)
    store.release(claim)
    claim = store.claim(10)
    assert [r.id for r in claim.rows] == ids
    store.settle(claim, published=ids)
    assert store.status().pending == 0


def test_create_tables_is_idempotent_and_missing_tables_are_explained(engine: sa.Engine) -> None:
    outbox.create_tables(engine)
    with pytest.raises(StoreError, match=r"create_tables\(engine, table_name='nope'\)"):
        OutboxStore(engine, table_name="nope").status()


def test_postgres_claims_skip_rows_locked_by_another_relay(pg_url: str) -> None:
    eng = sa.create_engine(pg_url)
    outbox.create_tables(eng)
    ids = add(eng, 6)
    a, b = OutboxStore(eng), OutboxStore(eng)
    first = a.claim(4)
    second = b.claim(4)
    assert [r.id for r in first.rows] == ids[:4]
    assert [r.id for r in second.rows] == ids[4:]
    # A relay that dies: its connection goes away, PostgreSQL releases its locks at once.
    assert first._conn is not None
    first._conn.invalidate()
    third = b.claim(10)
    assert [r.id for r in third.rows] == ids[:4]
    b.settle(third, published=ids[:4])
    b.settle(second, published=ids[4:])
    assert a.status().pending == 0
    eng.dispose()


def test_postgres_a_claim_is_a_lease_that_ends_when_its_relay_stops_talking(
    pg_url: str,
) -> None:
    eng = sa.create_engine(pg_url, pool_pre_ping=True)
    outbox.create_tables(eng)
    ids = add(eng, 3)
    stalled, other = OutboxStore(eng, lease_timeout_s=0.3), OutboxStore(eng)
    held = stalled.claim(10)
    assert [r.id for r in held.rows] == ids
    assert held._conn is not None
    settings = held._conn.exec_driver_sql(
        "SELECT current_setting('idle_in_transaction_session_timeout'),"
        " current_setting('synchronous_commit')"
    ).one()
    assert tuple(settings) == ("300ms", "off")  # the claim's own, for its transaction only
    assert other.claim(10).rows == []
    # The stalled relay says nothing more: the server ends its session, rows come back.
    deadline = time.monotonic() + 10
    again = other.claim(10)
    while not again.rows and time.monotonic() < deadline:
        time.sleep(0.05)
        again = other.claim(10)
    assert [r.id for r in again.rows] == ids
    other.settle(again, published=ids)
    with eng.connect() as conn:  # a pooled connection keeps the server's defaults
        after = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
    assert after == "on"
    stalled.release(held)
    eng.dispose()


def test_postgres_notify_arrives_on_commit_only(pg_url: str) -> None:
    eng = sa.create_engine(pg_url)
    outbox.create_tables(eng)
    store = OutboxStore(eng)
    channel = store.notify_channel()
    assert channel is not None
    woken = threading.Event()
    listener = Listener(eng, channel, woken.set).start()
    try:
        assert listener.listening.wait(10)
        assert woken.wait(5)  # the wake-up after (re)connecting
        woken.clear()
        with Session(eng) as s:
            s.begin()
            outbox.enqueue(s, exchange="", routing_key="q", body=b"x")
            s.rollback()
        # Nothing committed: a notification would have to arrive in this window.
        assert not woken.wait(0.5)
        with Session(eng) as s, s.begin():
            outbox.enqueue(s, exchange="", routing_key="q", body=b"x")
        assert woken.wait(5)
    finally:
        listener.stop()
        eng.dispose()


def test_enqueue_all_stores_shared_and_varying_columns_exactly(
    engine: sa.Engine, store: OutboxStore
) -> None:
    """A batch whose rows share some properties and differ in others reads back row by
    row as enqueued (PostgreSQL binds a shared property once)."""
    messages = [
        OutboxMessage(
            exchange="",
            routing_key="q",
            body=f"body {i}".encode(),
            message_id=f"m{i}",
            reply_to="acks",
            content_type="text/plain",
            headers={"n": i, "same": "yes"},
            priority=i % 3 if i < 2 else None,
            expiration_ms=None,
            persistent=i != 1,
        )
        for i in range(3)
    ]
    with Session(engine) as s, s.begin():
        assert enqueue_all(s, messages) == 3
    claim = store.claim(10)
    store.release(claim)  # a claim holds its rows' locks until released
    assert [row.message for row in claim.rows] == messages
    with Session(engine) as s, s.begin():  # every property shared but the bodies and ids
        enqueue_all(s, [OutboxMessage(exchange="", routing_key="q", body=b"a")] * 2)
    claim = store.claim(10, after_id=0)
    store.release(claim)
    assert [row.message.body for row in claim.rows][-2:] == [b"a", b"a"]


def test_a_fanout_is_one_row_that_expands_to_its_messages(engine: sa.Engine) -> None:
    group = fanout("q0", "q1", "q2")
    single = OutboxMessage(exchange="", routing_key="solo", body=b"alone")
    base = OutboxMessage(exchange="", routing_key="solo", body=b"alone", headers={"s": 0})
    stated = Fanout(base, ({"routing_key": "solo2", "headers": {"h": 1}},))
    with Session(engine) as s, s.begin():
        assert enqueue_fanouts(s, [group, [single], stated]) == 5
    store = OutboxStore(engine)
    claim = store.claim(10)
    fan, plain, one = claim.rows
    assert (len(fan.copies), plain.copies, one.copies) == (3, (), ())
    assert claim.messages == 5
    assert (one.message.routing_key, one.message.headers) == ("solo2", {"s": 0, "h": 1})
    expanded = fan.expand()
    assert [n for n, _ in expanded] == [0, 1, 2]
    assert [message_fields(m) for _, m in expanded] == [message_fields(m) for m in group]
    # 1 and True are different JSON values: neither is taken for a shared header.
    assert "flag" not in (fan.message.headers or {})
    assert fan.message.headers == {"cm": "cm-1"}
    assert plain.expand() == [(None, plain.message)]
    store.settle(claim, published=[fan.id, plain.id, one.id])
    assert store.status().pending == 0


def test_a_fanout_needs_one_body(engine: sa.Engine) -> None:
    other = OutboxMessage(exchange="", routing_key="q1", body=b"different")
    with Session(engine) as s, s.begin(), pytest.raises(OutboxValueError, match="one body"):
        enqueue_fanouts(s, [[fanout("q0")[0], other]])


def test_partial_settle_writes_back_exactly_the_unpublished_copies(engine: sa.Engine) -> None:
    group = fanout("q0", "q1", "q2", "q3")
    with Session(engine) as s, s.begin():
        enqueue_fanouts(s, [group])
    store = OutboxStore(engine)
    claim = store.claim(10)
    [row] = claim.rows
    later = datetime.now(UTC) + timedelta(hours=1)
    store.settle(
        claim,
        published=[(row.id, 0), (row.id, 2)],
        parked={(row.id, 1): "unroutable: 312 NO_ROUTE"},
        retry={(row.id, 3): ("nacked", later)},
    )
    status = store.status()
    assert (status.pending, status.failed) == (1, 1)
    [failed] = store.failed_rows()
    assert (failed.id, failed.attempts, failed.routing_key) == (row.id, 1, "q0")
    assert failed.last_error == "unroutable: 312 NO_ROUTE"
    assert store.claim(10).rows == []  # the retried copy is not due yet
    store.requeue_failed()
    again = store.claim(10)
    [back] = again.rows
    assert back.id == row.id
    [(n, message)] = back.expand()
    # Copy 1 keeps its number (consumers de-duplicate on row id and copy number).
    assert n == 1 and message_fields(message) == message_fields(group[1])
    store.settle(again, published=[(row.id, 1)])
    with engine.begin() as conn:
        left = conn.execute(sa.select(outbox.outbox_table().c.copies)).scalars().all()
    assert [[c["n"] for c in cs] for cs in left] == [[3]]


def test_a_claim_that_dies_gives_back_every_copy(pg_url: str) -> None:
    eng = sa.create_engine(pg_url)
    outbox.create_tables(eng)
    with Session(eng) as s, s.begin():
        enqueue_fanouts(s, [fanout("q0", "q1", "q2")])
    a, b = OutboxStore(eng), OutboxStore(eng)
    first = a.claim(10)
    assert first._conn is not None
    first._conn.invalidate()  # the relay died after publishing, before settling
    again = b.claim(10)
    [row] = again.rows
    assert [n for n, _ in row.expand()] == [0, 1, 2]
    b.settle(again, published=[row.id])
    assert b.status().pending == 0
    eng.dispose()


def _create_old_table(engine: sa.Engine, name: str) -> None:
    """The table as versions before fan-outs created it: no ``copies`` column."""
    old = sa.MetaData()
    columns = [
        sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in outbox.outbox_table().columns
        if c.name != "copies"
    ]
    sa.Table(name, old, *columns).create(engine)


def _lock_waits(engine: sa.Engine) -> int:
    """Backends of this database waiting for a lock (PostgreSQL)."""
    with engine.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).scalar_one()
        )


def test_create_tables_adds_the_copies_column_to_an_old_table_under_racing_creators(
    db_url: str,
) -> None:
    eng = sa.create_engine(db_url)
    name = "ob_old_layout"
    _create_old_table(eng, name)
    errors: list[BaseException] = []

    def create() -> None:
        try:
            outbox.create_tables(eng, table_name=name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    # A adds the column and holds its transaction open; B starts meanwhile, and A commits
    # only once B is in the race: once B has sent a statement that waits for A (on
    # PostgreSQL seen as a lock wait; SQLite's file lock shows in no catalog, so there
    # once B has sent its first statement, which waits for A's write lock).
    waiting = threading.Event()

    def sent(conn: sa.Connection, *rest: object) -> None:
        if conn is not a:
            waiting.set()

    with eng.connect() as a:
        with a.begin():
            outbox.create_tables(a, table_name=name)
            sa.event.listen(eng, "before_cursor_execute", sent)
            other = threading.Thread(target=create)
            other.start()
            assert waiting.wait(30), "the second creator never reached its racing statement"
            if eng.dialect.name == "postgresql":
                wait_for(lambda: _lock_waits(eng) > 0, timeout=30, what="B waiting on A's lock")
        other.join(30)
    sa.event.remove(eng, "before_cursor_execute", sent)
    assert errors == []
    columns = [c["name"] for c in sa.inspect(eng).get_columns(name)]
    assert columns.count("copies") == 1
    with Session(eng) as s, s.begin():
        enqueue_fanouts(s, [fanout("q0", "q1")], table_name=name)
    store = OutboxStore(eng, table_name=name)
    claim = store.claim(10)
    [row] = claim.rows
    assert [n for n, _ in row.expand()] == [0, 1]
    store.settle(claim, published=[row.id])
    eng.dispose()
