"""An evaluator started while its database is unreachable waits for it (saying so, with
the URL's password hidden) and then works; neither the ``condmsg evaluator`` command nor
``condmsg relay --create-tables`` exits while it is down."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import SECRET, ack_body
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def proxy(pg_engine_url: str) -> Iterator[TcpProxy]:
    """A proxy to PostgreSQL, not listening yet: the database looks down until ``up()``."""
    made = TcpProxy.to(pg_engine_url)
    yield made
    made.close()


def _through(url: str, port: int, password: str | None = None) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    auth = f"{user}:{password}" if password else user
    return urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{port}"))


def test_an_evaluator_started_while_the_database_is_down_waits_for_it(
    pg_url: str,
    proxy: TcpProxy,
    unique_name: str,
    make_sender: Any,
    amqp_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name, declare_queues=False)
    q = f"{unique_name}.q"
    cm = sender.send(b"x", Destination(q, pickup_within=timedelta(minutes=1)))
    # The trust authentication ignores the password: it is there to be hidden in the log.
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=name,
            db_url=_through(pg_url, proxy.port, password="s3cret"),
            secret=SECRET,
            relay=False,
            sweep_interval_s=3600,
        )
    )
    caplog.set_level(logging.INFO, logger="evaluator.store_setup")
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(name))
        channel.basic_publish(
            "", protocol.ack_queue(name), ack_body(cm, q, utcnow(), receiver="rx")
        )
        with service:

            def waits() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.getMessage().startswith("opening the store at")
                ]

            seen = wait_for(waits, timeout=30)
            assert service.running
            assert f"127.0.0.1:{proxy.port}" in seen[0] and "retrying quietly" in seen[0]
            assert "s3cret" not in " ".join(seen) and "***" in seen[0]
            proxy.up()  # the database is back

            def decided() -> bool:
                with sender.engine.connect() as conn:
                    state = conn.execute(sa.select(tables.cms.c.state)).scalar_one()
                return state == "satisfied"

            wait_for(decided, timeout=60)
            # Once when it failed (reminders come a minute apart), once when it opened.
            assert [line for line in waits() if "works again" in line]
            assert len([line for line in waits() if "failed:" in line]) == 1, waits()


def test_the_evaluator_command_waits_for_the_database(amqp_url: str, unique_name: str) -> None:
    """``condmsg evaluator`` pointed at a database that is down keeps running and says
    what it waits for, rather than exiting with a traceback from table creation."""
    port = _free_port()
    env = os.environ | {
        "CONDMSG_DB_URL": f"postgresql+psycopg://postgres:pw@127.0.0.1:{port}/test",
        "CONDMSG_AMQP_URL": amqp_url,
        "CONDMSG_SECRET": SECRET.decode(),
    }
    sender = unique_name.replace(".", "-")
    command = [sys.executable, "-m", "evaluator", "--sender", sender, "--no-relay"]
    command += ["--create-schema"]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if any("opening the store at" in x for x in lines):
                break
        assert proc.poll() is None, "".join(lines)
        waiting = [x for x in lines if "opening the store at" in x]
        assert len(waiting) == 1, "".join(lines)
        assert f"127.0.0.1:{port}" in waiting[0] and "pw" not in waiting[0]
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_the_relay_command_creating_its_table_waits_for_the_database() -> None:
    """``condmsg relay --create-tables`` pointed at a database that is down keeps running
    and says what it waits for, as the running relay does."""
    port = _free_port()
    env = os.environ | {"CONDMSG_DB_URL": f"postgresql+psycopg://postgres:pw@127.0.0.1:{port}/t"}
    command = [sys.executable, "-m", "condmsg.cli", "relay", "--create-tables"]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(lines) < 2:
            line = proc.stderr.readline()
            if not line:
                break
            if "waiting for the database" in line:
                lines.append(line)
        assert proc.poll() is None, "".join(lines)
        assert len(lines) == 2, "".join(lines)
        assert f"127.0.0.1:{port}" in lines[0] and "pw" not in lines[0]
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130


@pytest.mark.parametrize("service", ["evaluator", "relay"])
def test_a_service_whose_credentials_are_refused_exits_2(
    amqp_url: str, pg_url: str, unique_name: str, service: str
) -> None:
    """A broker restart never refuses credentials; a wrong password does, for ever: after a
    few refusals in a row the service exits with one line saying why."""
    env = {
        **os.environ,
        "CONDMSG_AMQP_URL": amqp_url.replace("guest:guest@", "guest:wrong@"),
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_SECRET": SECRET.decode(),
    }
    sender = unique_name.replace(".", "-")
    command = {
        "evaluator": ["-m", "evaluator", "--sender", sender, "--create-schema", "--no-relay"],
        "relay": ["-m", "condmsg.cli", "relay", "--create-tables"],
    }[service]
    done = subprocess.run(
        [sys.executable, *command], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr  # configuration: no restart mends it
    stops = [line for line in done.stderr.splitlines() if f"the {service} stops" in line]
    assert len(stops) == 1 and "refused the" in stops[0], done.stderr
    assert "guest:wrong" not in done.stderr and "Traceback" not in done.stderr
