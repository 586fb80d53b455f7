"""Contract of :class:`evaluator.store.DecisionStore`, run against every adapter: the
portable one on SQLite and on PostgreSQL, the psycopg one on PostgreSQL.

The racing tests need row locks, which only PostgreSQL has (on SQLite a transaction's
write lock keeps every other writer out, whatever the adapter does).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Destination, tables
from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_to_json
from condmsg.runtime.db import make_engine
from condmsg.tables import create_tables
from evaluator.store import CompensationRow, CopyRow, DecisionStore, to_utc
from evaluator.store_psycopg import PsycopgDecisionStore
from evaluator.store_sqlalchemy import SqlAlchemyDecisionStore

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
SEC = timedelta(seconds=1)
CONDITION = Destination("q", pickup_within=timedelta(seconds=10))


@pytest.fixture
def engine(adapter_backend: tuple[str, bool]) -> Iterator[sa.Engine]:
    eng = make_engine(adapter_backend[0])
    create_tables(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def store(adapter_backend: tuple[str, bool]) -> DecisionStore:
    return PsycopgDecisionStore() if adapter_backend[1] else SqlAlchemyDecisionStore()


def _postgres_only(engine: sa.Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("row locks: PostgreSQL only")


def add_cm(engine: sa.Engine, cm_id: str, **columns: Any) -> None:
    row = {
        "cm_id": cm_id,
        "sender": "s",
        "sent_at": T0,
        "condition_json": condition_to_json(CONDITION),
        "evaluation_deadline": T0 + 10 * SEC,
    }
    with engine.begin() as conn:
        conn.execute(sa.insert(tables.cms), [row | columns])


def ack_row(ack_id: str, cm_id: str, **columns: Any) -> dict[str, Any]:
    return {
        "ack_id": ack_id,
        "cm_id": cm_id,
        "destination": "q",
        "recipient": None,
        "receiver": "rx",
        "kind": "read",
        "read_at": T0 + SEC,
        "committed_at": None,
        "received_at": T0 + 2 * SEC,
        "status": "counted",
        "traceparent": None,
    } | columns


def decision(cm_id: str, state: str = "satisfied", **columns: Any) -> dict[str, Any]:
    return {
        "cm_id": cm_id,
        "state": state,
        "effective_at": T0 + 3 * SEC,
        "reasons_json": f'["{cm_id}"]',
        "facts_json": "[]",
    } | columns


def cm_rows(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {row.cm_id: row for row in conn.execute(sa.select(tables.cms))}


def in_session(engine: sa.Engine, work: Any) -> Any:
    with Session(engine) as session, session.begin():
        return work(session)


# -- CM rows ------------------------------------------------------------------------------


@pytest.mark.parametrize("lock", [False, True])
def test_load_cms_returns_the_known_cms_locked_or_not(
    engine: sa.Engine, store: DecisionStore, lock: bool
) -> None:
    add_cm(engine, "a", notify_success=True)
    add_cm(engine, "b", state="violated", effective_at=T0 + SEC)
    found = in_session(engine, lambda s: store.load_cms(s, ["b", "a", "nope", "a"], lock=lock))
    assert sorted(found) == ["a", "b"]
    a, b = found["a"], found["b"]
    assert (a.cm_id, a.sender, a.state, a.notify_success) == ("a", "s", "pending", True)
    assert a.sent_at == T0 and a.sent_at.tzinfo is UTC
    assert a.condition == CONDITION
    assert a.effective_at is None
    assert (b.state, b.effective_at) == ("violated", T0 + SEC)
    assert in_session(engine, lambda s: store.load_cms(s, [], lock=lock)) == {}


def test_load_cms_with_lock_holds_the_rows_until_the_transaction_ends(
    engine: sa.Engine, store: DecisionStore
) -> None:
    _postgres_only(engine)
    add_cm(engine, "a")
    with Session(engine) as first, first.begin():
        store.load_cms(first, ["a"], lock=True)
        with Session(engine) as second, second.begin():
            assert list(store.load_cms(second, ["a"])) == ["a"]  # reading does not wait
            second.execute(sa.text("SET LOCAL lock_timeout = '100ms'"))
            with pytest.raises(sa.exc.OperationalError, match="lock"):
                store.load_cms(second, ["a"], lock=True)


def test_copies_of_groups_copies_by_cm_and_destination(
    engine: sa.Engine, store: DecisionStore
) -> None:
    add_cm(engine, "a")
    add_cm(engine, "b")
    copies = [
        ("a", "q1", None, "m1"),
        ("a", "q2", "alice", "m2"),
        ("b", "q1", None, "m3"),
    ]
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.copies),
            [
                {
                    "cm_id": cm_id,
                    "destination": destination,
                    "recipient": recipient,
                    "message_id": message_id,
                    "exchange": "ex",
                    "routing_key": destination,
                    "requires": "read",
                }
                for cm_id, destination, recipient, message_id in copies
            ],
        )
    found = in_session(engine, lambda s: store.copies_of(s, ["a", "nope", "a"]))
    assert dict(found) == {
        "a": {
            "q1": CopyRow("q1", None, "ex", "q1"),
            "q2": CopyRow("q2", "alice", "ex", "q2"),
        }
    }
    assert dict(in_session(engine, lambda s: store.copies_of(s, []))) == {}


def test_decide_many_decides_each_pending_cm_exactly_once(
    engine: sa.Engine, store: DecisionStore
) -> None:
    add_cm(engine, "a", next_check_at=T0 + 5 * SEC)
    add_cm(engine, "b")
    add_cm(engine, "c", state="violated", decided_by="other")
    rows = [decision("a"), decision("b", "violated", effective_at=T0), decision("c")]
    at = T0 + 4 * SEC

    def decide(session: Session) -> set[str]:
        return store.decide_many(session, rows, instance="ev-1", decided_at=at)

    assert in_session(engine, decide) == {"a", "b"}
    assert in_session(engine, decide) == set()  # the same call again: nothing left to decide
    found = cm_rows(engine)
    a, b, c = found["a"], found["b"], found["c"]
    assert (a.state, a.decided_by, a.reasons_json, a.facts_json) == (
        "satisfied",
        "ev-1",
        '["a"]',
        "[]",
    )
    assert to_utc(a.decided_at) == at and to_utc(a.effective_at) == T0 + 3 * SEC
    assert a.next_check_at is None
    assert (b.state, to_utc(b.effective_at)) == ("violated", T0)
    assert (c.state, c.decided_by, c.decided_at) == ("violated", "other", None)
    assert (
        in_session(engine, lambda s: store.decide_many(s, [], instance="x", decided_at=at)) == set()
    )


def test_decide_many_with_rows_sharing_every_value_but_the_id(
    engine: sa.Engine, store: DecisionStore
) -> None:
    ids = [f"cm{i}" for i in range(5)]
    for cm_id in ids:
        add_cm(engine, cm_id)
    rows = [decision(cm_id, reasons_json="[]") for cm_id in ids]
    won = in_session(
        engine, lambda s: store.decide_many(s, rows, instance="ev-1", decided_at=T0 + 4 * SEC)
    )
    assert won == set(ids)
    assert {row.state for row in cm_rows(engine).values()} == {"satisfied"}


def test_a_racing_decision_waits_and_then_decides_nothing(
    engine: sa.Engine, store: DecisionStore
) -> None:
    _postgres_only(engine)
    add_cm(engine, "a")
    second: list[set[str]] = []
    with Session(engine) as first, first.begin():
        assert store.decide_many(first, [decision("a")], instance="ev-1", decided_at=T0) == {"a"}

        def race() -> None:
            second.append(
                in_session(
                    engine,
                    lambda s: store.decide_many(
                        s, [decision("a", "violated")], instance="ev-2", decided_at=T0 + SEC
                    ),
                )
            )

        racer = threading.Thread(target=race)
        racer.start()
        racer.join(0.3)
        assert racer.is_alive()  # waiting for the first transaction's row lock
    racer.join(10)
    assert second == [set()]
    row = cm_rows(engine)["a"]
    assert (row.state, row.decided_by) == ("satisfied", "ev-1")


def test_set_next_checks_reschedules_pending_cms_only(
    engine: sa.Engine, store: DecisionStore
) -> None:
    add_cm(engine, "a")
    add_cm(engine, "b", next_check_at=T0)
    add_cm(engine, "c", state="satisfied")
    plan = [("a", T0 + 5 * SEC), ("b", None), ("c", T0 + 6 * SEC)]
    in_session(engine, lambda s: store.set_next_checks(s, plan))
    in_session(engine, lambda s: store.set_next_checks(s, []))
    found = cm_rows(engine)
    assert to_utc(found["a"].next_check_at) == T0 + 5 * SEC
    assert found["b"].next_check_at is None
    assert found["c"].next_check_at is None


def test_claim_due_takes_the_earliest_due_pending_cms(
    engine: sa.Engine, store: DecisionStore
) -> None:
    add_cm(engine, "late", next_check_at=T0 + 3 * SEC)
    add_cm(engine, "early", next_check_at=T0 + SEC)
    add_cm(engine, "middle", next_check_at=T0 + 2 * SEC)
    add_cm(engine, "exactly", next_check_at=T0 + 4 * SEC)
    add_cm(engine, "future", next_check_at=T0 + 5 * SEC)
    add_cm(engine, "unscheduled")
    add_cm(engine, "decided", state="violated", next_check_at=T0)
    now = T0 + 4 * SEC
    assert in_session(engine, lambda s: store.claim_due(s, now, 2)) == ["early", "middle"]
    assert in_session(engine, lambda s: store.claim_due(s, now, 10)) == [
        "early",
        "middle",
        "late",
        "exactly",
    ]


def test_claim_due_skips_the_cms_another_transaction_claimed(
    engine: sa.Engine, store: DecisionStore
) -> None:
    _postgres_only(engine)
    for i in range(4):
        add_cm(engine, f"cm{i}", next_check_at=T0 + i * SEC)
    now = T0 + 10 * SEC
    with Session(engine) as first, first.begin():
        assert store.claim_due(first, now, 2) == ["cm0", "cm1"]
        assert in_session(engine, lambda s: store.claim_due(s, now, 10)) == ["cm2", "cm3"]
    assert in_session(engine, lambda s: store.claim_due(s, now, 10)) == [f"cm{i}" for i in range(4)]


def test_next_check_is_the_earliest_of_the_pending_cms(
    engine: sa.Engine, store: DecisionStore
) -> None:
    assert in_session(engine, lambda s: store.next_check(s)) is None
    add_cm(engine, "unscheduled")
    add_cm(engine, "decided", state="violated", next_check_at=T0)
    assert in_session(engine, lambda s: store.next_check(s)) is None
    add_cm(engine, "later", next_check_at=T0 + 3 * SEC)
    add_cm(engine, "earliest", next_check_at=T0 + SEC)
    assert in_session(engine, lambda s: store.next_check(s)) == T0 + SEC
    after = T0 + SEC
    assert in_session(engine, lambda s: store.next_check(s, after=after)) == T0 + 3 * SEC
    assert in_session(engine, lambda s: store.next_check(s, after=T0 + 3 * SEC)) is None


def test_compensations_of_and_their_release(engine: sa.Engine, store: DecisionStore) -> None:
    add_cm(engine, "a")
    add_cm(engine, "b")
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.compensations),
            [
                {"cm_id": cm_id, "destination": q, "body": body, "content_type": content_type}
                | {"system_generated": False}
                for cm_id, q, body, content_type in [
                    ("a", "q1", b"undo", "text/plain"),
                    ("a", "q2", b"\x00\xff", None),
                    ("b", "q1", b"b", None),
                ]
            ],
        )
    found = in_session(engine, lambda s: store.compensations_of(s, ["a", "nope"]))
    assert sorted(found) == ["a"]
    assert sorted(found["a"]) == [
        CompensationRow("q1", b"undo", "text/plain"),
        CompensationRow("q2", b"\x00\xff", None),
    ]
    in_session(engine, lambda s: store.release_compensations(s, ["a"], T0 + SEC))
    in_session(engine, lambda s: store.release_compensations(s, [], T0 + SEC))
    with engine.connect() as conn:
        released = {
            (r.cm_id, r.destination): r.released_at
            for r in conn.execute(sa.select(tables.compensations))
        }
    assert {k: to_utc(v) if v else None for k, v in released.items()} == {
        ("a", "q1"): T0 + SEC,
        ("a", "q2"): T0 + SEC,
        ("b", "q1"): None,
    }


# -- acks and anomalies -------------------------------------------------------------------


def test_insert_acks_is_idempotent_and_returns_only_new_ids(
    engine: sa.Engine, store: DecisionStore
) -> None:
    add_cm(engine, "a")
    # Columns every row shares and columns that vary (the psycopg adapter sends them
    # differently), and an ack stored before.
    first = [ack_row("k1", "a"), ack_row("k2", "a", kind="commit", committed_at=T0 + SEC)]
    assert in_session(engine, lambda s: store.insert_acks(s, first)) == {"k1", "k2"}
    again = [ack_row("k2", "a", receiver="other"), ack_row("k3", "a", recipient="bob")]
    assert in_session(engine, lambda s: store.insert_acks(s, again)) == {"k3"}
    assert in_session(engine, lambda s: store.insert_acks(s, again)) == set()
    assert in_session(engine, lambda s: store.insert_acks(s, [])) == set()
    with engine.connect() as conn:
        stored = {r.ack_id: r for r in conn.execute(sa.select(tables.acks))}
    assert sorted(stored) == ["k1", "k2", "k3"]
    assert stored["k2"].receiver == "rx"  # the first one stored stays
    assert (stored["k3"].recipient, to_utc(stored["k3"].received_at)) == ("bob", T0 + 2 * SEC)


def test_counted_and_late_acks_by_status_and_order(engine: sa.Engine, store: DecisionStore) -> None:
    add_cm(engine, "a")
    add_cm(engine, "b")

    def late(ack_id: str, cm_id: str, status: str, received_s: int, read_s: int) -> dict[str, Any]:
        return ack_row(
            ack_id,
            cm_id,
            status=status,
            received_at=T0 + received_s * SEC,
            read_at=T0 + read_s * SEC,
        )

    rows = [
        ack_row("c1", "a"),
        ack_row("c2", "a", destination="q2", kind="commit", committed_at=T0 + 2 * SEC),
        ack_row("c3", "b", recipient="bob"),
        late("l3", "a", "changes_verdict", 9, 3),
        late("l2", "a", "after_decision", 8, 2),
        late("l1", "a", "after_decision", 8, 1),
        late("lb", "b", "after_decision", 7, 4),
    ]
    in_session(engine, lambda s: store.insert_acks(s, rows))
    counted = in_session(engine, lambda s: store.counted_acks(s, ["a", "nope", "a"]))
    commit = Ack(destination="q2", kind=AckKind.COMMIT, read_at=T0 + SEC, committed_at=T0 + 2 * SEC)
    assert sorted(counted) == ["a"]
    assert sorted(counted["a"], key=lambda ack: ack.destination) == [_read(1), commit]
    assert all(ack.read_at.tzinfo is UTC for ack in counted["a"])
    found = in_session(engine, lambda s: store.late_acks(s, ["a", "b", "nope"]))
    assert sorted(found) == ["a", "b"]
    # In the order received (ties by ack id), each with its status.
    assert found["a"] == [
        (_read(1), "after_decision"),
        (_read(2), "after_decision"),
        (_read(3), "changes_verdict"),
    ]
    assert found["b"] == [(_read(4), "after_decision")]
    assert dict(in_session(engine, lambda s: store.late_acks(s, []))) == {}
    assert dict(in_session(engine, lambda s: store.counted_acks(s, []))) == {}


def _read(read_s: int) -> Ack:
    return Ack(destination="q", kind=AckKind.READ, read_at=T0 + read_s * SEC)


def test_record_anomalies_inserts_every_row(engine: sa.Engine, store: DecisionStore) -> None:
    anomaly = {
        "kind": "duplicate",
        "cm_id": "a",
        "ack_id": "k1",
        "destination": "q",
        "recipient": None,
        "detail": "twice",
        "recorded_at": T0,
    }
    in_session(engine, lambda s: store.record_anomalies(s, [anomaly, anomaly | {"cm_id": None}]))
    in_session(engine, lambda s: store.record_anomalies(s, []))
    with engine.connect() as conn:
        found = sorted((r.kind, r.cm_id or "") for r in conn.execute(sa.select(tables.anomalies)))
    assert found == [("duplicate", ""), ("duplicate", "a")]
