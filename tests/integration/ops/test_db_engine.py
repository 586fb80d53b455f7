"""The PostgreSQL engine's liveness check: pooled connections pinged only after idling."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from condmsg.runtime import db


@pytest.fixture
def engine(pg_engine_url: str) -> Iterator[Engine]:
    engine = db.make_engine(pg_engine_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _terminate(pg_engine_url: str, pid: int) -> None:
    killer = sa.create_engine(pg_engine_url, poolclass=sa.pool.NullPool)
    with killer.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
    killer.dispose()


def test_a_connection_the_server_dropped_while_idle_is_replaced_before_use(
    engine: Engine, pg_engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.0)  # every pooled connection has idled
    first = _backend_pid(engine)
    _terminate(pg_engine_url, first)
    second = _backend_pid(engine)  # no error: the ping found the dead one and replaced it
    assert second != first
    assert _backend_pid(engine) == second  # and the new one is pooled as usual


def test_a_connection_back_in_the_pool_just_now_is_not_pinged(
    engine: Engine, pg_engine_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 3600.0)
    pings: list[object] = []
    original = engine.dialect.do_ping

    def counting_ping(dbapi_conn: object) -> bool:
        pings.append(dbapi_conn)
        return bool(original(dbapi_conn))

    monkeypatch.setattr(engine.dialect, "do_ping", counting_ping)
    first = _backend_pid(engine)
    assert _backend_pid(engine) == first
    assert pings == []
    # Not pinged, a connection the server dropped fails its first statement; SQLAlchemy
    # invalidates it and the next checkout connects afresh.
    _terminate(pg_engine_url, first)
    with pytest.raises(sa.exc.DBAPIError) as failed:
        _backend_pid(engine)
    assert failed.value.connection_invalidated
    assert _backend_pid(engine) != first
