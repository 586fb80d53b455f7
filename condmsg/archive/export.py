"""``condmsg export``: a sender store (SQLite or PostgreSQL) to the audit's Parquet layout.

No Spark: SQLAlchemy streams each table in batches and pyarrow writes them partitioned by
day (:data:`condmsg.archive.layout.PARTITION_COLUMNS`: ``OUT/cms/sent_day=2026-11-25/``,
``OUT/acks/received_day=.../`` and so on) with the Arrow schema derived from
:mod:`condmsg.archive.layout`, plus ``OUT/_manifest.json`` (the cut, the days each table
holds, the exports that wrote them). An audit of a window reads only the days it needs
(:func:`spark_audit.readers.read_parquet`).

The rows are the same cut as the audit's window
(:func:`spark_audit.readers.apply_window`): CMs sent in ``[since, until)``, decisions and
releases taken by ``until``, acks received by ``until`` (orphans included), anomalies
recorded in the window, spheres begun in ``[since, until)`` with the commits, aborts and
decisions taken by ``until``, where ``since`` is midnight UTC of the given ``--since``: the
export writes whole days. With ``--since`` on an existing export it appends: the days from
``since`` on are written again, the earlier ones kept as they are. An audit of the export
defaults to the export's ``until``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from condmsg import tables as st
from condmsg.archive.files import ExportTarget, merged_days, previous_first
from condmsg.archive.layout import (
    ACKS,
    ALL_TABLES,
    ANOMALIES,
    CMS,
    COMPENSATIONS,
    COPIES,
    PARTITION_COLUMNS,
    SPHERES,
    Table,
    arrow_schema,
    manifest,
)
from condmsg.core.errors import StoreError
from condmsg.core.timeutil import stored_instant, utcnow
from condmsg.runtime.db import describe_db_url

BATCH_ROWS = 50_000
#: The label of the instant naming a row's day partition, after the table's columns.
_AT = "_partition_at"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    """What one export wrote: ``rows`` per table (this export's days only), the days it
    (re)wrote from ``since`` (midnight UTC) to ``until``."""

    directory: str
    rows: dict[str, int]
    since: datetime | None
    until: datetime


def day_start(instant: datetime) -> datetime:
    """Midnight (UTC) of ``instant``'s day: the export writes whole days."""
    utc: datetime = _utc(instant)
    return utc.replace(hour=0, minute=0, second=0, microsecond=0)


def _utc(value: Any) -> Any:
    return stored_instant(value) if isinstance(value, datetime) else value


def _selects(
    start: datetime | None, first: datetime | None, until: datetime
) -> dict[str, sa.Select[Any]]:
    """Each table's rows from ``start`` (None: from the beginning) to ``until``, every row
    followed by the instant that names its day partition (:data:`_AT`). ``first``: the
    export's first day (an earlier export's, when this one appends): an ack is kept when
    its CM is in the export, or when there is no such CM at all (an orphan); an ack of a CM
    sent before ``first`` would read as an orphan, so it is left out."""
    cm = st.cms.c

    def sent_from(lower: datetime | None) -> sa.ColumnElement[bool]:
        inside = cm.sent_at < until
        return sa.and_(inside, cm.sent_at >= lower) if lower is not None else inside

    in_window = sent_from(start)
    late = sa.or_(cm.decided_at.is_(None), cm.decided_at > until)

    cms = sa.select(
        cm.cm_id,
        cm.sender,
        cm.sent_at,
        cm.condition_json,
        cm.evaluation_deadline,
        cm.content_type,
        cm.payload_size,
        cm.notify_success,
        cm.sphere_id,
        sa.case((late, sa.literal("pending")), else_=cm.state).label("state"),
        cm.next_check_at,
        *(_unless(late, c) for c in (cm.decided_at, cm.effective_at, cm.reasons_json)),
        *(_unless(late, c) for c in (cm.facts_json, cm.decided_by)),
        cm.sent_at.label(_AT),
    ).where(in_window)
    copies = (
        sa.select(st.copies, cm.sent_at.label(_AT))
        .join_from(st.copies, st.cms, st.copies.c.cm_id == cm.cm_id)
        .where(in_window)
    )
    comp = st.compensations.c
    compensations = (
        sa.select(
            comp.cm_id,
            comp.destination,
            sa.func.length(comp.body).label("body_bytes"),
            comp.content_type,
            comp.system_generated,
            sa.case((comp.released_at <= until, comp.released_at), else_=sa.null()).label(
                "released_at"
            ),
            cm.sent_at.label(_AT),
        )
        .join_from(st.compensations, st.cms, comp.cm_id == cm.cm_id)
        .where(in_window)
    )
    ack = st.acks.c
    exported = sa.select(cm.cm_id).where(sent_from(first))
    orphan = ~sa.exists().where(cm.cm_id == ack.cm_id)
    received = ack.received_at <= until
    if start is not None:
        received = sa.and_(received, ack.received_at >= start)
    archived = [c for c in st.acks.c if c.name in ACKS.column_names]
    acks = sa.select(*archived, ack.received_at.label(_AT)).where(
        received, sa.or_(ack.cm_id.in_(exported), orphan)
    )
    recorded = st.anomalies.c.recorded_at <= until
    if start is not None:
        recorded = sa.and_(recorded, st.anomalies.c.recorded_at >= start)
    anomalies = sa.select(st.anomalies, st.anomalies.c.recorded_at.label(_AT)).where(recorded)
    return {
        CMS.name: cms,
        COPIES.name: copies,
        COMPENSATIONS.name: compensations,
        ACKS.name: acks,
        ANOMALIES.name: anomalies,
        SPHERES.name: _spheres(start, until),
    }


def _unless(hidden: sa.ColumnElement[bool], column: sa.ColumnElement[Any]) -> Any:
    """``column`` under its own name, null where ``hidden`` (a fact not visible yet)."""
    return sa.case((hidden, sa.null()), else_=column).label(column.key)


def _spheres(start: datetime | None, until: datetime) -> sa.Select[Any]:
    """The spheres begun in ``[start, until)`` as they stood at ``until`` (the rules of
    :func:`spark_audit.readers.cut_spheres`): a sphere decided later is in the state its
    sender's last request by ``until`` left it (``open``, ``committed`` or ``aborted``),
    without the decision, and a commit or an abort requested later is not visible yet."""
    sp = st.spheres.c
    begun = sp.begun_at < until
    if start is not None:
        begun = sa.and_(begun, sp.begun_at >= start)
    late = sa.or_(sp.decided_at.is_(None), sp.decided_at > until)
    # A decided sphere keeps the request its decision followed, whatever the sender's
    # clock wrote beside the evaluator's.
    commit_later = sa.and_(late, sp.committed_at > until)
    abort_later = sa.and_(late, sp.aborted_at > until)

    state = sa.case(
        (sa.and_(late, sp.aborted_at <= until), sa.literal("aborted")),
        (sa.and_(late, sp.committed_at <= until), sa.literal("committed")),
        (late, sa.literal("open")),
        else_=sp.state,
    )
    spheres = sa.select(
        sp.sphere_id,
        sp.sender,
        sp.begun_at,
        sp.deadline,
        sp.members,
        state.label("state"),
        _unless(commit_later, sp.committed_at),
        _unless(abort_later, sp.aborted_at),
        _unless(abort_later, sp.abort_reason),
        sp.next_check_at,
        *(_unless(late, c) for c in (sp.decided_at, sp.effective_at, sp.reasons_json)),
        *(_unless(late, c) for c in (sp.decided_by, sp.member_verdicts_json)),
        sp.begun_at.label(_AT),
    ).where(begun)
    return spheres


def arrow_batches(
    rows: Iterator[Sequence[Sequence[Any]]], table: Table
) -> Iterator[pa.RecordBatch]:
    """Chunks of rows (tuples in ``table``'s column order) as Arrow record batches of its
    archive schema, every instant as UTC (``condmsg export`` and the evaluator's
    retention archives write the same files)."""
    schema = arrow_schema(table)
    for chunk in rows:
        columns = list(zip(*chunk, strict=True)) if chunk else [() for _ in table.columns]
        arrays = [
            pa.array([_utc(v) for v in values], type=field.type)
            for values, field in zip(columns, schema, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def export_store(
    db_url: str,
    out: str | Path,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExportResult:
    """Write the store at ``db_url`` to ``out`` (a path or a URI pyarrow's filesystems
    know: ``file://``, ``s3://``, ...) in the audit's day-partitioned layout.

    Without ``since``: every day, replacing what ``out`` held. With ``since``: the days
    from midnight UTC of ``since`` on are (re)written and the earlier days an earlier
    export wrote are kept (``since`` may not be after that export's ``until``: the days
    between would be missing).
    """
    until = _utc(until or utcnow())
    start = day_start(since) if since is not None else None
    target = ExportTarget.at(out)
    previous = target.manifest() if start is not None else None
    first = start
    if previous is not None and start is not None:
        first = previous_first(previous, start, until, str(out))
    say = progress or (lambda _message: None)
    engine = sa.create_engine(db_url)
    counts: dict[str, dict[str, int]] = {}
    selects = _selects(start, first, until)
    try:
        with engine.connect() as conn:
            for table in ALL_TABLES:
                target.clear(table, start)
                result = conn.execution_options(yield_per=BATCH_ROWS).execute(selects[table.name])
                counts[table.name] = target.write(table, _by_day(result.partitions(), table))
                say(f"exported {table.name}: {sum(counts[table.name].values())} rows")
    except sa.exc.SQLAlchemyError as exc:
        safe = describe_db_url(db_url)
        cause = getattr(exc, "orig", None) or exc
        raise StoreError(f"cannot export from {safe}: {type(exc).__name__}: {cause}") from None
    finally:
        engine.dispose()
    days = merged_days(previous, counts, start)
    target.write_manifest(
        manifest(
            source=db_url,
            since=first,
            until=until,
            rows={name: sum(by_day.values()) for name, by_day in days.items()},
            extra={
                "partitioning": PARTITION_COLUMNS,
                "days": days,
                "exports": [
                    *(previous or {}).get("exports", []),
                    {"since": start.isoformat() if start else None, "until": until.isoformat()},
                ],
            },
        )
    )
    rows = {name: sum(by_day.values()) for name, by_day in counts.items()}
    return ExportResult(directory=str(out), rows=rows, since=start, until=until)


def _by_day(
    chunks: Iterator[Sequence[Sequence[Any]]], table: Table
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of ``chunks`` (``table``'s columns, then the instant naming the row's day)
    as record batches of one day each, with that day (``YYYY-MM-DD``, UTC)."""
    for chunk in chunks:
        days: dict[str, list[Sequence[Any]]] = {}
        for row in chunk:
            days.setdefault(_utc(row[-1]).date().isoformat(), []).append(row[:-1])
        for day, rows in days.items():
            for batch in arrow_batches(iter([rows]), table):
                yield day, batch
