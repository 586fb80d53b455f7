"""Operating the relay and the evaluator: the start banner and JSON logs, /healthz and
/readyz next to /metrics (ready when connected, 503 with the reason when RabbitMQ cannot
be reached), the metric names, the evaluator's gauges following the store, and a broken
store logged once rather than once per sweep."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination
from condmsg.core import protocol
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.gauges import ServiceGauges
from evaluator.metrics import EvaluatorMetrics
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import SECRET
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CLOSED_AMQP_URL = "amqp://guest:guest@127.0.0.1:1/"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET; (0, reason) while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError as error:
        return 0, str(error.reason)


class Service:
    """A service command in a subprocess with JSON logs, its stderr collected line by line."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.port = _free_port()
        self.lines: list[str] = []
        full = [*command, "--metrics-port", str(self.port), "--log-format", "json"]
        self.proc = subprocess.Popen(
            full, env={**os.environ, **env}, stderr=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(self.lines) if line.startswith("{")]

    def get(self, path: str) -> tuple[int, str]:
        return _get(self.port, path)

    def wait_answer(self, path: str, status: int, timeout: float = 30.0) -> str:
        def answered() -> str | None:
            code, body = self.get(path)
            return body if code == status else None

        try:
            return wait_for(answered, timeout=timeout)
        except AssertionError:
            raise AssertionError(
                f"{path} never answered {status}: last {self.get(path)}; log: {self.lines[-5:]}"
            ) from None

    def stop(self) -> int:
        self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._reader.join(5)
        return code


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        if service.proc.poll() is None:
            service.stop()


def _banner(service: Service, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((r for r in service.records() if r.get("service") == name), None)

    banner = wait_for(found, timeout=30)
    assert banner["level"] == "INFO"
    assert banner["message"].startswith(f"condmsg {banner['version']} {name} starting: ")
    assert "secret-password" not in json.dumps(service.records())
    return banner


def _with_password(pg_url: str) -> str:
    # Trust authentication ignores the password: there is one to hide in the banner.
    return pg_url.replace("postgres@", "postgres:secret-password@", 1)


def _process_env(pg_url: str, amqp_url: str) -> dict[str, str]:
    return {"CONDMSG_DB_URL": _with_password(pg_url), "CONDMSG_AMQP_URL": amqp_url}


def test_relay_banner_health_and_metrics(
    pg_url: str, amqp_url: str, services: list[Service]
) -> None:
    command = [sys.executable, "-m", "condmsg.cli", "relay", "--create-tables"]
    relay = Service(command, _process_env(pg_url, amqp_url))
    services.append(relay)
    banner = _banner(relay, "relay")
    assert banner["store"].startswith("postgresql+psycopg://postgres:***@127.0.0.1")
    assert banner["table"] == "condmsg_outbox"
    assert banner["metrics_port"] == relay.port
    assert relay.wait_answer("/readyz", 200) == "ok\n"
    assert relay.get("/healthz") == (200, "ok\n")
    status, metrics = relay.get("/metrics")
    assert status == 200
    for name in (
        'condmsg_outbox_published_total{table="condmsg_outbox"}',
        'condmsg_outbox_broker_connected{table="condmsg_outbox"} 1.0',
        "condmsg_outbox_backlog_rows",
        "condmsg_outbox_failed_rows",
        "condmsg_outbox_in_flight_messages",
        "process_resident_memory_bytes",
        "python_info",
        "condmsg_build_info{",
    ):
        assert name in metrics, name
    assert "\noutbox_" not in metrics
    assert relay.stop() == 0
    assert _get(relay.port, "/healthz")[0] == 0  # the port closed with the service


def test_relay_not_ready_while_rabbitmq_is_unreachable(
    pg_url: str, services: list[Service]
) -> None:
    command = [sys.executable, "-m", "condmsg.cli", "relay", "--create-tables"]
    relay = Service(command, _process_env(pg_url, CLOSED_AMQP_URL))
    services.append(relay)
    reason = wait_for(lambda: _unready_naming(relay, "127.0.0.1:1"), timeout=30)
    assert "cannot reach RabbitMQ at amqp://127.0.0.1:1: connection refused" in reason
    assert reason.endswith("\n") and reason.count("\n") == 1
    assert relay.get("/healthz") == (200, "ok\n")  # alive: waiting for the broker is its job


def _unready_naming(service: Service, text: str) -> str | None:
    code, body = service.get("/readyz")
    return body if code == 503 and text in body else None


def _metric(service: Service, line_start: str) -> float:
    for line in service.get("/metrics")[1].splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _evaluator_command(sender: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "evaluator",
        "--sender",
        sender,
        "--gauge-interval",
        "0.2",
        "--create-schema",
    ]


def test_evaluator_banner_health_and_metrics(
    pg_url: str, amqp_url: str, unique_name: str, services: list[Service]
) -> None:
    sender = unique_name.replace(".", "-")
    evaluator = Service(_evaluator_command(sender), _process_env(pg_url, amqp_url))
    services.append(evaluator)
    banner = _banner(evaluator, "evaluator")
    assert banner["sender"] == sender
    assert banner["consumes"] == protocol.ack_queue(sender)
    assert protocol.outcome_queue(sender) in banner["writes"]
    assert banner["store"].startswith("postgresql+psycopg://postgres:***@127.0.0.1")
    assert evaluator.wait_answer("/readyz", 200) == "ok\n"
    assert evaluator.get("/healthz") == (200, "ok\n")
    metrics = evaluator.get("/metrics")[1]
    for name in (
        "condmsg_evaluator_pending_cms 0.0",
        "condmsg_evaluator_overdue_cms 0.0",
        "condmsg_evaluator_ack_queue_messages",
        "condmsg_evaluator_sweep_failures_total 0.0",
        "condmsg_evaluator_decisions_total",
        "condmsg_outbox_broker_connected",
        "process_cpu_seconds_total",
        "condmsg_build_info{",
    ):
        assert name in metrics, name
    # APScheduler's line per sweep stays below INFO.
    assert not [r for r in evaluator.records() if r["logger"].startswith("apscheduler")]
    assert evaluator.stop() == 0


def test_evaluator_not_ready_while_rabbitmq_is_unreachable(
    pg_url: str, unique_name: str, services: list[Service]
) -> None:
    sender = unique_name.replace(".", "-")
    evaluator = Service(_evaluator_command(sender), _process_env(pg_url, CLOSED_AMQP_URL))
    services.append(evaluator)
    reason = wait_for(lambda: _unready_naming(evaluator, "127.0.0.1:1"), timeout=30)
    assert "RabbitMQ" in reason and reason.count("\n") == 1
    assert evaluator.get("/healthz") == (200, "ok\n")
    # Ten probes every 0.2 s, and meanwhile the consumer's retries with backoff: one line
    # each for the outage, not one per try.
    failures = 'condmsg_evaluator_gauge_refresh_failures_total{source="broker"}'
    wait_for(lambda: _metric(evaluator, failures) >= 10, timeout=30)
    for start in ("consuming the ack queue", "reading the depth of"):
        lines = [r for r in evaluator.records() if r["message"].startswith(start)]
        assert len(lines) == 1, lines
        # condmsg's own error says what to do in one line: no traceback with it.
        assert "exception" not in lines[0]


def _evaluator(pg_url: str, amqp_url: str, sender: str, **options: Any) -> Evaluator:
    config = EvaluatorConfig(
        amqp_url=amqp_url, sender=sender, db_url=pg_url, secret=SECRET, create=True, **options
    )
    return Evaluator(config)


def test_evaluator_gauges_follow_the_store(
    pg_url: str, amqp_url: str, unique_name: str, make_sender: Any
) -> None:
    name = unique_name.replace(".", "-")
    sender = make_sender(pg_url, name)
    condition = Destination(f"{unique_name}.q", pickup_within=timedelta(hours=1))
    for i in range(3):
        sender.send(f"m{i}".encode(), condition)
    # Sweeps an hour apart: nothing decides them while the gauges are watched.
    service = _evaluator(pg_url, amqp_url, name, sweep_interval_s=3600, gauge_interval_s=0.1)
    sample = service.registry.get_sample_value
    with service:
        wait_for(lambda: sample("condmsg_evaluator_pending_cms") == 3, timeout=15)
        assert sample("condmsg_evaluator_overdue_cms") == 0
        wait_for(lambda: service.readiness() is None, timeout=15)
        # Two CMs whose next check is due since longer than a sweep interval: overdue.
        cms = sa.table("condmsg_cm", sa.column("cm_id"), sa.column("next_check_at"))
        with service.engine.begin() as connection:
            ids = sorted(connection.scalars(sa.select(cms.c.cm_id)))[:2]
            past = utcnow() - timedelta(hours=2)
            connection.execute(cms.update().where(cms.c.cm_id.in_(ids)).values(next_check_at=past))
        wait_for(lambda: sample("condmsg_evaluator_overdue_cms") == 2, timeout=15)
        sender.send(b"m3", condition)
        wait_for(lambda: sample("condmsg_evaluator_pending_cms") == 4, timeout=15)
    service.engine.dispose()


def test_ack_backlog_gauge_counts_ready_messages(
    pg_url: str, amqp_url: str, unique_name: str
) -> None:
    name = unique_name.replace(".", "-")
    config = EvaluatorConfig(amqp_url=amqp_url, sender=name, db_url=pg_url)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        declare_service_queue(channel, protocol.ack_queue(name))
        for i in range(4):
            channel.basic_publish("", protocol.ack_queue(name), f"ack {i}".encode())
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
        engine = sa.create_engine(pg_url)
        gauges = ServiceGauges(config, engine, EvaluatorMetrics(registry), clock=utcnow)
        try:
            gauges.refresh_broker()
            assert gauges.broker_problem is None
            assert registry.get_sample_value("condmsg_evaluator_ack_queue_messages") == 4
        finally:
            gauges.close()
            engine.dispose()
    finally:
        connection.close()


def test_broken_store_is_logged_once_not_per_sweep(
    pg_url: str, amqp_url: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name.replace(".", "-")
    service = _evaluator(pg_url, amqp_url, name, sweep_interval_s=0.05, gauge_interval_s=0.1)
    sample = service.registry.get_sample_value
    caplog.set_level(logging.INFO)
    with service:
        wait_for(lambda: service.readiness() is None, timeout=15)
        with service.engine.begin() as connection:
            connection.execute(sa.text("ALTER TABLE condmsg_cm DROP COLUMN next_check_at"))
        wait_for(lambda: (sample("condmsg_evaluator_sweep_failures_total") or 0) >= 20, timeout=20)
        reason = service.readiness()
        assert reason is not None and "next_check_at" in reason
        sweep_lines = [r for r in caplog.records if r.getMessage().startswith("deadline sweep")]
        assert len(sweep_lines) == 1, [r.getMessage() for r in sweep_lines]
        assert "next_check_at" in sweep_lines[0].getMessage()
        assert sample("condmsg_evaluator_gauge_refresh_failures_total", {"source": "store"})
        # Mended: one line says so, and the service is ready again.
        with service.engine.begin() as connection:
            connection.execute(
                sa.text("ALTER TABLE condmsg_cm ADD COLUMN next_check_at TIMESTAMPTZ")
            )
        wait_for(
            lambda: any(
                r.getMessage().startswith("deadline sweep works again") for r in caplog.records
            ),
            timeout=15,
        )
        wait_for(lambda: service.readiness() is None, timeout=15)
    service.engine.dispose()
