"""``condmsg check-services`` logs in and opens the database as the services do: wrong
credentials, a missing database, a store without its schema and missing queues fail it
with one line each and exit 1."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg.runtime import migrate

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "condmsg.cli", "check-services", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fails_with(result: subprocess.CompletedProcess[str], *said: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for text in said:
        assert text in lines[0]


def test_a_reachable_broker_and_database_pass(amqp_url: str, pg_url: str) -> None:
    result = _check("--amqp-url", amqp_url, "--db-url", pg_url)
    assert result.returncode == 0, result.stderr
    assert "answer" in result.stdout


def test_a_wrong_password_fails(amqp_url: str, pg_url: str) -> None:
    wrong = amqp_url.replace("guest:guest@", "guest:wrong@")
    _fails_with(_check("--amqp-url", wrong, "--db-url", pg_url), "refused the credentials")


def test_a_missing_virtual_host_fails_with_the_brokers_reason(amqp_url: str, pg_url: str) -> None:
    missing = urlsplit(amqp_url)._replace(path="/no_such_vhost").geturl()
    _fails_with(_check("--amqp-url", missing, "--db-url", pg_url), "vhost no_such_vhost not found")


def test_a_missing_database_fails(amqp_url: str, pg_url: str) -> None:
    missing = pg_url.replace("/test", "/no_such_database")
    _fails_with(_check("--amqp-url", amqp_url, "--db-url", missing), "no_such_database")


def test_a_store_without_its_schema_fails_until_upgraded(amqp_url: str, pg_url: str) -> None:
    args = ("--amqp-url", amqp_url, "--db-url", pg_url, "--store", "receiver")
    _fails_with(_check(*args), "missing", "condmsg db upgrade --store receiver")
    engine = sa.create_engine(pg_url)
    migrate.upgrade(engine, "receiver")
    engine.dispose()
    assert _check(*args).returncode == 0


def test_a_store_whose_outbox_nobody_publishes_fails(amqp_url: str, pg_url: str) -> None:
    """A receiver store whose acks wait in its outbox: no relay runs for it."""
    engine = sa.create_engine(pg_url)
    migrate.upgrade(engine, "receiver")
    args = ("--amqp-url", amqp_url, "--db-url", pg_url, "--store", "receiver")
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, exchange="", routing_key="q", body=b"ack")
    assert _check(*args).returncode == 0  # just written: a relay may be on its way
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE condmsg_outbox SET created_at = :at"),
            {"at": datetime.now(UTC) - timedelta(minutes=2)},
        )
    _fails_with(_check(*args), "1 message has waited up to ", "no relay publishes")
    engine.dispose()


def test_missing_sender_queues_fail(amqp_url: str, pg_url: str, unique_name: str) -> None:
    result = _check("--amqp-url", amqp_url, "--db-url", pg_url, "--sender", unique_name)
    _fails_with(result, f"condmsg.{unique_name}.ack", "does not exist")
