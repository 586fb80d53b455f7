"""Defects the reference receiver can be started with (``python -m
condmsg.conformance.python_receiver --defect NAME``), so that condmsg's tests can check
that ``condmsg conformance`` rejects a receiver that breaks one rule of the protocol. The
names are shared with the Node receiver (interop/node/defects.js) and listed by
``--list-defects``.

Why this is honest: a defect is installed by this module alone, at the start of the
reference receiver's process, by replacing one seam of ``ackd`` (a method of one of its
classes, or a function one of its modules calls through its own namespace) with a
wrapper that breaks that one rule, or by giving ``Receiver`` a setting that does. Nothing
in ``ackd`` knows of defects and no production code imports this module: without
``--defect`` nothing is replaced and the receiver under test is ``ackd`` exactly as it
ships, and with it the variant differs from that in the one place the defect names.

A ``no-header-validation`` defect is not offered here: ``ackd``'s header checks are one
parser with no seam that could skip them and still yield a message (the Node receiver
has it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

import ackd.acceptance
import ackd.emit
import ackd.settlement
from ackd import validation
from ackd.broker import Broker, Delivery, Disposal, Fate
from ackd.message import Message
from ackd.receiver_store import ReceiverStore
from ackd.rlog import Decision, RlogDecisions
from ackd.sequences import SequenceReassembly
from ackd.transaction import Incoming, ReceiverTransaction
from ackd.validation import Inbound, InvalidMessage
from condmsg.core.acks import AckKind
from condmsg.core.protocol import MessageKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Defect:
    """One rule broken: ``settings`` are ``Receiver`` keywords it overrides, ``install``
    replaces seams of ``ackd`` (given the receiver's recipient identity)."""

    name: str
    breaks: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    read_mode: bool = False
    fails_once: bool = True
    install: Callable[[str], None] | None = None


# -- the wrappers ------------------------------------------------------------------------


def _refuse_wrong_recipient(recipient: str) -> None:

    def judging(delivery: Delivery, secret: bytes | None) -> Inbound:
        inbound = validation.judge(delivery, secret)
        if inbound.recipient is not None and inbound.recipient != recipient:
            raise InvalidMessage(f"a copy for recipient {inbound.recipient}, not {recipient}")
        return inbound

    ackd.acceptance.judge = judging  # type: ignore[attr-defined]


#: A change to the RLOG's decision on a message: (session, inbound, read_at, decision)
#: to the decision the receiver acts on.
RlogChange = Callable[[Session, Inbound, datetime, Decision], Decision]


def _on_rlog_decision(change: Callable[[str], RlogChange]) -> Callable[[str], None]:
    """Put ``change(recipient)`` after every RLOG decision."""

    def install(recipient: str) -> None:
        decide, after = RlogDecisions.rlog_decision, change(recipient)

        def deciding(
            self: RlogDecisions,
            session: Session,
            incoming: Incoming,
            inbound: Inbound,
            read_at: datetime,
            transactional: bool,
        ) -> Decision:
            decision = decide(self, session, incoming, inbound, read_at, transactional)
            return after(session, inbound, read_at, decision)

        RlogDecisions.rlog_decision = deciding  # type: ignore[method-assign]

    return install


def _ack_on(decisions: tuple[Decision, ...]) -> Callable[[str], RlogChange]:
    """COMMIT acks for originals that the RLOG decides as one of ``decisions``."""

    def change(recipient: str) -> RlogChange:
        def acking(
            session: Session, inbound: Inbound, read_at: datetime, got: Decision
        ) -> Decision:
            if inbound.kind is MessageKind.ORIGINAL and got in decisions:
                ackd.emit.enqueue_ack(
                    session,
                    inbound,
                    kind=AckKind.COMMIT,
                    read_at=read_at,
                    committed_at=read_at,
                    recipient=recipient,
                    receiver=f"defect:{recipient}",
                )
            return got

        return acking

    return change


def _no_compensation(recipient: str) -> RlogChange:
    def dropping(session: Session, inbound: Inbound, read_at: datetime, got: Decision) -> Decision:
        if inbound.kind is MessageKind.COMPENSATION and got is Decision.DELIVER:
            return Decision.DUPLICATE  # recorded as delivered, never handed over
        return got

    return dropping


def _deliver_on(decision: Decision) -> Callable[[str], None]:
    """Hand the app an original that the RLOG decides as ``decision`` (a duplicate, a
    discard) instead of dropping it."""

    def install(recipient: str) -> None:
        decide = RlogDecisions._decide_in_own_transaction

        def deciding(
            self: RlogDecisions, incoming: Incoming, inbound: Inbound, read_at: datetime
        ) -> tuple[Decision | None, Disposal]:
            found, disposal = decide(self, incoming, inbound, read_at)
            if found is decision and inbound.kind is MessageKind.ORIGINAL:
                return Decision.DELIVER, disposal
            return found, disposal

        RlogDecisions._decide_in_own_transaction = deciding  # type: ignore[method-assign]

    return install


def _on_decide(
    change: Callable[[RlogDecisions, Incoming, ReceiverTransaction | None, Message], Message],
) -> Callable[[str], None]:
    """Run ``change`` on every message the RLOG hands over."""

    def install(recipient: str) -> None:
        decide = RlogDecisions.decide

        def deciding(
            self: RlogDecisions,
            session: Session,
            incoming: Incoming,
            inbound: Inbound,
            read_at: datetime,
            tx: ReceiverTransaction | None,
        ) -> tuple[Message | None, Disposal]:
            message, disposal = decide(self, session, incoming, inbound, read_at, tx)
            if message is not None:
                message = change(self, incoming, tx, message)
            return message, disposal

        RlogDecisions.decide = deciding  # type: ignore[method-assign]

    return install


def _ack_at_once(
    self: RlogDecisions, incoming: Incoming, tx: ReceiverTransaction | None, message: Message
) -> Message:
    """Ack the delivery to the broker before the app has it (so before the commit)."""
    delivery = incoming.delivery
    if tx is not None and delivery is not None:
        self._ctx.broker.ack(delivery)
        incoming.delivery = None  # the commit has nothing left to ack
    return message


def _part_zero_id(
    self: RlogDecisions, incoming: Incoming, tx: ReceiverTransaction | None, message: Message
) -> Message:
    """A reassembled whole (it has no delivery) handed over with its part 0's id."""
    if incoming.delivery is None and message.message_id is not None:
        return replace(message, message_id=f"{message.message_id}.0")
    return message


def _ack_per_part(recipient: str) -> None:
    store_part = SequenceReassembly.store_part

    def storing(
        self: SequenceReassembly,
        delivery: Delivery,
        inbound: Inbound,
        received_at: datetime,
        tx: ReceiverTransaction | None,
    ) -> None:
        store_part(self, delivery, inbound, received_at, tx)
        if tx is not None:
            ackd.emit.enqueue_ack(
                tx.session,
                inbound,
                kind=AckKind.COMMIT,
                read_at=received_at,
                committed_at=received_at,
                recipient=recipient,
                receiver=f"defect:{recipient}",
            )

    SequenceReassembly.store_part = storing  # type: ignore[method-assign]


def _ack_second_transaction(recipient: str) -> None:
    commit = ackd.emit.commit_with_acks

    def committing(
        store: ReceiverStore,
        session: Session,
        delivered: Sequence[tuple[Inbound, datetime]],
        **fields: Any,
    ) -> None:
        commit(store, session, [], **fields)  # the app's writes and RLOG rows alone
        commit(store, session, delivered, **fields)  # then the acks, in a second one

    ackd.settlement.commit_with_acks = committing  # type: ignore[attr-defined]


def _wrong_ack_recipient(recipient: str) -> None:
    message = ackd.emit.ack_message

    def acking(inbound: Inbound, **fields: Any) -> Any:
        return message(inbound, **{**fields, "recipient": f"{fields['recipient']}-wrong"})

    ackd.emit.ack_message = acking


def _no_original_queue_header(recipient: str) -> None:
    publish = Broker._publish_invalid_copy

    def publishing(self: Broker, delivery: Delivery, headers: dict[str, Any]) -> None:
        kept = {k: v for k, v in headers.items() if k != "condmsg-original-queue"}
        publish(self, delivery, kept)

    Broker._publish_invalid_copy = publishing  # type: ignore[method-assign]


def _no_invalid_queue(recipient: str) -> None:
    dispose = Broker.dispose

    def disposing(self: Broker, delivery: Delivery, disposal: Disposal) -> None:
        if disposal.fate is Fate.INVALID:
            self.ack(delivery)  # dropped
            return
        dispose(self, delivery, disposal)

    Broker.dispose = disposing  # type: ignore[method-assign]
    Broker.publish_invalid = lambda self, body, headers, reason: None  # type: ignore[method-assign]


# -- the table ---------------------------------------------------------------------------

_DEFECTS = (
    Defect(
        name="refuse-wrong-recipient",
        breaks="moves a copy for another recipient to the invalid-message queue",
        install=_refuse_wrong_recipient,
    ),
    Defect(
        name="ignore-fail-once",
        breaks="lets the app commit on the first attempt of a conformance:fail-once message",
        fails_once=False,
    ),
    Defect(
        name="ack-duplicates",
        breaks="sends a COMMIT ack for a duplicate and for a discarded original",
        install=_on_rlog_decision(_ack_on((Decision.DUPLICATE, Decision.DISCARD))),
    ),
    Defect(
        name="ack-per-part",
        breaks="sends a COMMIT ack for every part of a sequence",
        install=_ack_per_part,
    ),
    Defect(
        name="ack-second-transaction",
        breaks="commits the COMMIT acks in a transaction of their own, after the app's",
        install=_ack_second_transaction,
    ),
    Defect(
        name="no-retry-pause",
        breaks="returns a failed message to its queue at once",
        settings={"retry_backoff": timedelta(0), "retry_backoff_max": timedelta(0)},
    ),
    Defect(
        name="no-original-queue-header",
        breaks="moves deliveries to the invalid-message queue without condmsg-original-queue",
        install=_no_original_queue_header,
    ),
    Defect(
        name="wrong-sequence-id",
        breaks="hands a sequence's whole over with part 0's message id, not the sequence id",
        install=_on_decide(_part_zero_id),
    ),
    Defect(
        name="read-mode",
        breaks="acks the broker before the app has the message, and sends READ acks",
        read_mode=True,
    ),
    Defect(name="no-verify", breaks="checks no token", settings={"secret": None}),
    Defect(
        name="no-cancel-out",
        breaks="delivers an original whose compensation came first",
        install=_deliver_on(Decision.DISCARD),
    ),
    Defect(
        name="deliver-duplicates",
        breaks="hands duplicates to the app",
        install=_deliver_on(Decision.DUPLICATE),
    ),
    Defect(
        name="no-invalid-queue",
        breaks="drops invalid messages instead of moving them",
        install=_no_invalid_queue,
    ),
    Defect(
        name="never-give-up",
        breaks="retries a failing message forever",
        settings={"max_attempts": 1_000_000},
    ),
    Defect(
        name="no-sequence-timeout",
        breaks="keeps incomplete sequences forever",
        settings={"sequence_timeout": timedelta(days=365)},
    ),
    Defect(
        name="ack-before-commit",
        breaks="acks each delivery to the broker before the app has it, so before the commit",
        install=_on_decide(_ack_at_once),
    ),
    Defect(
        name="wrong-ack-recipient",
        breaks="puts another recipient than its own in its acks",
        install=_wrong_ack_recipient,
    ),
    Defect(
        name="no-compensation",
        breaks="never hands a compensation to the app",
        install=_on_rlog_decision(_no_compensation),
    ),
)
DEFECTS: dict[str, Defect] = {d.name: d for d in _DEFECTS}
#: The receiver as it ships.
HONEST = Defect(name="honest", breaks="nothing")


def chosen(name: str | None, recipient: str) -> Defect:
    """The defect ``name`` (installed now), or :data:`HONEST` for None."""
    if name is None:
        return HONEST
    defect = DEFECTS[name]
    if defect.install is not None:
        defect.install(recipient)
    return defect
