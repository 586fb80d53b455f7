"""The sphere log: what the sender's spheres and the evaluator's sphere decisions read and
write.

The sender begins a sphere, adds members to it (under the sphere row's lock, only while it
is open), enlists participants, and requests its commit or abort; the evaluator locks the
spheres its decisions touch, judges them (:mod:`condmsg.core.sphere_evaluation`) and records the
outcome once. Every method takes the caller's session or connection and never commits.

One class serves every database, so there is no port to choose an adapter through:
spheres are few and their statements small, and a psycopg twin would be the same SQL twice
(``docs/stores.md``). Row locks are requested
everywhere; SQLAlchemy renders none on SQLite, whose writers are serialised anyway.
``tests/contract/test_sphere_store.py`` runs it on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import SphereOutcome
from condmsg.core.sphere_evaluation import MemberFacts, SphereFacts
from condmsg.core.store_values import ParticipantState, SphereState
from condmsg.core.timeutil import stored_instant

Bind = Session | Connection

_UNDECIDED = (SphereState.OPEN.value, SphereState.COMMITTED.value, SphereState.ABORTED.value)
_UNRESOLVED = (
    ParticipantState.ENLISTED.value,
    ParticipantState.PREPARED.value,
    ParticipantState.VOTED_NO.value,
)


class SphereRow(NamedTuple):
    """A ``condmsg_sphere`` row."""

    sphere_id: str
    sender: str
    begun_at: datetime
    deadline: datetime
    members: int
    state: str
    committed_at: datetime | None
    aborted_at: datetime | None
    abort_reason: str | None
    next_check_at: datetime | None
    decided_at: datetime | None
    effective_at: datetime | None
    reasons: tuple[str, ...]
    member_verdicts: dict[str, str] | None

    @property
    def decided(self) -> bool:
        return SphereState(self.state).decided

    def outcome(self) -> SphereOutcome | None:
        """The outcome its decision recorded (None while undecided): what the outcome
        notification carried, however its members were decided since."""
        if not self.decided:
            return None
        assert self.decided_at is not None and self.effective_at is not None
        return SphereOutcome(
            sphere_id=self.sphere_id,
            verdict=Verdict(self.state),
            reasons=self.reasons,
            decided_at=self.decided_at,
            effective_at=self.effective_at,
            members=dict(self.member_verdicts or {}),
        )

    @classmethod
    def of(cls, row: Any) -> SphereRow:
        return cls(
            sphere_id=row.sphere_id,
            sender=row.sender,
            begun_at=stored_instant(row.begun_at),
            deadline=stored_instant(row.deadline),
            members=row.members,
            state=row.state,
            committed_at=stored_instant(row.committed_at),
            aborted_at=stored_instant(row.aborted_at),
            abort_reason=row.abort_reason,
            next_check_at=stored_instant(row.next_check_at),
            decided_at=stored_instant(row.decided_at),
            effective_at=stored_instant(row.effective_at),
            reasons=tuple(json.loads(row.reasons_json or "[]")),
            member_verdicts=(
                None if row.member_verdicts_json is None else json.loads(row.member_verdicts_json)
            ),
        )


class MemberRow(NamedTuple):
    """A member CM as a sphere's judgement and outcome actions need it."""

    cm_id: str
    sender: str
    sent_at: datetime
    notify_success: bool
    state: str
    decided_at: datetime | None
    effective_at: datetime | None
    reasons_json: str | None
    facts_json: str | None

    def facts(self) -> MemberFacts:
        return MemberFacts(
            self.cm_id, self.state, self.effective_at, tuple(json.loads(self.reasons_json or "[]"))
        )


class ParticipantRow(NamedTuple):
    """A ``condmsg_sphere_participant`` row."""

    sphere_id: str
    participant_id: str
    kind: str
    resource: str
    args: dict[str, Any]
    run_on: str | None
    state: str
    detail: str | None


def sphere_facts(sphere: SphereRow, members: Iterable[MemberRow]) -> SphereFacts:
    return SphereFacts(
        sphere.sphere_id,
        sphere.state,
        sphere.deadline,
        sphere.committed_at,
        sphere.aborted_at,
        sphere.abort_reason,
        [m.facts() for m in members],
    )


class SphereStore:
    """The sphere log in the sender's store, on SQLAlchemy Core for every database
    (stateless). The sender's side begins, joins, requests and enlists; the evaluator's side
    locks, claims, decides and schedules the next check."""

    def begin(
        self, session: Session, *, sphere_id: str, sender: str, now: datetime, deadline: datetime
    ) -> None:
        """Record a new open sphere (its first check is its deadline)."""
        session.execute(
            sa.insert(tables.spheres),
            [
                {
                    "sphere_id": sphere_id,
                    "sender": sender,
                    "begun_at": now,
                    "deadline": deadline,
                    "members": 0,
                    "state": SphereState.OPEN.value,
                    "next_check_at": deadline,
                }
            ],
        )

    def join(self, session: Session, sphere_id: str, count: int, now: datetime) -> bool:
        """Count ``count`` new members into the sphere, holding its row until the caller's
        transaction ends; False (nothing changed) unless it is open and before its
        deadline."""
        s = tables.spheres
        done = session.execute(
            sa.update(s)
            .where(s.c.sphere_id == sphere_id)
            .where(s.c.state == SphereState.OPEN.value)
            .where(s.c.deadline > now)
            .values(members=s.c.members + count)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def request_commit(self, session: Session, sphere_id: str, now: datetime) -> bool:
        """Mark an open sphere committed, before its deadline; False if it was not open
        (or its deadline has passed)."""
        s = tables.spheres
        done = session.execute(
            sa.update(s)
            .where(s.c.sphere_id == sphere_id)
            .where(s.c.state == SphereState.OPEN.value)
            .where(s.c.deadline > now)
            .values(state=SphereState.COMMITTED.value, committed_at=now, next_check_at=now)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def request_abort(self, session: Session, sphere_id: str, now: datetime, reason: str) -> bool:
        """Mark an open sphere aborted with ``reason``; False if it was not open."""
        s = tables.spheres
        done = session.execute(
            sa.update(s)
            .where(s.c.sphere_id == sphere_id)
            .where(s.c.state == SphereState.OPEN.value)
            .values(
                state=SphereState.ABORTED.value,
                aborted_at=now,
                abort_reason=reason[:2000],
                next_check_at=now,
            )
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def sphere(self, bind: Bind, sphere_id: str) -> SphereRow | None:
        """The sphere's row, or None."""
        s = tables.spheres
        row = bind.execute(sa.select(s).where(s.c.sphere_id == sphere_id)).first()
        return None if row is None else SphereRow.of(row)

    def add_participant(
        self,
        session: Session,
        *,
        sphere_id: str,
        participant_id: str,
        kind: str,
        resource: str,
        now: datetime,
        args: Mapping[str, Any] | None = None,
        run_on: str | None = None,
    ) -> None:
        """Log a participant as enlisted (its id is unique within the sphere)."""
        session.execute(
            sa.insert(tables.sphere_participants),
            [
                {
                    "sphere_id": sphere_id,
                    "participant_id": participant_id,
                    "kind": kind,
                    "resource": resource,
                    "args_json": None if args is None else json.dumps(dict(args), sort_keys=True),
                    "run_on": run_on,
                    "state": ParticipantState.ENLISTED.value,
                    "enlisted_at": now,
                }
            ],
        )

    def set_participant(
        self,
        bind: Bind,
        sphere_id: str,
        participant_id: str,
        state: ParticipantState,
        *,
        now: datetime,
        detail: str | None = None,
    ) -> bool:
        """Move an unresolved participant to ``state``; False if it was resolved already
        (another process resolved it first)."""
        p = tables.sphere_participants
        values: dict[str, Any] = {"state": state.value}
        if state.resolved:
            values["resolved_at"] = now
        if detail is not None:
            values["detail"] = detail[:2000]
        done = bind.execute(
            sa.update(p)
            .where(p.c.sphere_id == sphere_id)
            .where(p.c.participant_id == participant_id)
            .where(p.c.state.in_(_UNRESOLVED))
            .values(**values)
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def participants(self, bind: Bind, sphere_id: str) -> list[ParticipantRow]:
        """The sphere's participants, in the order they were enlisted."""
        p = tables.sphere_participants
        rows = bind.execute(
            sa.select(p)
            .where(p.c.sphere_id == sphere_id)
            .order_by(p.c.enlisted_at, p.c.participant_id)
        )
        return [
            ParticipantRow(
                r.sphere_id,
                r.participant_id,
                r.kind,
                r.resource,
                json.loads(r.args_json) if r.args_json else {},
                r.run_on,
                r.state,
                r.detail,
            )
            for r in rows
        ]

    def unresolved(self, bind: Bind, *, sender: str, limit: int) -> list[str]:
        """Decided spheres of ``sender`` with a participant still unresolved."""
        s, p = tables.spheres, tables.sphere_participants
        rows = bind.execute(
            sa.select(s.c.sphere_id)
            .where(s.c.sender == sender)
            .where(s.c.state.in_([SphereState.SATISFIED.value, SphereState.VIOLATED.value]))
            .where(
                sa.exists().where(p.c.sphere_id == s.c.sphere_id).where(p.c.state.in_(_UNRESOLVED))
            )
            .order_by(s.c.decided_at)
            .limit(limit)
        )
        return [sphere_id for (sphere_id,) in rows]

    def members(self, bind: Bind, sphere_ids: Iterable[str]) -> dict[str, list[MemberRow]]:
        """Per sphere, its member CMs in the order they were sent."""
        ids = sorted(set(sphere_ids))
        found: dict[str, list[MemberRow]] = {sphere_id: [] for sphere_id in ids}
        if not ids:
            return found
        c = tables.cms.c
        rows = bind.execute(
            sa.select(
                c.sphere_id,
                c.cm_id,
                c.sender,
                c.sent_at,
                c.notify_success,
                c.state,
                c.decided_at,
                c.effective_at,
                c.reasons_json,
                c.facts_json,
            )
            .where(c.sphere_id.in_(ids))
            .order_by(c.sent_at, c.cm_id)
        )
        for r in rows:
            found[r.sphere_id].append(
                MemberRow(
                    r.cm_id,
                    r.sender,
                    stored_instant(r.sent_at),
                    r.notify_success,
                    r.state,
                    stored_instant(r.decided_at),
                    stored_instant(r.effective_at),
                    r.reasons_json,
                    r.facts_json,
                )
            )
        return found

    def lock(self, session: Session, sphere_ids: Iterable[str]) -> dict[str, SphereRow]:
        """The spheres' rows, locked until the transaction ends (in id order, the same in
        every instance, so that two decisions touching the same spheres queue up)."""
        ids = sorted(set(sphere_ids))
        if not ids:
            return {}
        s = tables.spheres
        rows = session.execute(
            sa.select(s).where(s.c.sphere_id.in_(ids)).order_by(s.c.sphere_id).with_for_update()
        )
        return {row.sphere_id: SphereRow.of(row) for row in rows}

    def claim_due(self, session: Session, now: datetime, limit: int) -> list[str]:
        """Up to ``limit`` undecided spheres whose next check is at or before ``now``,
        locked, skipping those another transaction holds."""
        s = tables.spheres
        rows = session.execute(
            sa.select(s.c.sphere_id)
            .where(s.c.state.in_(_UNDECIDED))
            .where(s.c.next_check_at <= now)
            .order_by(s.c.next_check_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [sphere_id for (sphere_id,) in rows]

    def decide(
        self,
        session: Session,
        sphere_id: str,
        *,
        verdict: str,
        effective_at: datetime,
        reasons: Sequence[str],
        members: Mapping[str, str],
        decided_at: datetime,
        instance: str,
    ) -> bool:
        """Record the sphere's outcome once, with ``members`` (each member CM's own verdict
        now); False if it was decided already."""
        s = tables.spheres
        done = session.execute(
            sa.update(s)
            .where(s.c.sphere_id == sphere_id)
            .where(s.c.state.in_(_UNDECIDED))
            .values(
                state=verdict,
                effective_at=effective_at,
                reasons_json=json.dumps(list(reasons)),
                member_verdicts_json=json.dumps(dict(members), sort_keys=True),
                decided_at=decided_at,
                decided_by=instance,
                next_check_at=None,
            )
        )
        return bool(done.rowcount)  # type: ignore[attr-defined]

    def set_next_check(self, session: Session, sphere_id: str, at: datetime | None) -> None:
        """When an undecided sphere is to be looked at again."""
        s = tables.spheres
        session.execute(
            sa.update(s)
            .where(s.c.sphere_id == sphere_id)
            .where(s.c.state.in_(_UNDECIDED))
            .values(next_check_at=at)
        )


#: The sphere log (stateless): what the sender and the evaluator use.
SPHERES = SphereStore()
