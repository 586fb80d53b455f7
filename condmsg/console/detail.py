"""What the console's CM, sphere and outbox pages read (SELECT only).

A CM is judged as ``condmsg status`` judges it (:mod:`condmsg.cm_status`); a CM whose
stored condition cannot be decoded is still shown, with what is wrong in place of its tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from condmsg import tables
from condmsg.cm_status import ack_line, cm_status, node_notes
from condmsg.console.queries import overdue
from condmsg.core.acks import Ack
from condmsg.core.conditions import Condition, Destination
from condmsg.core.errors import CondmsgError
from condmsg.core.evaluation import EvaluationResult, Truth, Verdict
from condmsg.core.protocol import H_CM_ID
from condmsg.core.store_values import AckStatus
from condmsg.core.timeutil import iso, stored_instant, utcnow
from condmsg.core.wording import plural
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
    #: The instant it was judged at; None with ``result`` and ``tree`` if it could not be.
    judged_at: datetime | None
    result: EvaluationResult | None
    tree: TreeNode | None
    contradiction: str | None
    stored_reasons_differ: bool
    timeline: list[tuple[datetime, str]]
    copies: list[Any]
    outbox: list[dict[str, Any]]
    #: Why its stored condition cannot be judged, if it cannot.
    undecodable: str | None = None

    @property
    def standing(self) -> tuple[str, str]:
        """(state, words) of the CM as both its pill and its verdict show it: the stored
        verdict once decided; while pending, ``pending`` and, if the acks so far already
        decide it, the verdict the evaluator will record (it has not yet: its sweep is
        due, or the ack grace has not passed)."""
        state = str(self.row.state)
        if state != "pending":
            return state, state
        if self.result is None or self.result.verdict is Verdict.PENDING:
            return state, state
        return state, f"pending, would be {self.result.verdict.value}"


def cm_detail(
    conn: sa.Connection,
    cm_id: str,
    settings: Settings,
    outbox_table: sa.Table | None,
    now: datetime | None = None,
) -> CmDetail | None:
    """The CM ``cm_id`` as its page shows it at ``now`` (default: the clock), or None."""
    now = utcnow() if now is None else now
    cms = tables.cms
    row = conn.execute(
        sa.select(cms, overdue(now).label("overdue")).where(cms.c.cm_id == cm_id)
    ).first()
    if row is None:
        return None
    copy_rows = conn.execute(
        sa.select(tables.copies)
        .where(tables.copies.c.cm_id == cm_id)
        .order_by(tables.copies.c.destination)
    ).all()
    comp_rows = conn.execute(
        sa.select(tables.compensations).where(tables.compensations.c.cm_id == cm_id)
    ).all()
    shown = CmDetail(
        row=row,
        sent_at=stored_instant(row.sent_at),
        judged_at=None,
        result=None,
        tree=None,
        contradiction=None,
        stored_reasons_differ=False,
        timeline=[],
        copies=list(copy_rows),
        outbox=[] if outbox_table is None else outbox_rows_of(conn, outbox_table, cm_id),
    )
    try:
        status = cm_status(conn, row, settings.ack_grace)
    except CondmsgError as exc:
        # Everything but its tree and verdict can still be shown.
        acks = tables.acks
        ack_rows = conn.execute(
            sa.select(acks).where(acks.c.cm_id == cm_id).order_by(acks.c.received_at)
        ).all()
        shown.undecodable = f"its stored condition cannot be decoded: {exc}"
        shown.timeline = _timeline(row, shown.sent_at, copy_rows, ack_rows, comp_rows)
        return shown
    shown.judged_at = status.judged_at
    shown.result = status.result
    shown.tree = _tree(status.condition, status.result, [*status.counted, *status.late])
    shown.contradiction = status.contradiction
    shown.stored_reasons_differ = status.stored_reasons_differ
    shown.timeline = _timeline(row, status.sent_at, copy_rows, status.ack_rows, comp_rows)
    return shown


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
        (
            sent_at,
            f"sent: {plural(len(copy_rows), 'copy', 'copies')} "
            f"({', '.join(c.destination for c in copy_rows)})",
        )
    ]
    for a in ack_rows:
        who = f" ({a.recipient})" if a.recipient else ""
        events.append((stored_instant(a.read_at), f"read by {a.destination}{who}"))
        if a.committed_at is not None:
            events.append((stored_instant(a.committed_at), f"committed by {a.destination}{who}"))
        status = "" if a.status == AckStatus.COUNTED.value else f", {a.status.replace('_', ' ')}"
        events.append(
            (stored_instant(a.received_at), f"{a.kind} ack from {a.destination} received{status}")
        )
    if row.decided_at is not None:
        decided = stored_instant(row.decided_at)
        assert decided is not None
        events.append((decided, f"decided {row.state} by {row.decided_by}"))
        if row.notify_success and row.state == "satisfied":
            events.append((decided, "success notices to every destination"))
    for comp in comp_rows:
        if comp.released_at is not None:
            kind = "system" if comp.system_generated else "application"
            events.append(
                (stored_instant(comp.released_at), f"compensation ({kind}) to {comp.destination}")
            )
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
        "created_at": stored_instant(r.created_at),
        "failed_at": stored_instant(r.failed_at),
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


@dataclass(slots=True)
class SphereList:
    #: The newest spheres (begun last first), at most the list's limit.
    rows: list[dict[str, Any]]
    #: Spheres in the store by state.
    by_state: dict[str, int]


def sphere_list(conn: sa.Connection, state: str | None, limit: int) -> SphereList:
    """The newest spheres, of one state or of any, with how many there are by state."""
    s = tables.spheres.c
    query = (
        sa.select(s.sphere_id, s.sender, s.begun_at, s.deadline, s.members, s.state, s.decided_at)
        .order_by(s.begun_at.desc(), s.sphere_id.desc())
        .limit(limit)
    )
    if state is not None:
        query = query.where(s.state == state)
    rows = [
        {
            **r._asdict(),
            "begun_at": stored_instant(r.begun_at),
            "deadline": stored_instant(r.deadline),
            "decided_at": stored_instant(r.decided_at),
        }
        for r in conn.execute(query)
    ]
    counts = conn.execute(sa.select(s.state, sa.func.count()).group_by(s.state)).all()
    return SphereList(rows, {str(k): int(n) for k, n in counts})
