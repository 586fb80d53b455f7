"""Schema versions of condmsg's stores: upgrade, inspect and check them (Alembic).

condmsg keeps three stores, each its own line of Alembic revisions (a branch):

- ``outbox``: the outbox table every store has (messages waiting for the relay);
- ``sender``: the sender's and the evaluator's tables (CMs, copies, acks, outcomes);
- ``receiver``: a receiver's RLOG, inbox and sequence parts.

``sender`` and ``receiver`` need ``outbox``: upgrading either upgrades the outbox of its
database first (the branches are independent in Alembic's terms, so that each keeps its own
row in the version table; this module orders them). One database may hold several stores
(a sender and its receivers in one database, as in a quick start): their revisions sit side
by side in one version table,
``condmsg_schema_version``. Revision ids are ``<store>_<number>``, so a revision written
by a newer release is still known to belong to its store.

A store created before it was versioned (by ``create_all``) is adopted by
:func:`upgrade`: its tables are recognised as the first revision and stamped so.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from condmsg.core.errors import StoreError
from condmsg.runtime.db import describe_db_url

#: The stores, in the order they are upgraded (a store's dependencies first).
STORES = ("outbox", "sender", "receiver")
VERSION_TABLE = "condmsg_schema_version"
#: What each store's first revision creates: a store holding all of these before it was
#: versioned is adopted at that revision.
BASELINE_TABLES = {
    "outbox": ("condmsg_outbox",),
    "sender": (
        "condmsg_meta",
        "condmsg_cm",
        "condmsg_copy",
        "condmsg_compensation",
        "condmsg_ack",
        "condmsg_anomaly",
    ),
    "receiver": ("condmsg_rlog", "condmsg_rx_inbox", "condmsg_poison", "condmsg_sequence_part"),
}
_DEPENDS = {"outbox": (), "sender": ("outbox",), "receiver": ("outbox",)}
#: The Alembic scripts, shipped in ``condmsg/migrations/``.
_SCRIPTS = Path(__file__).parents[1] / "migrations"


class SchemaError(StoreError):
    """A store's schema is not the one this release of condmsg expects."""


class SchemaState(enum.Enum):
    CURRENT = "current"
    BEHIND = "behind"  # older than the code: `condmsg db upgrade`
    AHEAD = "ahead"  # newer than the code: upgrade condmsg
    MISSING = "missing"  # not created yet


@dataclass(frozen=True, slots=True)
class StoreRevision:
    store: str
    revision: str | None  # what the database holds (None: not versioned)
    head: str  # what this release expects

    @property
    def state(self) -> SchemaState:
        if self.revision == self.head:
            return SchemaState.CURRENT
        if self.revision is None:
            return SchemaState.MISSING
        if _number(self.revision) > _number(self.head):
            return SchemaState.AHEAD
        return SchemaState.BEHIND


def _number(revision: str) -> int:
    return int(revision.rsplit("_", 1)[1])


def _config(conn: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    if conn is not None:
        config.attributes["connection"] = conn
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    """The revision files, read once per process: every check at a service's start asks
    for the heads, and the files do not change while it runs."""
    return ScriptDirectory.from_config(_config())


def head(store: str) -> str:
    """The revision of ``store`` that this release of condmsg expects."""
    _known(store)
    return _branch_head(store)


def _branch_head(store: str) -> str:
    (revision,) = _scripts().get_revisions(f"{store}@head")
    assert revision is not None
    return str(revision.revision)


def _known(store: str) -> None:
    if store not in STORES:
        raise ValueError(f"unknown store {store!r}: one of {', '.join(STORES)}")


def revisions(bind: Engine | Connection) -> dict[str, str | None]:
    """Per store, the revision the database holds (None where it holds none)."""
    with _connected(bind) as conn:
        found = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE}
        ).get_current_heads()
    held: dict[str, str | None] = dict.fromkeys(STORES)
    for revision in found:
        store = revision.rsplit("_", 1)[0]
        if store in held:
            held[store] = revision
    return held


def status(bind: Engine | Connection, store: str) -> StoreRevision:
    _known(store)
    return StoreRevision(store, revisions(bind)[store], _branch_head(store))


def check(bind: Engine | Connection, store: str) -> None:
    """Raise :class:`SchemaError` (one line, naming what to run) unless the database
    holds ``store`` (and the stores it depends on) at the revision this release expects."""
    held = revisions(bind)
    # The store asked for first: an empty database is then said to lack that store (the
    # one the user named, and whose upgrade creates the others too).
    for name in (store, *_DEPENDS[store]):
        found = StoreRevision(name, held[name], _branch_head(name))
        if found.state is not SchemaState.CURRENT:
            raise SchemaError(_explain(found, store, bind))


def _explain(found: StoreRevision, asked: str, bind: Engine | Connection) -> str:
    where = describe_db_url(str(bind.engine.url if isinstance(bind, Connection) else bind.url))
    fix = {
        SchemaState.MISSING: f"create it with: condmsg db upgrade --store {asked}",
        SchemaState.BEHIND: f"upgrade it with: condmsg db upgrade --store {asked}",
        SchemaState.AHEAD: "a newer release of condmsg wrote it: upgrade condmsg",
    }[found.state]
    held = found.revision or "no condmsg schema"
    return (
        f"the {found.store} store at {where} is {found.state.value} "
        f"({held}; this release expects {found.head}); {fix}"
    )


def ensure(
    bind: Engine | Connection,
    store: str,
    *,
    models: Sequence[sa.MetaData] = (),
    create: bool = False,
) -> None:
    """What a service, ``Sender`` or ``Receiver`` runs at its start: raise
    :class:`SchemaError` (one line naming what to run) unless ``bind`` holds ``store`` at
    this release's revision with every table and column of ``models``. With ``create``, a
    store that does not exist yet is created first (quick starts and tests); a store that is
    behind or ahead is refused all the same: upgrading one is the operator's step."""
    if create and status(bind, store).state is SchemaState.MISSING:
        try:
            upgrade(bind, store)
        except sa.exc.DBAPIError:
            # Another process created it at the same moment (two services started on one
            # fresh store): what counts is that it exists now, which the check says.
            if status(bind, store).state is SchemaState.MISSING:
                raise
    check(bind, store)
    verify_columns(bind, store, models)


def verify_columns(bind: Engine | Connection, store: str, models: Sequence[sa.MetaData]) -> None:
    """Raise :class:`SchemaError` if a table or column of ``models`` is missing from the
    database: a store at the right revision that was changed by hand."""
    with _connected(bind) as conn:
        inspector = sa.inspect(conn)
        for metadata in models:
            for table in metadata.sorted_tables:
                if not inspector.has_table(table.name):
                    raise SchemaError(_changed(bind, store, f"table {table.name} is missing"))
                present = {c["name"] for c in inspector.get_columns(table.name)}
                missing = [c.name for c in table.columns if c.name not in present]
                if missing:
                    lacks = f"table {table.name} lacks column(s) {', '.join(missing)}"
                    raise SchemaError(_changed(bind, store, lacks))


def _changed(bind: Engine | Connection, store: str, what: str) -> str:
    where = describe_db_url(str(bind.engine.url if isinstance(bind, Connection) else bind.url))
    return (
        f"the {store} store at {where} does not match its revision: {what} (changed outside "
        f"condmsg's migrations); restore it, or create the store afresh with: "
        f"condmsg db upgrade --store {store}"
    )


def upgrade(bind: Engine | Connection, store: str) -> StoreRevision:
    """Bring ``store`` (and the stores it depends on) to this release's revision; adopt
    tables created before the store was versioned. Safe to run again: at the head it does
    nothing. Returns the store's revision afterwards."""
    _known(store)
    with _connected(bind) as conn:
        for name in (*_DEPENDS[store], store):
            _adopt(conn, name)
            command.upgrade(_config(conn), f"{name}@head")
            if conn.in_transaction():
                conn.commit()
    return status(bind, store)


def _adopt(conn: Connection, store: str) -> None:
    if revisions(conn)[store] is not None:
        return
    inspector = sa.inspect(conn)
    if not all(inspector.has_table(name) for name in BASELINE_TABLES[store]):
        return
    if store == "outbox":
        from outbox.table import create_tables

        create_tables(conn)  # adds the columns later outbox versions introduced
    command.stamp(_config(conn), f"{store}_0001")
    if conn.in_transaction():
        conn.commit()


class _connected:
    """A connection for ``bind``: the caller's own, or a fresh one closed afterwards."""

    def __init__(self, bind: Engine | Connection) -> None:
        self._bind = bind
        self._own: Connection | None = None

    def __enter__(self) -> Connection:
        if isinstance(self._bind, Connection):
            return self._bind
        self._own = self._bind.connect()
        return self._own

    def __exit__(self, *_exc: object) -> None:
        if self._own is not None:
            self._own.close()
