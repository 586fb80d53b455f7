"""Dependency-Spheres (the paper's section 3) on the real services: a meeting notice and the
booking of its room as one unit of work, once committed and once aborted.

Each sphere holds one member, a notice under Example 1's condition, read by the attendees
as in Example 1's successful run, and one transactional participant: the room's row in the
facilities' database, written in a PostgreSQL prepared transaction, so that nobody sees it
unless the sphere succeeds. An ``on_failure`` handler records the room's release.

1. Committed at once, before anyone has read the notice: the sphere is decided the moment
   its member is, the booking commits and the attendees get success notices.
2. Aborted once the notice is satisfied: the member's success takes no action of its own
   while the sphere is open, so the abort turns it into compensations for every attendee
   who consumed it, the booking is rolled back, and the handler runs once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import SphereOutcome
from condmsg.demo import example1
from condmsg.demo.agents import pause
from condmsg.demo.stage import Stage, sleep_until
from condmsg.demo.story import Clock
from condmsg.spheres.participants import prepared_gids
from condmsg.spheres.sphere import Sphere
from condmsg.spheres.store import SPHERES

ROOM = "4.12"
#: The sphere's timeout, in days: long enough for the script, whose reads end at +1 day.
TIMEOUT_DAYS = 5
RELEASE_HANDLER = "release_room"


@dataclass(frozen=True, slots=True)
class SphereRun:
    title: str
    plot: str
    label: str
    notice: bytes
    cancelled: str
    #: The day the room is booked for (a row per room and day).
    day: str
    #: Days after the send at which the organiser aborts; None: committed at the start.
    abort_at: float | None = None
    abort_reason: str = ""


RUNS = (
    SphereRun(
        "committed, everyone processes in time",
        "the notice for the contract negotiation and room 4.12 on 3 December, committed at "
        "once; the attendees read it as in run 1",
        "meeting notice",
        example1.NOTICE,
        example1.CANCELLED,
        day="2026-12-03",
    ),
    SphereRun(
        "aborted after the notice succeeded",
        "the notice for the contract signing and room 4.12 on 10 December; everyone "
        "processes it in time, then the client postpones the signing",
        "signing notice",
        b"Contract signing on 10 December, 14:00, room 4.12: please confirm",
        "Contract signing on 10 December cancelled",
        day="2026-12-10",
        abort_at=1.5,
        abort_reason="the client postponed the signing",
    ),
)


def prepare_facilities(url: str) -> sa.Engine:
    """The facilities' database (its tables created once); the caller disposes of it."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS room_booking (room text, day date, meeting text,"
                " sphere_id text NOT NULL, PRIMARY KEY (room, day))"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS room_release (sphere_id text, room text, day date,"
                " released_at timestamptz NOT NULL DEFAULT now())"
            )
        )
    return engine


def _register_release(stage: Stage) -> None:
    # The handler's session is on the sender's store, which shares the database with the
    # facilities' schema: the release commits with the mark that the handler ran.
    table = f'"{stage.names.facilities_schema}".room_release'

    def release(session: Session, *, sphere: str, room: str, day: str) -> None:
        session.execute(
            sa.text(f"INSERT INTO {table} (sphere_id, room, day) VALUES (:s, :r, :d)"),
            {"s": sphere, "r": room, "d": day},
        )

    stage.sender.register_handler(RELEASE_HANDLER, release)


def run(stage: Stage, number: int, spec: SphereRun) -> str:
    """Begin the sphere, send its member, book the room, follow the script, check the
    outcome, the deliveries and the booking; returns the sphere's id."""
    stage.story.say(f"\n-- Dependency-Sphere {number}: {spec.title}. {spec.plot}.")
    pause(stage.receivers.values())
    _register_release(stage)
    rooms = prepare_facilities(stage.facilities_url)
    try:
        return _run(stage, spec, rooms)
    finally:
        rooms.dispose()


def _run(stage: Stage, spec: SphereRun, rooms: sa.Engine) -> str:
    story, names, day, checks = stage.story, stage.names, stage.day_s, stage.checks
    start = time.monotonic()
    ds = stage.sender.begin_sphere(timeout=TIMEOUT_DAYS * day)
    cm_id = ds.send(
        spec.notice,
        example1.condition(names, day),
        compensation=spec.cancelled,
        notify_success=True,
    )
    with ds.transaction(rooms) as session:
        session.execute(
            sa.text("INSERT INTO room_booking VALUES (:room, :day, :meeting, :sphere)"),
            {"room": ROOM, "day": spec.day, "meeting": spec.label, "sphere": ds.sphere_id},
        )
    ds.on_failure(RELEASE_HANDLER, sphere=ds.sphere_id, room=ROOM, day=spec.day)
    clock = Clock(stage.sent_at(cm_id), day, "d", spec.label)
    story.register(ds.sphere_id, clock)
    story.register(cm_id, clock)
    story.line(
        "+0.00d",
        "sender",
        f"began sphere {ds.sphere_id[:8]} (timeout {TIMEOUT_DAYS}d); sent the {spec.label}, "
        f"CM {cm_id[:8]}, to qr1..qr4",
        (
            f"booked room {ROOM} for {spec.day} in the facilities' database, in the sphere's "
            "transaction; on failure: release_room",
        ),
    )
    if spec.abort_at is None:
        ds.commit()
        story.line(
            story.when(cm_id),
            "sender",
            "committed the sphere: the booking is a prepared transaction until the outcome",
        )
        checks.expect(
            _booked(rooms, spec.day) == [] and len(prepared_gids(rooms, _gid(ds))) == 1,
            "after the commit the booking is prepared, not visible",
        )
    for read in example1.RUNS[0].reads:
        sleep_until(start, read.at * day)
        stage.receivers[read.dest].start_reading(
            transactional=read.transactional, hold_s=read.hold * day if read.transactional else 0
        )
    if spec.abort_at is not None:
        _abort_later(stage, spec, ds, cm_id, start, rooms)
    outcome = ds.outcome(timeout=TIMEOUT_DAYS * day + 20)  # finishes the participants
    if not checks.expect(outcome is not None, "the sphere was decided"):
        return ds.sphere_id
    assert outcome is not None
    _check(stage, spec, ds, cm_id, outcome, rooms)
    return ds.sphere_id


def _abort_later(
    stage: Stage, spec: SphereRun, ds: Sphere, cm_id: str, start: float, rooms: sa.Engine
) -> None:
    story, checks = stage.story, stage.checks
    assert spec.abort_at is not None
    satisfied = stage.settle(lambda: _state(stage, cm_id) == "satisfied", 10 + 2 * stage.day_s)
    if satisfied:
        story.line(
            story.when(cm_id),
            "evaluator",
            f"the {spec.label} is satisfied; the sphere is open, so nothing is sent for it yet",
        )
    sleep_until(start, spec.abort_at * stage.day_s)
    notices = [k for rx in stage.receivers.values() for k in rx.got(cm_id) if k != "original"]
    checks.expect(
        satisfied and stage.outcomes.get(cm_id) is None and not notices,
        f"the {spec.label} is satisfied on its own, with no notification nor notice yet",
    )
    checks.expect(_booked(rooms, spec.day) == [], "the booking is not visible while open")
    ds.abort(spec.abort_reason)
    story.line(story.when(cm_id), "sender", f"aborted the sphere: {spec.abort_reason}")


def _check(
    stage: Stage,
    spec: SphereRun,
    ds: Sphere,
    cm_id: str,
    outcome: SphereOutcome,
    rooms: sa.Engine,
) -> None:
    checks, day = stage.checks, stage.day_s
    committed = spec.abort_at is None
    verdict = Verdict.SATISFIED if committed else Verdict.VIOLATED
    reason = (
        "committed with its only member satisfied"
        if committed
        else f"sphere aborted: {spec.abort_reason}"
    )
    checks.expect(
        outcome.verdict is verdict and outcome.reasons == (reason,),
        f"sphere verdict {outcome.verdict.value}: {'; '.join(outcome.reasons)}",
    )
    checks.expect(
        outcome.members == {cm_id: "satisfied"},
        f"its member, the {spec.label}, was satisfied on its own",
    )
    if committed:
        member_decided = _decided_at(stage, cm_id)
        checks.expect(
            member_decided is not None and outcome.decided_at == member_decided,
            "the sphere was decided with its member's decision",
        )
    arrived = stage.settle(lambda: stage.outcomes.sphere(ds.sphere_id), timeout=10)
    checks.expect(arrived, "the sphere's outcome notification reached the sender")
    then = "success" if committed else "compensation"
    expected = {rx.label: ["original", then] for rx in stage.receivers.values()}

    def delivered() -> dict[str, list[str]]:
        return {rx.label: rx.got(cm_id) for rx in stage.receivers.values()}

    stage.settle(lambda: delivered() == expected, timeout=10 + 2 * day)
    got = delivered()
    for label, kinds in expected.items():
        checks.expect(got[label] == kinds, f"{label}'s app got {', '.join(kinds)}")
    if not committed:
        comp = [p for rx in stage.receivers.values() for p in rx.payloads(cm_id, "compensation")]
        checks.expect(set(comp) == {spec.cancelled}, f"each compensation read {spec.cancelled!r}")
    booked = _booked(rooms, spec.day)
    checks.expect(
        booked == ([ds.sphere_id] if committed else []),
        f"room {ROOM} on {spec.day}: {'booked' if booked else 'not booked'}, "
        f"no prepared transaction left ({len(prepared_gids(rooms, _gid(ds)))})",
    )
    stage.sender.resolve_spheres()  # nothing is left to finish: nothing runs twice
    released = _released(rooms, ds.sphere_id)
    checks.expect(
        released == (0 if committed else 1),
        f"release_room ran {released} time(s) (once on failure, never on success)",
    )
    states = _participants(stage, ds.sphere_id)
    want = {"p1": "committed", "h2": "skipped"} if committed else {"p1": "rolled_back", "h2": "ran"}
    shown = ", ".join(f"{k} {v}" for k, v in states.items())
    checks.expect(states == want, f"participants: {shown} (p1 the booking, h2 the handler)")


def _gid(ds: Sphere) -> str:
    """The prefix of the sphere's prepared transactions' ids."""
    return f"condmsg-{ds.sphere_id}-"


def _booked(rooms: sa.Engine, day: str) -> list[str]:
    with rooms.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT sphere_id FROM room_booking WHERE room = :r AND day = :d"),
            {"r": ROOM, "d": day},
        )
        return [s for (s,) in rows]


def _released(rooms: sa.Engine, sphere_id: str) -> int:
    with rooms.connect() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM room_release WHERE sphere_id = :s"), {"s": sphere_id}
        )
        return int(found.scalar_one())


def _state(stage: Stage, cm_id: str) -> str:
    cms = tables.cms
    with stage.sender.engine.connect() as conn:
        return str(conn.execute(sa.select(cms.c.state).where(cms.c.cm_id == cm_id)).scalar_one())


def _decided_at(stage: Stage, cm_id: str) -> Any:
    cms = tables.cms
    with stage.sender.engine.connect() as conn:
        value = conn.execute(sa.select(cms.c.decided_at).where(cms.c.cm_id == cm_id)).scalar_one()
    return value


def _participants(stage: Stage, sphere_id: str) -> dict[str, str]:
    """Each participant's state, by a short name: ``p1`` the booking, ``h2`` the handler."""
    with stage.sender.engine.connect() as conn:
        rows = SPHERES.participants(conn, sphere_id)
    return {p.participant_id.rsplit("-", 1)[-1]: p.state for p in rows}
