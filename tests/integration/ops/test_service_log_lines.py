"""What the services log for an operator: intake workers log JSON with the service, a
database outage under the relay takes a few lines rather than one per retry, and the
evaluator sums up its decisions, pending and overdue CMs."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import outbox
from condmsg.core.conditions import Destination
from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.cli.test_cli_commands import (
    COMMAND,
    ROOT,
    cli_env,
)
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


def test_intake_workers_log_json_with_the_service(
    pg_url: str, amqp_url: str, unique_name: str
) -> None:
    sender = unique_name.replace(".", "-")
    args = ["evaluator", "--sender", sender, "--create-schema", "--intake-processes", "2"]
    args += ["--log-format", "json", "--db-url", pg_url, "--amqp-url", amqp_url]
    proc = subprocess.Popen(
        [*COMMAND, *args], cwd=ROOT, env=cli_env(), stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "intake worker" in line and "started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        lines += proc.stderr.readlines()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    records = [json.loads(line) for line in lines]  # every line, the workers' too
    assert any(r["logger"] == "evaluator.intake_worker" for r in records), lines


@pytest.fixture
def pg_proxy(pg_url: str) -> Iterator[tuple[TcpProxy, str]]:
    proxy = TcpProxy.to(pg_url)
    proxy.up()
    try:
        yield proxy, proxy.url(pg_url)
    finally:
        proxy.close()


def test_the_relay_logs_a_database_outage_in_a_few_lines(
    pg_proxy: tuple[TcpProxy, str], pg_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, url = pg_proxy
    setup = make_engine(pg_url)
    try:
        migrate.upgrade(setup, "outbox")
    finally:
        setup.dispose()
    engine = make_engine(url)
    relay = outbox.Relay(engine, outbox.RelayConfig(amqp_url=amqp_url))
    caplog.set_level(logging.INFO, logger="outbox")
    relay.start()
    try:
        wait_for(lambda: relay._listener is not None and relay._listener.listening.is_set(), 30)
        proxy.down()
        # The outage's first lines (one per change of what fails: the connection lost,
        # then refused), then the steady state: several retries of both the relay and its
        # LISTEN connection (whose backoff reaches seconds), which log nothing more.
        failures = relay.metrics.store_errors

        def refused(what: str) -> bool:
            return any(
                what in r.getMessage() and "Connection refused" in r.getMessage()
                for r in caplog.records
            )

        # Each says once that its connection is refused (the status is read every 5 s).
        steady = ("LISTEN", "cannot connect to the outbox", "cannot read the outbox status")
        wait_for(lambda: all(refused(what) for what in steady), 30)
        caplog.clear()
        quiet_from, counted = time.monotonic(), failures._value.get()
        wait_for(
            lambda: time.monotonic() > quiet_from + 6 and failures._value.get() >= counted + 3,
            60,
        )
        during = [r for r in caplog.records if r.levelno >= logging.WARNING]
        proxy.up()
        wait_for(lambda: any("works again" in r.getMessage() for r in caplog.records), 60)
    finally:
        relay.stop()
        engine.dispose()
    assert during == [], [r.getMessage() for r in during]
    again = [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]
    assert all("\n" not in line for line in again), again


def test_the_evaluator_sums_up_its_decisions_pending_and_overdue(
    sqlite_url: str,
    amqp_url: str,
    unique_name: str,
    make_sender: Any,
    caplog: pytest.LogCaptureFixture,
    test_secret: bytes,
) -> None:
    sender = make_sender(sqlite_url, unique_name.replace(".", "-"))
    sender.send(b"x", Destination(f"{unique_name}.q", pickup_within=timedelta(milliseconds=50)))
    caplog.set_level(logging.INFO, logger="evaluator.summary")
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=sender.name,
            db_url=sqlite_url,
            secret=test_secret,
            ack_grace=timedelta(milliseconds=10),
            sweep_interval_s=0.1,
            summary_interval_s=0.5,
            relay=False,
        )
    ).start()
    try:

        def summed() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "evaluator.summary"]

        wait_for(lambda: any("decided 1 CMs" in m for m in summed()), 30)
        wait_for(lambda: any(m.startswith("decided 0 CMs") for m in summed()), 30)
    finally:
        service.stop()
        service.engine.dispose()
    line = next(m for m in summed() if "decided 1 CMs" in m)
    assert "(1 violated)" in line and "pending" in line and "overdue" in line
    assert summed()[-1].endswith("0 pending, 0 overdue")
