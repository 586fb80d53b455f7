"""Dependency-Spheres on the sender's side: a :class:`Sphere` to send, enlist, commit or
abort through, and the :class:`SphereCoordinator` that begins spheres and carries these
steps out (docs/spheres.md).

A sphere groups CMs (sent at once, like any CM) and transactional work into one unit that
succeeds or fails as a whole. Its state lives in the sender's store (the sphere log,
:mod:`condmsg.spheres.store`); the evaluator decides its outcome
(:mod:`condmsg.core.sphere_evaluation`), and this side then commits or rolls back the
participants (:mod:`condmsg.spheres.resolution`).
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from condmsg.core.errors import SphereError
from condmsg.core.outcome import SphereOutcome
from condmsg.core.store_values import ParticipantState, SphereState
from condmsg.infra import tracing
from condmsg.sending.outgoing import Outgoing, new_cm_id
from condmsg.spheres.participants import (
    Participant,
    PreparedTransaction,
    check_participant_id,
    require_prepared_transactions,
    resource_name,
)
from condmsg.spheres.resolution import Handler, SphereParticipants, SphereSender
from condmsg.spheres.store import SPHERES, SphereRow, SphereStore

log = logging.getLogger(__name__)

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
        self._participants = coordinator.participants
        self.sphere_id = row.sphere_id
        self.deadline = row.deadline
        self._ended: str | None = None if row.state == SphereState.OPEN.value else row.state
        self._token: contextvars.Token[Sphere | None] | None = None
        # The sphere's span while its block runs (docs/tracing.md): its members' sends
        # are its children, its participants events of it.
        self._span: tracing.OpenSpan | None = None

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
        self._participants.log(
            self.sphere_id, check_participant_id(participant.participant_id), kind, resource
        )
        self._participants.live(self.sphere_id)[participant.participant_id] = participant
        self._traced_participant(kind, participant.participant_id)
        return participant

    def _traced_participant(self, kind: str, participant_id: str) -> None:
        if self._span is not None:
            attributes = {
                "condmsg.participant.kind": kind,
                "condmsg.participant.id": participant_id,
            }
            self._span.event("participant", attributes)

    @contextmanager
    def transaction(self, bind: Engine | str) -> Iterator[Session]:
        """A session on ``bind`` (an engine or URL of a PostgreSQL database) whose work
        commits only if the sphere succeeds: a prepared transaction from the sphere's
        commit until its outcome. An exception in the block rolls the work back (and,
        raised on, aborts a sphere used as a context manager)."""
        self._check_open("open a transaction in it")
        engine = self._participants.database(bind)
        require_prepared_transactions(engine)
        participants = self._participants.live(self.sphere_id)
        number = len(self._participants.rows(self.sphere_id)) + 1
        gid = f"condmsg-{self.sphere_id}-p{number}"
        self._participants.log(self.sphere_id, gid, PreparedTransaction.kind, resource_name(engine))
        participant = PreparedTransaction(engine, gid)
        participants[gid] = participant
        self._traced_participant(PreparedTransaction.kind, gid)
        try:
            yield participant.session
            participant.session.flush()
        except BaseException as exc:
            participant.rollback()
            # The detail completes the abort reason at the commit: "participant <gid> ...".
            self._participants.mark(
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
        self._participants.handler(name)  # refuses an unknown name now, not at the outcome
        number = len(self._participants.rows(self.sphere_id)) + 1
        self._participants.log(
            self.sphere_id, f"h{number}", "handler", name, args=args, run_on=run_on.value
        )
        self._traced_participant("handler", f"h{number}")

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
        if tracing.active():
            self._span = tracing.OpenSpan(
                f"sphere {self._coordinator.sender.name}",
                attributes={"condmsg.sphere_id": self.sphere_id},
            )
        return self

    @property
    def ended(self) -> str | None:
        """How this sphere ended (``committed``, ``aborted``), or None while open."""
        return self._ended

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        try:
            if self._ended is not None:
                return
            if exc is None:
                self.commit()
            else:
                self.abort(f"the sphere's block raised {type(exc).__name__}: {exc}"[:500])
        finally:
            if self._span is not None:
                self._span.end({"condmsg.sphere.state": self._ended or "open"})
                self._span = None


class SphereCoordinator:
    """A sender's spheres: begins and reattaches them, carries their commit and abort, and
    has their participants finished once the outcome is known."""

    def __init__(self, sender: SphereSender, store: SphereStore = SPHERES) -> None:
        self.sender = sender
        self.store = store
        self.participants = SphereParticipants(sender, store)

    @property
    def _engine(self) -> Engine:
        return self.sender.engine

    def _now(self) -> datetime:
        return self.sender.clock()

    def register_handler(self, name: str, handler: Handler) -> None:
        self.participants.register_handler(name, handler)

    def register_database(self, bind: Engine | str) -> Engine:
        return self.participants.database(bind)

    # -- beginning -------------------------------------------------------------------------

    def begin(self, timeout: timedelta | float | None) -> Sphere:
        current = _current.get()
        if current is not None:
            raise SphereError(
                "spheres do not nest: a sphere is open in this block "
                f"({current.sphere_id}); begin the second one outside it"
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

    # -- commit and abort ----------------------------------------------------------------------

    def commit(self, sphere_id: str) -> None:
        refusal = self.participants.vote(sphere_id)
        if refusal is not None:
            self.abort(sphere_id, refusal)
            return
        with Session(self._engine) as session, session.begin():
            committed = self.store.request_commit(session, sphere_id, self._now())
        if not committed:  # decided meanwhile (a member failed) or too late: it has failed
            log.info("sphere %s was not committed: it has failed already", sphere_id)
            self.participants.rollback_live(sphere_id, "the sphere failed before its commit")

    def abort(self, sphere_id: str, reason: str) -> None:
        with Session(self._engine) as session, session.begin():
            self.store.request_abort(session, sphere_id, self._now(), reason)
        self.participants.rollback_live(sphere_id, "the sphere was aborted")

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
                self.participants.resolve(sphere_id)
                return outcome
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
