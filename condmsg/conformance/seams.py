"""The seams of ``ackd`` that :mod:`condmsg.conformance.defects` replaces, one
installer per defect: each takes the receiver's recipient identity and wraps one method of
an ``ackd`` class, or one function an ``ackd`` module calls through its own namespace, so
that the wrapper breaks one rule and otherwise does what the original does. Only the
reference receiver's process installs them, at its start (see the defects module for why
that is honest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
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
from ackd.transaction import ReceiverTransaction, Taken
from ackd.validation import Inbound, InvalidMessage
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.errors import ProtocolError
from condmsg.core.protocol import MessageKind
from condmsg.core.timeutil import utcnow


def refuse_wrong_recipient(recipient: str) -> None:
    """Refuse a copy naming another recipient than ``recipient`` as invalid."""

    def judging(delivery: Delivery, secret: bytes | None) -> Inbound:
        inbound = validation.judge(delivery, secret)
        if inbound.recipient is not None and inbound.recipient != recipient:
            raise InvalidMessage(f"a copy for recipient {inbound.recipient}, not {recipient}")
        return inbound

    ackd.acceptance.judge = judging  # type: ignore[attr-defined]


#: A change to the RLOG's decision on a message: (session, inbound, read_at, decision)
#: to the decision the receiver acts on.
RlogChange = Callable[[Session, Inbound, datetime, Decision], Decision]


def on_rlog_decision(change: Callable[[str], RlogChange]) -> Callable[[str], None]:
    """Put ``change(recipient)`` after every RLOG decision."""

    def install(recipient: str) -> None:
        decide, after = RlogDecisions.rlog_decision, change(recipient)

        def deciding(
            self: RlogDecisions, session: Session, taken: Taken, transactional: bool
        ) -> Decision:
            decision = decide(self, session, taken, transactional)
            return after(session, taken.inbound, taken.read_at, decision)

        RlogDecisions.rlog_decision = deciding  # type: ignore[method-assign]

    return install


def ack_on(decisions: tuple[Decision, ...]) -> Callable[[str], RlogChange]:
    """COMMIT acks for originals that the RLOG decides as one of ``decisions``."""

    def change(recipient: str) -> RlogChange:
        def acking(
            session: Session, inbound: Inbound, read_at: datetime, got: Decision
        ) -> Decision:
            if inbound.kind is MessageKind.ORIGINAL and got in decisions:
                _commit_ack(session, inbound, read_at, recipient)
            return got

        return acking

    return change


def _commit_ack(session: Session, inbound: Inbound, at: datetime, recipient: str) -> None:
    """Enqueue a COMMIT ack for ``inbound`` that the receiver's rules would not send."""
    ackd.emit.enqueue_ack(
        session,
        inbound,
        kind=AckKind.COMMIT,
        read_at=at,
        committed_at=at,
        recipient=recipient,
        receiver=f"defect:{recipient}",
    )


def no_compensation(recipient: str) -> RlogChange:
    def dropping(session: Session, inbound: Inbound, read_at: datetime, got: Decision) -> Decision:
        if inbound.kind is MessageKind.COMPENSATION and got is Decision.DELIVER:
            return Decision.DUPLICATE  # recorded as delivered, never handed over
        return got

    return dropping


def deliver_on(decision: Decision) -> Callable[[str], None]:
    """Hand the app an original that the RLOG decides as ``decision`` (a duplicate, a
    discard) instead of dropping it."""

    def install(recipient: str) -> None:
        decide = RlogDecisions._decide_in_own_transaction

        def deciding(self: RlogDecisions, taken: Taken) -> tuple[Decision | None, Disposal]:
            found, disposal = decide(self, taken)
            if found is decision and taken.inbound.kind is MessageKind.ORIGINAL:
                return Decision.DELIVER, disposal
            return found, disposal

        RlogDecisions._decide_in_own_transaction = deciding  # type: ignore[method-assign]

    return install


def on_decide(
    change: Callable[[RlogDecisions, Taken, ReceiverTransaction | None, Message], Message],
) -> Callable[[str], None]:
    """Run ``change`` on every message the RLOG hands over."""

    def install(recipient: str) -> None:
        decide = RlogDecisions.decide

        def deciding(
            self: RlogDecisions, session: Session, taken: Taken, tx: ReceiverTransaction | None
        ) -> tuple[Message | None, Disposal]:
            message, disposal = decide(self, session, taken, tx)
            if message is not None:
                message = change(self, taken, tx, message)
            return message, disposal

        RlogDecisions.decide = deciding  # type: ignore[method-assign]

    return install


def ack_at_once(
    self: RlogDecisions, taken: Taken, tx: ReceiverTransaction | None, message: Message
) -> Message:
    """Ack the delivery to the broker before the app has it (so before the commit)."""
    delivery = taken.delivery
    if tx is not None and delivery is not None:
        self._ctx.broker.ack(delivery)
        taken.delivery = None  # the commit has nothing left to ack
    return message


def part_zero_id(
    self: RlogDecisions, taken: Taken, tx: ReceiverTransaction | None, message: Message
) -> Message:
    """A reassembled whole (it has no delivery) handed over with its part 0's id."""
    if taken.delivery is None and message.message_id is not None:
        return replace(message, message_id=f"{message.message_id}.0")
    return message


def ack_per_part(recipient: str) -> None:
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
            _commit_ack(tx.session, inbound, received_at, recipient)

    SequenceReassembly.store_part = storing  # type: ignore[method-assign]


def ack_second_transaction(recipient: str) -> None:
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


def wrong_ack_recipient(recipient: str) -> None:
    message = ackd.emit.ack_message

    def acking(inbound: Inbound, **fields: Any) -> Any:
        return message(inbound, **{**fields, "recipient": f"{fields['recipient']}-wrong"})

    ackd.emit.ack_message = acking


def drop_trace_context(recipient: str) -> None:
    message = ackd.emit.ack_message

    def acking(inbound: Inbound, **fields: Any) -> Any:
        return replace(message(inbound, **fields), headers=None)

    ackd.emit.ack_message = acking


def no_original_queue_header(recipient: str) -> None:
    publish = Broker._publish_invalid_copy

    def publishing(self: Broker, delivery: Delivery, headers: dict[str, Any]) -> None:
        kept = {k: v for k, v in headers.items() if k != "condmsg-original-queue"}
        publish(self, delivery, kept)

    Broker._publish_invalid_copy = publishing  # type: ignore[method-assign]


def no_invalid_queue(recipient: str) -> None:
    dispose = Broker.dispose

    def disposing(self: Broker, delivery: Delivery, disposal: Disposal) -> None:
        if disposal.fate is Fate.INVALID:
            self.ack(delivery)  # dropped
            return
        dispose(self, delivery, disposal)

    Broker.dispose = disposing  # type: ignore[method-assign]
    Broker.publish_invalid = lambda self, body, headers, reason: None  # type: ignore[method-assign]


def no_header_validation(recipient: str) -> None:
    """Take whatever condmsg headers a message carries (any version, kind, type, length
    or instant) rather than refuse it; its token and payload are still checked."""
    parse = validation.parse

    def parsing(headers: dict[str, Any] | None, reply_to: str | None) -> Inbound:
        try:
            return parse(headers, reply_to)
        except InvalidMessage:
            if not isinstance(headers, dict) or protocol.H_VERSION not in headers:
                raise
        return _anything(headers, reply_to)

    validation.parse = parsing
    validation.check_message_id = lambda message_id, inbound: None


def _anything(headers: dict[str, Any], reply_to: str | None) -> Inbound:
    """The condmsg facts of ``headers`` taken as they come."""

    def text(name: str) -> str | None:
        value = headers.get(name)
        if value is None:
            return None
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    def number(name: str) -> int | None:
        value = headers.get(name)
        return int(value) if isinstance(value, int | float) else None

    try:
        kind = protocol.MessageKind(text(protocol.H_KIND) or "")
    except ValueError:
        kind = protocol.MessageKind.ORIGINAL
    try:
        sent_at = protocol.parse_instant(text(protocol.H_SENT_AT), protocol.H_SENT_AT)
    except ProtocolError:
        sent_at = utcnow()
    seq_id = text(protocol.H_SEQ_ID)
    return Inbound(
        kind=kind,
        cm_id=text(protocol.H_CM_ID) or "",
        destination=text(protocol.H_DESTINATION) or "",
        recipient=text(protocol.H_RECIPIENT),
        sender=text(protocol.H_SENDER) or "",
        sent_at=sent_at,
        token=text(protocol.H_TOKEN),
        reply_to=reply_to,
        seq_id=seq_id,
        seq_pos=number(protocol.H_SEQ_POS) if seq_id else None,
        seq_size=number(protocol.H_SEQ_SIZE) if seq_id else None,
    )
