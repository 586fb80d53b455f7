"""Dependency-Spheres across crashes: the evaluator killed with SIGKILL mid-sphere and
restarted, and the sender process killed after ``PREPARE TRANSACTION`` (before and after
the sphere's commit was recorded). Every sphere ends with exactly one outcome, its prepared
transaction is committed or rolled back by that outcome, and each handler runs once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.outcome import SPHERE_OUTCOME_TYPE, SphereOutcome
from condmsg.spheres.participants import prepared_gids
from tests.waiting import wait_for

from .conftest import ROOT, SECRET, Procs, publish_acks

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgres]


def _sphere_outcomes(amqp_url: str, sender: str) -> list[SphereOutcome]:
    """Every sphere outcome on the outcome queue now (the CMs' own are dropped)."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    found: list[SphereOutcome] = []
    try:
        channel = connection.channel()
        for method, props, body in channel.consume(
            protocol.outcome_queue(sender), auto_ack=True, inactivity_timeout=1.0
        ):
            if method is None:
                break
            if props.type == SPHERE_OUTCOME_TYPE:
                found.append(SphereOutcome.from_json(body))
        channel.cancel()
    finally:
        connection.close()
    return found


def _spheres(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        s = tables.spheres
        return dict(conn.execute(sa.select(s.c.sphere_id, s.c.state)).all())


def _rows(engine: sa.Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def _our_prepared(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        ours = {r for (r,) in conn.execute(sa.select(tables.sphere_participants.c.participant_id))}
    return [gid for gid in prepared_gids(engine) if gid in ours]


def _record(handler: str) -> Any:
    def run(session: Session, key: str) -> None:
        session.execute(sa.text("INSERT INTO ran VALUES (:h, :k)"), {"h": handler, "k": key})

    return run


@pytest.fixture
def world(procs: Procs, make_sender: Any) -> tuple[Any, sa.Engine]:
    engine = sa.create_engine(procs.pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE booking (k text PRIMARY KEY)"))
        conn.execute(sa.text("CREATE TABLE ran (handler text, k text)"))
    sender = make_sender(procs.pg_url, procs.sender)
    sender.register_handler("booked", _record("booked"))
    sender.register_handler("released", _record("released"))
    return sender, engine


def test_the_evaluator_killed_mid_sphere(procs: Procs, world: tuple[Any, sa.Engine]) -> None:
    sender, engine = world
    q = f"{procs.unique_name}.q"
    member = Destination(q, pickup_within=timedelta(seconds=10))
    victim = procs.evaluator("--no-relay")
    procs.relay()
    procs.wait_ready([], consumers=1)
    spheres: list[Any] = []
    members: list[tuple[str, str]] = []
    for i in range(12):
        ds = sender.begin_sphere(timeout=timedelta(seconds=15))
        members.append((ds.send(f"first {i}".encode(), member), ds.send(b"second", member)))
        with ds.transaction(engine) as session:
            session.execute(sa.text("INSERT INTO booking VALUES (:k)"), {"k": str(i)})
        ds.on_success("booked", key=str(i))
        ds.on_failure("released", key=str(i))
        if i < 6:
            ds.commit()  # committed before the crash (prepared transactions held)
        spheres.append(ds)
    publish_acks(procs.amqp_url, procs.sender, [(first, q) for first, _ in members])
    wait_for(
        lambda: len(_rows(engine, "SELECT 1 FROM condmsg_cm WHERE state = 'satisfied'")) >= 6,
        timeout=30,
    )
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    # While it is down: the second members are acked (but every fourth sphere's never is),
    # and the other spheres are committed.
    fails = {i for i in range(12) if i % 4 == 0}
    publish_acks(
        procs.amqp_url, procs.sender, [(m[1], q) for i, m in enumerate(members) if i not in fails]
    )
    for ds in spheres[6:]:
        ds.commit()
    restarted = procs.evaluator("--no-relay")
    outcomes = [ds.outcome(timeout=30) for ds in spheres]  # also finishes the participants
    assert all(o is not None for o in outcomes)
    verdicts = {ds.sphere_id: o.verdict.value for ds, o in zip(spheres, outcomes, strict=True)}
    expected = {
        ds.sphere_id: "violated" if i in fails else "satisfied" for i, ds in enumerate(spheres)
    }
    assert verdicts == expected == _spheres(engine)
    pushed = wait_for(lambda: _sphere_outcomes(procs.amqp_url, procs.sender), timeout=30)
    pushed += _sphere_outcomes(procs.amqp_url, procs.sender)
    assert sorted(o.sphere_id for o in pushed) == sorted(expected)  # one each, no duplicate
    assert {o.sphere_id: o.verdict.value for o in pushed} == expected
    assert _our_prepared(engine) == []
    booked = {str(i) for i in range(12) if i not in fails}
    assert {k for (k,) in _rows(engine, "SELECT k FROM booking")} == booked
    ran = sorted(_rows(engine, "SELECT handler, k FROM ran"))
    assert ran == sorted(
        [("booked", k) for k in booked] + [("released", str(i)) for i in sorted(fails)]
    )
    assert procs.stop(restarted) == 0


#: The sender process of the test below: begins a sphere with one member and a prepared
#: transaction, then dies (SIGKILL from the test) at the point ``stage`` names.
_SENDER = """
import json, sys, time
from datetime import timedelta
import sqlalchemy as sa
from condmsg import Destination
from condmsg.sending.sender import Sender
from condmsg.spheres.resolution import SphereParticipants
from condmsg.core.store_values import ParticipantState

config = json.loads(sys.argv[1])
sender = Sender(amqp_url=config["amqp_url"], db_url=config["db_url"], name=config["name"],
                secret=config["secret"].encode())
sender.register_handler("booked", lambda session, **a: None)
sender.register_handler("released", lambda session, **a: None)
ds = sender.begin_sphere(timeout=config["timeout_s"])
within = timedelta(seconds=config["timeout_s"])
member = ds.send(b"notice", Destination(config["queue"], pickup_within=within))
with ds.transaction(config["db_url"]) as session:
    session.execute(sa.text("INSERT INTO booking VALUES (:k)"), {"k": config["stage"]})
ds.on_success("booked", key=config["stage"])
ds.on_failure("released", key=config["stage"])
mark = SphereParticipants.mark


def stop_here() -> None:
    print(json.dumps({"sphere_id": ds.sphere_id, "member": member}), flush=True)
    time.sleep(600)


def crash_before_the_log(self, sphere_id, participant_id, state, detail=None):
    # PREPARE TRANSACTION has run; its mark in the sphere log has not.
    if state is ParticipantState.PREPARED:
        stop_here()
    return mark(self, sphere_id, participant_id, state, detail)


if config["stage"] == "prepared":
    SphereParticipants.mark = crash_before_the_log
ds.commit()
stop_here()
"""


@pytest.mark.parametrize(
    ("stage", "verdict"),
    [("prepared", "violated"), ("committed", "satisfied")],
)
def test_the_sender_killed_after_prepare_transaction(
    procs: Procs, world: tuple[Any, sa.Engine], tmp_path: Path, stage: str, verdict: str
) -> None:
    sender, engine = world
    q = f"{procs.unique_name}.q"
    evaluator = procs.evaluator()
    procs.wait_ready([], consumers=1)
    config = {
        "amqp_url": procs.amqp_url,
        "db_url": procs.pg_url,
        "name": procs.sender,
        "secret": SECRET.decode(),
        "queue": q,
        "stage": stage,
        "timeout_s": 3.0,
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _SENDER, json.dumps(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "sender.log").open("wb"),
    )
    assert child.stdout is not None
    began = json.loads(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    gid = f"condmsg-{began['sphere_id']}-p1"
    assert _our_prepared(engine) == [gid]  # in doubt: prepared, and its process gone
    publish_acks(procs.amqp_url, procs.sender, [(began["member"], q)])
    # The member is satisfied; the sphere's outcome comes from its recorded commit (or the
    # lack of one: then its timeout).
    wait_for(lambda: _spheres(engine)[began["sphere_id"]] == verdict, timeout=30)
    assert _our_prepared(engine) == [gid]  # nobody finished it yet: its sender is gone
    # The sender restarts (here: this process) and finishes what the dead one left.
    assert sender.resolve_spheres() == 1
    assert _our_prepared(engine) == []
    booked = [(stage,)] if verdict == "satisfied" else []
    assert _rows(engine, "SELECT k FROM booking") == booked
    handler = "booked" if verdict == "satisfied" else "released"
    assert _rows(engine, "SELECT handler, k FROM ran") == [(handler, stage)]
    assert sender.resolve_spheres() == 0  # nothing left; nothing runs twice
    assert _rows(engine, "SELECT handler, k FROM ran") == [(handler, stage)]
    with engine.connect() as conn:
        states = dict(
            conn.execute(
                sa.select(
                    tables.sphere_participants.c.participant_id,
                    tables.sphere_participants.c.state,
                )
            ).all()
        )
    assert states[gid] == ("committed" if verdict == "satisfied" else "rolled_back")
    assert procs.stop(evaluator) == 0
