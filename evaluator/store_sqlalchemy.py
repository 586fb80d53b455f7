"""The evaluator's store on SQLAlchemy Core: correct on SQLite and on PostgreSQL alike.

Row locks are always asked for: SQLAlchemy renders ``FOR UPDATE`` (``SKIP LOCKED``) where
the database has it and nothing on SQLite, whose one writer at a time (``BEGIN
IMMEDIATE``, see :mod:`condmsg.runtime.db`) already serialises the evaluator's transactions.

The public methods skip empty batches and normalise ids; the SQL of each batch operation
is one private method, which :class:`evaluator.store_psycopg.PsycopgDecisionStore`
replaces with its single-statement form.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core.acks import Ack, AckKind
from evaluator.store import DECISION_ROW_KEYS, CmRow, CompensationRow, CopyRow, Rows, to_utc

_PENDING = tables.CmState.PENDING.value


class CmLookup(NamedTuple):
    """Rows of ``table`` looked up by ``cm_id`` (with ``status``, if given): which
    ``columns`` of them, in this order."""

    table: sa.Table
    columns: tuple[str, ...]
    status: str | None = None


_ACK_COLUMNS = ("cm_id", "destination", "kind", "read_at", "committed_at", "recipient")
_COUNTED_ACKS = CmLookup(tables.acks, _ACK_COLUMNS, tables.AckStatus.COUNTED.value)
_COPIES = CmLookup(tables.copies, ("cm_id", "destination", "recipient", "exchange", "routing_key"))


class SqlAlchemyDecisionStore:
    """:class:`evaluator.store.DecisionStore` in portable SQLAlchemy Core (stateless)."""

    # -- CM rows ----------------------------------------------------------------------------

    def load_cms(
        self, session: Session, cm_ids: Iterable[str], *, lock: bool = False
    ) -> dict[str, CmRow]:
        ids = sorted(set(cm_ids))
        return self._load(session, ids, lock=lock) if ids else {}

    def _load(self, session: Session, ids: list[str], *, lock: bool) -> dict[str, CmRow]:
        query = (
            sa.select(tables.cms).where(tables.cms.c.cm_id.in_(ids)).order_by(tables.cms.c.cm_id)
        )
        if lock:
            query = query.with_for_update()
        return {row.cm_id: CmRow.of(row) for row in session.execute(query)}

    def copies_of(self, session: Session, cm_ids: Iterable[str]) -> dict[str, dict[str, CopyRow]]:
        ids = list(set(cm_ids))
        found: dict[str, dict[str, CopyRow]] = defaultdict(dict)
        if not ids:
            return found
        for cm_id, destination, recipient, exchange, routing_key in self._rows_by_cm(
            session, _COPIES, ids
        ):
            found[cm_id][destination] = CopyRow(destination, recipient, exchange, routing_key)
        return found

    def _rows_by_cm(self, session: Session, lookup: CmLookup, ids: list[str]) -> Iterable[Any]:
        """The ``lookup``'s columns of its rows whose ``cm_id`` is among ``ids``, as
        tuples, in no particular order."""
        c = lookup.table.c
        query = sa.select(*(c[name] for name in lookup.columns)).where(c.cm_id.in_(ids))
        if lookup.status is not None:
            query = query.where(c.status == lookup.status)
        return session.execute(query)

    def decide_many(
        self, session: Session, rows: Rows, *, instance: str, decided_at: datetime
    ) -> set[str]:
        if not rows:
            return set()
        return self._decide(session, rows, instance, decided_at)

    def _decide(self, session: Session, rows: Rows, instance: str, at: datetime) -> set[str]:
        # The pending rows are locked first (in id order, as load_cms locks them): a racing
        # instance that decided one of them first has made it not pending, one that comes
        # later waits for this transaction, then finds it decided. The UPDATE below then
        # writes exactly the rows found here.
        cm = tables.cms.c
        pending = (
            sa.select(cm.cm_id)
            .where(cm.cm_id.in_(sorted({row["cm_id"] for row in rows})), cm.state == _PENDING)
            .order_by(cm.cm_id)
            .with_for_update()
        )
        won = set(session.scalars(pending))
        if not won:
            return won
        stmt = (
            sa.update(tables.cms)
            .where(cm.cm_id == sa.bindparam("b_cm_id"), cm.state == _PENDING)
            .values(
                {c: sa.bindparam(f"b_{c}") for c in DECISION_ROW_KEYS if c != "cm_id"}
                | {"next_check_at": None, "decided_at": at, "decided_by": instance}
            )
        )
        params = [{f"b_{c}": row[c] for c in DECISION_ROW_KEYS} for row in rows]
        session.connection().execute(stmt, [p for p in params if p["b_cm_id"] in won])
        return won

    def set_next_checks(
        self, session: Session, rows: Sequence[tuple[str, datetime | None]]
    ) -> None:
        if rows:
            self._reschedule(session, rows)

    def _reschedule(self, session: Session, rows: Sequence[tuple[str, datetime | None]]) -> None:
        stmt = (
            sa.update(tables.cms)
            .where(
                tables.cms.c.cm_id == sa.bindparam("b_cm_id"),
                tables.cms.c.state == _PENDING,
            )
            .values(next_check_at=sa.bindparam("b_at"))
        )
        session.connection().execute(stmt, [{"b_cm_id": c, "b_at": at} for c, at in rows])

    def claim_due(self, session: Session, now: datetime, limit: int) -> list[str]:
        # Served by the partial index on next_check_at (pending CMs only).
        query = (
            sa.select(tables.cms.c.cm_id)
            .where(tables.cms.c.state == _PENDING, tables.cms.c.next_check_at <= now)
            .order_by(tables.cms.c.next_check_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return list(session.scalars(query))

    def next_check(self, session: Session, after: datetime | None = None) -> datetime | None:
        # The first entry of the partial index on next_check_at (pending CMs only): the
        # same index read as a claim that finds nothing due.
        query = sa.select(sa.func.min(tables.cms.c.next_check_at)).where(
            tables.cms.c.state == _PENDING
        )
        if after is not None:
            query = query.where(tables.cms.c.next_check_at > after)
        at = session.scalar(query)
        return to_utc(at) if at is not None else None

    def compensations_of(
        self, session: Session, cm_ids: Iterable[str]
    ) -> dict[str, list[CompensationRow]]:
        ids = list(set(cm_ids))
        found: dict[str, list[CompensationRow]] = defaultdict(list)
        if ids:
            c = tables.compensations.c
            query = sa.select(c.cm_id, c.destination, c.body, c.content_type).where(
                c.cm_id.in_(ids)
            )
            for cm_id, destination, body, content_type in session.execute(query):
                found[cm_id].append(CompensationRow(destination, body, content_type))
        return found

    def release_compensations(self, session: Session, cm_ids: Iterable[str], at: datetime) -> None:
        ids = list(set(cm_ids))
        if ids:
            session.execute(
                sa.update(tables.compensations)
                .where(tables.compensations.c.cm_id.in_(ids))
                .values(released_at=at)
            )

    # -- acks and anomalies ---------------------------------------------------------------

    def insert_acks(self, session: Session, rows: Rows) -> set[str]:
        return self._insert(session, rows) if rows else set()

    def _insert(self, session: Session, rows: Rows) -> set[str]:
        insert = (
            _dialect_insert(session)(tables.acks)
            .values(list(rows))
            .on_conflict_do_nothing(index_elements=[tables.acks.c.ack_id])
            .returning(tables.acks.c.ack_id)
        )
        return set(session.scalars(insert))

    def counted_acks(self, session: Session, cm_ids: Iterable[str]) -> dict[str, list[Ack]]:
        ids = list(set(cm_ids))
        found: dict[str, list[Ack]] = defaultdict(list)
        if not ids:
            return found
        rows = self._rows_by_cm(session, _COUNTED_ACKS, ids)
        for cm_id, destination, kind, read_at, committed_at, recipient in rows:
            found[cm_id].append(_ack(destination, kind, read_at, committed_at, recipient))
        return found

    def late_acks(
        self, session: Session, cm_ids: Iterable[str]
    ) -> dict[str, list[tuple[Ack, str]]]:
        ids = list(set(cm_ids))
        found: dict[str, list[tuple[Ack, str]]] = defaultdict(list)
        if not ids:
            return found
        late = (
            tables.AckStatus.AFTER_DECISION.value,
            tables.AckStatus.CHANGES_VERDICT.value,
        )
        c = tables.acks.c
        query = (
            sa.select(*(c[name] for name in _ACK_COLUMNS), c.status)
            .where(c.cm_id.in_(ids), c.status.in_(late))
            .order_by(c.received_at, c.ack_id)
        )
        for row in session.execute(query):
            ack = _ack(row.destination, row.kind, row.read_at, row.committed_at, row.recipient)
            found[row.cm_id].append((ack, row.status))
        return found

    def record_anomalies(self, session: Session, rows: Rows) -> None:
        if rows:
            session.execute(sa.insert(tables.anomalies), list(rows))


def _dialect_insert(session: Session) -> Any:
    """The ``insert`` that has ``ON CONFLICT`` for the session's database (PostgreSQL's
    or SQLite's: the two databases condmsg stores run on)."""
    dialect = session.get_bind().dialect.name
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def _ack(
    destination: str,
    kind: str,
    read_at: datetime,
    committed_at: datetime | None,
    recipient: str | None,
) -> Ack:
    return Ack(
        destination=destination,
        kind=AckKind(kind),
        read_at=to_utc(read_at),
        committed_at=to_utc(committed_at) if committed_at else None,
        recipient=recipient,
    )
