"""The outcome actions of a transaction's decisions, written to the outbox together.

A decided CM on its own sends its outcome notification to its sender, and success notices
(if asked for) or compensations to its destinations. A Dependency-Sphere's members send
nothing while the sphere is undecided; when it is decided, the sphere's notification and
every member's notification go out, and the sphere's verdict (not each member's) chooses
between success notices and compensations for all of them (:mod:`evaluator.spheres`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from condmsg.core import protocol
from condmsg.core.outcome import (
    OUTCOME_CONTENT_TYPE,
    OUTCOME_TYPE,
    SPHERE_OUTCOME_CONTENT_TYPE,
    SPHERE_OUTCOME_TYPE,
    Outcome,
    SphereOutcome,
)
from condmsg.core.payloads import JSON
from condmsg.core.protocol import PROTOCOL_VERSION, format_instant
from condmsg.sending.copies import notice_message
from condmsg.spheres.store import MemberRow
from evaluator.store import CopyRow, DecisionStore
from outbox.enqueueing import enqueue_all, enqueue_batch
from outbox.message import OutboxMessage


class Member(Protocol):
    """What outcome actions need of a CM (a decided row, or a sphere's member)."""

    @property
    def cm_id(self) -> str: ...
    @property
    def sender(self) -> str: ...
    @property
    def sent_at(self) -> datetime: ...
    @property
    def notify_success(self) -> bool: ...


def instants_json(decided_at: datetime, effective_at: datetime) -> str:
    """The ``decided_at`` and ``effective_at`` members of an outcome document."""
    return (
        f'"decided_at":{json.dumps(format_instant(decided_at))},'
        f'"effective_at":{json.dumps(format_instant(effective_at))}'
    )


def outcome_body(outcome: Outcome, reasons_json: str, facts_json: str, instants: str) -> bytes:
    """The document ``outcome.to_json()`` makes, reusing the JSON already made for the CM
    row (``tests/unit/test_outcome_document.py`` holds the two to the same document)."""
    return (
        f'{{"v":{PROTOCOL_VERSION},"cm_id":{json.dumps(outcome.cm_id)},'
        f'"verdict":"{outcome.verdict.value}","reasons":{reasons_json},{instants},'
        f'"facts":{facts_json}}}'
    ).encode()


def outcome_body_of_row(member: MemberRow) -> bytes:
    """The outcome document of a CM decided earlier, rebuilt from its row (the JSON the
    decision stored is the JSON the document holds)."""
    assert member.decided_at is not None and member.effective_at is not None
    return (
        f'{{"v":{PROTOCOL_VERSION},"cm_id":{json.dumps(member.cm_id)},'
        f'"verdict":"{member.state}","reasons":{member.reasons_json or "[]"},'
        f"{instants_json(member.decided_at, member.effective_at)},"
        f'"facts":{member.facts_json or "[]"}}}'
    ).encode()


class Actions:
    """The outcome actions of one transaction, collected and then written to the outbox
    in one batch per kind (:meth:`flush`): outcome notifications, success notices and
    compensations, of CMs decided on their own and of spheres' members."""

    def __init__(
        self,
        session: Session,
        store: DecisionStore,
        now: datetime,
        *,
        secret: bytes,
        copies: Mapping[str, Mapping[str, CopyRow]] | None = None,
        traces: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._session = session
        # Per decided CM, the trace context of its decision (evaluator.tracing), which
        # every message it releases carries; None without tracing.
        self._traces = traces
        self._store = store
        self._now = now
        self._secret = secret
        self._copies = dict(copies) if copies is not None else {}
        # Per outcome queue (one: the evaluator serves one sender): bodies and ids.
        self._notifications: dict[str, tuple[list[bytes], list[str | None], list[str | None]]]
        self._notifications = {}
        self._succeed: list[Member] = []
        self._compensate: list[Member] = []
        self._spheres: list[SphereOutcome] = []
        self._sphere_notices: list[OutboxMessage] = []

    def notify(self, cm: Member, body: bytes, *, message_id: str | None = None) -> None:
        """Send ``body`` (an outcome document) to ``cm``'s sender's outcome queue."""
        batch = self._notifications.get(cm.sender)
        if batch is None:
            batch = self._notifications[cm.sender] = ([], [], [])
        batch[0].append(body)
        batch[1].append(message_id or f"{cm.cm_id}.outcome")
        batch[2].append(cm.cm_id)

    def notify_sphere(
        self, sender: str, outcome: SphereOutcome, trace: Mapping[str, str] | None = None
    ) -> None:
        """Send the sphere's outcome to ``sender`` (with ``trace``, its decision's context)."""
        self._spheres.append(outcome)
        self._sphere_notices.append(
            dataclasses.replace(
                _sphere_template(sender),
                body=outcome.to_json(),
                message_id=f"{outcome.sphere_id}.outcome",
                correlation_id=outcome.sphere_id,
                headers=dict(trace) if trace else None,
            )
        )

    def trace(self, cm_ids: Iterable[str], trace: Mapping[str, str]) -> None:
        """Give the messages of ``cm_ids`` that have no decision context of their own
        (members a sphere's decision releases) the context ``trace``."""
        traces = dict(self._traces or {})
        for cm_id in cm_ids:
            traces.setdefault(cm_id, trace)
        self._traces = traces

    def succeed(self, cms: Iterable[Member]) -> None:
        """Success notices to every destination of those of ``cms`` that asked for them."""
        self._succeed += [cm for cm in cms if cm.notify_success]

    def compensate(self, cms: Iterable[Member]) -> None:
        """Release the compensations of ``cms`` to every destination (the receiver log drops
        one where the original was never consumed, and then drops the original too)."""
        self._compensate += cms

    def flush(self) -> list[SphereOutcome]:
        """Write everything collected; returns the sphere outcomes among it."""
        session, store = self._session, self._store
        messages: list[OutboxMessage] = list(self._sphere_notices)
        wanted = [cm.cm_id for cm in (*self._succeed, *self._compensate)]
        missing = [cm_id for cm_id in wanted if cm_id not in self._copies]
        if missing:
            self._copies.update(store.copies_of(session, missing))
        notice = b""
        for cm in self._succeed:
            notice = json.dumps({"cm_id": cm.cm_id, "verdict": "satisfied"}).encode()
            messages += [
                self._traced(
                    _notice(
                        protocol.MessageKind.SUCCESS, cm, copy, notice, JSON, secret=self._secret
                    )
                )
                for copy in self._copies.get(cm.cm_id, {}).values()
            ]
        failed = [cm.cm_id for cm in self._compensate]
        compensations = store.compensations_of(session, failed) if failed else {}
        for cm in self._compensate:
            cm_copies = self._copies.get(cm.cm_id, {})
            for row in compensations.get(cm.cm_id, []):
                copy = cm_copies.get(row.destination)
                if copy is not None:
                    messages.append(
                        self._traced(
                            _notice(
                                protocol.MessageKind.COMPENSATION,
                                cm,
                                copy,
                                row.body,
                                row.content_type,
                                secret=self._secret,
                            )
                        )
                    )
        released = [cm_id for cm_id in failed if compensations.get(cm_id)]
        if released:  # a CM without compensations has no row to mark
            store.release_compensations(session, released, self._now)
        for sender, (bodies, message_ids, correlation_ids) in self._notifications.items():
            if self._traces is None:
                enqueue_batch(
                    session, _outcome_template(sender), bodies, message_ids, correlation_ids
                )
                continue
            template = _outcome_template(sender)
            messages += [
                self._traced(template, body=b, message_id=m, correlation_id=c)
                for b, m, c in zip(bodies, message_ids, correlation_ids, strict=True)
            ]
        enqueue_all(session, messages)
        return self._spheres

    def _traced(self, message: OutboxMessage, **fields: Any) -> OutboxMessage:
        """``message`` (with ``fields`` replaced) carrying the trace context of the
        decision of its CM (its correlation id)."""
        cm_id = fields.get("correlation_id", message.correlation_id)
        trace = (self._traces or {}).get(str(cm_id))
        if trace:
            fields["headers"] = {**(message.headers or {}), **trace}
        return dataclasses.replace(message, **fields) if fields else message


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


@functools.lru_cache(maxsize=64)
def _sphere_template(sender: str) -> OutboxMessage:
    """What the sphere outcome notifications to ``sender`` share."""
    return OutboxMessage(
        exchange="",
        routing_key=protocol.outcome_queue(sender),
        body=b"",
        content_type=SPHERE_OUTCOME_CONTENT_TYPE,
        message_type=SPHERE_OUTCOME_TYPE,
    )


def _notice(
    kind: protocol.MessageKind,
    cm: Member,
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
