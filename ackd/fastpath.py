"""Round trips saved on PostgreSQL (psycopg 3) in the transactional read path.

A transactional read costs the application one database transaction. Done naively, the
receiver adds four round trips to it: the transaction's ``BEGIN`` (psycopg sends it on its
own before the first statement), the RLOG insert, the COMMIT ack's insert, and ``COMMIT``
on top of the app's own statements. Two of them ride along here:

- ``BEGIN`` and the RLOG insert travel as one query string (``BEGIN; INSERT ...
  RETURNING``) when the transaction has not begun yet;
- the COMMIT ack's outbox row and ``COMMIT`` travel as one (``INSERT ...; COMMIT``).

So the receiver's two statements add no round trip to the app's transaction: they travel
with the ``BEGIN`` and ``COMMIT`` it needs anyway. Several statements in one string need
PostgreSQL's simple query protocol, which takes no parameters and plans each statement it
is sent. So both statements are prepared once per connection with SQL ``PREPARE`` (only
ever while no transaction is open, ahead of a claim) and sent as ``EXECUTE name(...)``:
the server parses a call instead of planning an INSERT.
The values are written into the calls as literals, rendered here by type: strings
through libpq's own ``PQescapeLiteral`` (never by hand), instants as ISO text, bytes as
hex. If a statement fails, PostgreSQL skips the rest of the string: ``BEGIN; EXECUTE``
leaves a failed transaction that the caller rolls back, and a failed ack skips the
``COMMIT``.

Prepared statements belong to the server session, and psycopg deallocates them all
(``DEALLOCATE ALL``) after any ``ROLLBACK`` it runs, a savepoint's included, or a
``DROP``, ``ALTER`` or ``DISCARD ALL``, once it has prepared statements of its own. The
receiver therefore follows what its connections run through SQLAlchemy (:func:`watch`):
after such a statement, or a rollback, the transaction's ack goes as the plain statement
(``INSERT; COMMIT``), and the next claim prepares again (a ``PREPARE`` of a name still
there fails harmlessly). A claim that finds its statement gone all the same
(``invalid_sql_statement_name``: a ``DEALLOCATE`` sent past SQLAlchemy) rolls back the
``BEGIN`` it sent and sends ``BEGIN; INSERT``; an ack that does fails its transaction,
which the receiver rolls back and requeues like any failed commit (an ack that could
fall back on its own would need a ``SAVEPOINT`` in every commit, which costs the server
more than the fallback is worth). A connection that keeps losing them (a pooler in
transaction mode) gets plain statements from then on.

Why not psycopg's own ways: its pipeline mode saves the same round trips with bound
parameters, but on a local socket it costs more than it saves (more client CPU than plain
statements, and a longer wall time per message); its client-side binding
(``ClientCursor.mogrify``) adapts each value through its adapter registry, which costs
more than the literals rendered here. The figures are in ``bench/RESULTS.md``.

Both statements run on the session's own connection, so they are part of the app's
transaction exactly as portable SQLAlchemy statements would be. The receiver reaches them
through its store's psycopg adapter (:mod:`ackd.receiver_store_psycopg`); the portable
adapter runs the same claim and acks as plain SQLAlchemy statements, on PostgreSQL too.

libpq calls through psycopg (``pgconn.exec_``, ``errors.error_from_result``, the
connection's ``lock``) and the knowledge of when psycopg deallocates are psycopg's
internals, so a receiver takes this path only with the psycopg releases it was tested
with (:data:`TESTED_PSYCOPG`) and the portable adapter with any other: :func:`chosen`,
which ``CONDMSG_RECEIVER_FASTPATH`` can force (see :mod:`condmsg.infra.fastpaths.gate`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import ClientCursor, pq
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus, TransactionStatus

from ackd.tables import rlog
from condmsg.core.errors import CondmsgError
from condmsg.infra.fastpaths.gate import Gate, use_fast
from condmsg.infra.fastpaths.pg import wrapped
from outbox.table import outbox_table

__all__ = ["ack_statement", "chosen", "claim", "execute_and_commit", "watch"]

#: The psycopg releases this path is tested with, from and up to (excluded): by the
#: receiver store's contract suite and ``tests/integration/receiver/test_receiver_fastpath.py``,
#: which also hold psycopg's deallocations to what :func:`watch` expects. Widen it after
#: both pass on a new release (``CONDMSG_RECEIVER_FASTPATH=fast`` runs it there).
TESTED_PSYCOPG = ((3, 3), (3, 4))
#: The receiver's path on psycopg: ``auto`` (the default), ``fast`` or ``plain``.
ENV_FASTPATH = "CONDMSG_RECEIVER_FASTPATH"


def psycopg_gate() -> Gate:
    """Whether the psycopg imported is a release this path was tested with and has the
    libpq-level calls it makes."""
    return Gate.check(
        "psycopg",
        str(getattr(psycopg, "__version__", "unknown")),
        TESTED_PSYCOPG,
        [
            ("pq.PGconn.exec_", pq.PGconn, "exec_"),
            ("pq.Escaping.escape_literal", pq.Escaping, "escape_literal"),
            ("errors.error_from_result", pg_errors, "error_from_result"),
        ],
    )


def chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a receiver on psycopg takes this path (else the portable adapter's plain
    SQLAlchemy statements): as :data:`ENV_FASTPATH` says, by default where psycopg is a
    release it was tested with. Logged once per process."""
    env = os.environ if environ is None else environ
    mode = env.get(ENV_FASTPATH, "auto")
    return use_fast("receiver store on psycopg", mode, psycopg_gate())


_DONE = (ExecStatus.COMMAND_OK, ExecStatus.TUPLES_OK)
_LOST = "26000"  # invalid_sql_statement_name: the prepared statement is not there
_EXISTS = "42P05"  # duplicate_prepared_statement
#: Losses of the prepared statements after which a connection gets plain statements.
MAX_LOSSES = 3


@dataclass(frozen=True, slots=True)
class _Sql:
    """A statement: its text around its parameters (the plain form, values as literals)
    and its prepared form (``$n`` parameters) under a name derived from the text."""

    pieces: tuple[str, ...]
    name: str
    prepared: str

    @classmethod
    def of(cls, pieces: tuple[str, ...]) -> _Sql:
        prepared = "".join(
            piece + (f"${i}" if i < len(pieces) else "") for i, piece in enumerate(pieces, 1)
        )
        digest = hashlib.sha256(prepared.encode()).hexdigest()[:20]
        sql = cls(pieces, f"condmsg_{digest}", prepared)
        _KNOWN.setdefault(sql.name, sql)
        return sql


#: Every statement made so far; a claim prepares them all on its connection.
_KNOWN: dict[str, _Sql] = {}

#: A statement and the values of its parameters.
Statement = tuple[_Sql, Sequence[Any]]


@dataclass(slots=True)
class _Prepared:
    """What one connection has prepared, and how often in a row the server lost it.

    ``doubtful``: a statement ran (through SQLAlchemy) after which psycopg may have
    deallocated everything; until the next claim prepares again, calls are not trusted.
    """

    literal: _Literals
    names: set[str] = field(default_factory=set)
    losses: int = 0
    doubtful: bool = False

    @property
    def usable(self) -> bool:
        return self.losses < MAX_LOSSES

    def lost(self) -> None:
        self.names.clear()
        self.losses += 1


_CONNECTIONS: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Prepared] = (
    weakref.WeakKeyDictionary()
)
_CONNECTIONS_LOCK = threading.Lock()


class _Lost(CondmsgError):
    """A prepared statement was not there (``error``: the server's)."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(str(error))
        self.error = error


def claim(raw: psycopg.Connection[Any], values: Mapping[str, Any]) -> bool:
    """``INSERT ... ON CONFLICT DO NOTHING RETURNING`` into the RLOG, sent with the
    transaction's ``BEGIN`` if none was sent yet; True if this call inserted the row."""
    statement = (_claim_sql(tuple(values)), tuple(values.values()))
    prepared = _prepared(raw)
    literal = prepared.literal
    if raw.info.transaction_status is not TransactionStatus.IDLE:
        return _run(raw, _plain(literal, statement)).ntuples > 0
    if prepared.usable:
        if prepared.doubtful:
            prepared.names.clear()  # PREPARE again what is gone (an existing one is kept)
            prepared.doubtful = False
        _prepare_known(raw, prepared)
        try:
            return _run(raw, f"BEGIN; {_call(literal, statement)}", prepared=prepared).ntuples > 0
        except _Lost:
            _run(raw, "ROLLBACK")
    return _run(raw, f"BEGIN; {_plain(literal, statement)}").ntuples > 0


def execute_and_commit(raw: psycopg.Connection[Any], statements: Sequence[Statement]) -> None:
    """Run ``statements`` and ``COMMIT`` in one round trip.

    If a statement fails, PostgreSQL skips the rest, the ``COMMIT`` included: the
    transaction is left failed and the caller rolls it back. That is also what happens
    if a prepared statement is gone without this module knowing (see the module's
    docstring): the transaction fails, and the next claim prepares again.
    """
    prepared = _prepared(raw)
    literal = prepared.literal
    if not prepared.doubtful and all(sql.name in prepared.names for sql, _ in statements):
        query = "; ".join([*(_call(literal, s) for s in statements), "COMMIT"])
        try:
            _run(raw, query, prepared=prepared)
        except _Lost as lost:
            raise wrapped(query, {}, lost.error) from lost.error
        return
    _run(raw, "; ".join([*(_plain(literal, s) for s in statements), "COMMIT"]))


def watch(engine: sa.Engine) -> None:
    """Follow the statements ``engine``'s connections run through SQLAlchemy: after one
    that makes psycopg deallocate its prepared statements (it runs ``DEALLOCATE ALL``
    after a ``ROLLBACK``, a savepoint's included, or a ``DROP``, ``ALTER``, ``DISCARD
    ALL``, once it has prepared statements of its own) or a rollback, this module's are
    doubtful: the transaction's ack is sent as a plain statement, and the next claim
    prepares them again."""
    if getattr(engine, "_condmsg_watched", False):
        return

    def doubt(conn: sa.Connection) -> None:
        raw = conn.connection.driver_connection
        if isinstance(raw, psycopg.Connection):
            _prepared(raw).doubtful = True

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: sa.Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if _DEALLOCATING(statement):
            doubt(conn)

    @sa.event.listens_for(engine, "rollback")
    def _rollback(conn: sa.Connection) -> None:
        doubt(conn)

    engine._condmsg_watched = True  # type: ignore[attr-defined]


#: What makes psycopg deallocate its prepared statements (its own test, case-insensitive
#: and with leading blanks allowed here), plus a DEALLOCATE of one name.
_DEALLOCATING = re.compile(r"\s*(?:DROP|ALTER|ROLLBACK|DISCARD|DEALLOCATE)\b", re.IGNORECASE).match


def ack_statement(outbox_row: Mapping[str, Any]) -> Statement:
    """The insert of an ack's outbox row (its constant columns written into the text)."""
    values = []
    columns: list[tuple[str, str | None]] = []
    for column, value in outbox_row.items():
        constant = _constant(value) if column in _CONSTANT_COLUMNS else None
        if constant is None:
            values.append(value)
        columns.append((column, constant))
    return _ack_sql(tuple(columns)), values


def _prepared(raw: psycopg.Connection[Any]) -> _Prepared:
    with _CONNECTIONS_LOCK:
        found = _CONNECTIONS.get(raw)
        if found is None:
            found = _CONNECTIONS[raw] = _Prepared(_Literals(raw))
        return found


def _prepare_known(raw: psycopg.Connection[Any], prepared: _Prepared) -> None:
    """``PREPARE`` every known statement ``raw`` lacks (no transaction is open: a failed
    ``PREPARE`` must not fail the app's transaction)."""
    for sql in list(_KNOWN.values()):
        if sql.name in prepared.names:
            continue
        try:
            _run(raw, f"PREPARE {sql.name} AS {sql.prepared}")
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != _EXISTS:
                raise  # the same name is the same text: an existing one will do
        prepared.names.add(sql.name)


def _call(literal: _Literals, statement: Statement) -> str:
    sql, values = statement
    return f"EXECUTE {sql.name}({', '.join([literal(v) for v in values])})"


def _plain(literal: _Literals, statement: Statement) -> str:
    sql, values = statement
    text = [sql.pieces[0]]
    for value, piece in zip(values, sql.pieces[1:], strict=True):
        text += (literal(value), piece)
    return "".join(text)


def _run(
    raw: psycopg.Connection[Any], query: str, *, prepared: _Prepared | None = None
) -> pq.abc.PGresult:
    """Send ``query`` (one or more statements); the last statement's result. Errors are
    raised as SQLAlchemy would raise them. With ``prepared`` (the query calls prepared
    statements), a missing one is recorded there and raised as :class:`_Lost`."""
    encoding = raw.info.encoding
    with raw.lock:
        result = raw.pgconn.exec_(query.encode(encoding))
    if result.status not in _DONE:
        error = pg_errors.error_from_result(result, encoding=encoding)
        if prepared is not None and error.sqlstate == _LOST:
            prepared.lost()
            raise _Lost(error) from error
        raise wrapped(query, {}, error) from error
    if prepared is not None:
        prepared.losses = 0  # they were there: a loss now and then is psycopg's doing
    return result


class _Literals:
    """Values as SQL literals for one connection (its encoding and string settings)."""

    __slots__ = ("_bytes_prefix", "_encoding", "_escape", "_raw")

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        # Weakly: this object is the value of a weak-keyed mapping from ``raw``.
        self._raw = weakref.ref(raw)
        self._encoding = raw.info.encoding
        self._escape: Callable[[bytes], bytes] = pq.Escaping(raw.pgconn).escape_literal
        standard = raw.info.parameter_status("standard_conforming_strings") == "on"
        # In an E'' string the backslash escapes always apply, whatever the setting.
        self._bytes_prefix = "'\\x" if standard else "E'\\\\x"

    def __call__(self, value: Any) -> str:
        if value is None:
            return "NULL"
        if value is True or value is False:
            return "true" if value else "false"
        kind = type(value)
        if kind is str:
            if "\x00" in value:
                raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
            return self._escape(value.encode(self._encoding)).decode(self._encoding)
        if kind is datetime:
            return f"'{value.isoformat()}'"
        if kind is bytes:
            return f"{self._bytes_prefix}{value.hex()}'"
        if kind is int:
            return str(value)
        if kind is dict or kind is list:
            return self(json.dumps(value))
        # Anything else: psycopg's own client-side adaptation.
        raw = self._raw()
        if raw is None:
            raise psycopg.InterfaceError("the connection is gone")
        return str(ClientCursor(raw).mogrify("%s", (value,)))


def _pieces(*parts: str | int) -> tuple[str, ...]:
    """Statement text from text parts and parameter counts: ``("INSERT ... (", 3, ")")``
    is the text around three comma-separated parameters."""
    pieces = [""]
    for part in parts:
        if isinstance(part, str):
            pieces[-1] += part
        else:
            pieces += [", "] * (part - 1) + [""] if part else []
    return tuple(pieces)


@functools.cache
def _claim_sql(columns: tuple[str, ...]) -> _Sql:
    return _Sql.of(
        _pieces(
            f"INSERT INTO {rlog.name} ({', '.join(columns)}) VALUES (",
            len(columns),
            ") ON CONFLICT (cm_id, destination) DO NOTHING RETURNING cm_id",
        )
    )


#: Outbox columns that hold the same value in every ack (the exchange, state, content
#: type, the unset properties ...): written into the statement's text, so a call renders
#: and sends only the values that vary.
_CONSTANT_COLUMNS = frozenset(
    {
        "state",
        "exchange",
        "reply_to",
        "content_type",
        "content_encoding",
        "message_type",
        "headers",
        "priority",
        "expiration_ms",
        "persistent",
        "mandatory",
        "attempts",
        "copies",
    }
)
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9._/+:-]*\Z")


def _constant(value: object) -> str | None:
    """``value`` as SQL text when it is plain enough to need no escaping, else None."""
    if value is None:
        return "NULL"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is str and _PLAIN_TEXT.match(value):
        return f"'{value}'"
    return None


@functools.cache
def _ack_sql(outbox_columns: tuple[tuple[str, str | None], ...]) -> _Sql:
    """The ack's insert; ``outbox_columns`` are (column, constant text or None for a
    parameter) in order."""
    names = ", ".join(column for column, _constant in outbox_columns)
    parts: list[str | int] = [f"INSERT INTO {outbox_table().name} ({names}) VALUES ("]
    for i, (_column, constant) in enumerate(outbox_columns):
        parts += [", " if i else "", 1 if constant is None else constant]
    parts.append(")")
    return _Sql.of(_pieces(*parts))
