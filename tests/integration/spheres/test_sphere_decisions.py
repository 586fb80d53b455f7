"""Dependency-Spheres as the evaluator decides them, one step at a time: the outcome a
decision records is the outcome every later read returns, and every path that decides a
sphere counts it once in ``condmsg_evaluator_sphere_decisions_total``.

The sender and the evaluator share a settable clock, and the evaluator's steps (ack
intake, the deadline sweep, the sphere sweep) are called directly; runs on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from condmsg import Destination, Verdict
from condmsg.cli import main
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.outcome import SPHERE_OUTCOME_TYPE, SphereOutcome
from condmsg.core.timeutil import utcnow
from condmsg.spheres.sphere import Sphere
from evaluator.service import Evaluator
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import Clock, ack_body, stepped_evaluator

pytestmark = [pytest.mark.postgres]

S = timedelta(seconds=1)
GRACE = timedelta(milliseconds=100)
METRIC = "condmsg_evaluator_sphere_decisions_total"


@dataclass
class World:
    sender: Any
    evaluator: Evaluator
    clock: Clock
    queue: str
    db_url: str

    def member(self, ds: Sphere, pickup_within: timedelta = 60 * S) -> str:
        return ds.send(b"notice", Destination(self.queue, pickup_within=pickup_within))

    def ack(self, *cm_ids: str) -> int:
        """Ack intake: a commit ack for each of ``cm_ids``, read and committed now."""
        at = self.clock.at
        bodies = [
            ack_body(cm_id, self.queue, at, receiver="rx", kind=AckKind.COMMIT, committed_at=at)
            for cm_id in cm_ids
        ]
        self.clock.at += 2 * GRACE  # the acks are in before the effective instant
        return self.evaluator.process_bodies(bodies)

    def sweep(self) -> None:
        """The deadline sweep (due CMs) and the sphere sweep (due spheres)."""
        self.evaluator.sweep()
        self.evaluator.jobs.sweep_spheres()

    def counted(self) -> dict[str, float]:
        registry = self.evaluator.registry
        found = {v.value: registry.get_sample_value(METRIC, {"verdict": v.value}) for v in Verdict}
        return {verdict: count for verdict, count in found.items() if count}

    def notifications(self) -> list[SphereOutcome]:
        """The sphere outcomes written to the outbox for the sender's outcome queue."""
        outbox = outbox_table()
        with self.sender.engine.connect() as conn:
            bodies = conn.scalars(
                sa.select(outbox.c.body)
                .where(outbox.c.routing_key == protocol.outcome_queue(self.sender.name))
                .where(outbox.c.message_type == SPHERE_OUTCOME_TYPE)
            ).all()
        return [SphereOutcome.from_json(body) for body in bodies]

    def state(self, cm_id: str) -> str:
        with self.sender.engine.connect() as conn:
            return str(self.sender.store.cm(conn, cm_id).state)


@pytest.fixture
def world(db_url: str, unique_name: str, make_sender: Any) -> World:
    return _world(db_url, unique_name, make_sender)


def _world(db_url: str, unique_name: str, make_sender: Any) -> World:
    name = unique_name.replace(".", "-")
    clock = Clock(utcnow())
    sender = make_sender(db_url, name, clock=clock, declare_queues=False)
    evaluator = stepped_evaluator(sender, clock, ack_grace=GRACE)
    return World(sender, evaluator, clock, f"{unique_name}.q", db_url)


# -- the outcome, as recorded -----------------------------------------------------------


def test_a_decided_spheres_outcome_stays_as_it_was_decided(world: World, capsys: Any) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    done = w.member(ds)
    late = w.member(ds, pickup_within=5 * S)
    assert w.ack(done) == 1
    ds.abort("changed plans")
    w.sweep()
    (notified,) = w.notifications()
    assert notified.verdict is Verdict.VIOLATED
    assert notified.members == {done: "satisfied", late: "pending"}

    w.clock.at += 10 * S  # the pending member is decided: violated at its pickup deadline
    w.sweep()
    assert w.state(late) == "violated"

    assert ds.outcome() == notified
    assert w.sender.sphere_outcome(ds.sphere_id) == notified
    assert w.sender.sphere_by_id(ds.sphere_id).outcome() == notified
    assert main(["status", ds.sphere_id, "--db-url", w.db_url]) == 0
    out = capsys.readouterr().out
    assert "members when it was decided:" in out
    assert f"  {done}: satisfied" in out and f"  {late}: pending" in out
    assert f"cm {late} from {w.sender.name}, sent" in out and "state violated" in out


def test_an_undecided_sphere_has_no_outcome(world: World, capsys: Any) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    w.member(ds)
    w.sweep()
    assert ds.outcome() is None and w.sender.sphere_outcome(ds.sphere_id) is None
    assert main(["status", ds.sphere_id, "--db-url", w.db_url]) == 0
    assert "members when it was decided" not in capsys.readouterr().out


# -- every path that decides a sphere counts it once -------------------------------------


def _counts_once(w: World, ds: Sphere, verdict: Verdict, *pending: str) -> None:
    """The sphere is decided with ``verdict`` and counted once, also after its pending
    members are decided and every sweep ran again."""
    assert w.counted() == {verdict.value: 1}
    outcome = ds.outcome()
    assert outcome is not None and outcome.verdict is verdict
    assert [n.sphere_id for n in w.notifications()] == [ds.sphere_id]
    w.clock.at += 120 * S
    w.sweep()
    if pending:
        assert w.state(pending[0]) == "violated"
    w.sweep()
    assert w.counted() == {verdict.value: 1}


def test_decided_by_ack_intake(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    member = w.member(ds)
    ds.commit()
    w.evaluator.jobs.sweep_spheres()  # committed, its member still pending: undecided
    assert w.counted() == {}
    assert w.ack(member) == 1
    _counts_once(w, ds, Verdict.SATISFIED)


def test_decided_by_the_deadline_sweep_deciding_a_member(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    member = w.member(ds, pickup_within=S)
    ds.commit()
    w.evaluator.jobs.sweep_spheres()
    w.clock.at += 2 * S
    assert w.evaluator.sweep() == 1  # the member is violated at its pickup deadline
    assert w.state(member) == "violated"
    _counts_once(w, ds, Verdict.VIOLATED)


def test_decided_by_the_sphere_sweep_at_the_deadline(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=S)
    member = w.member(ds, pickup_within=30 * S)
    w.clock.at += 2 * S
    assert w.evaluator.jobs.sweep_spheres() == 1
    _counts_once(w, ds, Verdict.VIOLATED, member)


def test_decided_after_an_abort(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    member = w.member(ds)
    ds.abort()
    w.sweep()
    _counts_once(w, ds, Verdict.VIOLATED, member)


def test_decided_after_a_commit_past_the_deadline(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=S)
    member = w.member(ds)
    w.clock.at += 2 * S
    assert ds.commit() is None  # too late: not committed
    w.sweep()
    outcome = ds.outcome()
    assert outcome is not None and "not committed" in outcome.reasons[0]
    _counts_once(w, ds, Verdict.VIOLATED, member)


class _VotesNo:
    participant_id = "inventory"

    def prepare(self) -> bool:
        return False

    def commit(self) -> None:
        raise AssertionError("never committed")

    def rollback(self) -> None:
        pass


def test_decided_after_a_participant_votes_no(world: World) -> None:
    w = world
    ds = w.sender.begin_sphere(timeout=60 * S)
    member = w.member(ds)
    ds.enlist(_VotesNo())
    ds.commit()
    w.sweep()
    outcome = ds.outcome()
    assert outcome is not None
    assert outcome.reasons == ("sphere aborted: participant inventory voted no",)
    _counts_once(w, ds, Verdict.VIOLATED, member)


def test_a_transaction_whose_block_raised_votes_no_numbered_among_all_participants(
    pg_url: str, unique_name: str, make_sender: Any
) -> None:
    """``p<n>`` counts every participant before it (here a handler, ``h1``); the
    application caught the exception, so the sphere's commit finds the no vote."""
    w = _world(pg_url, unique_name, make_sender)
    w.sender.register_handler("undo", lambda session: None)
    ds = w.sender.begin_sphere(timeout=60 * S)
    ds.on_failure("undo")
    with pytest.raises(ValueError, match="boom"), ds.transaction(pg_url):
        raise ValueError("boom")
    ds.commit()
    w.sweep()
    outcome = ds.outcome()
    gid = f"condmsg-{ds.sphere_id}-p2"
    assert outcome is not None
    assert outcome.reasons == (
        f"sphere aborted: participant {gid} voted no: its block raised ValueError",
    )
    participants = {
        p.participant_id: p.state for p in w.sender.spheres.participants.rows(ds.sphere_id)
    }
    assert participants == {"h1": "ran", gid: "rolled_back"}


def test_participants_are_numbered_in_one_count(world: World) -> None:
    """A handler's ``h<n>`` (and a transaction's ``p<n>``) counts every participant
    added before it, the ones the application enlists too."""
    w = world
    w.sender.register_handler("undo", lambda session: None)
    ds = w.sender.begin_sphere(timeout=60 * S)
    for add in (lambda: ds.enlist(_VotesNo()), lambda: ds.on_failure("undo")):
        add()
        w.clock.at += S  # participants are listed in the order of their enlisting instants
    ds.on_success("undo")
    ids = [p.participant_id for p in w.sender.spheres.participants.rows(ds.sphere_id)]
    assert ids == ["inventory", "h2", "h3"]
