"""SQL of the relay side: claim pending rows, settle them after the broker answered, report.

How a claim works, and why:

* PostgreSQL: the claim is a transaction that deletes up to ``limit`` pending rows and
  returns them (``DELETE … WHERE id IN (SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP
  LOCKED) RETURNING …``), and stays open while the rows are published. Until it commits
  the rows are still there for everyone else, locked: the row locks *are* the lease.
  Another relay's claim skips them (SKIP LOCKED), a relay that dies loses its connection
  and PostgreSQL rolls the delete back at once, and a relay that hangs is cut off by
  ``idle_in_transaction_session_timeout`` (the lease timeout). When the broker has
  confirmed the batch the transaction commits, and the published rows are gone; the few
  rows the broker refused or nacked are written back first (parked as failed, or pending
  with a retry time), with their ids. A broker failure rolls the transaction back and the
  rows are pending again, untouched. Locking and deleting in one statement touches each
  row once, where a separate ``SELECT … FOR UPDATE`` and ``DELETE`` would touch it twice
  and slow the relay down (figures in ``bench/RESULTS.md``).
* SQLite has no row locks: the claim is a plain read and only one relay may run against a
  SQLite database (documented); settling happens in one short write transaction.

Published rows are deleted when their batch settles, so retention is bounded by
construction: the table holds the backlog plus parked (failed) rows, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RootTransaction
from sqlalchemy.sql.dml import ReturningDelete

from condmsg.core.timeutil import stored_instant
from condmsg.infra.urls import redact_url
from outbox.enqueueing import row_values
from outbox.errors import StoreError
from outbox.message import MESSAGE_FIELDS, OutboxMessage, StoredMessage
from outbox.table import DEFAULT_TABLE_NAME, FAILED, PENDING, notify_channel, outbox_table

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxStatus:
    """A snapshot of the table. ``oldest_pending_age_s`` is in seconds (``None``: empty)."""

    pending: int
    failed: int
    oldest_pending_id: int | None
    oldest_pending_age_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedRow:
    """A parked row: why it failed and how often it was tried. ``failed_at`` is UTC."""

    id: int
    exchange: str
    routing_key: str
    attempts: int
    last_error: str | None
    failed_at: datetime | None


@dataclass(slots=True, eq=False)
class Claim:
    """Rows claimed for publishing; settle with :meth:`OutboxStore.settle` or release."""

    rows: list[StoredMessage]
    _conn: Connection | None = field(default=None, repr=False)
    _txn: RootTransaction | None = field(default=None, repr=False)

    @property
    def last_id(self) -> int:
        return self.rows[-1].id if self.rows else 0

    @property
    def messages(self) -> int:
        """How many messages the claimed rows hold (a fan-out row holds several)."""
        return sum(len(row.copies) or 1 for row in self.rows)


#: What :meth:`OutboxStore.settle` is told about: a row id, or (row id, copy number).
Key = int | tuple[int, int | None]
#: ("published",) | ("pending",) | ("parked", reason) | ("retry", reason, available_at)
Verdict = tuple[Any, ...]
_PUBLISHED: Verdict = ("published",)
_PENDING: Verdict = ("pending",)


class _Verdicts:
    """The broker's answers of one settle, looked up per row and per copy."""

    def __init__(
        self,
        published: Collection[Key],
        parked: Mapping[Key, str],
        retry: Mapping[Key, tuple[str, datetime]],
    ) -> None:
        self._by_key: dict[Key, Verdict] = {}
        for key in published:
            self._by_key[key] = _PUBLISHED
        for key, (reason, at) in retry.items():
            self._by_key[key] = ("retry", reason, at)
        for key, reason in parked.items():
            self._by_key[key] = ("parked", reason)
        self._rows = {k if isinstance(k, int) else k[0] for k in self._by_key}

    def about(self, row_id: int) -> bool:
        return row_id in self._rows

    def of(self, row_id: int, copy: int | None) -> Verdict:
        by_key = self._by_key
        found = by_key.get((row_id, copy)) if copy is not None else None
        if found is None:
            found = by_key.get(row_id) or by_key.get((row_id, None)) or _PENDING
        return found

    def groups(self, row: StoredMessage) -> list[tuple[Verdict, list[dict[str, Any]] | None]]:
        """What to write back of ``row``: one (verdict, copies) per verdict other than
        published (copies None for a plain row); nothing if it was published."""
        if not row.copies:
            verdict = self.of(row.id, None)
            return [] if verdict is _PUBLISHED else [(verdict, None)]
        groups: dict[str, tuple[Verdict, list[dict[str, Any]]]] = {}
        for copy in row.copies:
            verdict = self.of(row.id, int(copy["n"]))
            if verdict is not _PUBLISHED:
                groups.setdefault(verdict[0], (verdict, []))[1].append(copy)
        return [(verdict, copies) for verdict, copies in groups.values()]


class OutboxStore:
    """The outbox table ``table_name`` in the database behind ``engine``."""

    def __init__(
        self,
        engine: Engine,
        *,
        table_name: str = DEFAULT_TABLE_NAME,
        lease_timeout_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.table = outbox_table(table_name)
        self.lease_timeout_s = lease_timeout_s
        #: What the database can do, decided once here: row locks with SKIP LOCKED make a
        #: claim a lease (several relays, LISTEN/NOTIFY wake-ups); without them a claim is a
        #: plain read and one relay serves the database. All of it is SQLAlchemy Core, so
        #: the driver does not matter (no psycopg-only form, unlike the writers).
        self.locking = engine.dialect.name == "postgresql"
        self._claim_stmt = self._build_claim()
        # Settling on SQLite (on PostgreSQL the claim itself deletes).
        self._delete_stmt = sa.delete(self.table).where(
            self.table.c.id.in_(sa.bindparam("ids", expanding=True))
        )

    # -- errors ---------------------------------------------------------------------------

    def _translate(self, exc: sa.exc.SQLAlchemyError, doing: str) -> StoreError:
        where = redact_url(self.engine.url.render_as_string(hide_password=True))
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        hint = ""
        if "does not exist" in reason or "no such table" in reason:
            hint = f"; create it with outbox.create_tables(engine, table_name={self.table.name!r})"
        elif isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
            hint = "; is the database running?"
        return StoreError(f"cannot {doing} in {where}: {reason}{hint}")

    def _run(self, doing: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except sa.exc.SQLAlchemyError as exc:
            raise self._translate(exc, doing) from exc

    @contextmanager
    def _write(self, doing: str) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa.exc.SQLAlchemyError as exc:
            raise self._translate(exc, doing) from exc

    # -- claim and settle -----------------------------------------------------------------

    def _build_claim(self) -> sa.Select[Any] | ReturningDelete[Any]:
        t = self.table
        cols = [
            t.c.id,
            t.c.created_at,
            t.c.attempts,
            *(t.c[f] for f in MESSAGE_FIELDS),
            t.c.copies,
        ]
        # ORDER BY id: a relay publishes what it claims in id order (the documented FIFO
        # guarantee), and the partial pending index yields rows already in that order.
        # `id > :after` lets a relay draining a backlog start behind its previous batch
        # instead of walking the dead index entries of rows it just deleted.
        due = (
            sa.select(*([t.c.id] if self.locking else cols))
            .where(
                t.c.state == PENDING,
                t.c.id > sa.bindparam("after"),
                sa.or_(t.c.available_at.is_(None), t.c.available_at <= sa.bindparam("now")),
            )
            .order_by(t.c.id)
            .limit(sa.bindparam("limit"))
        )
        if not self.locking:
            return due
        # The claim's transaction settings (SET LOCAL scope: this claim only) ride on the
        # claim itself, one round trip fewer per batch: an uncorrelated scalar subquery is
        # an InitPlan, and the condition on it a one-time filter, run once before anything
        # is scanned or locked.
        # - The lease: a relay that stops talking while holding rows is disconnected and
        #   its locks released after `lease` (idle_in_transaction_session_timeout).
        # - No synchronous commit for the settle: it only deletes (or parks) published
        #   rows, and if a crash loses that commit the rows simply go out again, which
        #   at-least-once delivery allows; the relay does not wait for a disk flush per
        #   batch.
        settings = sa.select(
            sa.func.concat(
                sa.func.set_config(
                    "idle_in_transaction_session_timeout", sa.bindparam("lease"), True
                ),
                sa.func.set_config("synchronous_commit", "off", True),
            )
        ).scalar_subquery()
        # SKIP LOCKED: relays claim disjoint rows without waiting for each other.
        return (
            sa.delete(t)
            .where(t.c.id.in_(due.with_for_update(skip_locked=True)), settings.is_not(None))
            .returning(*cols)
        )

    def claim(self, limit: int, *, after_id: int = 0) -> Claim:
        """Claim up to ``limit`` pending, due rows with ``id > after_id``, in id order."""
        params = {"after": after_id, "now": datetime.now(UTC), "limit": limit}
        if not self.locking:
            with self._run("read the outbox", self.engine.connect) as conn:
                rows = self._run("read the outbox", lambda: self._fetch(conn, params))
            return Claim(rows)
        conn = self._run("connect to the outbox database", self.engine.connect)
        try:
            txn = conn.begin()
            lease = f"{int(self.lease_timeout_s * 1000)}ms"
            rows = self._fetch(conn, params | {"lease": lease})
        except sa.exc.SQLAlchemyError as exc:
            self._abandon(conn)
            raise self._translate(exc, "claim outbox rows") from exc
        if not rows:
            self._close(conn, txn, commit=False)
            return Claim([])
        return Claim(rows, conn, txn)

    def _fetch(self, conn: Connection, params: dict[str, Any]) -> list[StoredMessage]:
        # fetchall(): one driver call for the batch instead of one per row. A DELETE
        # returns its rows in no particular order: publish them in id order.
        rows = sorted(conn.execute(self._claim_stmt, params).all(), key=itemgetter(0))
        return [
            StoredMessage(
                id=r[0],
                created_at=stored_instant(r[1]),
                attempts=r[2],
                message=OutboxMessage.trusted(**dict(zip(MESSAGE_FIELDS, r[3:-1], strict=True))),
                copies=tuple(r[-1] or ()),
            )
            for r in rows
        ]

    @staticmethod
    def _close(conn: Connection, txn: RootTransaction, *, commit: bool) -> None:
        try:
            if commit:
                txn.commit()
            else:
                txn.rollback()
        except BaseException:
            OutboxStore._abandon(conn)
            raise
        conn.close()

    @staticmethod
    def _abandon(conn: Connection) -> None:
        """Let go of a connection whose transaction failed, the connection lost with it
        perhaps (the server rolls back on its own). The local rollback comes first:
        SQLAlchemy refuses to close a connection that still holds a transaction it
        invalidated, and that refusal must not replace the error being reported."""
        with suppress(sa.exc.SQLAlchemyError):
            conn.rollback()
        with suppress(sa.exc.SQLAlchemyError):
            conn.close()

    def release(self, claim: Claim) -> None:
        """Give the claimed rows back untouched (the broker failed; they go out again)."""
        if claim._conn is not None and claim._txn is not None:
            # A broken connection here is fine: the server rolls back on disconnect.
            with suppress(sa.exc.SQLAlchemyError):
                self._close(claim._conn, claim._txn, commit=False)
        claim._conn = claim._txn = None

    def settle(
        self,
        claim: Claim,
        *,
        published: Collection[Key],
        parked: Mapping[Key, str] | None = None,
        retry: Mapping[Key, tuple[str, datetime]] | None = None,
    ) -> None:
        """Record the broker's verdict on a claim and end it.

        A key is a row id (every message of the row) or ``(row id, copy number)`` (one
        message of a fan-out row). ``published`` messages are done; ``parked`` ones become
        ``failed`` with the reason; ``retry`` ones stay pending with the reason and are not
        claimed before the given UTC instant; each of those counts one more attempt. A row
        is deleted when all its messages are published; a fan-out row whose messages got
        different verdicts is written back with the unpublished ones only, one row per
        verdict (the first keeps the row's id).
        """
        verdicts = _Verdicts(published, parked or {}, retry or {})
        if claim._conn is not None and claim._txn is not None:
            conn, txn = claim._conn, claim._txn
            claim._conn = claim._txn = None
            try:
                # The claim deleted its rows: write back whatever was not published.
                self._write_back(conn, claim.rows, verdicts)
                self._close(conn, txn, commit=True)
            except sa.exc.SQLAlchemyError as exc:
                self._abandon(conn)
                raise self._translate(exc, "settle outbox rows") from exc
            return
        # SQLite: the claim only read its rows; rows nothing was said about stay as they are.
        touched = [row for row in claim.rows if verdicts.about(row.id)]
        if not touched:
            return
        with self._write("settle outbox rows") as conn:
            conn.execute(self._delete_stmt, {"ids": [row.id for row in touched]})
            self._write_back(conn, touched, verdicts)

    def _write_back(
        self, conn: Connection, rows: Sequence[StoredMessage], verdicts: _Verdicts
    ) -> None:
        """Insert, with their ids, the rows (or the parts of fan-out rows) that were not
        published: parked ones as failed, retried ones pending from the given instant,
        anything the broker did not answer for pending as it was."""
        now = datetime.now(UTC)
        same_id: list[dict[str, Any]] = []
        new_id: list[dict[str, Any]] = []
        for row in rows:
            for i, (verdict, copies) in enumerate(verdicts.groups(row)):
                # As it was stored (pending, its attempts so far), then the broker's verdict.
                value = row_values(row.message, row.created_at, copies) | {
                    "attempts": row.attempts,
                    "last_error": None,
                    "available_at": None,
                    "failed_at": None,
                }
                if verdict[0] == "parked":
                    value |= {
                        "state": FAILED,
                        "attempts": row.attempts + 1,
                        "last_error": verdict[1],
                        "failed_at": now,
                    }
                elif verdict[0] == "retry":
                    value |= {
                        "attempts": row.attempts + 1,
                        "last_error": verdict[1],
                        "available_at": verdict[2],
                    }
                if i == 0:
                    same_id.append(value | {"id": row.id})
                else:
                    new_id.append(value)
        for values in (same_id, new_id):
            if values:
                conn.execute(sa.insert(self.table), values)

    # -- operators ------------------------------------------------------------------------

    def status(self) -> OutboxStatus:
        """Counts of pending and failed rows, and the age of the oldest pending one."""
        t = self.table

        def query() -> OutboxStatus:
            with self.engine.connect() as conn:
                # Each count is an index(-only) scan of one partial index.
                pending = conn.scalar(sa.select(sa.func.count()).where(t.c.state == PENDING))
                failed = conn.scalar(sa.select(sa.func.count()).where(t.c.state == FAILED))
                # Lowest id = oldest enqueue (ids come from one sequence); one index probe.
                oldest = conn.execute(
                    sa.select(t.c.id, t.c.created_at)
                    .where(t.c.state == PENDING)
                    .order_by(t.c.id)
                    .limit(1)
                ).first()
            age = None
            if oldest is not None:
                age = max(0.0, (datetime.now(UTC) - stored_instant(oldest[1])).total_seconds())
            return OutboxStatus(
                pending=int(pending or 0),
                failed=int(failed or 0),
                oldest_pending_id=None if oldest is None else int(oldest[0]),
                oldest_pending_age_s=age,
            )

        return self._run("read the outbox status", query)

    def failed_rows(self, limit: int = 100) -> list[FailedRow]:
        """Parked rows, oldest first, with the reason they were parked."""
        t = self.table
        stmt = (
            sa.select(
                t.c.id, t.c.exchange, t.c.routing_key, t.c.attempts, t.c.last_error, t.c.failed_at
            )
            .where(t.c.state == FAILED)
            .order_by(t.c.id)
            .limit(limit)
        )

        def query() -> list[FailedRow]:
            with self.engine.connect() as conn:
                return [
                    FailedRow(
                        id=r[0],
                        exchange=r[1],
                        routing_key=r[2],
                        attempts=r[3],
                        last_error=r[4],
                        failed_at=stored_instant(r[5]),
                    )
                    for r in conn.execute(stmt)
                ]

        return self._run("list failed outbox rows", query)

    def requeue_failed(self, ids: Collection[int] | None = None) -> int:
        """Make parked rows pending again (all, or those in ``ids``); return how many.

        Attempts restart at zero; ``last_error`` keeps the previous reason until the next
        outcome. On PostgreSQL the relays are woken at commit.
        """
        t = self.table
        stmt = (
            sa.update(t)
            .where(t.c.state == FAILED)
            .values(state=PENDING, attempts=0, available_at=None, failed_at=None)
        )
        if ids is not None:
            stmt = stmt.where(t.c.id.in_(list(ids)))
        with self._write("requeue failed outbox rows") as conn:
            count = conn.execute(stmt).rowcount
            if self.locking and count:
                conn.execute(sa.text("SELECT pg_notify(:c, '')"), {"c": self._channel(conn)})
        return int(count)

    def delete_failed(self, ids: Collection[int] | None = None, *, batch: int = 1000) -> int:
        """Delete parked rows (all, or those in ``ids``) in batches of ``batch``."""
        t = self.table
        total = 0
        while True:
            victims = sa.select(t.c.id).where(t.c.state == FAILED).order_by(t.c.id).limit(batch)
            if ids is not None:
                victims = victims.where(t.c.id.in_(list(ids)))
            with self._write("delete failed outbox rows") as conn:
                chosen = [r[0] for r in conn.execute(victims)]
                if chosen:
                    conn.execute(sa.delete(t).where(t.c.id.in_(chosen)))
            total += len(chosen)
            if len(chosen) < batch:
                return total

    # -- PostgreSQL wake-ups --------------------------------------------------------------

    def _channel(self, conn: Connection) -> str:
        schema = conn.scalar(
            sa.text(
                "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.oid = to_regclass(:t)"
            ),
            {"t": self.table.name},
        )
        if schema is None:
            raise StoreError(
                f"outbox table {self.table.name!r} does not exist; create it with "
                f"outbox.create_tables(engine, table_name={self.table.name!r})"
            )
        return notify_channel(str(schema), self.table.name)

    def notify_channel(self) -> str | None:
        """The LISTEN channel that commits into this table notify (``None`` off PostgreSQL)."""
        if not self.locking:
            return None

        def query() -> str:
            with self.engine.connect() as conn:
                return self._channel(conn)

        return self._run("look up the outbox table", query)
