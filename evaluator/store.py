"""The evaluator's queries over the sender store (``condmsg.sender_tables``).

Every function takes the caller's session and never commits: the service stores a batch of
acks, decides, and writes the outcome actions to the outbox in one transaction.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from condmsg import sender_tables as t
from condmsg.acks import Ack, AckKind
from condmsg.condition_codec import condition_from_json
from condmsg.conditions import Condition
from outbox import pg


@lru_cache(maxsize=4096)
def parse_condition(document: str) -> Condition:
    """Conditions repeat across CMs of one shape; decoding each once is enough."""
    return condition_from_json(document)


class CmRow(NamedTuple):
    """What the evaluator needs of a CM row (a tuple: thousands are built per second)."""

    cm_id: str
    sender: str
    sent_at: datetime
    condition: Condition
    state: str
    notify_success: bool
    effective_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> CmRow:
        return cls(
            cm_id=row.cm_id,
            sender=row.sender,
            sent_at=_utc(row.sent_at),
            condition=parse_condition(row.condition_json),
            state=row.state,
            notify_success=row.notify_success,
            effective_at=_utc(row.effective_at) if row.effective_at is not None else None,
        )


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes, psycopg the session's time zone; everything
    # condmsg stores is UTC (and the evaluation is quickest on datetime.UTC itself).
    return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)


_CM_COLUMNS = "cm_id, sender, sent_at, condition_json, state, notify_success, effective_at"


def load_cms(session: Session, cm_ids: Iterable[str], *, lock: bool = False) -> dict[str, CmRow]:
    """The CM rows for ``cm_ids``. With ``lock`` (PostgreSQL), rows are locked ``FOR UPDATE``
    in id order (Python's sort, the same in every instance), so that two instances deciding
    overlapping batches queue behind each other
    instead of deadlocking."""
    ids = sorted(set(cm_ids))
    if not ids:
        return {}
    raw = pg.driver_connection(session)
    if raw is not None:
        # One parameter for all the ids: the statement text stays the same whatever the
        # batch, so psycopg parses it once.
        sql = _lookup_sql(t.cms.name, _CM_COLUMNS, lock=lock)
        return {
            cm_id: CmRow(
                cm_id,
                sender,
                _utc(sent_at),
                parse_condition(condition),
                state,
                notify_success,
                _utc(effective_at) if effective_at is not None else None,
            )
            for cm_id, sender, sent_at, condition, state, notify_success, effective_at in (
                pg.execute(raw, sql, {"ids": _json_ids(ids)})
            )
        }
    query = sa.select(t.cms).where(t.cms.c.cm_id.in_(ids)).order_by(t.cms.c.cm_id)
    if lock and session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    return {row.cm_id: CmRow.of(row) for row in session.execute(query)}


@lru_cache(maxsize=16)
def _lookup_sql(table: str, columns: str, where: str = "", *, lock: bool = False) -> str:
    """``columns`` of the rows of ``table`` whose ``cm_id`` is in ``ids`` (a JSON array of
    strings, see :func:`_json_ids`), looked up id by id through the index on ``cm_id`` (a
    nested loop over the array), in the array's order; with ``lock``, each row is locked
    ``FOR UPDATE`` as it is found.

    Written so that the plan cannot be a scan of the table: with ``cm_id = ANY(ids)`` and
    statistics that lag behind the table (a store that has just grown), PostgreSQL scans
    every row of it, and for the CM table's conditional update it hashed every pending
    CM, per batch. A sub-select that locks, or has ``OFFSET 0``, is not merged into the
    outer query: it runs once per id, on the index."""
    tail = " FOR UPDATE" if lock else " OFFSET 0"
    return (
        f"SELECT r.* FROM json_array_elements_text(CAST(%(ids)s AS json)) AS i(id) "
        "CROSS JOIN LATERAL "
        f"(SELECT {columns} FROM {table} WHERE cm_id = i.id{where}{tail}) AS r"
    )


def _json_ids(ids: list[str]) -> str:
    """The ids as one JSON array: the json module encodes a batch's ids in C in a few
    microseconds, while a binary ``text[]`` parameter costs psycopg a Python call per
    element (about 150 µs of client CPU per 500 ids). (A NUL, which no PostgreSQL text
    holds, never gets here: ack documents with one are dead-lettered.)"""
    return json.dumps(ids)


def _select_by_cm(
    session: Session,
    table: sa.Table,
    columns: Sequence[str],
    ids: list[str],
    *,
    status: str | None = None,
) -> Iterable[Any]:
    """``columns`` of the rows of ``table`` whose ``cm_id`` is among ``ids`` (and whose
    ``status`` is ``status``, if given), as tuples. On PostgreSQL the ids are one array
    parameter: the statement text stays the same whatever the batch."""
    raw = pg.driver_connection(session)
    if raw is not None:
        where = f" AND status = '{status}'" if status is not None else ""
        sql = _lookup_sql(table.name, ", ".join(columns), where)
        return pg.execute(raw, sql, {"ids": _json_ids(ids)})
    c = table.c
    query = sa.select(*(c[name] for name in columns)).where(c.cm_id.in_(ids))
    if status is not None:
        query = query.where(c.status == status)
    return session.execute(query)


class CopyRow(NamedTuple):
    """What the evaluator needs of a copy: who may ack it, and where notices go."""

    destination: str
    recipient: str | None
    exchange: str
    routing_key: str


def copies_of(session: Session, cm_ids: Iterable[str]) -> dict[str, dict[str, CopyRow]]:
    """Per CM, its copies by destination name."""
    ids = list(set(cm_ids))
    found: dict[str, dict[str, CopyRow]] = defaultdict(dict)
    if not ids:
        return found
    rows = _select_by_cm(
        session, t.copies, ("cm_id", "destination", "recipient", "exchange", "routing_key"), ids
    )
    for cm_id, destination, recipient, exchange, routing_key in rows:
        found[cm_id][destination] = CopyRow(destination, recipient, exchange, routing_key)
    return found


_ACK_COLUMNS = {
    "ack_id": "text",
    "cm_id": "text",
    "destination": "text",
    "recipient": "text",
    "receiver": "text",
    "kind": "text",
    "read_at": "timestamptz",
    "committed_at": "timestamptz",
    "received_at": "timestamptz",
    "status": "text",
}
#: Columns that always differ between the acks of a batch (never worth checking).
_ACK_VARYING = frozenset({"ack_id", "cm_id", "read_at"})


def _split_shared(
    columns: Mapping[str, str], rows: Sequence[Mapping[str, Any]], varying: frozenset[str]
) -> tuple[frozenset[str], dict[str, Any]]:
    """Column-wise parameters for ``rows``: one array per column, except one plain
    parameter for a column whose value every row shares (the arrival instant, the ack
    kind, the receiver, a destination...). Dumping an array element by element is most
    of the client's cost of a batch statement."""
    shared: set[str] = set()
    params: dict[str, Any] = {}
    for column in columns:
        values = [row[column] for row in rows]
        first = values[0]
        if column not in varying and values.count(first) == len(values):
            shared.add(column)
            params[column] = first
        else:
            params[column] = values
    return frozenset(shared), params


@lru_cache(maxsize=256)
def _insert_acks_sql(shared: frozenset[str]) -> str:
    arrays = {c: type_ for c, type_ in _ACK_COLUMNS.items() if c not in shared}
    constants = {c: f"CAST(%({c})s AS {_ACK_COLUMNS[c]})" for c in _ACK_COLUMNS if c in shared}
    return pg.unnest_insert(
        t.acks.name,
        arrays,
        constants=constants,
        suffix="ON CONFLICT (ack_id) DO NOTHING RETURNING ack_id",
    )


def insert_acks(session: Session, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Store acks idempotently; returns the ack ids this call inserted (the rest were
    already stored: duplicates)."""
    if not rows:
        return set()
    raw = pg.driver_connection(session)
    if raw is not None:
        # One array per column: a short statement whatever the batch size (a multi-row
        # VALUES of a whole batch costs more to build and parse than to execute).
        shared, params = _split_shared(_ACK_COLUMNS, rows, _ACK_VARYING)
        return {ack_id for (ack_id,) in pg.execute(raw, _insert_acks_sql(shared), params)}
    insert = (
        sqlite.insert(t.acks)
        .values(list(rows))
        .on_conflict_do_nothing(index_elements=[t.acks.c.ack_id])
        .returning(t.acks.c.ack_id)
    )
    return {r.ack_id for r in session.execute(insert)}


def counted_acks(session: Session, cm_ids: Iterable[str]) -> dict[str, list[Ack]]:
    """The acks that count for each CM (stored before its decision)."""
    ids = list(set(cm_ids))
    found: dict[str, list[Ack]] = defaultdict(list)
    if not ids:
        return found
    rows = _select_by_cm(
        session,
        t.acks,
        ("cm_id", "destination", "kind", "read_at", "committed_at", "recipient"),
        ids,
        status=t.AckStatus.COUNTED.value,
    )
    for cm_id, destination, kind, read_at, committed_at, recipient in rows:
        found[cm_id].append(_ack(destination, kind, read_at, committed_at, recipient))
    return found


def late_acks(session: Session, cm_ids: Iterable[str]) -> dict[str, list[tuple[Ack, str]]]:
    """The acks stored after each (decided) CM's decision, with their status
    (``after_decision`` or ``changes_verdict``), in the order they were received."""
    ids = list(set(cm_ids))
    found: dict[str, list[tuple[Ack, str]]] = defaultdict(list)
    if not ids:
        return found
    columns = ("cm_id", "destination", "kind", "read_at", "committed_at", "recipient")
    late = (t.AckStatus.AFTER_DECISION.value, t.AckStatus.CHANGES_VERDICT.value)
    c = t.acks.c
    query = (
        sa.select(*(c[name] for name in columns), c.status)
        .where(c.cm_id.in_(ids), c.status.in_(late))
        .order_by(c.received_at, c.ack_id)
    )
    for row in session.execute(query):
        found[row.cm_id].append(
            (
                _ack(row.destination, row.kind, row.read_at, row.committed_at, row.recipient),
                row.status,
            )
        )
    return found


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
        read_at=_utc(read_at),
        committed_at=_utc(committed_at) if committed_at else None,
        recipient=recipient,
    )


def decide_many(
    session: Session,
    rows: Sequence[Mapping[str, Any]],
    *,
    instance: str,
    decided_at: datetime,
) -> set[str]:
    """Record verdicts exactly once: one conditional UPDATE per row (``WHERE state =
    'pending'``); returns the CM ids whose verdict this call wrote.

    Each row has ``cm_id``, ``state``, ``effective_at`` (each CM's: clamped to its
    ``sent_at``), ``reasons_json`` and ``facts_json``; the decision instant and
    ``instance`` (``decided_by``) are the call's. Of two evaluator instances racing on
    one CM, the second matches no row and loses cleanly (it rolls nothing back; its
    outcome actions are simply not written). The winners are the rows now carrying this
    call's ``decided_by`` and ``decided_at``.
    """
    if not rows:
        return set()
    raw = pg.driver_connection(session)
    if raw is not None:
        # One UPDATE ... FROM unnest(...) RETURNING; what every row shares is one parameter.
        shared, params = _split_shared(_DECISION_TYPES, rows, _DECISION_VARYING)
        params |= {"decided_at": decided_at, "by": instance}
        return {cm_id for (cm_id,) in pg.execute(raw, _decide_sql(shared), params)}
    stmt = (
        sa.update(t.cms)
        .where(t.cms.c.cm_id == sa.bindparam("b_cm_id"))
        .where(t.cms.c.state == t.CmState.PENDING.value)
        .values(
            {c: sa.bindparam(f"b_{c}") for c in _DECISION_ARRAYS if c != "cm_id"}
            | {"next_check_at": None, "decided_at": decided_at, "decided_by": instance}
        )
    )
    session.connection().execute(
        stmt, [{f"b_{c}": row[c] for c in _DECISION_ARRAYS} for row in rows]
    )
    ids = [row["cm_id"] for row in rows]
    query = sa.select(t.cms.c.cm_id).where(
        t.cms.c.cm_id.in_(ids),
        t.cms.c.decided_by == instance,
        t.cms.c.decided_at == decided_at,
    )
    return {row.cm_id for row in session.execute(query)}


#: What may vary between the decisions of one call (see ``decisions.judge``).
_DECISION_ARRAYS = ("cm_id", "state", "effective_at", "reasons_json", "facts_json")
_DECISION_TYPES = dict.fromkeys(_DECISION_ARRAYS, "text") | {"effective_at": "timestamptz"}
_DECISION_VARYING = frozenset({"cm_id", "reasons_json", "facts_json"})


@lru_cache(maxsize=16)
def _decide_sql(shared: frozenset[str]) -> str:
    arrays = [c for c in _DECISION_ARRAYS if c not in shared]
    types = _DECISION_TYPES
    value = {
        c: f"CAST(%({c})s AS {types[c]})" if c in shared else f"d.{c}" for c in _DECISION_ARRAYS
    }
    return (
        f"UPDATE {t.cms.name} AS cm SET state = {value['state']}, next_check_at = NULL, "
        f"decided_at = %(decided_at)s, effective_at = {value['effective_at']}, "
        f"reasons_json = {value['reasons_json']}, facts_json = {value['facts_json']}, "
        "decided_by = %(by)s "
        f"FROM unnest({', '.join(f'CAST(%({c})b AS {types[c]}[])' for c in arrays)}) "
        f"AS d({', '.join(arrays)}) "
        f"WHERE cm.cm_id = d.cm_id AND cm.state = '{t.CmState.PENDING.value}' "
        "RETURNING cm.cm_id"
    )


def set_next_checks(session: Session, rows: Sequence[tuple[str, datetime | None]]) -> None:
    """Reschedule pending CMs (one statement on PostgreSQL, else one executemany)."""
    if not rows:
        return
    raw = pg.driver_connection(session)
    if raw is not None:
        pg.execute(
            raw,
            f"UPDATE {t.cms.name} AS cm SET next_check_at = d.at "
            "FROM unnest(CAST(%(ids)b AS text[]), CAST(%(ats)b AS timestamptz[])) AS d(cm_id, at) "
            f"WHERE cm.cm_id = d.cm_id AND cm.state = '{t.CmState.PENDING.value}'",
            {"ids": [cm_id for cm_id, _ in rows], "ats": [at for _, at in rows]},
        )
        return
    stmt = (
        sa.update(t.cms)
        .where(t.cms.c.cm_id == sa.bindparam("b_cm_id"))
        .where(t.cms.c.state == t.CmState.PENDING.value)
        .values(next_check_at=sa.bindparam("b_at"))
    )
    session.connection().execute(stmt, [{"b_cm_id": c, "b_at": at} for c, at in rows])


def claim_due(session: Session, now: datetime, limit: int) -> list[str]:
    """Pending CMs whose next check is due, served by the partial index on next_check_at.

    ``FOR UPDATE SKIP LOCKED`` (PostgreSQL) lets several instances sweep at once without
    waiting for each other: each takes the due CMs nobody else holds.
    """
    query = (
        sa.select(t.cms.c.cm_id)
        .where(t.cms.c.state == t.CmState.PENDING.value, t.cms.c.next_check_at <= now)
        .order_by(t.cms.c.next_check_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [row.cm_id for row in session.execute(query)]


def record_anomalies(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        session.execute(sa.insert(t.anomalies), list(rows))


def compensations_of(session: Session, cm_ids: Iterable[str]) -> dict[str, list[Any]]:
    """Per CM, its stored compensation rows."""
    ids = list(set(cm_ids))
    found: dict[str, list[Any]] = defaultdict(list)
    if ids:
        query = sa.select(t.compensations).where(t.compensations.c.cm_id.in_(ids))
        for row in session.execute(query):
            found[row.cm_id].append(row)
    return found


def release_compensations(session: Session, cm_ids: Iterable[str], at: datetime) -> None:
    ids = list(set(cm_ids))
    if ids:
        session.execute(
            sa.update(t.compensations)
            .where(t.compensations.c.cm_id.in_(ids))
            .values(released_at=at)
        )
