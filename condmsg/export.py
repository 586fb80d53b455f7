"""``condmsg export``: a sender store (SQLite or PostgreSQL) to the audit's Parquet layout.

No Spark: SQLAlchemy streams each table in batches and pyarrow writes one Parquet file per
table (``OUT/<table>/part-00000.parquet``) with the Arrow schema derived from
:mod:`condmsg.archive_layout`, plus ``OUT/_manifest.json``. The rows are the same cut as the
audit's window (:func:`spark_audit.readers.apply_window`): CMs sent in ``[since, until)``,
decisions and releases taken by ``until``, acks received by ``until`` (orphans included),
anomalies recorded in the window. An audit of the export defaults to the export's
``until``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from condmsg import sender_tables as st
from condmsg.archive_layout import (
    ACKS,
    ANOMALIES,
    CMS,
    COMPENSATIONS,
    COPIES,
    Table,
    arrow_schema,
    write_manifest,
)
from condmsg.errors import StoreError
from condmsg.timeutil import utcnow

BATCH_ROWS = 50_000


@dataclass(frozen=True, slots=True)
class ExportResult:
    directory: Path
    rows: dict[str, int]
    since: datetime | None
    until: datetime


def _utc(value: Any) -> Any:
    # SQLite hands back naive datetimes; the store only ever writes UTC instants.
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def _selects(since: datetime | None, until: datetime) -> dict[str, sa.Select[Any]]:
    cm = st.cms.c
    in_window = cm.sent_at < until
    if since is not None:
        in_window = sa.and_(in_window, cm.sent_at >= since)
    late = sa.or_(cm.decided_at.is_(None), cm.decided_at > until)

    def decision(column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        return sa.case((late, sa.null()), else_=column).label(column.key)

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
        *(decision(c) for c in (cm.decided_at, cm.effective_at, cm.reasons_json)),
        *(decision(c) for c in (cm.facts_json, cm.decided_by)),
    ).where(in_window)
    window_ids = sa.select(cm.cm_id).where(in_window)
    copies = sa.select(st.copies).where(st.copies.c.cm_id.in_(window_ids))
    comp = st.compensations.c
    compensations = sa.select(
        comp.cm_id,
        comp.destination,
        sa.func.length(comp.body).label("body_bytes"),
        comp.content_type,
        comp.system_generated,
        sa.case((comp.released_at <= until, comp.released_at), else_=sa.null()).label(
            "released_at"
        ),
    ).where(comp.cm_id.in_(window_ids))
    ack = st.acks.c
    orphan = ~sa.exists().where(cm.cm_id == ack.cm_id)
    if since is not None:
        orphan = sa.and_(orphan, ack.received_at >= since)
    acks = sa.select(st.acks).where(
        ack.received_at <= until, sa.or_(ack.cm_id.in_(window_ids), orphan)
    )
    recorded = st.anomalies.c.recorded_at <= until
    if since is not None:
        recorded = sa.and_(recorded, st.anomalies.c.recorded_at >= since)
    anomalies = sa.select(st.anomalies).where(recorded)
    return {
        CMS.name: cms,
        COPIES.name: copies,
        COMPENSATIONS.name: compensations,
        ACKS.name: acks,
        ANOMALIES.name: anomalies,
    }


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
    """Write the store at ``db_url`` to ``out`` in the audit's Parquet layout."""
    until = until or utcnow()
    directory = Path(out)
    say = progress or (lambda _message: None)
    engine = sa.create_engine(db_url)
    counts: dict[str, int] = {}
    selects = _selects(since, until)
    try:
        with engine.connect() as conn:
            for table in (CMS, COPIES, ACKS, COMPENSATIONS, ANOMALIES):
                target = directory / table.name
                target.mkdir(parents=True, exist_ok=True)
                result = conn.execution_options(yield_per=BATCH_ROWS).execute(selects[table.name])
                written = 0
                with pq.ParquetWriter(target / "part-00000.parquet", arrow_schema(table)) as w:
                    for batch in arrow_batches(result.partitions(), table):
                        w.write_batch(batch)
                        written += batch.num_rows
                counts[table.name] = written
                say(f"exported {table.name}: {written} rows")
    except sa.exc.SQLAlchemyError as exc:
        safe = sa.engine.make_url(db_url).render_as_string(hide_password=True)
        cause = getattr(exc, "orig", None) or exc
        raise StoreError(f"cannot export from {safe}: {type(exc).__name__}: {cause}") from None
    finally:
        engine.dispose()
    write_manifest(directory, source=db_url, since=since, until=until, rows=counts)
    return ExportResult(directory, counts, since, until)
