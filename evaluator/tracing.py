"""The evaluator's spans: each ack's intake, and each decision, joined to the send's trace.

An ack's delivery keeps the W3C ``traceparent`` it carried (:class:`TracedBody`), its row
stores it (with tracing off too: a header read, and the conformance harness checks what
a receiver passed on), and a decision links to the
stored contexts of every ack that counted, whichever batch, process or instance took them
in. The decision span is a child of the send's span (``condmsg_cm.traceparent``); the
outcome notification, success notices and compensations it releases carry its context.
No span is made without tracing (:func:`condmsg.infra.tracing.active`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.infra import tracing
from evaluator.store import CmRow


class TracedBody(bytes):
    """An ack body with the ``traceparent`` its delivery carried: it travels through the
    batches as the bytes it is, and :func:`evaluator.intake.decode` reads the context."""

    traceparent: str | None = None

    @classmethod
    def of(cls, body: bytes, headers: Mapping[str, Any] | None) -> bytes:
        """``body`` with the context of ``headers`` attached (``body`` itself without)."""
        traceparent = tracing.traceparent_of(headers)
        if traceparent is None:
            return body
        traced = cls(body)
        traced.traceparent = traceparent
        return traced


def traceparent_of(body: bytes) -> str | None:
    """The context an ack body's delivery carried, if any."""
    return body.traceparent if isinstance(body, TracedBody) else None


def record_intake(sender: str, acks: Iterable[tuple[protocol.AckMessage, str | None, str]]) -> None:
    """One ``process`` span per ack taken in (``(document, carried traceparent, status)``),
    a child of the span that made the ack."""
    queue = protocol.ack_queue(sender)
    for ack, traceparent, status in acks:
        with tracing.span(
            f"process {queue}",
            kind="consumer",
            parent={tracing.TRACEPARENT: traceparent} if traceparent else None,
            attributes={
                tracing.SYSTEM: tracing.RABBITMQ,
                tracing.OPERATION_TYPE: "process",
                tracing.OPERATION_NAME: "ack-intake",
                tracing.DESTINATION: queue,
                tracing.MESSAGE_ID: ack.ack_id,
                tracing.CONVERSATION_ID: ack.cm_id,
                "condmsg.cm_id": ack.cm_id,
                "condmsg.destination": ack.destination,
                "condmsg.ack.kind": ack.kind.value,
                "condmsg.ack.status": status,
            },
        ):
            pass


def decision_traces(
    session: Session, decided: Sequence[CmRow], verdicts: Mapping[str, tuple[Outcome, bytes]]
) -> dict[str, dict[str, str]] | None:
    """Record a ``decide`` span per CM of ``decided`` (its outcome in ``verdicts``) and
    return, per CM, the W3C headers of its span (for the messages the decision
    releases); None without tracing."""
    if not tracing.active():
        return None
    ids = [cm.cm_id for cm in decided]
    if not ids:
        return {}
    cms, ack = tables.cms.c, tables.acks.c
    found_sends = session.execute(sa.select(cms.cm_id, cms.traceparent).where(cms.cm_id.in_(ids)))
    sends = {row.cm_id: row.traceparent for row in found_sends}
    counted: dict[str, list[str]] = {}
    query = sa.select(ack.cm_id, ack.traceparent).where(
        ack.cm_id.in_(ids),
        ack.status == tables.AckStatus.COUNTED.value,
        ack.traceparent.is_not(None),
    )
    for cm_id, traceparent in session.execute(query.order_by(ack.received_at, ack.ack_id)):
        counted.setdefault(cm_id, []).append(traceparent)
    found: dict[str, dict[str, str]] = {}
    for cm in decided:
        outcome, sender = verdicts[cm.cm_id][0], cm.sender
        send = sends.get(outcome.cm_id)
        links = tracing.links_to(counted.get(outcome.cm_id, ()))
        with tracing.span(
            f"decide {sender}",
            parent={tracing.TRACEPARENT: send} if send else None,
            links=links,
            attributes={
                "condmsg.cm_id": outcome.cm_id,
                "condmsg.verdict": outcome.verdict.value,
                "condmsg.reasons": list(outcome.reasons),
                "condmsg.acks": len(links),
                tracing.CONVERSATION_ID: outcome.cm_id,
            },
        ):
            found[outcome.cm_id] = tracing.current_headers()
    return found


def sphere_trace(session: Session, sender: str, outcome: SphereOutcome) -> dict[str, str] | None:
    """Record the ``decide sphere`` span of ``outcome``, linked to every member's send,
    and return the W3C headers of its span (for the messages it releases); None without
    tracing."""
    if not tracing.active():
        return None
    cms = tables.cms.c
    query = sa.select(cms.traceparent).where(
        cms.cm_id.in_(list(outcome.members)), cms.traceparent.is_not(None)
    )
    links = tracing.links_to(session.scalars(query.order_by(cms.sent_at, cms.cm_id)))
    with tracing.span(
        f"decide sphere {sender}",
        links=links,
        attributes={
            "condmsg.sphere_id": outcome.sphere_id,
            "condmsg.verdict": outcome.verdict.value,
            "condmsg.reasons": list(outcome.reasons),
            "condmsg.sphere.members": len(outcome.members),
            tracing.CONVERSATION_ID: outcome.sphere_id,
        },
    ):
        return tracing.current_headers()
