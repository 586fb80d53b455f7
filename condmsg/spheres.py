"""Dependency-Spheres on the sender's side: begin, send, enlist, commit or abort, and
finish the participants once the outcome is known (docs/spheres.md).

A sphere groups CMs (sent at once, like any CM) and transactional work into one unit that
succeeds or fails as a whole. Its state lives in the sender's store (the sphere log,
:mod:`condmsg.sphere_store`); the evaluator decides its outcome
(:mod:`condmsg.sphere_outcome`), and this side then commits or rolls back the participants
(:meth:`SphereCoordinator.resolve`). Every step is recorded before it is taken, so a process
that restarts finishes what a crashed one left: :meth:`SphereCoordinator.resolve_all`.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from condmsg.db import make_engine
from condmsg.errors import SphereError
from condmsg.outgoing import Outgoing, new_cm_id
from condmsg.sphere_outcome import SphereOutcome
from condmsg.sphere_participants import (
    Participant,
    PreparedTransaction,
    check_participant_id,
    finish_prepared,
    require_prepared_transactions,
    resource_name,
)
from condmsg.sphere_store import SPHERES, ParticipantRow, SphereRow, SphereStore
from condmsg.store_values import ParticipantState, SphereState

log = logging.getLogger(__name__)

#: A handler run when a sphere's outcome is known: it gets a session on the sender's store
#: (its writes commit with the mark that it ran, so it runs once) and its JSON arguments.
Handler = Callable[..., None]

_current: contextvars.ContextVar[Sphere | None] = contextvars.ContextVar(
    "condmsg_sphere", default=None
)


def _seconds(timeout: timedelta | float | None) -> timedelta:
    if timeout is None:
        raise SphereError("a sphere needs a timeout (a positive timedelta or seconds)")
    if isinstance(timeout, bool) or not isinstance(timeout, timedelta | int | float):
        raise SphereError(f"a sphere's timeout must be a timedelta or seconds, not {timeout!r}")
    value = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    if value <= timedelta(0):
        raise SphereError(f"a sphere's timeout must be positive (got {value})")
    return value


class Sphere:
    """One Dependency-Sphere, as its sender handles it.

    Use it as a context manager (leaving the block commits, an exception aborts) or call
    :meth:`commit` / :meth:`abort`. Members sent with :meth:`send` are published at once;
    their outcome actions wait for the sphere's outcome. :meth:`outcome` waits for the
    outcome and then commits or rolls back the participants.
    """

    def __init__(self, coordinator: SphereCoordinator, row: SphereRow) -> None:
        self._coordinator = coordinator
        self.sphere_id = row.sphere_id
        self.deadline = row.deadline
        self._ended: str | None = None if row.state == SphereState.OPEN.value else row.state
        self._token: contextvars.Token[Sphere | None] | None = None

    def __repr__(self) -> str:
        return f"Sphere({self.sphere_id!r}, deadline={self.deadline.isoformat()})"

    # -- members and participants -----------------------------------------------------------

    def send(self, payload: object, condition: Any, **options: Any) -> str:
        """Send one member CM (the arguments of :meth:`Sender.send`); returns its id."""
        session = options.pop("session", None)
        return self.send_many(
            [Outgoing(payload=payload, condition=condition, **options)], session=session
        )[0]

    def send_many(
        self, messages: Iterable[Outgoing], *, session: Session | None = None
    ) -> list[str]:
        """Send several member CMs in one transaction (see :meth:`Sender.send_many`).
        Refused, with nothing sent, once the sphere has ended or its deadline has passed."""
        self._check_open("send through it")
        return self._coordinator.sender.send_many(messages, session=session, sphere=self.sphere_id)

    def enlist(self, participant: Participant) -> Participant:
        """Make ``participant`` share the sphere's fate (logged before it is used)."""
        self._check_open("enlist in it")
        if not isinstance(participant, Participant):
            raise SphereError(
                f"{participant!r} is no participant (it needs participant_id, prepare, "
                "commit and rollback)"
            )
        kind = getattr(participant, "kind", "custom")
        resource = type(participant).__qualname__ if kind == "custom" else kind
        self._coordinator.log_participant(
            self.sphere_id, check_participant_id(participant.participant_id), kind, resource
        )
        self._coordinator.live(self.sphere_id)[participant.participant_id] = participant
        return participant

    @contextmanager
    def transaction(self, bind: Engine | str) -> Iterator[Session]:
        """A session on ``bind`` (an engine or URL of a PostgreSQL database) whose work
        commits only if the sphere succeeds: a prepared transaction from the sphere's
        commit until its outcome. An exception in the block rolls the work back (and,
        raised on, aborts a sphere used as a context manager)."""
        self._check_open("open a transaction in it")
        engine = self._coordinator.database(bind)
        require_prepared_transactions(engine)
        participants = self._coordinator.live(self.sphere_id)
        number = len(self._coordinator.participants_of(self.sphere_id)) + 1
        gid = f"condmsg-{self.sphere_id}-p{number}"
        self._coordinator.log_participant(
            self.sphere_id, gid, PreparedTransaction.kind, resource_name(engine)
        )
        participant = PreparedTransaction(engine, gid)
        participants[gid] = participant
        try:
            yield participant.session
            participant.session.flush()
        except BaseException as exc:
            participant.rollback()
            # The detail completes the abort reason at the commit: "participant <gid> ...".
            self._coordinator.mark(
                self.sphere_id,
                gid,
                ParticipantState.VOTED_NO,
                f"voted no: its block raised {type(exc).__name__}",
            )
            raise

    def on_success(self, handler: str, **args: Any) -> None:
        """Run the handler registered as ``handler`` once, with ``args``, if the sphere
        is satisfied."""
        self._handler(handler, args, SphereState.SATISFIED)

    def on_failure(self, handler: str, **args: Any) -> None:
        """Run the handler registered as ``handler`` once, with ``args``, if the sphere
        is violated: the compensating participant, for work committed now."""
        self._handler(handler, args, SphereState.VIOLATED)

    def _handler(self, name: str, args: Mapping[str, Any], run_on: SphereState) -> None:
        self._check_open("add a handler to it")
        self._coordinator.handler(name)  # refuses an unknown name now, not at the outcome
        number = len(self._coordinator.participants_of(self.sphere_id)) + 1
        self._coordinator.log_participant(
            self.sphere_id, f"h{number}", "handler", name, args=args, run_on=run_on.value
        )

    # -- ending -----------------------------------------------------------------------------

    def commit(self, *, wait: float = 0.0) -> SphereOutcome | None:
        """Commit: prepare every participant and, if all vote yes, mark the sphere
        committed (its outcome then waits for the members); a no vote aborts it. Returns
        the outcome if it is known within ``wait`` seconds (participants then finished)."""
        self._check_open("commit it")
        self._ended = SphereState.COMMITTED.value
        self._coordinator.commit(self.sphere_id)
        return self.outcome(wait)

    def abort(self, reason: str = "aborted by the sender") -> None:
        """Abort: the sphere is violated, and its members are compensated."""
        self._check_open("abort it")
        self._ended = SphereState.ABORTED.value
        self._coordinator.abort(self.sphere_id, reason)

    def outcome(self, timeout: float = 0.0, *, poll_s: float = 0.05) -> SphereOutcome | None:
        """The sphere's outcome, waiting up to ``timeout`` seconds; None while undecided.
        Once it is known, the participants are committed or rolled back (once)."""
        return self._coordinator.outcome(self.sphere_id, timeout, poll_s=poll_s)

    def _check_open(self, doing: str) -> None:
        if self._ended is not None:
            raise SphereError(f"cannot {doing}: sphere {self.sphere_id} has ended ({self._ended})")

    def __enter__(self) -> Sphere:
        if _current.get() is not None:
            raise SphereError(
                "spheres do not nest: this block is inside sphere "
                f"{_current.get().sphere_id}; "  # type: ignore[union-attr]
                "send through one sphere, or begin a second one outside it"
            )
        self._token = _current.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if self._ended is not None:
            return
        if exc is None:
            self.commit()
        else:
            self.abort(f"the sphere's block raised {type(exc).__name__}: {exc}"[:500])


class SphereSender(Protocol):
    """What spheres need of their :class:`~condmsg.sender.Sender`."""

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


class SphereCoordinator:
    """A sender's spheres: begins and reattaches them, logs their participants, carries
    their commit and abort, and finishes participants once the outcome is known."""

    def __init__(self, sender: SphereSender, store: SphereStore = SPHERES) -> None:
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

    def register_database(self, bind: Engine | str) -> Engine:
        return self.database(bind)

    def database(self, bind: Engine | str) -> Engine:
        """The engine for a participant's database (one per database, reused)."""
        engine = bind if isinstance(bind, Engine) else None
        name = resource_name(engine) if engine is not None else None
        if engine is None:
            url = sa.engine.make_url(str(bind))
            name = url.render_as_string(hide_password=True)
        assert name is not None
        known = self._databases.get(name)
        if known is not None:
            return known
        if engine is None:
            engine = make_engine(str(bind))
        self._databases[name] = engine
        return engine

    def live(self, sphere_id: str) -> dict[str, Participant]:
        return self._live.setdefault(sphere_id, {})

    # -- beginning -------------------------------------------------------------------------

    def begin(self, timeout: timedelta | float | None) -> Sphere:
        if _current.get() is not None:
            raise SphereError(
                "spheres do not nest: a sphere is open in this block "
                f"({_current.get().sphere_id}); "  # type: ignore[union-attr]
                "begin the second one outside it"
            )
        window = _seconds(timeout)
        sphere_id = new_cm_id()
        now = self._now()
        with Session(self._engine) as session, session.begin():
            self.store.begin(
                session,
                sphere_id=sphere_id,
                sender=self.sender.name,
                now=now,
                deadline=now + window,
            )
        return self.attach(sphere_id)

    def attach(self, sphere_id: str) -> Sphere:
        with self._engine.connect() as conn:
            row = self.store.sphere(conn, sphere_id)
        if row is None or row.sender != self.sender.name:
            raise SphereError(f"no sphere {sphere_id!r} of sender {self.sender.name!r}")
        return Sphere(self, row)

    def join(self, session: Session, sphere_id: str, count: int) -> None:
        """Count ``count`` members into the sphere in the send's transaction, or refuse."""
        now = self._now()
        if self.store.join(session, sphere_id, count, now):
            return
        row = self.store.sphere(session, sphere_id)
        if row is None:
            raise SphereError(f"no sphere {sphere_id!r}: nothing was sent")
        if row.state == SphereState.OPEN.value:
            raise SphereError(
                f"sphere {sphere_id} timed out at {row.deadline.isoformat()}: nothing was sent"
            )
        raise SphereError(f"sphere {sphere_id} has ended ({row.state}): nothing was sent")

    # -- participants --------------------------------------------------------------------------

    def log_participant(
        self,
        sphere_id: str,
        participant_id: str,
        kind: str,
        resource: str,
        *,
        args: Mapping[str, Any] | None = None,
        run_on: str | None = None,
    ) -> None:
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

    def participants_of(self, sphere_id: str) -> list[ParticipantRow]:
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

    # -- commit and abort ----------------------------------------------------------------------

    def commit(self, sphere_id: str) -> None:
        live = self.live(sphere_id)
        for row in self.participants_of(sphere_id):
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
                self.abort(sphere_id, f"participant {row.participant_id} {refusal}")
                return
            self.mark(sphere_id, row.participant_id, ParticipantState.PREPARED)
        with Session(self._engine) as session, session.begin():
            committed = self.store.request_commit(session, sphere_id, self._now())
        if not committed:  # decided meanwhile (a member failed) or too late: it has failed
            log.info("sphere %s was not committed: it has failed already", sphere_id)
            self._rollback_live(sphere_id, "the sphere failed before its commit")

    def abort(self, sphere_id: str, reason: str) -> None:
        with Session(self._engine) as session, session.begin():
            self.store.request_abort(session, sphere_id, self._now(), reason)
        self._rollback_live(sphere_id, "the sphere was aborted")

    def _rollback_live(self, sphere_id: str, why: str) -> None:
        """Roll back this process's participants of a sphere that cannot succeed (their
        outcome is certain, so their locks go now, not at the decision)."""
        for participant_id, participant in list(self.live(sphere_id).items()):
            participant.rollback()
            self.mark(sphere_id, participant_id, ParticipantState.ROLLED_BACK, why)

    # -- the outcome ------------------------------------------------------------------------

    def outcome(
        self, sphere_id: str, timeout: float, *, poll_s: float = 0.05
    ) -> SphereOutcome | None:
        deadline = time.monotonic() + timeout
        while True:
            with self._engine.connect() as conn:
                row = self.store.sphere(conn, sphere_id)
            if row is None:
                raise SphereError(f"no sphere {sphere_id!r} in this sender's store")
            outcome = row.outcome()
            if outcome is not None:
                self.resolve(sphere_id)
                return outcome
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)

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
        for p in self.participants_of(sphere_id):
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
        if all(ParticipantState(p.state).resolved for p in self.participants_of(sphere_id)):
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


_VOTING = (ParticipantState.ENLISTED.value, ParticipantState.VOTED_NO.value)


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
