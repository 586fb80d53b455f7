"""The participants of a sender's spheres: the handlers and databases registered in this
process, the participants it holds, their log, their votes at a commit, and finishing them
once the outcome is known.

Every step is marked in the sphere log (:mod:`condmsg.spheres.store`) once it is done, so
a process that restarts finishes what a crashed one left
(:meth:`SphereParticipants.resolve_all`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from condmsg.core.errors import SphereError
from condmsg.core.store_values import ParticipantState, SphereState
from condmsg.runtime.db import describe_db_url, make_engine
from condmsg.sending.outgoing import Outgoing
from condmsg.spheres.participants import (
    Participant,
    PreparedTransaction,
    finish_prepared,
    resource_name,
)
from condmsg.spheres.store import ParticipantRow, SphereRow, SphereStore

log = logging.getLogger(__name__)

#: A handler run when a sphere's outcome is known: it gets a session on the sender's store
#: (its writes commit with the mark that it ran, so it runs once) and its JSON arguments.
Handler = Callable[..., None]

_VOTING = (ParticipantState.ENLISTED.value, ParticipantState.VOTED_NO.value)


class SphereSender(Protocol):
    """What spheres need of their :class:`~condmsg.sending.sender.Sender`."""

    name: str
    engine: Engine

    def clock(self) -> datetime: ...

    def send_many(
        self,
        messages: Iterable[Outgoing],
        *,
        session: Session | None = ...,
        sphere: str | None = ...,
    ) -> list[str]: ...


class SphereParticipants:
    """The participants of ``sender``'s spheres, logged in ``store``."""

    def __init__(self, sender: SphereSender, store: SphereStore) -> None:
        self.sender = sender
        self.store = store
        self._handlers: dict[str, Handler] = {}
        self._live: dict[str, dict[str, Participant]] = {}
        self._databases: dict[str, Engine] = {}

    @property
    def _engine(self) -> Engine:
        return self.sender.engine

    def _now(self) -> datetime:
        return self.sender.clock()

    # -- registries ---------------------------------------------------------------------

    def register_handler(self, name: str, handler: Handler) -> None:
        if not isinstance(name, str) or not name or len(name) > 200:
            raise SphereError(f"a handler needs a name of 1-200 characters (got {name!r})")
        self._handlers[name] = handler

    def handler(self, name: str) -> Handler:
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(sorted(self._handlers)) or "none"
            raise SphereError(
                f"no handler named {name!r} is registered on sender {self.sender.name!r} "
                f"(registered: {known}); register it with sender.register_handler"
            ) from None

    def database(self, bind: Engine | str) -> Engine:
        """The engine for a participant's database (one per database, reused)."""
        engine = bind if isinstance(bind, Engine) else None
        name = resource_name(engine) if engine is not None else None
        if engine is None:
            name = describe_db_url(str(bind))
        assert name is not None
        known = self._databases.get(name)
        if known is not None:
            return known
        if engine is None:
            engine = make_engine(str(bind))
        self._databases[name] = engine
        return engine

    def live(self, sphere_id: str) -> dict[str, Participant]:
        """The participants of the sphere that this process holds, by id."""
        return self._live.setdefault(sphere_id, {})

    # -- the log ------------------------------------------------------------------------

    def log(
        self,
        sphere_id: str,
        participant_id: str,
        kind: str,
        resource: str,
        *,
        args: Mapping[str, Any] | None = None,
        run_on: str | None = None,
    ) -> None:
        """Log a participant as enlisted, before its work begins."""
        try:
            with Session(self._engine) as session, session.begin():
                self.store.add_participant(
                    session,
                    sphere_id=sphere_id,
                    participant_id=participant_id,
                    kind=kind,
                    resource=resource,
                    now=self._now(),
                    args=args,
                    run_on=run_on,
                )
        except sa.exc.IntegrityError:
            raise SphereError(
                f"participant {participant_id!r} is enlisted in sphere {sphere_id} already"
            ) from None
        except TypeError as exc:  # arguments that JSON cannot hold
            raise SphereError(f"a handler's arguments must be JSON values ({exc})") from None

    def rows(self, sphere_id: str) -> list[ParticipantRow]:
        """The sphere's logged participants, in the order they were enlisted."""
        with self._engine.connect() as conn:
            return self.store.participants(conn, sphere_id)

    def mark(
        self,
        sphere_id: str,
        participant_id: str,
        state: ParticipantState,
        detail: str | None = None,
    ) -> bool:
        with self._engine.begin() as conn:
            return self.store.set_participant(
                conn, sphere_id, participant_id, state, now=self._now(), detail=detail
            )

    # -- the commit -----------------------------------------------------------------------

    def vote(self, sphere_id: str) -> str | None:
        """Prepare every participant that has not voted yet; None if all vote yes, else
        why the first one refuses (it is marked ``voted_no``)."""
        live = self.live(sphere_id)
        for row in self.rows(sphere_id):
            if row.kind == "handler" or row.state not in _VOTING:
                continue
            refusal = (
                _vote(live.get(row.participant_id))
                if row.state == ParticipantState.ENLISTED.value
                else row.detail or "voted no"
            )
            if refusal is not None:
                self.mark(sphere_id, row.participant_id, ParticipantState.VOTED_NO, refusal)
                log.warning("sphere %s: participant %s %s", sphere_id, row.participant_id, refusal)
                return f"participant {row.participant_id} {refusal}"
            self.mark(sphere_id, row.participant_id, ParticipantState.PREPARED)
        return None

    def rollback_live(self, sphere_id: str, why: str) -> None:
        """Roll back this process's participants of a sphere that cannot succeed (their
        outcome is certain, so their locks go now, not at the decision)."""
        for participant_id, participant in list(self.live(sphere_id).items()):
            participant.rollback()
            self.mark(sphere_id, participant_id, ParticipantState.ROLLED_BACK, why)

    # -- the outcome ------------------------------------------------------------------------

    def resolve_all(self, *, participants: Iterable[Participant] = (), limit: int = 100) -> int:
        """Finish the participants of every decided sphere of this sender that still has
        some (after a crash, or an outcome nobody waited for); returns the spheres seen.
        ``participants`` are custom participants rebuilt by the application."""
        given = {p.participant_id: p for p in participants}
        with self._engine.connect() as conn:
            ids = self.store.unresolved(conn, sender=self.sender.name, limit=limit)
        for sphere_id in ids:
            self.resolve(sphere_id, given)
        return len(ids)

    def resolve(self, sphere_id: str, given: Mapping[str, Participant] | None = None) -> None:
        """Commit or roll back every unresolved participant of a decided sphere, run its
        handlers for that outcome, skip the others. Each step is marked once done; a step
        that fails is logged and left for the next call."""
        with self._engine.connect() as conn:
            row = self.store.sphere(conn, sphere_id)
        if row is None or not row.decided:
            return
        satisfied = row.state == SphereState.SATISFIED.value
        live = self.live(sphere_id)
        for p in self.rows(sphere_id):
            if ParticipantState(p.state).resolved:
                continue
            try:
                if p.kind == "handler":
                    self._run_handler(row, p)
                else:
                    participant = live.get(p.participant_id) or (given or {}).get(p.participant_id)
                    self._finish(row, p, participant, satisfied)
            except Exception as exc:
                log.error(
                    "sphere %s: participant %s could not be finished (%s); tried again later",
                    sphere_id,
                    p.participant_id,
                    exc,
                )
        if all(ParticipantState(p.state).resolved for p in self.rows(sphere_id)):
            self._live.pop(sphere_id, None)

    def _finish(
        self, sphere: SphereRow, p: ParticipantRow, participant: Participant | None, satisfied: bool
    ) -> None:
        commit = satisfied and p.state == ParticipantState.PREPARED.value
        if participant is not None:
            participant.commit() if commit else participant.rollback()
        elif p.kind == PreparedTransaction.kind:
            finish_prepared(self.database(p.resource), p.participant_id, commit=commit)
        else:
            log.warning(
                "sphere %s: custom participant %s is not known to this process; pass it to "
                "sender.resolve_spheres(participants=...)",
                sphere.sphere_id,
                p.participant_id,
            )
            return
        state = ParticipantState.COMMITTED if commit else ParticipantState.ROLLED_BACK
        self.mark(sphere.sphere_id, p.participant_id, state, f"sphere {sphere.state}")

    def _run_handler(self, sphere: SphereRow, p: ParticipantRow) -> None:
        if p.run_on != sphere.state:
            self.mark(sphere.sphere_id, p.participant_id, ParticipantState.SKIPPED)
            return
        handler = self.handler(p.resource)
        with Session(self._engine) as session, session.begin():
            # The mark and the handler's writes commit together: it runs once.
            if not self.store.set_participant(
                session,
                sphere.sphere_id,
                p.participant_id,
                ParticipantState.RAN,
                now=self._now(),
            ):
                return
            handler(session, **p.args)


def _vote(participant: Participant | None) -> str | None:
    """None for a yes vote, else why the participant refuses."""
    if participant is None:
        return "is not in this process (its work ended with the process that enlisted it)"
    try:
        if participant.prepare():
            return None
        return "voted no"
    except Exception as exc:
        return f"failed to prepare: {type(exc).__name__}: {exc}"
