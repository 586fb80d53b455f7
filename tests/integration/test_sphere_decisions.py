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

from condmsg import Destination, Verdict, protocol
from condmsg.acks import AckKind
from condmsg.cli import main
from condmsg.sphere_outcome import SPHERE_OUTCOME_TYPE, SphereOutcome
from condmsg.spheres import Sphere
from condmsg.timeutil import utcnow
from evaluator.service import Evaluator
from outbox.table import outbox_table

from .condmsg_helpers import Clock, ack_body, stepped_evaluator

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
