"""Dependency-Spheres end to end in one process: a sender, receivers, the evaluator and
relays on the real RabbitMQ and PostgreSQL, time scaled (a day becomes a second).

Each test is one of the issue's scenarios: the sphere's single outcome, its members'
actions following it (success notices or compensations, unread copies cancelling out), the
prepared transaction committed or rolled back, and each handler run once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Destination, Verdict, tables
from condmsg.cli import main
from condmsg.core import protocol
from condmsg.core.errors import SphereError
from condmsg.core.outcome import SPHERE_OUTCOME_TYPE, SphereOutcome
from condmsg.core.protocol import MessageKind
from condmsg.spheres.participants import prepared_gids
from tests.integration.condmsg_helpers import SECRET, get_all
from tests.running_world import RunningWorld
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DAY = timedelta(seconds=1)


@dataclass
class World(RunningWorld):
    """The running world, with the rooms a sphere's members book in the same database."""

    rooms: sa.Engine

    def handler_runs(self) -> list[tuple[str, str]]:
        with self.rooms.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT handler, room FROM ran"))]

    def rooms_booked(self) -> list[str]:
        with self.rooms.connect() as conn:
            return [r for (r,) in conn.execute(sa.text("SELECT room FROM booking ORDER BY room"))]


@pytest.fixture
def world(running_world: RunningWorld) -> Iterator[World]:
    w = running_world
    rooms = sa.create_engine(w.pg_url)
    with rooms.begin() as conn:
        conn.execute(sa.text("CREATE TABLE booking (room text PRIMARY KEY)"))
        conn.execute(sa.text("CREATE TABLE ran (handler text, room text)"))

    def record(handler: str) -> Any:
        def run(session: Session, room: str) -> None:
            session.execute(sa.text("INSERT INTO ran VALUES (:h, :r)"), {"h": handler, "r": room})

        return run

    w.sender.register_handler("booked", record("booked"))
    w.sender.register_handler("released", record("released"))
    try:
        yield World(w.sender, w.evaluator, w.name, w.pg_url, w.prefix, rooms)
    finally:
        w.stop()  # before looking for prepared transactions left behind
        leftover = prepared_gids(rooms, "condmsg-")
        rooms.dispose()
        assert not [g for g in leftover if g in _gids_of(w.pg_url)], leftover


def _gids_of(pg_url: str) -> set[str]:
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(tables.sphere_participants.c.participant_id))
            return {r for (r,) in rows}
    finally:
        engine.dispose()


def _member(w: World, short: str, within: timedelta = 5 * DAY) -> Destination:
    return Destination(w.queue(short), process_within=within)


def _commit_read(rx: Any, queue: str) -> Any:
    with rx.transaction() as tx:
        return tx.read(queue, timeout=5)


def _book(ds: Any, w: World, room: str) -> None:
    with ds.transaction(w.pg_url) as session:
        session.execute(sa.text("INSERT INTO booking VALUES (:r)"), {"r": room})
    ds.on_success("booked", room=room)
    ds.on_failure("released", room=room)


def _state(w: World, cm_id: str) -> str:
    with w.sender.engine.connect() as conn:
        row = w.sender.store.cm(conn, cm_id)
    return str(row.state)


def _outcome_queue(w: World, channel: Any) -> tuple[list[SphereOutcome], list[dict[str, Any]]]:
    """The sphere outcomes and member outcome documents on the sender's outcome queue."""
    spheres: list[SphereOutcome] = []
    members: list[dict[str, Any]] = []
    for props, body in get_all(channel, protocol.outcome_queue(w.name)):
        if props.type == SPHERE_OUTCOME_TYPE:
            spheres.append(SphereOutcome.from_json(body))
        else:
            members.append(json.loads(body))
    return spheres, members


def test_all_members_satisfied_and_committed(
    world: World, make_receiver: Any, channel: Any
) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=10 * DAY)
    a = ds.send(b"meeting notice", _member(w, "qr1"), notify_success=True)
    b = ds.send(b"room request", _member(w, "qr2"), notify_success=True)
    _book(ds, w, "r1")
    rx = make_receiver(w.pg_url, "alice")
    with rx.relay():
        assert _commit_read(rx, w.queue("qr1")) is not None
        assert _commit_read(rx, w.queue("qr2")) is not None
        wait_for(lambda: _state(w, a) == _state(w, b) == "satisfied")
        # Members are decided, but the sphere is open: no action of theirs is taken.
        assert _outcome_queue(w, channel) == ([], [])
        assert rx.read(w.queue("qr1"), timeout=0.5) is None
        assert w.rooms_booked() == []  # the booking is a prepared transaction's, not visible
        outcome = ds.commit(wait=10)
        assert outcome is not None and outcome.verdict is Verdict.SATISFIED
        assert outcome.members == {a: "satisfied", b: "satisfied"}
        notices = [rx.read(w.queue(q), timeout=5) for q in ("qr1", "qr2")]
    assert [n.kind for n in notices if n] == [MessageKind.SUCCESS] * 2
    assert w.rooms_booked() == ["r1"]
    assert w.handler_runs() == [("booked", "r1")]
    assert w.sender.resolve_spheres() == 0  # nothing left to finish; nothing runs twice
    assert w.handler_runs() == [("booked", "r1")]
    spheres, members = wait_for(lambda: _outcome_queue(w, channel))
    assert [(s.sphere_id, s.verdict) for s in spheres] == [(ds.sphere_id, Verdict.SATISFIED)]
    assert sorted(m["cm_id"] for m in members) == sorted([a, b])


def test_one_member_fails_the_sphere_and_every_consumer_is_compensated(
    world: World, make_receiver: Any, channel: Any
) -> None:
    w = world
    rx = make_receiver(w.pg_url, "alice")
    seen: dict[str, Any] = {}

    def give_up() -> None:
        with w.sender.sphere(timeout=10 * DAY) as ds:
            seen["ok"] = ds.send(b"notice", _member(w, "qr1"), compensation=b"undo qr1")
            seen["bad"] = ds.send(b"notice", _member(w, "qr2"), compensation=b"undo qr2")
            seen["unread"] = ds.send(b"notice", _member(w, "qr3"), compensation=b"undo qr3")
            _book(ds, w, "r2")
            assert _commit_read(rx, w.queue("qr1")) is not None
            assert rx.read(w.queue("qr2"), timeout=5) is not None  # read, never processed
            seen["outcome"] = ds.outcome(timeout=10)  # decided at once, while still open
            raise RuntimeError("the application gives up")

    with rx.relay():
        with pytest.raises(RuntimeError, match="gives up"):
            give_up()
        ok, bad, unread, outcome = seen["ok"], seen["bad"], seen["unread"], seen["outcome"]
        assert outcome is not None and outcome.verdict is Verdict.VIOLATED
        assert outcome.reasons[0].startswith(f"member {bad} violated")
        assert _state(w, ok) == "satisfied"  # satisfied on its own, compensated with the sphere
        for q in ("qr1", "qr2"):
            compensation = rx.read(w.queue(q), timeout=5)
            assert compensation is not None and compensation.kind is MessageKind.COMPENSATION
            assert compensation.payload == f"undo {q}".encode()
        assert rx.read(w.queue("qr3"), timeout=1) is None  # original and compensation cancel
        assert rx.stats.cancelled == 1 and rx.stats.discards == 1
    assert w.rooms_booked() == []
    assert w.handler_runs() == [("released", "r2")]
    spheres, members = wait_for(lambda: _outcome_queue(w, channel))
    assert [s.verdict for s in spheres] == [Verdict.VIOLATED]
    assert sorted(m["cm_id"] for m in members) == sorted([ok, bad])  # unread is pending
    assert _state(w, unread) == "pending"


def test_abort_after_sends(world: World, make_receiver: Any) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=10 * DAY)
    ds.send(b"notice", _member(w, "qr1"), compensation=b"undo")
    ds.send(b"notice", _member(w, "qr2"), compensation=b"undo")
    _book(ds, w, "r3")
    rx = make_receiver(w.pg_url, "alice")
    with rx.relay():
        assert _commit_read(rx, w.queue("qr1")) is not None
        ds.abort("the customer cancelled")
        outcome = ds.outcome(timeout=10)
        assert outcome is not None and outcome.verdict is Verdict.VIOLATED
        assert outcome.reasons == ("sphere aborted: the customer cancelled",)
        compensation = rx.read(w.queue("qr1"), timeout=5)
        assert compensation is not None and compensation.kind is MessageKind.COMPENSATION
        assert rx.read(w.queue("qr2"), timeout=1) is None
    assert w.rooms_booked() == []
    assert w.handler_runs() == [("released", "r3")]


def test_timeout_before_commit(world: World, make_receiver: Any) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=1.5 * DAY)
    member = ds.send(b"notice", _member(w, "qr1"), compensation=b"undo")
    rx = make_receiver(w.pg_url, "alice")
    with rx.relay():
        assert _commit_read(rx, w.queue("qr1")) is not None
        wait_for(lambda: _state(w, member) == "satisfied")
        outcome = ds.outcome(timeout=10)  # never committed
        assert outcome is not None and outcome.verdict is Verdict.VIOLATED
        assert (
            outcome.reasons[0].startswith("sphere timeout")
            and "not committed" in outcome.reasons[0]
        )
        assert outcome.effective_at == ds.deadline
        compensation = rx.read(w.queue("qr1"), timeout=5)
        assert compensation is not None and compensation.kind is MessageKind.COMPENSATION
    with pytest.raises(SphereError, match=r"has ended|timed out"):
        ds.send(b"late", _member(w, "qr2"))


def test_commit_before_the_members_are_decided(world: World, make_receiver: Any) -> None:
    w = world
    with w.sender.sphere(timeout=10 * DAY) as ds:
        a = ds.send(b"notice", _member(w, "qr1"), notify_success=True)
        b = ds.send(b"notice", _member(w, "qr2"), notify_success=True)
        _book(ds, w, "r5")
    assert ds.outcome(timeout=0.5) is None  # committed, waiting for its members
    rx = make_receiver(w.pg_url, "alice")
    with rx.relay():
        assert _commit_read(rx, w.queue("qr1")) is not None
        assert ds.outcome(timeout=0.5) is None
        assert _commit_read(rx, w.queue("qr2")) is not None
        outcome = ds.outcome(timeout=10)
        assert outcome is not None and outcome.verdict is Verdict.SATISFIED
        for q in ("qr1", "qr2"):
            notice = rx.read(w.queue(q), timeout=5)
            assert notice is not None and notice.kind is MessageKind.SUCCESS
    with w.sender.engine.connect() as conn:
        decided = {
            r.cm_id: r.decided_at
            for r in conn.execute(sa.select(tables.cms).where(tables.cms.c.cm_id.in_([a, b])))
        }
    assert outcome.decided_at >= max(
        d.replace(tzinfo=outcome.decided_at.tzinfo) for d in decided.values()
    )
    assert w.rooms_booked() == ["r5"]
    assert w.handler_runs() == [("booked", "r5")]


class _Refuses:
    """A participant that votes no (and records what was asked of it)."""

    def __init__(self, participant_id: str) -> None:
        self.participant_id = participant_id
        self.calls: list[str] = []

    def prepare(self) -> bool:
        self.calls.append("prepare")
        return False

    def commit(self) -> None:
        self.calls.append("commit")

    def rollback(self) -> None:
        self.calls.append("rollback")


def test_a_participant_voting_no_fails_the_sphere(world: World, make_receiver: Any) -> None:
    w = world
    refuses = _Refuses("inventory-check")
    with w.sender.sphere(timeout=10 * DAY) as ds:
        ds.send(b"notice", _member(w, "qr1"), compensation=b"undo")
        _book(ds, w, "r6")
        ds.enlist(refuses)
    rx = make_receiver(w.pg_url, "alice")
    with rx.relay():
        outcome = ds.outcome(timeout=10)
        assert outcome is not None and outcome.verdict is Verdict.VIOLATED
        assert outcome.reasons == ("sphere aborted: participant inventory-check voted no",)
        # Never consumed: the original and its compensation cancel out.
        assert rx.read(w.queue("qr1"), timeout=1) is None
    assert refuses.calls == ["prepare", "rollback"]
    assert w.rooms_booked() == []
    assert w.handler_runs() == [("released", "r6")]


def test_an_ack_naming_a_sphere_is_dead_lettered_and_changes_nothing(
    world: World, channel: Any
) -> None:
    """Acks carry no sphere: one that names a sphere (or claims its verdict) is not an ack
    of this protocol, and goes to the dead-letter queue with the reason."""
    w = world
    ds = w.sender.begin_sphere(timeout=10 * DAY)
    member = ds.send(b"notice", _member(w, "qr1"))
    forged = {
        "v": 1,
        "ack_id": uuid.uuid4().hex,
        "cm_id": member,
        "destination": w.queue("qr1"),
        "recipient": None,
        "receiver": "mallory",
        "kind": "commit",
        "read_at": protocol.format_instant(w.sender.clock()),
        "committed_at": protocol.format_instant(w.sender.clock()),
        "token": protocol.copy_token(SECRET, member, w.queue("qr1"), None),
        "sphere_id": ds.sphere_id,
        "verdict": "satisfied",
    }
    channel.basic_publish("", protocol.ack_queue(w.name), json.dumps(forged).encode())
    dead = wait_for(lambda: get_all(channel, protocol.dead_letter_queue(w.name)))
    assert "sphere_id" in dead[0][0].headers[protocol.H_REASON]
    assert _state(w, member) == "pending"
    ds.commit()
    assert ds.outcome(timeout=0.5) is None  # the member still waits for a genuine ack
    with w.sender.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.acks)).scalar() == 0


def test_status_draws_a_sphere_with_its_members(world: World, capsys: Any) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=10 * DAY)
    member = ds.send(b"notice", _member(w, "qr1"))
    ds.on_failure("released", room="r7")
    ds.abort("changed plans")
    assert ds.outcome(timeout=10) is not None
    assert main(["status", ds.sphere_id, "--db-url", w.pg_url]) == 0
    out = capsys.readouterr().out
    assert f"sphere {ds.sphere_id} from {w.name}" in out and "state violated" in out
    assert "aborted " in out and "sphere aborted: changed plans" in out
    assert "h1: handler released on violated, ran" in out
    assert f"cm {member} from {w.name}" in out and f"member of sphere {ds.sphere_id}" in out
    assert w.queue("qr1") in out  # the member's tree


def test_the_outcome_queue_yields_spheres_and_skips_what_does_not_decode(
    world: World, channel: Any
) -> None:
    w = world
    channel.basic_publish("", protocol.outcome_queue(w.name), b"{not an outcome")
    ds = w.sender.begin_sphere(timeout=10 * DAY)
    member = ds.send(b"notice", _member(w, "qr1"))
    ds.abort()
    assert ds.outcome(timeout=10) is not None
    got = wait_for(lambda: list(w.sender.outcomes(timeout=1)))
    spheres = [o for o in got if isinstance(o, SphereOutcome)]
    assert [(s.sphere_id, s.verdict, s.members) for s in spheres] == [
        (ds.sphere_id, Verdict.VIOLATED, {member: "pending"})
    ]
    assert get_all(channel, protocol.outcome_queue(w.name)) == []  # nothing stuck behind it
