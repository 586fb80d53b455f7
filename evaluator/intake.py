"""Ack intake: decode, verify, store idempotently, and classify what cannot count.

Nothing here raises on bad input. A body that is not a valid ack document (or whose
decoding raises anything at all, or with a field longer than its column) goes to the
sender's dead-letter queue (through the outbox, in the same transaction) with the reason
in a header, and is recorded as a ``malformed`` anomaly (its reason and the start of its
body) in that transaction too: the store keeps what the queue holds, so that looking at
dead letters (the console) never has to take them from the queue, where every look would
spend one of their delivery attempts. A valid document that cannot count (unknown CM,
bad token, wrong destination or recipient, implausible times, duplicate) is recorded as
an anomaly. An ack after its CM's decision is stored and reported, and flagged if, with
every late ack of the CM before it, it would have changed the verdict.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.acks import Ack
from condmsg.core.errors import ProtocolError
from condmsg.core.evaluation import evaluate
from condmsg.infra import tracing
from evaluator.store import CmRow, CopyRow, DecisionStore
from evaluator.tracing import record_intake, traceparent_of
from outbox.enqueueing import enqueue_all
from outbox.message import OutboxMessage

Kind = tables.AnomalyKind

_NEVER = datetime.min.replace(tzinfo=UTC)
#: Dead-letter reasons are cut to this many characters (``condmsg-reason``).
MAX_REASON = 1000
#: Body bytes of a dead letter its ``malformed`` anomaly keeps (as text).
DEAD_EXCERPT = 160


@dataclass(slots=True)
class Intake:
    """What one batch did: CMs to re-evaluate, and counts for the metrics."""

    touched: dict[str, CmRow] = field(default_factory=dict)
    #: Per touched CM, every ack that counts (stored earlier or in this batch).
    acks: dict[str, list[Ack]] = field(default_factory=dict)
    #: Per CM of the batch, its copies by destination (for the outcome actions).
    copies: dict[str, dict[str, CopyRow]] = field(default_factory=dict)
    stored: int = 0
    dead: int = 0
    anomalies: Counter[str] = field(default_factory=Counter)
    #: Decided CMs that this batch's late acks contradicted for the first time.
    contradicted: int = 0
    #: The batch's receipt and decision instant, read once its CM rows are locked.
    now: datetime = _NEVER


class Received(NamedTuple):
    """One decoded ack: the document, the evaluation's view of it, and the token it
    should carry if its recipient is the copy's (the usual case; computed up front)."""

    message: protocol.AckMessage
    ack: Ack
    token_if_same_recipient: str
    #: The W3C traceparent the ack's delivery carried (only while tracing is on).
    traceparent: str | None = None


@dataclass(slots=True)
class Decoded:
    """A batch of ack bodies decoded and checked as documents, before any database work."""

    received: list[Received] = field(default_factory=list)
    #: Malformed bodies, as dead letters for the sender's dead-letter queue.
    dead: list[OutboxMessage] = field(default_factory=list)


def decode(bodies: Sequence[bytes], *, sender: str, secret: bytes) -> Decoded:
    """Decode a batch of ack bodies (in delivery order); nothing here raises on bad input."""
    decoded = Decoded()
    for body in bodies:
        try:
            message, ack = protocol.decode_ack(body)
            token = protocol.copy_token(
                secret, message.cm_id, message.destination, message.recipient
            )
        except ProtocolError as exc:
            decoded.dead.append(dead_letter(body, sender, str(exc)))
            continue
        except Exception as exc:  # a codec bug must cost one message, never the batch
            decoded.dead.append(dead_letter(body, sender, f"undecodable: {describe(exc)}"))
            continue
        decoded.received.append(Received(message, ack, token, traceparent_of(body)))
    return decoded


def describe(exc: BaseException) -> str:
    """``ExcType: message`` for a dead-letter reason."""
    return f"{type(exc).__name__}: {exc}"


def dead_letter(body: bytes, sender: str, reason: str) -> OutboxMessage:
    """``body`` for the sender's dead-letter queue, untouched, with ``reason`` in its
    ``condmsg-reason`` header (cut to :data:`MAX_REASON`; a NUL, which no store's text
    holds, spelled out)."""
    return OutboxMessage(
        exchange="",
        routing_key=protocol.dead_letter_queue(sender),
        body=body,
        message_type="condmsg.malformed-ack",
        headers={protocol.H_REASON: _no_nul(reason)[:MAX_REASON]},
    )


def dead_letter_anomaly(message: OutboxMessage, now: datetime) -> dict[str, Any]:
    """The ``malformed`` anomaly row recording the dead letter ``message``: its reason,
    its size and the start of its body as text (``detail``), at ``now`` (UTC)."""
    body = message.body
    reason = (message.headers or {}).get(protocol.H_REASON, "")
    text = _no_nul(bytes(body[:DEAD_EXCERPT]).decode("utf-8", "replace"))
    more = "…" if len(body) > DEAD_EXCERPT else ""
    return {
        "kind": Kind.MALFORMED.value,
        "cm_id": None,
        "ack_id": None,
        "destination": None,
        "recipient": None,
        "detail": f"{reason}; body ({len(body)} bytes): {text}{more}",
        "recorded_at": now,
    }


def _no_nul(text: str) -> str:
    """``text`` with NUL, which no store's text column holds, spelled out."""
    return text.replace("\x00", "\\x00")


def ingest(
    session: Session,
    bodies: Sequence[bytes],
    *,
    store: DecisionStore,
    sender: str,
    secret: bytes,
    clock: Callable[[], datetime],
    clock_skew: timedelta,
) -> Intake:
    """Take one batch of ack bodies (in delivery order) into ``store``.

    The batch's instant (``Intake.now``: every ack's ``received_at``, and the decision
    instant of what it decides) is read from ``clock`` only once the batch's CM rows are
    locked: a batch that waited behind another one for them must not stamp its acks, or
    decide, earlier than the other one's commit (whose acks it then counts).
    """
    batch = decode(bodies, sender=sender, secret=secret)
    intake = Intake()
    if batch.dead:
        enqueue_all(session, batch.dead)
        intake.dead = len(batch.dead)
    decoded = batch.received
    cms = store.load_cms(session, (r.message.cm_id for r in decoded), lock=True)
    now = intake.now = clock()
    copies = intake.copies = store.copies_of(session, cms)
    # What counted before this batch: for a decided CM to judge a late ack, for a pending
    # one to be judged below with this batch's acks added (no second query).
    prior = store.counted_acks(session, cms)
    # Late evidence is judged cumulatively: every late ack of a decided CM stored before,
    # then this batch's, in order (one query, only when the batch has a decided CM).
    late = _LateEvidence(store.late_acks(session, [c for c, cm in cms.items() if _decided(cm)]))
    anomalies = _Anomalies(intake, now)
    screen = _Screen(cms, copies, secret, now, clock_skew)
    rows: list[dict[str, Any]] = []
    accepted: list[Received] = []  # the ack of each row
    for received in decoded:
        refused = screen(received)
        if refused is not None:
            anomalies.add(*refused, received.message)
            continue
        cm = cms[received.message.cm_id]
        rows.append(_row(received, cm, prior.get(cm.cm_id, []), late, now))
        accepted.append(received)
    inserted = store.insert_acks(session, rows)
    for row, received in zip(rows, accepted, strict=True):
        _count(intake, anomalies, received, row, inserted, cms, prior, late)
    anomalies.rows += [dead_letter_anomaly(m, now) for m in batch.dead]
    store.record_anomalies(session, anomalies.rows)
    if tracing.active():
        statuses = [row["status"] for row in rows]
        taken = zip(accepted, statuses, strict=True)
        record_intake(sender, ((r.message, r.traceparent, status) for r, status in taken))
    return intake


class _Anomalies:
    """The batch's anomaly rows, counted in the intake as they are added."""

    def __init__(self, intake: Intake, now: datetime) -> None:
        self._intake = intake
        self._now = now
        self.rows: list[dict[str, Any]] = []

    def add(self, kind: Kind, detail: str, ack: protocol.AckMessage) -> None:
        self._intake.anomalies[kind.value] += 1
        self.rows.append(
            {
                "kind": kind.value,
                "cm_id": ack.cm_id,
                "ack_id": ack.ack_id,
                "destination": ack.destination,
                "recipient": ack.recipient,
                "detail": detail,
                "recorded_at": self._now,
            }
        )


class _Screen:
    """Why an ack of the batch cannot count (an anomaly kind and its detail), or None."""

    def __init__(
        self,
        cms: dict[str, CmRow],
        copies: dict[str, dict[str, CopyRow]],
        secret: bytes,
        now: datetime,
        clock_skew: timedelta,
    ) -> None:
        self._cms, self._copies, self._secret = cms, copies, secret
        self._earliest = {cm_id: cm.sent_at - clock_skew for cm_id, cm in cms.items()}
        self._latest = now + clock_skew
        self._skew = clock_skew
        self._seen: set[str] = set()

    def __call__(self, received: Received) -> tuple[Kind, str] | None:
        ack = received.message
        copy = self._copies.get(ack.cm_id, {}).get(ack.destination)
        if ack.cm_id not in self._cms:
            return Kind.UNKNOWN_CM, "no such conditional message in this store"
        if copy is None:
            return Kind.WRONG_DESTINATION, f"the CM has no destination {ack.destination!r}"
        if not _token_ok(received, copy.recipient, self._secret):
            return Kind.BAD_TOKEN, "the token does not verify (forged or altered ack)"
        if copy.recipient is not None and ack.recipient != copy.recipient:
            return (
                Kind.WRONG_RECIPIENT,
                f"acked by {ack.recipient!r}, addressed to {copy.recipient!r}",
            )
        skew = _implausible(ack, self._earliest[ack.cm_id], self._latest, self._skew)
        if skew is not None:
            return Kind.CLOCK_SKEW, skew
        if ack.ack_id in self._seen:
            return Kind.DUPLICATE, "the same ack twice in one batch"
        self._seen.add(ack.ack_id)
        return None


def _count(
    intake: Intake,
    anomalies: _Anomalies,
    received: Received,
    row: dict[str, Any],
    inserted: set[str],
    cms: dict[str, CmRow],
    prior: dict[str, list[Ack]],
    late: _LateEvidence,
) -> None:
    """What one stored row means: an ack that counts for a pending CM, or evidence that
    arrived after its CM was decided (changing the verdict or not), or a duplicate."""
    ack = received.message
    if row["ack_id"] not in inserted:
        anomalies.add(Kind.DUPLICATE, "this ack was stored before", ack)
        return
    intake.stored += 1
    cm = cms[ack.cm_id]
    if cm.state == "pending":
        intake.touched[cm.cm_id] = cm
        counted = intake.acks.get(cm.cm_id)
        if counted is None:
            counted = intake.acks[cm.cm_id] = list(prior.get(cm.cm_id, []))
        counted.append(received.ack)
    elif row["status"] == tables.AckStatus.CHANGES_VERDICT.value:
        if late.first_contradiction(cm.cm_id):
            intake.contradicted += 1
        anomalies.add(
            Kind.LATE_CHANGES_VERDICT,
            "arrived after the decision and, with the acks that counted and the late "
            "ones before it, would have changed the verdict: the ack grace was too short",
            ack,
        )
    else:
        anomalies.add(Kind.AFTER_DECISION, f"arrived after the CM was decided ({cm.state})", ack)


def _decided(cm: CmRow) -> bool:
    return cm.state != "pending" and cm.effective_at is not None


def _implausible(
    ack: protocol.AckMessage, earliest: datetime, latest: datetime, skew: timedelta
) -> str | None:
    """Why the ack's times cannot be true within the clock-skew tolerance ``skew``: read
    before its CM was sent, or read or committed after the evaluator received it."""
    if ack.read_at < earliest:
        return f"read_at {_iso(ack.read_at)} is before the CM was sent (tolerance {skew})"
    if ack.read_at > latest:
        return f"read_at {_iso(ack.read_at)} is after the ack was received (tolerance {skew})"
    if ack.committed_at is not None and ack.committed_at > latest:
        return (
            f"committed_at {_iso(ack.committed_at)} is after the ack was received "
            f"(tolerance {skew})"
        )
    return None


_iso = protocol.format_instant


class _LateEvidence:
    """The late acks of the batch's decided CMs: those stored before (status
    ``after_decision`` or ``changes_verdict``), then this batch's as they are judged."""

    def __init__(self, stored: dict[str, list[tuple[Ack, str]]]) -> None:
        self._acks = {cm_id: [ack for ack, _ in rows] for cm_id, rows in stored.items()}
        self._contradicted = {
            cm_id
            for cm_id, rows in stored.items()
            if any(status == tables.AckStatus.CHANGES_VERDICT.value for _, status in rows)
        }

    def before(self, cm_id: str) -> list[Ack]:
        return self._acks.get(cm_id, [])

    def add(self, cm_id: str, ack: Ack) -> None:
        self._acks.setdefault(cm_id, []).append(ack)

    def first_contradiction(self, cm_id: str) -> bool:
        """Is this the first late ack to contradict ``cm_id``'s decision (for the metric)?"""
        if cm_id in self._contradicted:
            return False
        self._contradicted.add(cm_id)
        return True


def _token_ok(received: Received, recipient: str | None, secret: bytes) -> bool:
    """Does the ack carry the token of the copy (signed for the copy's recipient)?"""
    ack = received.message
    if recipient == ack.recipient:
        expected = received.token_if_same_recipient
    else:
        expected = protocol.copy_token(secret, ack.cm_id, ack.destination, recipient)
    return hmac.compare_digest(expected, ack.token)


def _row(
    received: Received,
    cm: CmRow,
    counted: list[Ack],
    late: _LateEvidence,
    now: datetime,
) -> dict[str, Any]:
    ack = received.message
    status = tables.AckStatus.COUNTED
    if _decided(cm):
        assert cm.effective_at is not None
        status = tables.AckStatus.AFTER_DECISION
        # The stored verdict is exactly evaluate() over the acks that counted, at the
        # decision's effective instant. Late acks are judged together: two that each
        # change nothing alone may satisfy a minimum between them, so this one is judged
        # with every late ack of the CM before it.
        before = late.before(cm.cm_id)
        evidence = [*counted, *before, received.ack]
        judged = evaluate(cm.condition, cm.sent_at, evidence, cm.effective_at)
        if judged.verdict.value != cm.state:
            status = tables.AckStatus.CHANGES_VERDICT
        late.add(cm.cm_id, received.ack)
    return {
        "ack_id": ack.ack_id,
        "cm_id": ack.cm_id,
        "destination": ack.destination,
        "recipient": ack.recipient,
        "receiver": ack.receiver,
        "kind": ack.kind.value,
        "read_at": ack.read_at,
        "committed_at": ack.committed_at,
        "received_at": now,
        "status": status.value,
        "traceparent": received.traceparent,
    }
