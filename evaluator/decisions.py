"""Deciding CMs and writing their outcome actions, in the caller's transaction.

A CM is judged with the pure ``evaluate`` at the *effective* instant ``now - ack_grace``
(never before the CM's ``sent_at``: no deadline lies before it, so the verdict is the
same, but a decision never claims to take effect before its CM existed): an ack made in
time but still in a receiver's relay is not misjudged at a deadline. The
verdict is recorded exactly once (a conditional UPDATE), and in the same transaction the
outbox receives the outcome notification, the success notices (if asked for) or the
compensations. A CM still pending gets its next check time, shifted by the grace.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from condmsg import protocol
from condmsg.acks import Ack
from condmsg.copies import notice_message
from condmsg.evaluation import Verdict, evaluate
from condmsg.outcome import OUTCOME_CONTENT_TYPE, OUTCOME_TYPE, Outcome
from condmsg.payloads import JSON
from condmsg.protocol import PROTOCOL_VERSION, format_instant
from evaluator.store import CmRow, CopyRow, DecisionStore
from outbox.enqueueing import enqueue_all, enqueue_batch
from outbox.message import OutboxMessage


@dataclass(slots=True)
class Decided:
    outcomes: list[Outcome] = field(default_factory=list)
    rescheduled: int = 0


def judge(
    session: Session,
    cms: Mapping[str, CmRow],
    *,
    store: DecisionStore,
    now: datetime,
    ack_grace: timedelta,
    instance: str,
    secret: bytes,
    acks: Mapping[str, Sequence[Ack]] | None = None,
    copies: Mapping[str, Mapping[str, CopyRow]] | None = None,
) -> Decided:
    """Evaluate the pending CMs among ``cms`` and decide those whose verdict is final, in
    ``store`` (``secret`` signs the compensations and success notices).

    ``acks`` (the counted acks per CM) and ``copies`` (per CM, by destination) spare the
    queries when the caller has them already (the ack intake does); else they are read.
    """
    pending = {cm_id: cm for cm_id, cm in cms.items() if cm.state == "pending"}
    if acks is None:
        acks = store.counted_acks(session, pending)
    effective = now - ack_grace
    done = Decided()
    reschedule: list[tuple[str, datetime | None]] = []
    verdicts: dict[str, tuple[Outcome, bytes]] = {}
    rows: list[dict[str, Any]] = []
    instants = _instants_json(now, effective)  # shared by the outcomes of the call
    for cm_id, cm in pending.items():
        at, at_json = (effective, instants)
        if cm.sent_at > effective:  # sent less than a grace ago
            at, at_json = cm.sent_at, _instants_json(now, cm.sent_at)
        result = evaluate(cm.condition, cm.sent_at, acks.get(cm_id, ()), at)
        if not result.decided:
            next_at = result.next_check_at + ack_grace if result.next_check_at else None
            reschedule.append((cm_id, next_at))
            continue
        outcome = Outcome.from_result(cm_id, result, decided_at=now, effective_at=at)
        reasons_json = json.dumps(list(outcome.reasons))
        facts_json = json.dumps(list(outcome.facts))
        verdicts[cm_id] = (outcome, _outcome_body(outcome, reasons_json, facts_json, at_json))
        rows.append(
            {
                "cm_id": cm_id,
                "state": result.verdict.value,
                "effective_at": at,
                "reasons_json": reasons_json,
                "facts_json": facts_json,
            }
        )
    store.set_next_checks(session, reschedule)
    done.rescheduled = len(reschedule)
    # One statement per kind for the whole batch, not per CM (round trips dominate).
    won = store.decide_many(session, rows, instance=instance, decided_at=now)
    decided = [pending[cm_id] for cm_id in verdicts if cm_id in won]
    _write_actions(session, store, decided, verdicts, now, copies, secret=secret)
    done.outcomes = [verdicts[cm.cm_id][0] for cm in decided]
    return done


def _instants_json(decided_at: datetime, effective_at: datetime) -> str:
    """The ``decided_at`` and ``effective_at`` members of an outcome document."""
    return (
        f'"decided_at":{json.dumps(format_instant(decided_at))},'
        f'"effective_at":{json.dumps(format_instant(effective_at))}'
    )


def _outcome_body(outcome: Outcome, reasons_json: str, facts_json: str, instants: str) -> bytes:
    """The document ``outcome.to_json()`` makes, reusing the JSON already made for the CM
    row (``tests/unit/test_outcome_document.py`` holds the two to the same document)."""
    return (
        f'{{"v":{PROTOCOL_VERSION},"cm_id":{json.dumps(outcome.cm_id)},'
        f'"verdict":"{outcome.verdict.value}","reasons":{reasons_json},{instants},'
        f'"facts":{facts_json}}}'
    ).encode()


def _write_actions(
    session: Session,
    store: DecisionStore,
    cms: list[CmRow],
    outcomes: dict[str, tuple[Outcome, bytes]],
    now: datetime,
    copies: Mapping[str, Mapping[str, CopyRow]] | None,
    *,
    secret: bytes,
) -> None:
    if not cms:
        return
    if copies is None:
        copies = store.copies_of(session, [cm.cm_id for cm in cms])
    failed = [cm.cm_id for cm in cms if outcomes[cm.cm_id][0].verdict is Verdict.VIOLATED]
    compensations = store.compensations_of(session, failed)
    # The outcome notifications, per outcome queue (one: the evaluator serves one sender):
    # one template, and per CM its body and ids.
    notifications: dict[str, tuple[list[bytes], list[str | None], list[str | None]]] = {}
    messages: list[OutboxMessage] = []  # notices and compensations
    for cm in cms:
        outcome, body = outcomes[cm.cm_id]
        batch = notifications.get(cm.sender)
        if batch is None:
            batch = notifications[cm.sender] = ([], [], [])
        batch[0].append(body)
        batch[1].append(f"{cm.cm_id}.outcome")
        batch[2].append(cm.cm_id)
        if outcome.verdict is Verdict.SATISFIED and cm.notify_success:
            cm_copies = copies.get(cm.cm_id, {})
            notice = json.dumps({"cm_id": cm.cm_id, "verdict": "satisfied"}).encode()
            messages += [
                _notice(protocol.MessageKind.SUCCESS, cm, copy, notice, JSON, secret=secret)
                for copy in cm_copies.values()
            ]
        elif outcome.verdict is Verdict.VIOLATED:
            # Every destination gets the compensation; the receiver log drops it where the
            # original was never consumed (and then drops the original too).
            cm_copies = copies.get(cm.cm_id, {})
            for row in compensations.get(cm.cm_id, []):
                copy = cm_copies.get(row.destination)
                if copy is not None:
                    messages.append(
                        _notice(
                            protocol.MessageKind.COMPENSATION,
                            cm,
                            copy,
                            row.body,
                            row.content_type,
                            secret=secret,
                        )
                    )
    if failed:
        store.release_compensations(session, failed, now)
    for sender, (bodies, message_ids, correlation_ids) in notifications.items():
        enqueue_batch(session, _outcome_template(sender), bodies, message_ids, correlation_ids)
    enqueue_all(session, messages)


@functools.lru_cache(maxsize=64)
def _outcome_template(sender: str) -> OutboxMessage:
    """What the outcome notifications to ``sender`` share (body and ids are each CM's)."""
    return OutboxMessage(
        exchange="",
        routing_key=protocol.outcome_queue(sender),
        body=b"",
        content_type=OUTCOME_CONTENT_TYPE,
        message_type=OUTCOME_TYPE,
    )


def _notice(
    kind: protocol.MessageKind,
    cm: CmRow,
    copy: CopyRow,
    body: bytes,
    content_type: str | None,
    *,
    secret: bytes,
) -> OutboxMessage:
    return notice_message(
        kind=kind,
        cm_id=cm.cm_id,
        destination=copy.destination,
        recipient=copy.recipient,
        sender=cm.sender,
        sent_at=cm.sent_at,
        exchange=copy.exchange,
        routing_key=copy.routing_key,
        body=body,
        content_type=content_type,
        secret=secret,
    )
