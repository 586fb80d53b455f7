"""A password in a database URL's query string (``?password=``, which psycopg hands to
libpq) is masked wherever condmsg prints the URL: the relay's start-up line, its metrics,
``condmsg relay --status`` and a command's error line. SQLAlchemy's ``hide_password``
masks only the user info's password, so each of these is checked."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.cli.test_cli_commands import COMMAND, ROOT, cli_env
from tests.integration.ops.test_ops_services import Service, _banner

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

PASSWORD = "s3cret-in-the-query"


@pytest.fixture
def relay(pg_url: str, amqp_url: str) -> Iterator[tuple[Service, dict[str, str]]]:
    # The test database trusts local connections: libpq sends the password unasked for.
    env = cli_env({"CONDMSG_DB_URL": f"{pg_url}&password={PASSWORD}", "CONDMSG_AMQP_URL": amqp_url})
    service = Service([*COMMAND, "relay", "--create-tables"], env)
    try:
        yield service, env
    finally:
        service.stop()


def test_the_relay_never_prints_a_query_string_password(
    relay: tuple[Service, dict[str, str]],
) -> None:
    service, env = relay
    banner = _banner(service, "relay")
    assert "password=***" in banner["store"], banner
    service.wait_answer("/readyz", 200)
    _, metrics = service.get("/metrics")
    status = subprocess.run(
        [*COMMAND, "relay", "--status"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert status.returncode == 0, status.stderr
    assert service.stop() == 0
    printed = {
        "log": "".join(service.lines),
        "metrics": metrics,
        "status": status.stdout + status.stderr,
    }
    for where, text in printed.items():
        assert PASSWORD not in text, where


def test_an_error_line_masks_a_query_string_password() -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:1/test?password={PASSWORD}"
    done = subprocess.run(
        [*COMMAND, "status", "0" * 8, "--db-url", url],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert "password=***" in done.stderr and "Traceback" not in done.stderr
