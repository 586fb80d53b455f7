"""Contract of the receiver's store (ackd.receiver_store.ReceiverStore), run against each
adapter: the portable one on SQLite and on PostgreSQL, the psycopg one on PostgreSQL."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ackd import tables
from ackd.emit import ack_message
from ackd.receiver_store import ReceiverStore, SqlAlchemyReceiverStore, StoreTraits
from ackd.receiver_store_psycopg import PsycopgReceiverStore
from ackd.validation import Inbound
from condmsg.core.acks import AckKind
from condmsg.core.protocol import AckMessage, MessageKind
from outbox.enqueueing import row_values
from outbox.message import OutboxMessage
from outbox.table import create_tables as create_outbox_tables
from outbox.table import outbox_table

pytestmark = pytest.mark.postgres

PREPARED = sa.text("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'condmsg_%'")
REFUSED = "refused-by-trigger"


class _Base(DeclarativeBase):
    pass


class AppRow(_Base):
    """The app's own work, added to the session as the app would (pending until flushed)."""

    __tablename__ = "contract_app_rows"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    note: Mapped[str]


@dataclass(frozen=True)
class Backend:
    engine: sa.Engine
    store: ReceiverStore
    traits: StoreTraits
    psycopg: bool

    @property
    def postgresql(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def count(self, table: sa.Table | str) -> int:
        name = table if isinstance(table, str) else table.name
        with self.engine.connect() as conn:
            return int(conn.scalar(sa.text(f"SELECT count(*) FROM {name}")) or 0)


@pytest.fixture
def backend(adapter_backend: tuple[str, bool]) -> Iterator[Backend]:
    url, psycopg = adapter_backend
    # One connection, as a receiver keeps per reading thread: what one connection has
    # prepared is what the psycopg adapter's later transactions find.
    engine = sa.create_engine(url, pool_size=1, max_overflow=0)
    tables.metadata.create_all(engine)
    create_outbox_tables(engine)
    _Base.metadata.create_all(engine)
    store = PsycopgReceiverStore() if psycopg else SqlAlchemyReceiverStore()
    yield Backend(engine, store, store.attach(engine), psycopg)
    engine.dispose()


def rlog_row(cm_id: str, destination: str = "q", **values: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "cm_id": cm_id,
        "destination": destination,
        "state": "consumed",
        "message_id": f"m-{cm_id}",
        "recipient": "o'brien \\ zoë",  # quotes, backslashes, non-ASCII: literals
        "receiver": "rx-1",
        "sender": "s",
        "read_at": now,
        "transactional": True,
        "updated_at": now,
    } | values


def commit_ack(cm_id: str, routing_key: str = "condmsg.s.ack") -> OutboxMessage:
    inbound = Inbound(
        kind=MessageKind.ORIGINAL,
        cm_id=cm_id,
        destination="q",
        sender="s",
        token="ab" * 32,
        reply_to=routing_key,
    )
    now = datetime.now(UTC)
    return ack_message(
        inbound,
        kind=AckKind.COMMIT,
        read_at=now,
        committed_at=now,
        recipient="o'brien \\ zoë",
        receiver="rx-1",
    )


def new_id() -> str:
    return str(uuid.uuid4())


def test_attaching_reports_how_the_database_runs_writers(backend: Backend) -> None:
    assert backend.traits.row_locks is backend.postgresql
    assert backend.traits.keep_connection is backend.postgresql


def test_an_original_is_claimed_once(backend: Backend) -> None:
    cm_id = new_id()
    with Session(backend.engine) as s, s.begin():
        assert backend.store.claim_original(s, rlog_row(cm_id)) is True
        assert backend.store.claim_original(s, rlog_row(cm_id)) is False
    with Session(backend.engine) as s, s.begin():
        assert backend.store.claim_original(s, rlog_row(cm_id, state="cancelled")) is False
        assert backend.store.claim_original(s, rlog_row(cm_id, destination="other")) is True
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(tables.rlog).order_by(tables.rlog.c.destination)).all()
    assert [(r.destination, r.state, r.recipient) for r in rows] == [
        ("other", "consumed", "o'brien \\ zoë"),
        ("q", "consumed", "o'brien \\ zoë"),
    ]


def test_a_rolled_back_claim_leaves_the_key_free(backend: Backend) -> None:
    cm_id = new_id()
    with Session(backend.engine) as s:
        s.begin()
        assert backend.store.claim_original(s, rlog_row(cm_id)) is True
        s.rollback()
    with Session(backend.engine) as s, s.begin():
        assert backend.store.claim_original(s, rlog_row(cm_id)) is True


def test_compensations_and_notices_are_claimed_once(backend: Backend) -> None:
    cm_id = new_id()
    now = datetime.now(UTC)
    cancelled = {
        "cm_id": cm_id,
        "destination": "q",
        "state": "cancelled",
        "receiver": "rx-1",
        "sender": "s",
        "compensated_at": now,
        "updated_at": now,
    }
    notice = {"cm_id": cm_id, "destination": "q", "kind": "success", "delivered_at": now}
    for _ in range(2):  # a redelivery finds the row its first delivery committed
        with Session(backend.engine) as s, s.begin():
            first = backend.store.claim(s, tables.rlog, cancelled)
            assert backend.store.claim(s, tables.rx_inbox, notice) is first
    assert backend.count(tables.rlog) == backend.count(tables.rx_inbox) == 1
    with Session(backend.engine) as s, s.begin():
        assert backend.store.claim_original(s, rlog_row(cm_id)) is False


def test_a_racing_claim_waits_for_the_first_and_sees_its_outcome(backend: Backend) -> None:
    """A second transaction claiming the same key waits until the first one ends, then
    conflicts if it committed and claims the key if it rolled back (what cancel-out
    relies on); SQLite gets there by running one writer at a time."""
    engine = sa.create_engine(backend.engine.url)  # the racer needs a connection of its own
    try:
        for first_commits in (True, False):
            cm_id = new_id()
            seen: list[bool] = []
            with Session(backend.engine) as first:
                first.begin()
                assert backend.store.claim_original(first, rlog_row(cm_id)) is True

                def race(cm_id: str = cm_id, seen: list[bool] = seen) -> None:
                    with Session(engine) as second, second.begin():
                        seen.append(backend.store.claim_original(second, rlog_row(cm_id)))

                racer = threading.Thread(target=race)
                racer.start()
                racer.join(0.5)
                assert seen == []  # still waiting on the first transaction
                if first_commits:
                    first.commit()
                else:
                    first.rollback()
                racer.join(10)
            assert seen == [not first_commits]
    finally:
        engine.dispose()


def test_a_lock_wait_is_cut_after_the_limit(backend: Backend) -> None:
    cm_id = new_id()
    with Session(backend.engine) as s, s.begin():
        backend.store.claim_original(s, rlog_row(cm_id))
    if not backend.traits.row_locks:
        with Session(backend.engine) as s, s.begin():  # nothing to cut: the call is harmless
            backend.store.limit_lock_wait(s, 100)
        return
    locked = sa.select(tables.rlog).where(tables.rlog.c.cm_id == cm_id).with_for_update()
    engine = sa.create_engine(backend.engine.url)
    try:
        with Session(backend.engine) as holder, holder.begin():
            holder.execute(locked)
            with Session(engine) as waiter, waiter.begin():
                backend.store.limit_lock_wait(waiter, 100)
                with pytest.raises(sa.exc.OperationalError) as cut:
                    waiter.execute(locked)
        assert getattr(cut.value.orig, "sqlstate", None) == "55P03"
    finally:
        engine.dispose()


def test_acks_commit_with_the_claims_and_the_apps_work(backend: Backend) -> None:
    cm_ids = [new_id() for _ in range(3)]
    acks = [commit_ack(cm_id) for cm_id in cm_ids]
    with Session(backend.engine) as s:
        s.begin()
        for cm_id in cm_ids:
            assert backend.store.claim_original(s, rlog_row(cm_id))
        s.add(AppRow(note="the app's own work"))  # pending: flushed by the commit
        backend.store.commit_with_acks(s, acks)
        assert not s.in_transaction()
    table = outbox_table()
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(table).order_by(table.c.id)).mappings().all()
        notes = conn.execute(sa.select(AppRow.note)).scalars().all()
    assert notes == ["the app's own work"]
    assert backend.count(tables.rlog) == 3
    assert [row["message_id"] for row in rows] == [ack.message_id for ack in acks]
    for row, ack in zip(rows, acks, strict=True):
        expected = row_values(ack, row["created_at"])
        assert {column: row[column] for column in expected} == expected
        document = AckMessage.from_json(row["body"])
        assert (document.kind, document.cm_id) == (AckKind.COMMIT, ack.correlation_id)


def test_a_commit_without_acks_commits_the_apps_work(backend: Backend) -> None:
    with Session(backend.engine) as s:
        s.begin()
        s.add(AppRow(note="alone"))
        backend.store.commit_with_acks(s, [])
    assert backend.count(AppRow.__tablename__) == 1
    assert backend.count(outbox_table()) == 0


def test_a_failing_ack_rolls_back_the_whole_transaction(backend: Backend) -> None:
    _refuse_acks_to(backend.engine, REFUSED)
    cm_id = new_id()
    with Session(backend.engine) as s:
        s.begin()
        assert backend.store.claim_original(s, rlog_row(cm_id))
        s.add(AppRow(note="must not stay"))
        with pytest.raises(sa.exc.DBAPIError):
            backend.store.commit_with_acks(s, [commit_ack(cm_id), commit_ack(cm_id, REFUSED)])
        s.rollback()
    assert backend.count(AppRow.__tablename__) == 0
    assert backend.count(outbox_table()) == 0
    assert backend.count(tables.rlog) == 0
    with Session(backend.engine) as s:  # and the connection serves the next transaction
        s.begin()
        assert backend.store.claim_original(s, rlog_row(cm_id))
        backend.store.commit_with_acks(s, [commit_ack(cm_id)])
    assert backend.count(outbox_table()) == 1


def _refuse_acks_to(engine: sa.Engine, routing_key: str) -> None:
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {outbox_table().name} "
                f"WHEN NEW.routing_key = '{routing_key}' BEGIN SELECT RAISE(ABORT, 'no'); END"
            )
            return
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.routing_key = '{routing_key}' THEN RAISE EXCEPTION 'no'; END IF; "
            "RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            f"CREATE TRIGGER refuse BEFORE INSERT ON {outbox_table().name} "
            "FOR EACH ROW EXECUTE FUNCTION refuse()"
        )


def test_a_sequence_part_is_kept_once(backend: Backend) -> None:
    row = {
        "seq_id": new_id(),
        "position": 0,
        "size": 2,
        "queue": "q",
        "headers_json": "{}",
        "properties_json": "{}",
        "body": b"part",
        "received_at": datetime.now(UTC),
    }
    for _ in range(2):  # a redelivered part is ignored
        with Session(backend.engine) as s, s.begin():
            backend.store.store_part(s, row)
    assert backend.count(tables.sequence_parts) == 1


@pytest.mark.parametrize("when", ["between", "inside"])
@pytest.mark.parametrize("how", ["sqlalchemy", "driver"])
def test_prepared_statements_the_server_forgets_cost_no_transaction(
    backend: Backend, when: str, how: str
) -> None:
    """psycopg deallocates every prepared statement after a rollback once it prepared some
    of its own, and an app may deallocate them too, through SQLAlchemy (the psycopg
    adapter sees it) or past it (it does not). Between transactions, the next claim
    prepares them again; inside one, the commit either succeeds or fails whole (and the
    caller's retry succeeds). Every claim ends with exactly one ack."""
    with backend.engine.connect() as conn:  # one connection, as a receiver's thread keeps

        def transaction(cm_id: str, *, forget: bool = False, fails: bool = False) -> None:
            with Session(conn) as s:
                s.begin()
                assert backend.store.claim_original(s, rlog_row(cm_id))
                if forget:
                    _deallocate_all(s, how)
                if not fails:
                    backend.store.commit_with_acks(s, [commit_ack(cm_id)])
                    return
                with pytest.raises(sa.exc.DBAPIError) as failed:
                    backend.store.commit_with_acks(s, [commit_ack(cm_id)])
                assert getattr(failed.value.orig, "sqlstate", None) == "26000"
                s.rollback()
            transaction(cm_id)  # the caller's retry (a receiver requeues the message)

        cm_ids = [new_id() for _ in range(5)]
        for cm_id in cm_ids[:2]:  # the second transaction finds its statements prepared
            transaction(cm_id)
        if when == "between":
            with Session(conn) as s, s.begin():
                _deallocate_all(s, how)
            transaction(cm_ids[2])
        else:
            # Only a fast-path ack finds its statement gone unseen: that commit fails whole.
            transaction(cm_ids[2], forget=True, fails=backend.psycopg and how == "driver")
        for cm_id in cm_ids[3:]:
            transaction(cm_id)
        if backend.postgresql:
            # Prepared again (the psycopg adapter's) or never (the portable one).
            assert bool(conn.scalar(PREPARED)) is backend.psycopg
            conn.rollback()
    assert backend.count(tables.rlog) == 5
    table = outbox_table()
    with backend.engine.connect() as conn:
        acked = conn.execute(sa.select(table.c.correlation_id)).scalars().all()
    assert sorted(acked) == sorted(cm_ids)


def _deallocate_all(session: Session, how: str) -> None:
    """``DEALLOCATE ALL`` through SQLAlchemy or past it (on SQLite: nothing to forget)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    if how == "sqlalchemy":
        session.execute(sa.text("DEALLOCATE ALL"))
    else:
        session.connection().connection.driver_connection.execute("DEALLOCATE ALL")  # type: ignore[union-attr]
