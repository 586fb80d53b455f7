"""What the console's CM, sphere and outbox pages read (SELECT only).

A CM is judged as ``condmsg status`` judges it (:mod:`condmsg.cm_status`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from condmsg import tables
from condmsg.cm_status import ack_line, cm_status, node_notes
from condmsg.console.queries import utc
from condmsg.core.acks import Ack
from condmsg.core.conditions import Condition, Destination
from condmsg.core.evaluation import EvaluationResult, Truth
from condmsg.core.protocol import H_CM_ID
from condmsg.core.store_values import AckStatus
from condmsg.core.timeutil import iso
from condmsg.runtime.settings import Settings
from condmsg.spheres.store import SPHERES, ParticipantRow, SphereRow

_MARK = {Truth.TRUE: "held", Truth.FALSE: "failed", Truth.UNKNOWN: "open"}
#: Payload bytes of an outbox row the console shows (escaped, as text).
EXCERPT = 120


@dataclass(slots=True)
class TreeNode:
    """One node of a condition tree as the CM page draws it."""

    label: str
    path: str
    #: (status: held/failed/open, text) per constraint of the node.
    constraints: list[tuple[str, str]]
    notes: list[str]
    acks: list[str]
    children: list[TreeNode] = field(default_factory=list)


@dataclass(slots=True)
class CmDetail:
    row: Any
    sent_at: datetime
    judged_at: datetime
    result: EvaluationResult
    tree: TreeNode
    contradiction: str | None
    stored_reasons_differ: bool
    timeline: list[tuple[datetime, str]]
    copies: list[Any]
    outbox: list[dict[str, Any]]


def cm_detail(
    conn: sa.Connection, cm_id: str, settings: Settings, outbox_table: sa.Table | None
) -> CmDetail | None:
    cms = tables.cms
    row = conn.execute(sa.select(cms).where(cms.c.cm_id == cm_id)).first()
    if row is None:
        return None
    status = cm_status(conn, row, settings.ack_grace)
    copy_rows = conn.execute(
        sa.select(tables.copies)
        .where(tables.copies.c.cm_id == cm_id)
        .order_by(tables.copies.c.destination)
    ).all()
    comp_rows = conn.execute(
        sa.select(tables.compensations).where(tables.compensations.c.cm_id == cm_id)
    ).all()
    return CmDetail(
        row=row,
        sent_at=status.sent_at,
        judged_at=status.judged_at,
        result=status.result,
        tree=_tree(status.condition, status.result, [*status.counted, *status.late]),
        contradiction=status.contradiction,
        stored_reasons_differ=status.stored_reasons_differ,
        timeline=_timeline(row, status.sent_at, copy_rows, status.ack_rows, comp_rows),
        copies=list(copy_rows),
        outbox=[] if outbox_table is None else outbox_rows_of(conn, outbox_table, cm_id),
    )


def _tree(condition: Condition, result: EvaluationResult, acks: list[Ack]) -> TreeNode:
    by_path: dict[str, list[Any]] = {}
    for constraint in result.constraints:
        by_path.setdefault(constraint.path, []).append(constraint)

    def visit(node: Condition, path: str) -> TreeNode:
        constraints = [
            (_MARK[c.value], f"{c.kind} by {iso(c.deadline)}") for c in by_path.get(path, [])
        ]
        mine = []
        if isinstance(node, Destination):
            mine = [ack_line(ack) for ack in acks if ack.destination == node.name]
        out = TreeNode(node.label, path, constraints, node_notes(node), mine)
        out.children = [visit(m, f"{path}[{i}]") for i, m in enumerate(node.members)]
        return out

    return visit(condition, "root")


def _timeline(
    row: Any, sent_at: datetime, copy_rows: Any, ack_rows: Any, comp_rows: Any
) -> list[tuple[datetime, str]]:
    """The CM's events in time order: its copies, every ack's read and commit (and when
    the evaluator received it), its decision, success notices and compensations."""
    events: list[tuple[datetime, str]] = [
        (sent_at, f"sent: {len(copy_rows)} copies ({', '.join(c.destination for c in copy_rows)})")
    ]
    for a in ack_rows:
        who = f" ({a.recipient})" if a.recipient else ""
        events.append((utc(a.read_at), f"read by {a.destination}{who}"))  # type: ignore[arg-type]
        if a.committed_at is not None:
            events.append((utc(a.committed_at), f"committed by {a.destination}{who}"))  # type: ignore[arg-type]
        status = "" if a.status == AckStatus.COUNTED.value else f", {a.status.replace('_', ' ')}"
        events.append(
            (utc(a.received_at), f"{a.kind} ack from {a.destination} received{status}")  # type: ignore[arg-type]
        )
    if row.decided_at is not None:
        decided = utc(row.decided_at)
        assert decided is not None
        events.append((decided, f"decided {row.state} by {row.decided_by}"))
        if row.notify_success and row.state == "satisfied":
            events.append((decided, "success notices to every destination"))
    for comp in comp_rows:
        if comp.released_at is not None:
            kind = "system" if comp.system_generated else "application"
            events.append((utc(comp.released_at), f"compensation ({kind}) to {comp.destination}"))  # type: ignore[arg-type]
    events.sort(key=lambda e: e[0])
    return events


def outbox_rows_of(conn: sa.Connection, table: sa.Table, cm_id: str) -> list[dict[str, Any]]:
    """The outbox rows still waiting or parked for ``cm_id``: its copies, notices and
    compensations carry its id in a header, its outcome notification as correlation id."""
    t = table.c
    query = (
        sa.select(table)
        .where(sa.or_(t.headers[H_CM_ID].as_string() == cm_id, t.correlation_id == cm_id))
        .order_by(t.id)
        .limit(200)
    )
    return [outbox_row(r) for r in conn.execute(query)]


def outbox_row(r: Any) -> dict[str, Any]:
    """An outbox row as the pages show it: no headers (a copy's carry its token)."""
    excerpt = bytes(r.body[:EXCERPT]).decode("utf-8", "replace")
    return {
        "id": r.id,
        "state": r.state,
        "destination": f"{r.exchange}/{r.routing_key}" if r.exchange else r.routing_key,
        "type": r.message_type,
        "attempts": r.attempts,
        "reason": r.last_error,
        "created_at": utc(r.created_at),
        "failed_at": utc(r.failed_at),
        "excerpt": excerpt + ("…" if len(r.body) > EXCERPT else ""),
    }


def parked_rows(
    conn: sa.Connection, table: sa.Table, after: int | None, limit: int
) -> list[dict[str, Any]]:
    """Parked rows oldest first, from after id ``after`` (the parked rows' own index)."""
    from outbox.table import FAILED

    query = sa.select(table).where(table.c.state == FAILED).order_by(table.c.id).limit(limit)
    if after is not None:
        query = query.where(table.c.id > after)
    return [outbox_row(r) for r in conn.execute(query)]


@dataclass(slots=True)
class SphereDetail:
    sphere: SphereRow
    participants: list[ParticipantRow]
    members: list[Any]


def sphere_detail(conn: sa.Connection, sphere_id: str) -> SphereDetail | None:
    sphere = SPHERES.sphere(conn, sphere_id)
    if sphere is None:
        return None
    cms = tables.cms
    members = conn.execute(
        sa.select(cms.c.cm_id, cms.c.sent_at, cms.c.state, cms.c.decided_at)
        .where(cms.c.sphere_id == sphere_id)
        .order_by(cms.c.sent_at, cms.c.cm_id)
    ).all()
    return SphereDetail(sphere, SPHERES.participants(conn, sphere_id), list(members))
