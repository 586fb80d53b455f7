"""What the console's overview and CM list read from a sender store (SELECT only).

Every query is SQLAlchemy Core over :mod:`condmsg.tables` and the outbox table, so
one code serves SQLite and PostgreSQL, and a role with SELECT on the tables is enough.
The CM list pages by keyset on ``(sent_at, cm_id)`` (newest first): each page reads the
``ix_condmsg_cm_sent_at`` index from where the previous one stopped, so its cost does not
grow with how deep the page is (bench/console.py measures it at 1,000,000 CMs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from condmsg import tables
from condmsg.core.store_values import AckStatus, CmState
from condmsg.core.timeutil import stored_instant

#: CMs a page of the list shows.
PAGE_SIZE = 50
#: Bars of the overview's chart.
BUCKETS = 24
#: Decided CMs (the latest) whose latencies the overview's percentiles summarise.
LATENCY_SAMPLE = 2000
#: A pending CM whose next check is due since longer than this is overdue: the sweeps are
#: behind or failing (the evaluator's own gauge uses one sweep interval; a console cannot
#: know it, so it allows a few).
OVERDUE_AFTER = timedelta(seconds=10)
#: The CM list counts the CMs its filter matches up to this many (a count is a scan).
COUNT_CAP = 10_000

STATES = ("pending", "decided", "overdue")
VERDICTS = (CmState.SATISFIED.value, CmState.VIOLATED.value)

cms = tables.cms
copies = tables.copies
acks = tables.acks
anomalies = tables.anomalies


def overdue(now: datetime) -> sa.ColumnElement[bool]:
    """Whether a CM is overdue at ``now``: the one definition every page uses (the list's
    filter and marks, the overview's count, a CM's page). Pending CMs are found through
    the sweeps' partial index on ``next_check_at``, which holds every pending row."""
    c = cms.c
    return sa.and_(c.state == CmState.PENDING.value, c.next_check_at <= now - OVERDUE_AFTER)


@dataclass(frozen=True, slots=True, kw_only=True)
class ListFilter:
    """The CM list's filters; each is optional. ``since``/``until`` bound ``sent_at``
    (UTC, ``until`` exclusive); ``cm_id`` matches an id or the start of one."""

    state: str | None = None
    verdict: str | None = None
    destination: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    cm_id: str | None = None


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: the last CM shown, in list order."""

    sent_at: datetime
    cm_id: str

    def encode(self) -> str:
        return f"{self.sent_at.isoformat()}|{self.cm_id}"

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``text`` encodes; ValueError if it encodes none."""
        instant, _, cm_id = text.partition("|")
        try:
            return cls(stored_instant(datetime.fromisoformat(instant)), cm_id)
        except OverflowError:  # year 1 or 9999 once in UTC
            raise ValueError(f"instant out of range: {instant}") from None


@dataclass(slots=True)
class CmPage:
    rows: list[dict[str, Any]]
    next_cursor: Cursor | None
    #: CMs the filter matches, counted up to COUNT_CAP + 1.
    matching: int = 0

    @property
    def matching_text(self) -> str:
        """``1 CM matches``, ``1,234 CMs match``, ``more than 10,000 CMs match``."""
        if self.matching > COUNT_CAP:
            return f"more than {COUNT_CAP:,} CMs match"
        return (
            f"{self.matching:,} CM matches"
            if self.matching == 1
            else f"{self.matching:,} CMs match"
        )


def list_query(flt: ListFilter, after: Cursor | None, now: datetime, limit: int) -> sa.Select[Any]:
    """The SELECT of one page: the plain SQL the console runs (bench/console.py times it)."""
    c = cms.c
    query = _filtered(
        sa.select(
            c.cm_id,
            c.sender,
            c.sent_at,
            c.state,
            c.decided_at,
            c.sphere_id,
            overdue(now).label("overdue"),
        ),
        flt,
        now,
    )
    if after is not None:
        # The first condition is redundant but lets the planner start the index range at
        # the cursor; the OR alone would make it read the index from the top.
        query = query.where(
            c.sent_at <= after.sent_at,
            sa.or_(
                c.sent_at < after.sent_at,
                sa.and_(c.sent_at == after.sent_at, c.cm_id < after.cm_id),
            ),
        )
    return query.order_by(c.sent_at.desc(), c.cm_id.desc()).limit(limit)


def count_query(flt: ListFilter, now: datetime) -> sa.Select[Any]:
    """How many CMs ``flt`` matches, counted up to ``COUNT_CAP + 1``: the count reads what
    the list's index range holds, so a cap keeps it as cheap as a few pages."""
    matching = _filtered(sa.select(cms.c.cm_id), flt, now).limit(COUNT_CAP + 1).subquery()
    return sa.select(sa.func.count()).select_from(matching)


def _filtered(query: sa.Select[Any], flt: ListFilter, now: datetime) -> sa.Select[Any]:
    c = cms.c
    if flt.state == "pending":
        query = query.where(c.state == CmState.PENDING.value)
    elif flt.state == "decided":
        query = query.where(c.state != CmState.PENDING.value)
    elif flt.state == "overdue":
        query = query.where(overdue(now))
    if flt.verdict:
        query = query.where(c.state == flt.verdict)
    if flt.destination:
        # A probe of the copy table's primary key (cm_id, destination) per candidate row.
        query = query.where(
            sa.exists().where(copies.c.cm_id == c.cm_id, copies.c.destination == flt.destination)
        )
    if flt.since is not None:
        query = query.where(c.sent_at >= flt.since)
    if flt.until is not None:
        query = query.where(c.sent_at < flt.until)
    if flt.cm_id:
        # A prefix as a range, so that the primary key's index serves it in any collation.
        query = query.where(c.cm_id >= flt.cm_id, c.cm_id < flt.cm_id + "\uffff")
    return query


def cm_page(
    conn: sa.Connection,
    flt: ListFilter,
    after: Cursor | None,
    now: datetime,
    limit: int = PAGE_SIZE,
) -> CmPage:
    """One page of the list, newest first, with each CM's destinations."""
    found = conn.execute(list_query(flt, after, now, limit + 1)).all()
    more = len(found) > limit
    found = found[:limit]
    ids = [r.cm_id for r in found]
    dests: dict[str, list[str]] = {i: [] for i in ids}
    if ids:
        for cm_id, destination in conn.execute(
            sa.select(copies.c.cm_id, copies.c.destination)
            .where(copies.c.cm_id.in_(ids))
            .order_by(copies.c.destination)
        ):
            dests[cm_id].append(destination)
    rows = [
        {
            "cm_id": r.cm_id,
            "sent_at": stored_instant(r.sent_at),
            "state": r.state,
            "decided_at": stored_instant(r.decided_at),
            "sphere_id": r.sphere_id,
            "destinations": dests[r.cm_id],
            "overdue": bool(r.overdue),
        }
        for r in found
    ]
    last = found[-1] if more and found else None
    cursor = Cursor(stored_instant(last.sent_at), last.cm_id) if last is not None else None
    return CmPage(rows, cursor, int(conn.scalar(count_query(flt, now)) or 0))


@dataclass(slots=True)
class Overview:
    """The overview's figures; instants UTC, durations in seconds."""

    window_start: datetime
    window_end: datetime
    bucket_s: float
    #: Per bar: CMs sent in it by state (pending, satisfied, violated).
    chart: list[dict[str, int]] = field(default_factory=list)
    pending: int = 0
    overdue: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    latency: dict[str, float | None] = field(default_factory=dict)
    outbox_pending: int | None = None
    outbox_parked: int | None = None
    anomalies: dict[str, int] = field(default_factory=dict)
    recent_anomalies: list[dict[str, Any]] = field(default_factory=list)
    contradicted: list[dict[str, Any]] = field(default_factory=list)


def overview(
    conn: sa.Connection, now: datetime, window: timedelta, outbox_table: sa.Table | None
) -> Overview:
    """The overview of the CMs sent in the last ``window`` and of the store's queues."""
    c = cms.c
    start = now - window
    view = Overview(window_start=start, window_end=now, bucket_s=window.total_seconds() / BUCKETS)
    # Pending CMs are read through the sweeps' partial index (it holds every pending row).
    view.pending = (
        conn.scalar(sa.select(sa.func.count()).where(c.state == CmState.PENDING.value)) or 0
    )
    view.overdue = conn.scalar(sa.select(sa.func.count()).where(overdue(now))) or 0
    step = window / BUCKETS
    for index in range(BUCKETS):
        low, high = start + step * index, start + step * (index + 1)
        counts = {s.value: 0 for s in CmState}
        for state, count in conn.execute(
            sa.select(c.state, sa.func.count())
            .where(c.sent_at >= low, c.sent_at < high)
            .group_by(c.state)
        ):
            counts[state] = count
        view.chart.append(counts)
    for state in CmState:
        view.by_state[state.value] = sum(bar[state.value] for bar in view.chart)
    view.latency = _latency(conn, start)
    if outbox_table is not None:
        view.outbox_pending, view.outbox_parked = _outbox_counts(conn, outbox_table)
    view.anomalies = {
        str(kind): int(n)
        for kind, n in conn.execute(
            sa.select(anomalies.c.kind, sa.func.count())
            .where(anomalies.c.recorded_at >= start)
            .group_by(anomalies.c.kind)
            .order_by(anomalies.c.kind)
        )
    }
    view.recent_anomalies = recent_anomalies(conn, 10)
    view.contradicted = contradicted(conn, 20)
    return view


def _latency(conn: sa.Connection, since: datetime) -> dict[str, float | None]:
    """p50/p99 of sent-to-decided and of effective-to-decided (the ack grace plus the
    evaluator's lag) over the latest decided CMs sent since ``since``, in seconds."""
    c = cms.c
    rows = conn.execute(
        sa.select(c.sent_at, c.effective_at, c.decided_at)
        .where(c.sent_at >= since, c.state != CmState.PENDING.value)
        .order_by(c.sent_at.desc())
        .limit(LATENCY_SAMPLE)
    ).all()
    to_decide = [
        (stored_instant(r.decided_at) - stored_instant(r.sent_at)).total_seconds() for r in rows
    ]
    lag = [
        (stored_instant(r.decided_at) - stored_instant(r.effective_at)).total_seconds()
        for r in rows
    ]
    return {
        "decide_p50": _pct(to_decide, 50),
        "decide_p99": _pct(to_decide, 99),
        "lag_p50": _pct(lag, 50),
        "lag_p99": _pct(lag, 99),
        "sample": float(len(rows)),
    }


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * p / 100))]


def _outbox_counts(conn: sa.Connection, table: sa.Table) -> tuple[int, int]:
    from outbox.table import FAILED, PENDING

    counts: dict[str, int] = dict(
        conn.execute(
            sa.select(table.c.state, sa.func.count())
            .where(table.c.state.in_([PENDING, FAILED]))
            .group_by(table.c.state)
        ).all()
    )
    return int(counts.get(PENDING, 0)), int(counts.get(FAILED, 0))


def recent_anomalies(conn: sa.Connection, limit: int) -> list[dict[str, Any]]:
    a = anomalies.c
    return [
        {**row._asdict(), "recorded_at": stored_instant(row.recorded_at)}
        for row in conn.execute(
            sa.select(a.kind, a.cm_id, a.destination, a.recipient, a.detail, a.recorded_at)
            .order_by(a.recorded_at.desc())
            .limit(limit)
        )
    ]


def contradicted(conn: sa.Connection, limit: int) -> list[dict[str, Any]]:
    """Decided CMs that a late ack would have given another verdict (the evaluator marks
    such an ack ``changes_verdict``): the ack grace was too short for them."""
    k = acks.c
    query = (
        sa.select(
            k.cm_id,
            sa.func.count().label("acks"),
            sa.func.max(k.received_at).label("last"),
            cms.c.state,
        )
        .join(cms, cms.c.cm_id == k.cm_id)
        .where(k.status == AckStatus.CHANGES_VERDICT.value)
        .group_by(k.cm_id, cms.c.state)
        .order_by(sa.func.max(k.received_at).desc())
        .limit(limit)
    )
    return [{**r._asdict(), "last": stored_instant(r.last)} for r in conn.execute(query)]
