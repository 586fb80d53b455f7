"""Participants of a Dependency-Sphere: transactional work that shares the sphere's fate.

A participant is identified by a stable id (logged in the sphere log before its work
begins), votes in :meth:`Participant.prepare` when the sphere commits, and is then
committed or rolled back by the sphere's outcome, each step idempotent. Two are built in:

- :class:`PreparedTransaction`: work in a PostgreSQL database held as a prepared
  transaction (``PREPARE TRANSACTION`` at the sphere's commit, ``COMMIT PREPARED`` or
  ``ROLLBACK PREPARED`` once the outcome is known). Its global id is its participant id, so
  a process that restarts finds it in ``pg_prepared_xacts`` and finishes it
  (:func:`finish_prepared`);
- handlers (``Sphere.on_success`` / ``on_failure``): compensating work run once by name
  when the outcome is known, resolved by the sender (:mod:`condmsg.spheres.resolution`).
"""

from __future__ import annotations

import logging
import re
from typing import Protocol, runtime_checkable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, TwoPhaseTransaction
from sqlalchemy.orm import Session

from condmsg.core.errors import SphereError
from condmsg.runtime.db import describe_db_url

log = logging.getLogger(__name__)

#: What a participant id may hold: it is stored, and a prepared transaction's id is quoted
#: into ``COMMIT PREPARED '...'`` (PostgreSQL takes no parameter there).
PARTICIPANT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


@runtime_checkable
class Participant(Protocol):
    """Transactional work enlisted in a sphere (``Sphere.enlist``).

    ``prepare`` makes the work ready to commit and votes (True: yes). A ``prepare`` that
    returns False or raises makes the sphere fail. ``commit`` and ``rollback`` may be called
    more than once (after a crash, say) and must then do nothing more.
    """

    @property
    def participant_id(self) -> str: ...

    def prepare(self) -> bool: ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...


def check_participant_id(participant_id: object) -> str:
    if not isinstance(participant_id, str) or not PARTICIPANT_ID.fullmatch(participant_id):
        raise SphereError(
            f"a participant id must be 1-200 characters of letters, digits and _.:- "
            f"(got {participant_id!r})"
        )
    return participant_id


def resource_name(engine: Engine) -> str:
    """How the sphere log names a database: its URL without credentials (also in a query)."""
    return describe_db_url(engine.url)


def require_prepared_transactions(engine: Engine) -> None:
    """Refuse a database that cannot hold prepared transactions, saying what to change."""
    where = resource_name(engine)
    if engine.dialect.name != "postgresql":
        raise SphereError(
            f"a sphere's prepared transaction needs PostgreSQL, not {engine.dialect.name} "
            f"({where}); use ds.on_failure(...) for work there"
        )
    with engine.connect() as conn:
        limit = int(conn.exec_driver_sql("SHOW max_prepared_transactions").scalar_one())
    if limit <= 0:
        raise SphereError(
            f"PostgreSQL at {where} has max_prepared_transactions = 0, so it cannot hold a "
            "sphere's prepared transaction: set max_prepared_transactions (say 64) in "
            "postgresql.conf and restart it, or use ds.on_failure(...) instead"
        )


class PreparedTransaction:
    """Work in one PostgreSQL database that commits or rolls back with a sphere.

    ``session`` is an ORM session on the participant's own connection; its work stays in
    one open transaction until the sphere commits (``PREPARE TRANSACTION``), and is
    committed or rolled back by the sphere's outcome. The transaction holds its row locks
    until then, so it suits spheres that end quickly (docs/spheres.md).
    """

    kind = "postgresql"

    def __init__(self, engine: Engine, gid: str) -> None:
        self._gid = check_participant_id(gid)
        self._engine = engine
        self._conn: Connection | None = engine.connect()
        self._tx: TwoPhaseTransaction | None = self._conn.begin_twophase(xid=gid)
        self._prepared = False
        self.session = Session(bind=self._conn, join_transaction_mode="rollback_only")

    @property
    def participant_id(self) -> str:
        return self._gid

    def prepare(self) -> bool:
        if self._tx is None:
            return False  # rolled back already: the work is gone
        if not self._prepared:
            self.session.flush()
            self._tx.prepare()
            self._prepared = True
        return True

    def commit(self) -> None:
        if self._tx is not None and self._prepared:
            self._tx.commit()  # COMMIT PREPARED
        else:
            finish_prepared(self._engine, self._gid, commit=True)
        self._close()

    def rollback(self) -> None:
        if self._tx is not None:
            self._tx.rollback()  # ROLLBACK, or ROLLBACK PREPARED once prepared
        else:
            finish_prepared(self._engine, self._gid, commit=False)
        self._close()

    def _close(self) -> None:
        self._tx = None
        self.session.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def finish_prepared(engine: Engine, gid: str, *, commit: bool) -> bool:
    """Commit or roll back the prepared transaction ``gid`` of ``engine``'s database if it
    is still there (``pg_prepared_xacts``); False if there was none (finished before, or
    never prepared: an unprepared transaction dies with its connection)."""
    check_participant_id(gid)
    verb = "COMMIT" if commit else "ROLLBACK"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        found = conn.execute(
            sa.text(
                "SELECT 1 FROM pg_prepared_xacts WHERE gid = :gid AND database = current_database()"
            ),
            {"gid": gid},
        ).first()
        if found is None:
            return False
        try:
            conn.exec_driver_sql(f"{verb} PREPARED '{gid}'")
        except sa.exc.DBAPIError as exc:
            # Another process finished it between the look and the statement.
            if getattr(exc.orig, "sqlstate", None) != "42704":
                raise
            return False
    log.info("prepared transaction %s: %s PREPARED", gid, verb)
    return True


def prepared_gids(engine: Engine, prefix: str = "condmsg-") -> list[str]:
    """The prepared transactions of ``engine``'s database whose id starts with ``prefix``."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT gid FROM pg_prepared_xacts "
                "WHERE database = current_database() AND gid LIKE :prefix ORDER BY gid"
            ),
            {"prefix": prefix + "%"},
        )
        return [gid for (gid,) in rows]
