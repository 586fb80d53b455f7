"""``Kit``: the sender, receivers and evaluator of one application in one process, over
SQLite stores and an in-memory broker, on a virtual clock the test moves.

The kit runs the real code: :class:`~condmsg.sending.sender.Sender` records CMs,
:class:`~ackd.receiver.Receiver` reads them and writes its RLOG and acks, the outbox
rows go through the real :class:`~outbox.store.OutboxStore`, and the
:class:`~evaluator.service.Evaluator` takes the acks in and sweeps deadlines with its own
intake and sweep code. Two seams are replaced, and only these: the broker (RabbitMQ and
the relays' connections to it become :class:`~condmsg.testing.memory_broker.MemoryBroker`)
and the clock (every instant comes from one :class:`~condmsg.testing.clock.VirtualClock`).
Decisions, cancel-out, sequences and spheres are the services' own. What a test does as
a receiver is :mod:`condmsg.testing.receivers`.

Nothing runs in the background. Whatever the kit is asked to do (send, read, commit), it
then lets the world settle at the current instant: relays publish, the evaluator takes
the acks in and decides, notices and compensations reach their queues, standing consumers
take what came. :meth:`Kit.advance` moves the clock, stopping just after every instant at
which something falls due on the way (a deadline, a sphere's deadline, a retry pause), and
settles there, so a three-day condition plays out as it would in three days.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pika
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.receiver import Receiver
from condmsg import tables
from condmsg.core import protocol
from condmsg.core.conditions import Condition
from condmsg.core.errors import CondmsgError, ConfigError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.core.store_values import SphereState
from condmsg.core.timeutil import RESOLUTION, stored_instant
from condmsg.runtime.settings import DEFAULT_ACK_GRACE
from condmsg.sending.outcomes import decode_outcome
from condmsg.sending.outgoing import Outgoing
from condmsg.sending.sender import DEFAULT_PART_BYTES, Sender
from condmsg.spheres.sphere import Sphere
from condmsg.testing.clock import DEFAULT_START, VirtualClock
from condmsg.testing.memory_broker import MemoryBroker
from condmsg.testing.receiver_broker import MemoryReceiverBroker
from condmsg.testing.receivers import KitReceiver
from condmsg.testing.relaying import relay_outbox
from condmsg.testing.stores import KitStores
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from outbox.store import OutboxStore

#: Where the kit's parts would connect to RabbitMQ: never used, the broker is in memory.
KIT_AMQP_URL = "amqp://kit.invalid/"
#: Rounds of settling at one instant after which the kit gives up (something keeps
#: producing work: a bug, or a handler that sends on every message it gets).
MAX_ROUNDS = 1000
_UNDECIDED_SPHERES = (SphereState.OPEN, SphereState.COMMITTED, SphereState.ABORTED)


class KitError(CondmsgError):
    """The kit cannot do what the test asked (its world would not settle, a store failed)."""


@dataclass(frozen=True, slots=True)
class HandlerCall:
    """One run of a sphere handler registered through :meth:`Kit.register_handler`."""

    name: str
    args: dict[str, Any]
    at: datetime


class Kit:
    """A sender (``sender``), receivers (:meth:`receiver`) and the evaluator
    (``evaluator``) of one application, in one process, on one virtual clock (``clock``).

    ``sender`` names the sender (its ack and outcome queues); ``start`` is where the
    clock starts; ``ack_grace`` is the evaluator's settle window (the services' default);
    ``directory``, when given, holds the SQLite stores (kept afterwards), else a temporary
    directory does; ``part_bytes`` is the sender's (payloads above it travel as a Message
    Sequence). Close it (or use it as a context manager) to remove its stores.
    """

    def __init__(
        self,
        *,
        sender: str = "app",
        start: datetime = DEFAULT_START,
        ack_grace: timedelta = DEFAULT_ACK_GRACE,
        directory: Path | None = None,
        part_bytes: int = DEFAULT_PART_BYTES,
    ) -> None:
        self.clock = VirtualClock(start)
        self.broker = MemoryBroker(self.clock)
        self._stores = KitStores(directory)
        try:
            engine = self._stores.engine("sender", "sender")
            self.sender = Sender(
                amqp_url=KIT_AMQP_URL,
                name=sender,
                engine=engine,
                clock=self.clock,
                declare_queues=False,
                part_bytes=part_bytes,
            )
            self.evaluator = Evaluator(
                EvaluatorConfig(
                    amqp_url=KIT_AMQP_URL,
                    sender=sender,
                    ack_grace=ack_grace,
                    sweeps=False,
                    relay=False,
                    instance="kit",
                ),
                engine=engine,
                clock=self.clock,
            )
            self.evaluator.store.prepare()
        except BaseException:
            self._stores.close()  # a sender name refused, say: no directory left behind
            raise
        self._outbox = OutboxStore(engine)
        self._ack_queue = protocol.ack_queue(sender)
        self._outcome_queue = protocol.outcome_queue(sender)
        for queue in (self._ack_queue, self._outcome_queue, protocol.dead_letter_queue(sender)):
            self.broker.declare(queue)
        self.receivers: dict[str, KitReceiver] = {}
        #: Every notification of the outcome queue, in order: CM outcomes and sphere outcomes.
        self.outcomes: list[Outcome | SphereOutcome] = []
        #: Every run of a handler registered through :meth:`register_handler`.
        self.handler_calls: list[HandlerCall] = []
        self._settling = False

    def close(self) -> None:
        for rx in self.receivers.values():
            rx.receiver.close()
        self._stores.close()

    def __enter__(self) -> Kit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the parts ----------------------------------------------------------------------

    def receiver(self, recipient: str, *, store: str | None = None, **config: Any) -> KitReceiver:
        """The receiver of ``recipient`` (made on first use, with ``config``: the fields
        of :class:`~ackd.receiver_config.ReceiverConfig`). Each receiver has a store of its
        own unless ``store`` names one that several share (competing consumers that share
        one RLOG). It verifies tokens with the sender's secret, as a deployment does."""
        if recipient in self.receivers:
            if config or store is not None:
                raise ConfigError(f"receiver {recipient!r} exists already; configure it once")
            return self.receivers[recipient]
        name = f"rx-{store or recipient}"
        broker = MemoryReceiverBroker(self.broker, self.clock, name=f"kit-{recipient}")
        config.setdefault("secret", self.sender.secret)
        receiver = Receiver(
            recipient=recipient,
            engine=self._stores.engine(name, "receiver"),
            amqp_url=KIT_AMQP_URL,
            clock=self.clock,
            monotonic=self.clock.monotonic,
            broker=broker,
            **config,
        )
        kit_receiver = KitReceiver(receiver, broker, memory=self.broker, settle=self._settle)
        self.receivers[recipient] = kit_receiver
        return kit_receiver

    # -- sending --------------------------------------------------------------------------

    def send(self, payload: object, condition: Condition, **options: Any) -> str:
        """``Sender.send`` (the same arguments), then settle: the copies are in their
        queues when it returns."""
        cm_id = self.sender.send(payload, condition, **options)
        self._settle()
        return cm_id

    def send_many(self, messages: Iterable[Outgoing], **options: Any) -> list[str]:
        cm_ids = self.sender.send_many(messages, **options)
        self._settle()
        return cm_ids

    @contextmanager
    def sphere(self, *, timeout: timedelta | float) -> Iterator[Sphere]:
        """``Sender.sphere``: leaving the block commits the sphere (an exception aborts
        it), then the kit settles."""
        try:
            with self.sender.sphere(timeout=timeout) as ds:
                yield ds
        finally:
            self.settle()

    def register_handler(self, name: str, handler: Callable[..., None]) -> None:
        """``Sender.register_handler``; each run is also recorded in :attr:`handler_calls`."""

        def recorded(session: Session, **args: Any) -> None:
            handler(session, **args)
            self.handler_calls.append(HandlerCall(name, dict(args), self.clock()))

        self.sender.register_handler(name, recorded)

    # -- what came of it ------------------------------------------------------------------

    def outcome(self, cm_id: str) -> Outcome | None:
        """The decided outcome of ``cm_id`` (None while pending), from the sender store."""
        return self.sender.outcome(cm_id)

    def verdict(self, cm_id: str) -> Verdict:
        """``PENDING`` while undecided, else the decided verdict."""
        outcome = self.outcome(cm_id)
        return Verdict.PENDING if outcome is None else outcome.verdict

    def sphere_outcome(self, sphere_id: str) -> SphereOutcome | None:
        return self.sender.sphere_outcome(sphere_id)

    def queued(self, queue: str) -> list[Any]:
        """The messages waiting in ``queue`` now (outbox messages, next first)."""
        return self.broker.peek(queue)

    def invalid(self) -> list[Any]:
        """The messages on the invalid-message queue."""
        return self.broker.peek(protocol.INVALID_MESSAGE_QUEUE)

    # -- time -----------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()

    def advance(
        self,
        delta: timedelta | None = None,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
    ) -> datetime:
        """Move the clock forward by ``delta`` (or the keyword durations), settling just
        after every instant on the way at which something falls due (a deadline plus the
        evaluator's ack grace, a sphere's deadline, a retry pause); returns the new
        instant."""
        step = (delta or timedelta(0)) + timedelta(
            days=days, hours=hours, minutes=minutes, seconds=seconds
        )
        return self.advance_to(self.clock() + step)

    def advance_to(self, instant: datetime) -> datetime:
        """Move the clock to ``instant`` (see :meth:`advance`)."""
        if instant < self.clock():
            raise ConfigError(f"cannot go back to {instant.isoformat()}")
        self.settle()
        # What falls due at D is done at D plus the clock's resolution (a microsecond):
        # the services' sweeps and timers run after the instant they wait for, never at
        # it, and a verdict's reasons can tell (at the evaluation deadline itself, the
        # acks still missing are missing "by the evaluation timeout").
        while (due := self._next_due()) is not None and due + RESOLUTION <= instant:
            self.clock.set(due + RESOLUTION)
            self._settle()
        self.clock.set(instant)
        self._settle()
        return instant

    @contextmanager
    def together(self) -> Iterator[None]:
        """Do several things at the current instant as one: nothing settles until the
        block ends (many receivers reading at the same instant, say), then the world
        settles once."""
        if self._settling:
            yield
            return
        self._settling = True
        try:
            yield
        finally:
            self._settling = False
        self._settle()

    def settle(self) -> None:
        """Let everything happen that can at the current instant (see the module
        docstring); returns once nothing moves any more. Call it after using a part
        directly (``kit.sender``, a ``KitReceiver.receiver``): the kit's own calls do."""
        for rx in self.receivers.values():
            rx.unrelayed = True
        self._settle()

    def _settle(self) -> None:
        if self._settling:
            return  # a handler that reads or sends: the settling under way carries on
        self._settling = True
        try:
            for _ in range(MAX_ROUNDS):
                if not self._round():
                    return
            raise KitError(f"the world did not settle within {MAX_ROUNDS} rounds")
        finally:
            self._settling = False

    def _round(self) -> int:
        moved = relay_outbox(self._outbox, self.broker)
        for rx in self.receivers.values():
            if rx.active:
                moved += rx._work()
        moved += self._take_acks()
        moved += self._sweep()
        taken = self._take_outcomes()
        if any(isinstance(o, SphereOutcome) for o in taken):
            # A sphere was decided: its participants are finished now (as the sender's
            # ``outcome()`` or ``resolve_spheres()`` does in production).
            self.sender.resolve_spheres()
        return moved + len(taken)

    def _take_acks(self) -> int:
        bodies = [item.message.body for item in self.broker.take_all(self._ack_queue)]
        if bodies and not self.evaluator.batches.store(bodies):
            raise KitError("the evaluator could not store a batch of acks (see the log)")
        return len(bodies)

    def _take_outcomes(self) -> list[Outcome | SphereOutcome]:
        taken = []
        for item in self.broker.take_all(self._outcome_queue):
            props = pika.BasicProperties(**self.broker.properties(item))
            decoded = decode_outcome(props, item.message.body)
            if decoded is not None:
                taken.append(decoded)
        self.outcomes.extend(taken)
        return taken

    def _sweep(self) -> int:
        now = self.clock()
        cm_due, sphere_due = self._checks()
        decided = 0
        if cm_due is not None and cm_due <= now:
            decided += self.evaluator.sweep()
        if sphere_due is not None and sphere_due <= now:
            decided += self.evaluator.jobs.sweep_spheres()
        return decided

    def _checks(self, after: datetime | None = None) -> tuple[datetime | None, datetime | None]:
        """The earliest next check of a pending CM and of an undecided sphere (later than
        ``after``, if given)."""
        s = tables.spheres
        query = sa.select(sa.func.min(s.c.next_check_at)).where(
            s.c.state.in_([state.value for state in _UNDECIDED_SPHERES])
        )
        if after is not None:
            query = query.where(s.c.next_check_at > after)
        with Session(self.evaluator.engine) as session:
            cm_due = self.evaluator.store.decisions.next_check(session, after=after)
            sphere_due = session.scalar(query)
        return cm_due, None if sphere_due is None else stored_instant(sphere_due)

    def _next_due(self) -> datetime | None:
        """The next instant after now at which something falls due on its own."""
        now = self.clock()
        candidates = [at for at in self._checks(after=now) if at is not None]
        for rx in self.receivers.values():
            release = rx.broker.next_release()
            if release is not None and release > now and not rx.away:
                candidates.append(release)
        return min(candidates, default=None)
