"""Which implementation of a store serves a database: chosen once, here, from its engine.

Each store concern of condmsg (outbox rows, the sender's CM rows, the evaluator's decisions,
the receiver's RLOG and acks) is one small ``Protocol`` with two adapters:

- a **portable** one on SQLAlchemy Core, correct on every database SQLAlchemy speaks
  (SQLite is the embedded default; it runs on PostgreSQL too, which is how the contract
  tests hold the two adapters to the same behaviour);
- a **psycopg** one for PostgreSQL through the psycopg 3 driver, which sends batches as
  one statement with binary array parameters (see :mod:`condmsg.infra.fastpaths.pg`).

An object that owns an engine (a sender, a receiver, the evaluator, a relay) picks its
adapters when it is built, with :func:`pick`; a function that is handed a caller's session
(:func:`outbox.enqueue_all`) picks from the session's bind, which is one dictionary lookup.
Callers only ever see the protocol: no caller asks which database it runs on.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

T = TypeVar("T")


def uses_psycopg(bind: Engine | Connection | Session) -> bool:
    """True if ``bind`` talks to PostgreSQL through psycopg 3 (the psycopg adapters apply)."""
    if isinstance(bind, Session):
        bind = bind.get_bind()
    dialect = bind.dialect
    # The psycopg adapters run psycopg's blocking cursor; under SQLAlchemy's asyncio
    # extension (an AsyncEngine's sync facade) the connection is psycopg's AsyncConnection,
    # which the portable adapters serve through SQLAlchemy instead.
    return dialect.name == "postgresql" and dialect.driver == "psycopg" and not dialect.is_async


def pick(bind: Engine | Connection | Session, *, psycopg: T, portable: T) -> T:
    """The adapter for ``bind``: ``psycopg`` on PostgreSQL via psycopg 3, else ``portable``."""
    return psycopg if uses_psycopg(bind) else portable


def psycopg_connection(bind: Session | Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under ``bind`` (checked out now, inside its transaction).

    Only the psycopg adapters call this, and they are only chosen for such binds; anything
    else is a programming error, reported as one.
    """
    conn = bind.connection() if isinstance(bind, Session) else bind
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(f"a psycopg adapter was handed a {conn.dialect.name} connection")
    return driver
