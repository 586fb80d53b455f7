"""``Sender``: send a payload with a condition, in one database transaction.

``send`` records the CM (condition, ``sent_at``, evaluation deadline), one copy per
destination, the compensation to release on failure, and the copies' outbox rows, all in
one transaction: the caller's own when ``session`` is given (the send then commits or rolls
back with the caller's writes), else a transaction of its own. Nothing is published here;
the outbox relay publishes after the commit.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.condition_codec import condition_to_json
from condmsg.core.conditions import Condition
from condmsg.core.errors import (
    BrokerError,
    ConditionError,
    ConfigError,
)
from condmsg.core.evaluation import evaluate
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.core.payloads import JSON, encode_payload
from condmsg.core.timeutil import utcnow
from condmsg.infra import backends, tracing
from condmsg.runtime import migrate
from condmsg.runtime.amqp import connect
from condmsg.runtime.db import make_engine
from condmsg.runtime.relaying import OwnsOutbox
from condmsg.runtime.settings import DEFAULT_QUEUE_TYPE, Settings
from condmsg.runtime.topology import (
    checked_sender_name,
    declare_destination,
    declare_outcome_queue,
    declare_service_queue,
    describe_mode,
    destination_arguments,
)
from condmsg.sending.copies import check_app_headers, plan_fanouts
from condmsg.sending.outcomes import outcome_notifications
from condmsg.sending.outgoing import Outgoing, new_cm_id
from condmsg.sending.send_rows import (
    PsycopgSendStore,
    SendRows,
    SendStore,
    SqlAlchemySendStore,
)
from condmsg.sending.send_span import send_attributes
from condmsg.spheres.participants import Participant
from condmsg.spheres.resolution import Handler
from condmsg.spheres.sphere import Sphere, SphereCoordinator
from condmsg.tables import store_secret

log = logging.getLogger(__name__)

#: Copies larger than this travel as a Message Sequence (bytes). RabbitMQ accepts far
#: larger messages, but big ones stall a queue and its consumers; 1 MiB parts stay cheap.
DEFAULT_PART_BYTES = 1024 * 1024


class Sender(OwnsOutbox):
    """The sending side of conditional messaging for one sender identity (``name``).

    ``name`` names the sender's ack queue (``condmsg.<name>.ack``) and outcome queue; the
    evaluator for this sender consumes the former and writes the latter. Its rows go
    through the :class:`~condmsg.sending.send_rows.SendStore` adapter that serves ``engine``
    (``store`` gives another, for tests and benchmarks).

    The store must hold the schema this release expects (``condmsg db upgrade --store
    sender``); else :class:`~condmsg.runtime.migrate.SchemaError` says what to run.
    ``create_schema=True`` creates a store that does not exist yet (quick starts, tests).

    ``amqp_url`` may name a cluster's nodes, comma-separated (see :mod:`condmsg.runtime.amqp`);
    ``destination_queue_type`` (``classic`` or ``quorum``, ``CONDMSG_DESTINATION_QUEUE_TYPE``
    in :meth:`from_env`) is the type of the destination queues it declares.
    """

    def __init__(
        self,
        *,
        amqp_url: str,
        db_url: str | None = None,
        name: str,
        engine: Engine | None = None,
        secret: bytes | None = None,
        part_bytes: int = DEFAULT_PART_BYTES,
        clock: Callable[[], datetime] = utcnow,
        declare_queues: bool = True,
        store: SendStore | None = None,
        create_schema: bool = False,
        destination_queue_type: str = DEFAULT_QUEUE_TYPE,
    ) -> None:
        self.name = checked_arguments(
            "Sender", name, engine is not None or db_url is not None, destination_queue_type
        )
        self.amqp_url = amqp_url
        self.destination_queue_type = destination_queue_type
        self.engine = engine if engine is not None else make_engine(str(db_url))
        if store is None:
            store = backends.pick(
                self.engine, psycopg=PsycopgSendStore(), portable=SqlAlchemySendStore()
            )
        self.store = store
        self.part_bytes = part_bytes
        self._clock = clock
        self._declare = declare_queues
        self._declared: set[str] = set()
        migrate.ensure(self.engine, "sender", models=[tables.metadata], create=create_schema)
        self.secret = secret or store_secret(self.engine)
        self.spheres = SphereCoordinator(self)
        if declare_queues:
            self._declare_service_queues()

    @classmethod
    def from_env(cls, *, name: str, **overrides: Any) -> Sender:
        return cls(name=name, **options_from_env(overrides))

    def clock(self) -> datetime:
        """The sender's clock (``sent_at`` of its CMs, the instants of its spheres)."""
        return self._clock()

    # -- Dependency-Spheres (docs/spheres.md) --------------------------------------------

    def sphere(self, *, timeout: timedelta | float | None = None) -> Sphere:
        """Begin a Dependency-Sphere that must be committed, with every member satisfied,
        within ``timeout``. Use it as a context manager: leaving the block commits it, an
        exception aborts it. Spheres do not nest."""
        return self.spheres.begin(timeout)

    def begin_sphere(self, *, timeout: timedelta | float | None = None) -> Sphere:
        """Begin a sphere to end later with ``commit()`` or ``abort()`` (maybe in another
        process: :meth:`sphere_by_id`)."""
        return self.spheres.begin(timeout)

    def sphere_by_id(self, sphere_id: str) -> Sphere:
        """Reattach to a sphere of this sender (from another process, after a restart)."""
        return self.spheres.attach(sphere_id)

    def register_handler(self, name: str, handler: Handler) -> None:
        """Register ``handler(session, **args)`` under ``name`` for spheres'
        ``on_success`` / ``on_failure``; ``session`` is on this sender's store, and the
        handler's writes there commit with the record that it ran (so it runs once)."""
        self.spheres.register_handler(name, handler)

    def register_database(self, bind: Engine | str) -> None:
        """Make a database that spheres' prepared transactions use known to this process,
        so that :meth:`resolve_spheres` finishes them with this engine (else it connects
        with the logged URL, which has no password: libpq's PGPASSWORD or .pgpass)."""
        self.spheres.register_database(bind)

    def resolve_spheres(self, *, participants: Iterable[Participant] = (), limit: int = 100) -> int:
        """Finish the participants of this sender's decided spheres that still have some
        unfinished: prepared transactions committed or rolled back by the outcome, handlers
        run once. Call it when a process that uses spheres starts (it finishes what a crashed
        one left) and now and then after; returns the spheres looked at."""
        return self.spheres.participants.resolve_all(participants=participants, limit=limit)

    def sphere_outcome(self, sphere_id: str, timeout: float = 0.0) -> SphereOutcome | None:
        """The outcome of a sphere of this sender, waiting up to ``timeout`` seconds."""
        return self.spheres.outcome(sphere_id, timeout)

    # -- sending --------------------------------------------------------------------

    def send(
        self,
        payload: object,
        condition: Condition,
        *,
        compensation: object | None = None,
        notify_success: bool = False,
        session: Session | None = None,
        headers: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Record and (after commit) send ``payload`` under ``condition``; return the CM id.

        ``compensation`` is what every destination that consumed the CM receives if it
        fails; without it a system-generated notice is sent. With ``session`` (bound to
        this sender's database) the send joins the caller's transaction and is published
        only if that transaction commits.
        """
        outgoing = Outgoing(
            payload=payload,
            condition=condition,
            compensation=compensation,
            notify_success=notify_success,
            headers=headers,
            content_type=content_type,
        )
        return self.send_many([outgoing], session=session)[0]

    def send_many(
        self,
        messages: Iterable[Outgoing],
        *,
        session: Session | None = None,
        sphere: str | None = None,
    ) -> list[str]:
        """Send several conditional messages in one transaction; return their CM ids.

        All or nothing, like :meth:`send` (the caller's transaction with ``session``). The
        rows of all of them go to the database as one statement on PostgreSQL (an insert
        per table elsewhere), however many CMs it holds: the way to send at volume.
        ``sphere`` makes them members of that open Dependency-Sphere (``Sphere.send_many``).
        """
        rows = self.prepare(messages, sphere=sphere)
        if not rows.cms:
            return []
        self._ensure_destinations(rows.queues())
        self.write(rows, session=session, sphere=sphere)
        return rows.cm_ids()

    def prepare(self, messages: Iterable[Outgoing], *, sphere: str | None = None) -> SendRows:
        """The rows that sending ``messages`` writes (as members of ``sphere``, if given),
        built without I/O: the one definition of a send's rows, which
        :class:`~condmsg.sending.async_sender.AsyncSender` shares."""
        rows = SendRows()
        for message in messages:
            self._record(message, rows)
        if sphere is not None:
            for row in rows.cms:
                row["sphere_id"] = sphere
        return rows

    def write(
        self, rows: SendRows, *, session: Session | None = None, sphere: str | None = None
    ) -> None:
        """Write prepared ``rows`` through the store: in ``session``'s transaction if
        given, else in one of their own; counted into ``sphere`` in the same transaction."""
        if session is None and sphere is None:
            self.store.add_committed(self.engine, rows)
            return
        with self._transaction(session) as s:
            if sphere is not None:
                self.spheres.join(s, sphere, len(rows.cms))
            self.store.add(s, rows)

    def _record(self, item: Outgoing, rows: SendRows) -> str:
        """Add the rows and messages of one CM to the batch; return its id.

        With tracing on, each CM is made inside a ``send`` span of its own (a child of the
        application's current span), whose context its copies and its row carry.
        """
        if not tracing.active():
            return self._add(item, rows, {})
        first_copy = len(rows.copies)
        with tracing.span(f"send {self.name}", kind="producer") as span:
            cm_id = self._add(item, rows, tracing.current_headers())
            if span is not None:
                own = rows.copies[first_copy:]
                span.set_attributes(send_attributes(cm_id, item.condition, own))
            return cm_id

    def _add(self, item: Outgoing, rows: SendRows, trace: Mapping[str, str]) -> str:
        """Add the rows and messages of one CM to the batch; return its id. ``trace``:
        the W3C headers of its send span (empty without tracing).

        The copies of a CM share its payload: they go to the outbox as one fan-out row
        (one per part of a sequence), which the relay expands into one message per
        destination.
        """
        condition = item.condition
        if not isinstance(condition, Condition):
            raise ConditionError(
                f"condition must be a Destination or DestinationSet, got {type(condition).__name__}"
            )
        shape = _shape(condition)
        body, ctype = encode_payload(item.payload, item.content_type)
        app_headers = check_app_headers(item.headers) | dict(trace)
        cm_id = new_cm_id()
        sent_at = self._clock()
        plans, fanouts = plan_fanouts(
            cm_id=cm_id,
            condition=condition,
            sender=self.name,
            sent_at=sent_at,
            secret=self.secret,
            body=body,
            content_type=ctype,
            app_headers=app_headers,
            part_bytes=self.part_bytes,
        )
        rows.cms.append(
            {
                "cm_id": cm_id,
                "sender": self.name,
                "sent_at": sent_at,
                "condition_json": shape.json,
                "evaluation_deadline": sent_at + shape.window,
                "content_type": ctype,
                "payload_size": len(body),
                "notify_success": item.notify_success,
                "state": tables.CmState.PENDING.value,
                # With no ack yet, the first instant the verdict can change on its own.
                "next_check_at": None if shape.first_check is None else sent_at + shape.first_check,
                "traceparent": trace.get(tracing.TRACEPARENT),
            }
        )
        for plan in plans:
            rows.copies.append(
                {
                    "cm_id": cm_id,
                    "destination": plan.destination.name,
                    "recipient": plan.destination.recipient,
                    "message_id": plan.message_id,
                    "exchange": plan.exchange,
                    "routing_key": plan.routing_key,
                    "requires": plan.requires.value,
                    "parts": plan.parts,
                }
            )
            rows.compensations.append(
                self._compensation_row(cm_id, plan.destination.name, item.compensation)
            )
        rows.outbox.extend(fanouts)
        return cm_id

    @contextmanager
    def _transaction(self, session: Session | None) -> Iterator[Session]:
        if session is not None:
            yield session  # the caller's transaction: the caller commits
            return
        with Session(self.engine) as own, own.begin():
            yield own

    def _compensation_row(self, cm_id: str, destination: str, payload: object) -> dict[str, Any]:
        if payload is None:
            notice = {"cm_id": cm_id, "destination": destination, "reason": "condition failed"}
            return {
                "cm_id": cm_id,
                "destination": destination,
                "body": json.dumps(notice, separators=(",", ":")).encode(),
                "content_type": JSON,
                "system_generated": True,
            }
        body, ctype = encode_payload(payload)
        return {
            "cm_id": cm_id,
            "destination": destination,
            "body": body,
            "content_type": ctype,
            "system_generated": False,
        }

    # -- outcomes -----------------------------------------------------------------------

    def outcome(self, cm_id: str, timeout: float = 0.0, *, poll_s: float = 0.05) -> Outcome | None:
        """The decided outcome of ``cm_id``, waiting up to ``timeout`` seconds; None if the
        CM is still pending then. Read from the store the evaluator decides in, so it is
        exact however many processes consume the outcome queue."""
        deadline = time.monotonic() + timeout
        while True:
            with self.engine.connect() as conn:
                row = self.store.cm(conn, cm_id)
            if row is None:
                raise ConfigError(f"unknown conditional message {cm_id!r} in this sender's store")
            if row.state != tables.CmState.PENDING.value:
                return Outcome.from_row(row)
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)

    def outcomes(self, *, timeout: float | None = None) -> Iterator[Outcome | SphereOutcome]:
        """Outcome notifications from the outcome queue, as they arrive: each CM's
        :class:`Outcome` and, for Dependency-Spheres, each sphere's :class:`SphereOutcome`.

        Each is acknowledged once the loop asks for the next one; stops after ``timeout``
        seconds without a notification (None: never).

        A broker that goes away (its node lost, the connection cut) pauses the stream
        until a node answers again, said once each way on the ``condmsg.sending.outcomes``
        logger; a notification handed over but not acknowledged when the connection broke
        comes again (outcomes are at least once). With ``timeout``, an outage that
        outlasts it ends the stream with the broker's error; refused credentials end it
        at once.
        """
        return outcome_notifications(self.amqp_url, self.name, timeout)

    @property
    def _relay_name(self) -> str:
        return f"condmsg-sender-relay-{self.name}"

    # -- broker topology --------------------------------------------------------------

    def _declare_service_queues(self) -> None:
        try:
            connection = connect(self.amqp_url, name=f"condmsg-sender-{self.name}")
        except BrokerError as exc:
            log.warning("not declaring the sender's queues now: %s", exc)
            return
        try:
            log.info("%s", describe_mode(connection, self.destination_queue_type))
            channel = connection.channel()
            for queue in (protocol.ack_queue(self.name), protocol.dead_letter_queue(self.name)):
                declare_service_queue(channel, queue)
            declare_outcome_queue(connection, protocol.outcome_queue(self.name))
        finally:
            connection.close()

    def _ensure_destinations(self, queues: list[str]) -> None:
        """Declare destination queues not seen yet (best effort: the outbox keeps copies
        for a broker that is down, and the relay parks copies for a missing queue)."""
        missing = [q for q in queues if q not in self._declared]
        if not missing or not self._declare:
            return
        try:
            connection = connect(self.amqp_url, name=f"condmsg-sender-{self.name}")
        except BrokerError as exc:
            log.warning("destination queues not declared now: %s", exc)
            return
        try:
            for queue in missing:
                declare_destination(connection, queue, self.destination_queue_type)
                self._declared.add(queue)
        finally:
            connection.close()


def checked_arguments(what: str, name: object, has_store: bool, queue_type: str) -> str:
    """``name`` checked for a sender of kind ``what``; :class:`ConfigError` for a missing
    store, an unusable name or an unknown queue type (here, not mid-send)."""
    destination_arguments(queue_type)
    if not has_store:
        raise ConfigError(f"{what} needs db_url (CONDMSG_DB_URL) or an engine")
    if not name or not isinstance(name, str):
        raise ConfigError(f"{what} needs a non-empty name")
    return checked_sender_name(name)  # it names queues: no spaces, within RabbitMQ's length


def options_from_env(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A sender's arguments from the environment (:class:`Settings`), ``overrides`` on top."""
    settings = Settings.from_env()
    options = settings.endpoint_options() | dict(overrides)
    options.setdefault("destination_queue_type", settings.destination_queue_type)
    return options


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a send derives from its condition alone, computed once per distinct condition."""

    json: str
    window: timedelta
    #: ``next_check_at - sent_at`` of a CM with no ack yet (evaluation is relative to
    #: ``sent_at``), or None if nothing can change on its own.
    first_check: timedelta | None


@functools.lru_cache(maxsize=1024)
def _shape(condition: Condition) -> _Shape:
    condition.validate()
    origin = datetime(2000, 1, 1, tzinfo=UTC)
    first = evaluate(condition, origin, (), origin).next_check_at
    return _Shape(
        json=condition_to_json(condition),
        window=condition.evaluation_window(),
        first_check=None if first is None else first - origin,
    )
