"""A stored CM judged again, as ``condmsg status`` prints it and the console's CM page shows it.

A decided CM is judged at its decision's effective instant over the acks counted then; a
pending one as it stands now, less the ack grace. Both use the evaluator's
:func:`~condmsg.core.evaluation.evaluate`, and both say when the acks that came after the
decision would have changed it. The words for a node's counts and an ack are here too, so
the terminal and the page describe a tree alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from condmsg import tables
from condmsg.core.acks import Ack, AckKind
from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Condition
from condmsg.core.evaluation import EvaluationResult, evaluate
from condmsg.core.store_values import AckStatus
from condmsg.core.timeutil import describe_duration, iso, stored_instant, utcnow
from condmsg.core.wording import plural


@dataclass(frozen=True, slots=True, kw_only=True)
class CmStatus:
    """A ``condmsg_cm`` row judged again; ``ack_rows`` are its ``condmsg_ack`` rows in the
    order they were received."""

    condition: Condition
    sent_at: datetime
    #: The instant it was judged at: the decision's effective instant, or now less the grace.
    judged_at: datetime
    ack_rows: list[Any]
    counted: list[Ack]
    #: The acks that were not counted (they came after the decision).
    late: list[Ack]
    result: EvaluationResult
    #: A decided CM whose stored reasons are not those of the judgement again.
    stored_reasons_differ: bool
    contradiction: str | None


def ack_of(row: Any) -> Ack:
    """The :class:`Ack` a ``condmsg_ack`` row records."""
    return Ack(
        destination=row.destination,
        kind=AckKind(row.kind),
        read_at=stored_instant(row.read_at),
        committed_at=None if row.committed_at is None else stored_instant(row.committed_at),
        recipient=row.recipient,
    )


def cm_status(conn: sa.Connection, cm: Any, ack_grace: timedelta) -> CmStatus:
    """The CM row ``cm`` judged again over its stored acks."""
    acks = tables.acks
    ack_rows = list(
        conn.execute(
            sa.select(acks).where(acks.c.cm_id == cm.cm_id).order_by(acks.c.received_at)
        ).all()
    )
    counted = [ack_of(r) for r in ack_rows if r.status == AckStatus.COUNTED.value]
    late = [ack_of(r) for r in ack_rows if r.status != AckStatus.COUNTED.value]
    condition = condition_from_json(cm.condition_json)
    sent_at = stored_instant(cm.sent_at)
    at = stored_instant(cm.effective_at) if cm.effective_at else utcnow() - ack_grace
    result = evaluate(condition, sent_at, counted, at)
    differ, contradicted = False, None
    if cm.decided_at is not None:
        differ = list(result.reasons) != json.loads(cm.reasons_json or "[]")
        if late:
            with_late = evaluate(condition, sent_at, [*counted, *late], at)
            contradicted = contradiction(cm.state, with_late, len(late))
    return CmStatus(
        condition=condition,
        sent_at=sent_at,
        judged_at=at,
        ack_rows=ack_rows,
        counted=counted,
        late=late,
        result=result,
        stored_reasons_differ=differ,
        contradiction=contradicted,
    )


def contradiction(stored_state: str, with_late: EvaluationResult, late_acks: int) -> str | None:
    """The line saying that a decided CM's late acks, judged with the counted ones at the
    decision's effective instant, give another verdict; None if they do not (or if the
    CM is pending)."""
    if stored_state == "pending" or late_acks == 0:
        return None
    if with_late.verdict.value == stored_state:
        return None
    return (
        f"contradicted by late acks: with the {plural(late_acks, 'ack')} received after the "
        f"decision the verdict would be {with_late.verdict.value}, not {stored_state} "
        f"(the ack grace was too short for {'it' if late_acks == 1 else 'them'})"
    )


def node_notes(node: Condition) -> list[str]:
    """A node's count bounds and evaluation timeout, as words (``pickup count [1..*]``)."""
    notes = []
    for kind in ("pickup", "process"):
        low, high = getattr(node, f"min_{kind}"), getattr(node, f"max_{kind}")
        if low is not None or high is not None:
            bounds = f"{low if low is not None else 0}..{high if high is not None else '*'}"
            notes.append(f"{kind} count [{bounds}]")
    if node.evaluation_timeout is not None:
        notes.append(f"evaluation timeout {describe_duration(node.evaluation_timeout)}")
    return notes


def ack_line(ack: Ack) -> str:
    """An ack in words: ``process ack by r1: read <instant>, committed <instant>``."""
    when = f"read {iso(ack.read_at)}"
    if ack.committed_at is not None:
        when += f", committed {iso(ack.committed_at)}"
    who = f" by {ack.recipient}" if ack.recipient else ""
    return f"{ack.kind.value} ack{who}: {when}"
