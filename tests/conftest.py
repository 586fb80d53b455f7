"""Shared fixtures.

Integration and end-to-end tests talk to the real RabbitMQ and PostgreSQL. A service that
cannot be reached makes those tests *fail* with a message naming how to start it; they are
never skipped (CI must not go green without them).

Isolation under pytest-xdist: every PostgreSQL test gets its own schema (selected through
the connection's ``search_path``) and every broker test names its queues through
``unique_name``, so two workers never see each other's rows or messages.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

AMQP_URL = os.environ.get("CONDMSG_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG_URL = os.environ.get("CONDMSG_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

_START_HINTS = {
    "RabbitMQ": "start it with `rabbitmq-server -detached`",
    "PostgreSQL": (
        "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
    ),
}


def _require_port(service: str, host: str, port: int) -> None:
    try:
        with socket.create_connection((host, port), timeout=3):
            return
    except OSError as exc:
        pytest.fail(
            f"cannot reach {service} at {host}:{port}: {exc}; {_START_HINTS[service]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of the real RabbitMQ broker (fails the test if it is down)."""
    _require_port("RabbitMQ", "127.0.0.1", 5672)
    return AMQP_URL


@pytest.fixture(scope="session")
def pg_engine_url() -> str:
    """URL of the real PostgreSQL database (fails the test if it is down)."""
    _require_port("PostgreSQL", "127.0.0.1", 5432)
    return PG_URL


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test run: use it as a prefix for queues and exchanges."""
    return f"t.{request.node.name[:24]}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pg_url(pg_engine_url: str) -> Iterator[str]:
    """A PostgreSQL URL whose ``search_path`` is a fresh schema, dropped after the test."""
    import sqlalchemy as sa

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_engine_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    options = quote(f"-csearch_path={schema}")
    sep = "&" if "?" in pg_engine_url else "?"
    try:
        yield f"{pg_engine_url}{sep}options={options}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A file-backed SQLite URL in the test's temporary directory."""
    return f"sqlite:///{tmp_path / 'condmsg.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs a test once against SQLite and once against the real PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))
