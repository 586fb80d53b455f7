"""The evaluator's store on PostgreSQL through psycopg 3: one statement per batch.

Each batch operation is a single statement whose text does not depend on the batch (so
psycopg and PostgreSQL parse and plan it once): the ids of a lookup are one JSON array
parameter, the rows of an INSERT or UPDATE one binary array per column (see
:mod:`condmsg.infra.fastpaths.pg`). The operations that have no such form are the portable
adapter's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.infra.backends import psycopg_connection
from condmsg.infra.fastpaths import pg
from evaluator.store import ACK_ROW_KEYS, DECISION_ROW_KEYS, CmRow, Rows, parse_condition, to_utc
from evaluator.store_sqlalchemy import CmLookup, SqlAlchemyDecisionStore

_CM_COLUMNS = (
    "cm_id, sender, sent_at, condition_json, state, notify_success, effective_at, sphere_id"
)
#: PostgreSQL types of the ack columns (the element types of their arrays).
_ACK_TYPES = dict.fromkeys(ACK_ROW_KEYS, "text") | dict.fromkeys(
    ("read_at", "committed_at", "received_at"), "timestamptz"
)
#: Columns that always differ between the acks of a batch (never worth checking).
_ACK_VARYING = frozenset({"ack_id", "cm_id", "read_at"})
_DECISION_TYPES = dict.fromkeys(DECISION_ROW_KEYS, "text") | {"effective_at": "timestamptz"}
_DECISION_VARYING = frozenset({"cm_id", "reasons_json", "facts_json"})
_PENDING = tables.CmState.PENDING.value


class PsycopgDecisionStore(SqlAlchemyDecisionStore):
    """:class:`evaluator.store.DecisionStore` on psycopg 3 (stateless)."""

    def _load(self, session: Session, ids: list[str], *, lock: bool) -> dict[str, CmRow]:
        sql = _lookup_sql(tables.cms.name, _CM_COLUMNS, lock=lock)
        rows = pg.execute(psycopg_connection(session), sql, {"ids": _json_ids(ids)})
        return {
            cm_id: CmRow(
                cm_id,
                sender,
                to_utc(sent_at),
                parse_condition(condition),
                state,
                notify_success,
                to_utc(effective_at) if effective_at is not None else None,
                sphere_id,
            )
            for (
                cm_id,
                sender,
                sent_at,
                condition,
                state,
                notify_success,
                effective_at,
                sphere_id,
            ) in rows
        }

    def _rows_by_cm(self, session: Session, lookup: CmLookup, ids: list[str]) -> Iterable[Any]:
        status = lookup.status
        where = f" AND status = '{status}'" if status is not None else ""
        sql = _lookup_sql(lookup.table.name, ", ".join(lookup.columns), where)
        return pg.execute(psycopg_connection(session), sql, {"ids": _json_ids(ids)})

    def _insert(self, session: Session, rows: Rows) -> set[str]:
        # One array per column: a short statement whatever the batch size (a multi-row
        # VALUES of a whole batch costs more to build and parse than to execute).
        shared, params = _split_shared(_ACK_TYPES, rows, _ACK_VARYING)
        inserted = pg.execute(psycopg_connection(session), _insert_acks_sql(shared), params)
        return {ack_id for (ack_id,) in inserted}

    def _decide(self, session: Session, rows: Rows, instance: str, at: datetime) -> set[str]:
        # One conditional UPDATE ... FROM unnest(...) RETURNING: a racing instance's
        # UPDATE waits for this one's row locks, then finds the rows no longer pending.
        shared, params = _split_shared(_DECISION_TYPES, rows, _DECISION_VARYING)
        params |= {"decided_at": at, "by": instance}
        won = pg.execute(psycopg_connection(session), _decide_sql(shared), params)
        return {cm_id for (cm_id,) in won}

    def _reschedule(self, session: Session, rows: Sequence[tuple[str, datetime | None]]) -> None:
        params = {"ids": [cm_id for cm_id, _ in rows], "ats": [at for _, at in rows]}
        pg.execute(psycopg_connection(session), _RESCHEDULE_SQL, params)


@lru_cache(maxsize=16)
def _lookup_sql(table: str, columns: str, where: str = "", *, lock: bool = False) -> str:
    """``columns`` of the rows of ``table`` whose ``cm_id`` is in ``ids`` (a JSON array of
    strings, see :func:`_json_ids`), looked up id by id through the index on ``cm_id`` (a
    nested loop over the array), in the array's order; with ``lock``, each row is locked
    ``FOR UPDATE`` as it is found.

    Written so that the plan cannot be a scan of the table: with ``cm_id = ANY(ids)`` and
    statistics that lag behind the table (a store that has just grown), PostgreSQL may
    scan every row of it, and for the CM table's conditional update hash every pending
    CM, per batch. A sub-select that locks, or has ``OFFSET 0``, is not merged into the
    outer query: it runs once per id, on the index."""
    tail = " FOR UPDATE" if lock else " OFFSET 0"
    return (
        f"SELECT r.* FROM json_array_elements_text(CAST(%(ids)s AS json)) AS i(id) "
        "CROSS JOIN LATERAL "
        f"(SELECT {columns} FROM {table} WHERE cm_id = i.id{where}{tail}) AS r"
    )


def _json_ids(ids: list[str]) -> str:
    """The ids as one JSON array: the json module encodes a batch's ids in C, while a
    binary ``text[]`` parameter costs psycopg a Python call per element. (A NUL, which no
    PostgreSQL text holds, never gets here: ack documents with one are dead-lettered.)"""
    return json.dumps(ids)


def _split_shared(
    columns: Mapping[str, str], rows: Rows, varying: frozenset[str]
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
    arrays = {c: type_ for c, type_ in _ACK_TYPES.items() if c not in shared}
    constants = {c: f"CAST(%({c})s AS {_ACK_TYPES[c]})" for c in _ACK_TYPES if c in shared}
    return pg.unnest_insert(
        tables.acks.name,
        arrays,
        constants=constants,
        suffix="ON CONFLICT (ack_id) DO NOTHING RETURNING ack_id",
    )


@lru_cache(maxsize=16)
def _decide_sql(shared: frozenset[str]) -> str:
    arrays = [c for c in DECISION_ROW_KEYS if c not in shared]
    types = _DECISION_TYPES
    value = {
        c: f"CAST(%({c})s AS {types[c]})" if c in shared else f"d.{c}" for c in DECISION_ROW_KEYS
    }
    return (
        f"UPDATE {tables.cms.name} AS cm "
        f"SET state = {value['state']}, next_check_at = NULL, "
        f"decided_at = %(decided_at)s, effective_at = {value['effective_at']}, "
        f"reasons_json = {value['reasons_json']}, facts_json = {value['facts_json']}, "
        "decided_by = %(by)s "
        f"FROM unnest({', '.join(f'CAST(%({c})b AS {types[c]}[])' for c in arrays)}) "
        f"AS d({', '.join(arrays)}) "
        f"WHERE cm.cm_id = d.cm_id AND cm.state = '{_PENDING}' "
        "RETURNING cm.cm_id"
    )


_RESCHEDULE_SQL = (
    f"UPDATE {tables.cms.name} AS cm SET next_check_at = d.at "
    "FROM unnest(CAST(%(ids)b AS text[]), CAST(%(ats)b AS timestamptz[])) AS d(cm_id, at) "
    f"WHERE cm.cm_id = d.cm_id AND cm.state = '{_PENDING}'"
)
