"""The outbox table (SQLAlchemy Core), its indexes and its PostgreSQL NOTIFY trigger.

One table per store; the name is configurable (default ``condmsg_outbox``) so that several
applications, or several tests, can keep separate outboxes in one database. Another package
puts the table into its own :class:`~sqlalchemy.MetaData` with ``outbox_table(name,
metadata=its_metadata)`` and its ``create_all`` creates the table, indexes and trigger too.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

DEFAULT_TABLE_NAME = "condmsg_outbox"

PENDING = "pending"
FAILED = "failed"

#: This package's own metadata; tables built without an explicit ``metadata`` live here.
metadata = sa.MetaData()

# BIGINT ids on PostgreSQL (no wrap-around on a busy outbox); on SQLite only a column
# declared exactly ``INTEGER PRIMARY KEY`` is the auto-incrementing rowid.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# One function serves every outbox table of a schema. The channel is derived from the
# *schema-qualified* table name so that two schemas (or two tables) never wake each other's
# relays; md5 keeps it inside PostgreSQL's 63-byte identifier limit. NOTIFY is delivered
# only when the inserting transaction commits, and identical notifications of one
# transaction are folded into one, which is exactly the wake-up a relay wants.
_NOTIFY_FUNCTION = sa.DDL(  # type: ignore[no-untyped-call]
    "CREATE OR REPLACE FUNCTION condmsg_outbox_notify() RETURNS trigger "
    "LANGUAGE plpgsql AS $$ BEGIN "
    "PERFORM pg_notify('outbox_' || md5(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME), ''); "
    "RETURN NULL; END $$"
)
# FOR EACH STATEMENT: one notification per INSERT statement, not per row of a batch.
_NOTIFY_TRIGGER = sa.DDL(  # type: ignore[no-untyped-call]
    "CREATE TRIGGER %(table)s_notify AFTER INSERT ON %(fullname)s "
    "FOR EACH STATEMENT EXECUTE FUNCTION condmsg_outbox_notify()"
)

# Every row is inserted, claimed and deleted within milliseconds: the live rows are the
# backlog, the dead ones pile up at the traffic's rate until a vacuum frees their space
# for the next inserts. A fixed threshold (scale factor 0) vacuums the table at each
# autovacuum visit that finds 1,000 dead rows, not after a fifth of an estimate that a
# past backlog inflated; no cost delay, so that vacuuming a table this small is not
# paced while dead rows keep coming (docs/operations.md, "Outbox tables under churn").
STORAGE_OPTIONS = (
    "autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_cost_delay = 0"
)
_STORAGE = sa.DDL(  # type: ignore[no-untyped-call]
    f"ALTER TABLE %(fullname)s SET ({STORAGE_OPTIONS})"
)


def notify_channel(schema: str, table_name: str) -> str:
    """The LISTEN/NOTIFY channel of ``schema.table_name`` (same formula as the trigger)."""
    digest = hashlib.md5(f"{schema}.{table_name}".encode(), usedforsecurity=False).hexdigest()
    return f"outbox_{digest}"


def outbox_table(
    name: str = DEFAULT_TABLE_NAME, *, metadata: sa.MetaData | None = None
) -> sa.Table:
    """The outbox table called ``name`` in ``metadata`` (this package's own by default).

    Calling it twice with the same arguments returns the same :class:`~sqlalchemy.Table`.
    """
    md = metadata if metadata is not None else globals()["metadata"]
    existing = md.tables.get(name)
    if existing is not None:
        return existing
    table = sa.Table(
        name,
        md,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        # UTC, the enqueuing process's clock; "oldest pending age" is measured from it.
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, default=PENDING),
        sa.Column("exchange", sa.String(255), nullable=False),
        sa.Column("routing_key", sa.String(255), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("message_id", sa.String(255)),
        sa.Column("correlation_id", sa.String(255)),
        sa.Column("reply_to", sa.String(255)),
        sa.Column("content_type", sa.String(255)),
        sa.Column("content_encoding", sa.String(255)),
        sa.Column("message_type", sa.String(255)),
        sa.Column("headers", sa.JSON()),
        sa.Column("priority", sa.SmallInteger()),
        sa.Column("expiration_ms", sa.BigInteger()),
        sa.Column("persistent", sa.Boolean(), nullable=False, default=True),
        sa.Column("mandatory", sa.Boolean(), nullable=False, default=True),
        # Publish attempts that ended in a nack or a refusal; reset by requeue_failed().
        sa.Column("attempts", sa.Integer(), nullable=False, default=0),
        # A nacked row waits until then (UTC) before it is claimed again; NULL = at once.
        sa.Column("available_at", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text()),
        sa.Column("failed_at", sa.DateTime(timezone=True)),
        # A fan-out row (outbox.enqueue_fanouts): per message of the group, its copy
        # number and what it does not share with the row's columns. NULL: a plain row.
        sa.Column("copies", sa.JSON(none_as_null=True)),
    )
    # The relay's claim (`state = 'pending' AND id > :cursor ORDER BY id LIMIT n`) and the
    # backlog count read only this partial index: its size is the backlog, not the history.
    sa.Index(
        f"ix_{name}_pending",
        table.c.id,
        postgresql_where=table.c.state == PENDING,
        sqlite_where=table.c.state == PENDING,
    )
    # Operators list, count, requeue and purge parked rows through this one.
    sa.Index(
        f"ix_{name}_failed",
        table.c.id,
        postgresql_where=table.c.state == FAILED,
        sqlite_where=table.c.state == FAILED,
    )
    sa.event.listen(table, "after_create", _NOTIFY_FUNCTION.execute_if(dialect="postgresql"))
    sa.event.listen(table, "after_create", _NOTIFY_TRIGGER.execute_if(dialect="postgresql"))
    sa.event.listen(table, "after_create", _STORAGE.execute_if(dialect="postgresql"))
    return table


def create_tables(bind: Engine | Connection, *, table_name: str = DEFAULT_TABLE_NAME) -> sa.Table:
    """Create the outbox table, its indexes and (PostgreSQL) its NOTIFY trigger if missing."""
    table = outbox_table(table_name)
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            table.create(conn, checkfirst=True)
            _add_missing_columns(conn, table)
    else:
        table.create(bind, checkfirst=True)
        _add_missing_columns(bind, table)
    return table


def _add_missing_columns(conn: Connection, table: sa.Table) -> None:
    """Add the columns later versions introduced (``copies``) to a table created before.

    Several processes may do this at once (evaluator instances, receivers, relays
    starting together): on PostgreSQL ``IF NOT EXISTS`` makes the loser a no-op (its
    ALTER waits for the winner's lock, then finds the column); SQLite has no such clause:
    there the loser's "duplicate column" error is the same answer.
    """
    present = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    if "copies" in present:
        return
    name = conn.dialect.identifier_preparer.format_table(table)
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS copies JSON"))
        return
    try:
        conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN copies JSON"))
    except sa.exc.OperationalError as exc:  # a failed statement leaves SQLite's txn usable
        if "duplicate column" not in str(exc):
            raise
