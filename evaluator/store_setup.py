"""The sender's store as the evaluator works on it: made ready once (tables and secret),
and read and written through the :class:`evaluator.store.DecisionStore` adapter that
serves its database, chosen once, here."""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from condmsg import tables
from condmsg.core import protocol
from condmsg.core.errors import ConfigError
from condmsg.core.wording import first_line
from condmsg.infra import backends
from condmsg.infra.backoff import Backoff
from condmsg.infra.repeated_failures import RepeatedFailures
from condmsg.runtime import migrate
from condmsg.runtime.db import describe_db_url
from condmsg.tables import store_secret
from evaluator.failures import FIRST_RETRY_S, MAX_RETRY_S
from evaluator.store import DecisionStore
from evaluator.store_psycopg import PsycopgDecisionStore
from evaluator.store_sqlalchemy import SqlAlchemyDecisionStore

log = logging.getLogger(__name__)


def decision_store(bind: Engine | Connection | Session) -> DecisionStore:
    """The :class:`DecisionStore` adapter for ``bind``'s database and driver."""
    return backends.pick(bind, psycopg=PsycopgDecisionStore(), portable=SqlAlchemyDecisionStore())


def check_new_sender(engine: Engine, sender: str) -> None:
    """:class:`ConfigError` if ``sender`` looks mistyped: its queues do not exist yet (the
    caller knows) and the store holds CMs of other senders but none of its own. A
    sender's first start finds an empty store (made by ``condmsg db upgrade``) or its own
    CMs (its application sent before the evaluator first ran); a store that serves someone
    else only is what a typo in ``--sender`` meets."""
    with engine.connect() as conn:
        other = another_sender(conn, sender)
    if other is not None:
        where = describe_db_url(engine.url)
        raise ConfigError(
            f"no sender {sender!r}: its ack queue {protocol.ack_queue(sender)} does not exist "
            f"and the store at {where} holds CMs of {other!r}, none of {sender!r}; check "
            "--sender (the name the application's Sender uses)"
        )


def another_sender(conn: Connection, sender: str) -> str | None:
    """The name of a sender with CMs in the store if ``sender`` has none there, else None
    (also for a store without any CM): what a mistyped sender name finds."""
    cms = tables.cms
    own = conn.execute(sa.select(cms.c.cm_id).where(cms.c.sender == sender).limit(1))
    if own.first() is not None:
        return None
    return conn.execute(sa.select(cms.c.sender).limit(1)).scalar()


class SenderStore:
    """The engine of a sender store, its :class:`DecisionStore` (``decisions``: the one
    for the engine's database, unless one is given), and its secret once known.

    Building one does not touch the database: :meth:`prepare` checks the schema (creating a
    missing store with ``create``) and reads the secret if none was given, and
    :meth:`wait_until_prepared` retries it while the database is unreachable, so a
    service started during a database outage waits for it instead of exiting.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        secret: bytes | None,
        create: bool,
        stop: threading.Event,
        decisions: DecisionStore | None = None,
    ) -> None:
        self.engine = engine
        self.decisions = decisions if decisions is not None else decision_store(engine)
        self._secret = secret or None
        self._create = create
        self._stop = stop
        self._prepared = threading.Event()
        self._preparing = threading.Lock()
        # Logged as every service logs a retried failure: once, then a reminder a minute.
        self._waits = RepeatedFailures(log, f"opening the store at {self.name}", traceback=False)

    @property
    def secret(self) -> bytes:
        """The key of the copies' tokens: the one given, else the store's."""
        if self._secret is None:
            self.prepare()
        assert self._secret is not None
        return self._secret

    @property
    def name(self) -> str:
        """The database URL without its password, for the log."""
        return describe_db_url(self.engine.url)

    def prepare(self) -> None:
        """Make the store ready once (its tables, the secret); raises if the database
        cannot be reached (:meth:`wait_until_prepared` retries)."""
        if self._prepared.is_set():  # every batch asks: no lock once it is done
            return
        with self._preparing:
            if self._prepared.is_set():
                return
            # A store that is missing, behind, ahead or changed by hand is refused with
            # one line naming the fix (``create`` makes a missing one).
            migrate.ensure(self.engine, "sender", models=[tables.metadata], create=self._create)
            if self._secret is None:
                self._secret = store_secret(self.engine)
            self._prepared.set()

    def wait_until_prepared(self, stop: threading.Event | None = None) -> bool:
        """:meth:`prepare`, retried with backoff while the database is unreachable (logged
        once, then a reminder a minute, and once when it opens); False if the service was
        stopped (or ``stop`` set) meanwhile. A configuration error (:class:`ConfigError`)
        is raised: no retry mends it."""
        retries = Backoff(FIRST_RETRY_S, MAX_RETRY_S, stop=self._stop)
        while True:
            try:
                self.prepare()
                self._waits.succeeded()
                return True
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                if self._stop.is_set() or (stop is not None and stop.is_set()):
                    return False
                reason = first_line(exc)
                self._waits.failed(reason, level=logging.WARNING)
                retries.wait(stop)
