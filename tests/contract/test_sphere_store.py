"""Contract of :class:`condmsg.spheres.store.SphereStore` (one class, every database)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Verdict, tables
from condmsg.core.outcome import SphereOutcome
from condmsg.core.store_values import ParticipantState
from condmsg.spheres.store import SphereStore

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 11, 25, 12, 0, 0, 123000, tzinfo=UTC)
S = timedelta(seconds=1)
store = SphereStore()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(db_url)
    tables.metadata.create_all(eng)
    yield eng
    eng.dispose()


def begin(engine: sa.Engine, sphere_id: str = "s1", deadline: datetime = T0 + 10 * S) -> None:
    with Session(engine) as session, session.begin():
        store.begin(session, sphere_id=sphere_id, sender="snd", now=T0, deadline=deadline)


def add_member(engine: sa.Engine, cm_id: str, sphere_id: str, state: str = "pending") -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.cms),
            [
                {
                    "cm_id": cm_id,
                    "sender": "snd",
                    "sent_at": T0 + S,
                    "condition_json": "{}",
                    "evaluation_deadline": T0 + 5 * S,
                    "payload_size": 0,
                    "notify_success": True,
                    "sphere_id": sphere_id,
                    "state": state,
                    "decided_at": None if state == "pending" else T0 + 3 * S,
                    "effective_at": None if state == "pending" else T0 + 2 * S,
                    "reasons_json": None if state == "pending" else '["why"]',
                }
            ],
        )


def test_a_sphere_begins_open_with_its_deadline_as_first_check(engine: sa.Engine) -> None:
    begin(engine)
    with engine.connect() as conn:
        row = store.sphere(conn, "s1")
    assert row is not None
    assert (row.state, row.members, row.sender) == ("open", 0, "snd")
    assert (row.begun_at, row.deadline, row.next_check_at) == (T0, T0 + 10 * S, T0 + 10 * S)
    assert not row.decided and row.reasons == ()
    with engine.connect() as conn:
        assert store.sphere(conn, "nope") is None


def test_members_join_only_an_open_sphere_before_its_deadline(engine: sa.Engine) -> None:
    begin(engine)
    with Session(engine) as session, session.begin():
        assert store.join(session, "s1", 2, T0 + S)
        assert not store.join(session, "s1", 1, T0 + 10 * S)  # at the deadline: too late
        assert not store.join(session, "missing", 1, T0 + S)
    with Session(engine) as session, session.begin():
        assert store.request_commit(session, "s1", T0 + 2 * S)
        assert not store.join(session, "s1", 1, T0 + 3 * S)  # committed: closed
    with engine.connect() as conn:
        row = store.sphere(conn, "s1")
    assert row is not None and row.members == 2
    assert (row.state, row.committed_at, row.next_check_at) == ("committed", T0 + 2 * S, T0 + 2 * S)


def test_commit_and_abort_take_an_open_sphere_only(engine: sa.Engine) -> None:
    begin(engine, "a")
    begin(engine, "b")
    with Session(engine) as session, session.begin():
        assert store.request_abort(session, "a", T0 + S, "changed my mind")
        assert not store.request_commit(session, "a", T0 + 2 * S)
        assert not store.request_abort(session, "a", T0 + 2 * S, "again")
        assert not store.request_commit(session, "b", T0 + 10 * S)  # the deadline has passed
        assert store.request_commit(session, "b", T0 + 9 * S)
        assert not store.request_abort(session, "b", T0 + 9 * S, "too late")
    with engine.connect() as conn:
        a = store.sphere(conn, "a")
    assert a is not None
    assert (a.state, a.aborted_at, a.abort_reason) == ("aborted", T0 + S, "changed my mind")


def test_a_sphere_is_decided_once(engine: sa.Engine) -> None:
    begin(engine)
    with Session(engine) as session, session.begin():
        decided = {
            "verdict": "violated",
            "effective_at": T0 + 4 * S,
            "reasons": ["sphere aborted: x"],
            "members": {"m1": "satisfied", "m2": "pending"},
            "decided_at": T0 + 5 * S,
        }
        assert store.decide(session, "s1", instance="e1", **decided)  # type: ignore[arg-type]
        again = decided | {"verdict": "satisfied", "members": {"m1": "satisfied"}}
        assert not store.decide(session, "s1", instance="e2", **again)  # type: ignore[arg-type]
        store.set_next_check(session, "s1", T0)  # a decided sphere keeps no next check
    with engine.connect() as conn:
        row = store.sphere(conn, "s1")
    assert row is not None and row.decided
    assert (row.state, row.reasons, row.next_check_at) == ("violated", ("sphere aborted: x",), None)
    assert (row.decided_at, row.effective_at) == (T0 + 5 * S, T0 + 4 * S)
    assert row.member_verdicts == {"m1": "satisfied", "m2": "pending"}


def test_the_outcome_is_the_one_recorded_at_the_decision(engine: sa.Engine) -> None:
    begin(engine)
    add_member(engine, "m1", "s1", "satisfied")
    add_member(engine, "m2", "s1")
    with engine.connect() as conn:
        row = store.sphere(conn, "s1")
    assert row is not None and row.outcome() is None  # undecided
    with Session(engine) as session, session.begin():
        store.decide(
            session,
            "s1",
            verdict="violated",
            effective_at=T0 + 4 * S,
            reasons=["sphere aborted: x"],
            members={"m1": "satisfied", "m2": "pending"},
            decided_at=T0 + 5 * S,
            instance="e1",
        )
    with engine.begin() as conn:  # the pending member is decided afterwards
        cms = tables.cms
        conn.execute(
            sa.update(cms)
            .where(cms.c.cm_id == "m2")
            .values(state="violated", decided_at=T0 + 9 * S, effective_at=T0 + 8 * S)
        )
    with engine.connect() as conn:
        row = store.sphere(conn, "s1")
    assert row is not None
    assert row.outcome() == SphereOutcome(
        sphere_id="s1",
        verdict=Verdict.VIOLATED,
        reasons=("sphere aborted: x",),
        decided_at=T0 + 5 * S,
        effective_at=T0 + 4 * S,
        members={"m1": "satisfied", "m2": "pending"},
    )


def test_members_are_read_per_sphere(engine: sa.Engine) -> None:
    begin(engine, "s1")
    begin(engine, "s2")
    add_member(engine, "m1", "s1", "satisfied")
    add_member(engine, "m2", "s1")
    add_member(engine, "m3", "s2", "violated")
    with engine.connect() as conn:
        found = store.members(conn, ["s1", "s2", "s3"])
    assert sorted(m.cm_id for m in found["s1"]) == ["m1", "m2"]
    assert found["s3"] == []
    (m3,) = found["s2"]
    facts = m3.facts()
    assert (facts.state, facts.effective_at, facts.reasons) == ("violated", T0 + 2 * S, ("why",))
    assert m3.sent_at == T0 + S and m3.notify_success is True


def test_participants_are_logged_and_resolved_once(engine: sa.Engine) -> None:
    begin(engine)
    with Session(engine) as session, session.begin():
        store.add_participant(
            session,
            sphere_id="s1",
            participant_id="p1",
            kind="postgresql",
            resource="postgresql://u@h/db",
            now=T0,
        )
        store.add_participant(
            session,
            sphere_id="s1",
            participant_id="h2",
            kind="handler",
            resource="undo",
            now=T0 + S,
            args={"room": 7},
            run_on="violated",
        )
    with engine.begin() as conn:
        assert store.set_participant(conn, "s1", "p1", ParticipantState.PREPARED, now=T0)
        assert store.set_participant(
            conn, "s1", "p1", ParticipantState.COMMITTED, now=T0 + S, detail="sphere satisfied"
        )
        assert not store.set_participant(conn, "s1", "p1", ParticipantState.ROLLED_BACK, now=T0)
    with engine.connect() as conn:
        p1, h2 = store.participants(conn, "s1")
    assert (p1.participant_id, p1.state, p1.detail) == ("p1", "committed", "sphere satisfied")
    assert (h2.kind, h2.resource, h2.args, h2.run_on, h2.state) == (
        "handler",
        "undo",
        {"room": 7},
        "violated",
        "enlisted",
    )
    with Session(engine) as session, pytest.raises(sa.exc.IntegrityError), session.begin():
        store.add_participant(
            session, sphere_id="s1", participant_id="p1", kind="custom", resource="x", now=T0
        )


def test_unresolved_lists_decided_spheres_with_work_left(engine: sa.Engine) -> None:
    for sphere_id in ("done", "open", "left"):
        begin(engine, sphere_id)
        with Session(engine) as session, session.begin():
            store.add_participant(
                session,
                sphere_id=sphere_id,
                participant_id="p",
                kind="custom",
                resource="X",
                now=T0,
            )
    with Session(engine) as session, session.begin():
        for sphere_id in ("done", "left"):
            store.decide(
                session,
                sphere_id,
                verdict="violated",
                effective_at=T0,
                reasons=[],
                members={},
                decided_at=T0,
                instance="e",
            )
    with engine.begin() as conn:
        store.set_participant(conn, "done", "p", ParticipantState.ROLLED_BACK, now=T0)
        assert store.unresolved(conn, sender="snd", limit=10) == ["left"]
        assert store.unresolved(conn, sender="other", limit=10) == []


def test_due_spheres_are_claimed_by_their_next_check(engine: sa.Engine) -> None:
    begin(engine, "early", deadline=T0 + 5 * S)
    begin(engine, "later", deadline=T0 + 20 * S)
    with Session(engine) as session, session.begin():
        assert store.claim_due(session, T0 + 4 * S, 10) == []
        assert store.claim_due(session, T0 + 5 * S, 10) == ["early"]
        locked = store.lock(session, ["later", "early", "missing"])
        assert list(locked) == ["early", "later"]


def test_a_claimed_sphere_is_skipped_by_a_second_claimer(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    tables.metadata.create_all(engine)
    try:
        begin(engine, "a", deadline=T0 + S)
        begin(engine, "b", deadline=T0 + 2 * S)
        with Session(engine) as first, first.begin():
            assert store.claim_due(first, T0 + 5 * S, 1) == ["a"]
            with Session(engine) as second, second.begin():
                assert store.claim_due(second, T0 + 5 * S, 10) == ["b"]
    finally:
        engine.dispose()
