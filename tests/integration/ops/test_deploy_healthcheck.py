"""compose.yaml's sequence run here without Docker: the migration's command, then the relay's
and the evaluator's commands, each judged by the very healthcheck compose runs in their
containers (Python's urllib against /healthz and /readyz; the image has no curl), on a free port in
place of the containers' 9464 (the services are run as tests/integration/ops/test_ops_services.py
runs them)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.ops.test_ops_services import Service, _free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ROOT = Path(__file__).resolve().parents[3]
CONTAINER_PORT = "9464"
CONTAINER_BASE = f'"http://127.0.0.1:{CONTAINER_PORT}"'
CLOSED_AMQP_URL = "amqp://guest:guest@127.0.0.1:1/"


def _services() -> dict[str, Any]:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert isinstance(services, dict)
    return services


def _healthcheck(service: str, port: int) -> subprocess.CompletedProcess[str]:
    """The service's compose healthcheck (``CMD python -c SCRIPT``), asking ``port``."""
    test = _services()[service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert test[3].count(CONTAINER_BASE) == 1
    script = test[3].replace(CONTAINER_BASE, f'"http://127.0.0.1:{port}"')
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )


def _command(service: str, sender: str | None = None) -> list[str]:
    """The service's compose command after the image's entrypoint, ``condmsg``, with the
    sender replaced and without its metrics port (a :class:`Service` picks a free one)."""
    command = [str(part) for part in _services()[service]["command"]]
    if "--metrics-port" in command:
        at = command.index("--metrics-port")
        assert command[at + 1] == CONTAINER_PORT
        del command[at : at + 2]
    if sender is not None and "--sender" in command:
        command[command.index("--sender") + 1] = sender
    return [sys.executable, "-m", "condmsg.cli", *command]


@pytest.fixture
def started() -> Iterator[list[Service]]:
    running: list[Service] = []
    yield running
    for service in running:
        if service.proc.poll() is None:
            service.stop()


def _until_healthy(name: str, service: Service) -> None:
    def healthy() -> bool:
        assert service.proc.poll() is None, f"{name} ended: {service.lines[-5:]}"
        return _healthcheck(name, service.port).returncode == 0

    try:
        wait_for(healthy, timeout=45, interval=0.2)
    except AssertionError:
        last = _healthcheck(name, service.port).stderr.strip()
        raise AssertionError(f"{name} never healthy: {last}; log: {service.lines[-5:]}") from None


def _migrate(env: dict[str, str]) -> None:
    done = subprocess.run(
        _command("migrate"), env={**os.environ, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_after_the_migration_relay_and_evaluator_pass_their_healthchecks(
    pg_url: str, amqp_url: str, unique_name: str, started: list[Service]
) -> None:
    env = {"CONDMSG_DB_URL": pg_url, "CONDMSG_AMQP_URL": amqp_url}
    _migrate(env)
    # Nothing answers yet: unhealthy, and why.
    before = _healthcheck("relay", _free_port())
    assert before.returncode == 1
    assert before.stderr.startswith("not ready: ")

    sender = unique_name.replace(".", "-")
    services = {name: Service(_command(name, sender), env) for name in ("relay", "evaluator")}
    started.extend(services.values())
    for name, service in services.items():
        _until_healthy(name, service)
    for service in started:
        assert service.stop() == 0, service.lines[-5:]


def test_a_relay_that_cannot_reach_rabbitmq_is_unhealthy_with_the_reason(
    pg_url: str, started: list[Service]
) -> None:
    env = {"CONDMSG_DB_URL": pg_url, "CONDMSG_AMQP_URL": CLOSED_AMQP_URL}
    _migrate(env)
    relay = Service(_command("relay"), env)
    started.append(relay)

    def refused() -> subprocess.CompletedProcess[str] | None:
        assert relay.proc.poll() is None, f"the relay ended: {relay.lines[-5:]}"
        check = _healthcheck("relay", relay.port)
        # "connecting" until the first attempt has failed; then the reason.
        return check if "cannot reach RabbitMQ" in check.stderr else None

    check = wait_for(refused, timeout=30, interval=0.2)
    assert check.returncode == 1
    assert check.stderr.startswith("not ready: ")
    assert "cannot reach RabbitMQ at amqp://127.0.0.1:1" in check.stderr
    assert check.stderr.count("\n") == 1  # the service's one line, no traceback
