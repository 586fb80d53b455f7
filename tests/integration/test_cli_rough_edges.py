"""The command line's rough edges a new user met (issue 37, "The CLI" 1-9), each as that
user meets it: a mistyped sender, a URL or a path that cannot be used, a store without its
schema, a stopped pipe, JSON logs from intake workers, a database outage under the relay,
messages that say what is wrong in the user's own terms, and the evaluator's summary line.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import outbox
from condmsg import migrate
from condmsg.conditions import Destination
from condmsg.db import make_engine
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import wait_for
from tests.integration.outbox_helpers import TcpProxy
from tests.integration.test_cli_commands import (
    COMMAND,
    ROOT,
    cli,
    cli_env,
    fails_with,
    queue_exists,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A SQLite sender store (with its outbox) that exists."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    try:
        migrate.upgrade(engine, "sender")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def empty(tmp_path: Path) -> str:
    """A SQLite file without any condmsg schema."""
    (tmp_path / "empty.db").touch()
    return f"sqlite:///{tmp_path / 'empty.db'}"


# -- 1: a mistyped sender -------------------------------------------------------------------


def test_outcomes_follow_of_a_sender_without_queues_creates_none(
    store: str, amqp_url: str, unique_name: str
) -> None:
    typo = unique_name.replace(".", "-")
    result = cli(
        "outcomes",
        "--sender",
        typo,
        "--follow",
        "--timeout",
        "1",
        "--db-url",
        store,
        "--amqp-url",
        amqp_url,
    )
    fails_with(result, 2, f"queue 'condmsg.{typo}.outcome' does not exist", "sender's name")
    for kind in ("ack", "dead", "outcome"):
        assert not queue_exists(amqp_url, f"condmsg.{typo}.{kind}")


# -- 2: tracebacks that become one line ------------------------------------------------------


def test_a_database_url_of_another_kind_is_one_line() -> None:
    fails_with(
        cli("status", "x", "--db-url", "mysql://u@h/db"),
        2,
        "unsupported database scheme 'mysql'",
        "postgresql+psycopg://",
        "sqlite:///",
    )


def test_an_export_output_that_cannot_be_used_is_one_line(store: str, tmp_path: Path) -> None:
    fails_with(cli("export", "--out", "/etc/passwd", "--db-url", store), 2, "not a directory")
    fails_with(
        cli("export", "--out", "/etc/passwd/x", "--db-url", store),
        2,
        "/etc/passwd is not a directory",
    )
    fails_with(
        cli("export", "--out", "/proc/nope", "--db-url", store),
        2,
        "cannot write the export to /proc/nope",
    )
    # An S3 endpoint that is not there: pyarrow's error, in one line, with the settings.
    s3 = "s3://bucket/x?region=us-east-1&scheme=http&endpoint_override=127.0.0.1:1"
    line = fails_with(cli("export", "--out", s3, "--db-url", store), 2, "cannot write the export")
    assert "AWS_ACCESS_KEY_ID" in line


def test_a_reader_that_goes_away_ends_a_command_quietly(store: str) -> None:
    proc = subprocess.Popen(
        [*COMMAND, "relay", "--status", "--db-url", store],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `| head -0` does, before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


# -- 3: exit codes --------------------------------------------------------------------------


def test_debug_shows_the_traceback_and_keeps_the_exit_code() -> None:
    result = cli("--debug", "status", "x", "--db-url", "mysql://u@h/db")
    assert result.returncode == 2, result.stderr
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("condmsg status: unsupported database")


def test_check_services_refuses_a_url_that_is_not_amqp() -> None:
    fails_with(cli("check-services", "--amqp-url", "http://x"), 2, "not an AMQP URL")


def test_the_evaluator_on_a_store_without_schema_does_not_say_it_started(
    empty: str, amqp_url: str
) -> None:
    result = cli("evaluator", "--sender", "s", "--db-url", empty, "--amqp-url", amqp_url)
    assert result.returncode == 2, result.stderr
    assert "cannot start" in result.stderr and "condmsg db upgrade" in result.stderr
    assert " started" not in result.stderr, result.stderr


# -- 4: export and retention on a store without its schema -----------------------------------


def test_export_and_retention_on_a_store_without_schema_name_the_fix(
    empty: str, tmp_path: Path
) -> None:
    fix = "condmsg db upgrade --store sender"
    fails_with(cli("export", "--out", str(tmp_path / "out"), "--db-url", empty), 2, fix)
    line = fails_with(
        cli("retention", "--older-than", "1d", "--archive", str(tmp_path / "a"), "--db-url", empty),
        2,
        fix,
    )
    assert "deleted" not in line and "relation" not in line


# -- 5: intake workers log as the service does ----------------------------------------------


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


# -- 6: the relay during a database outage --------------------------------------------------


@pytest.fixture
def pg_proxy(pg_url: str) -> Iterator[tuple[TcpProxy, str]]:
    parts = urlsplit(pg_url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    proxy.up()
    through = parts._replace(
        netloc=parts.netloc.replace(
            f"{parts.hostname}:{parts.port or 5432}", f"127.0.0.1:{proxy.port}"
        )
    ).geturl()
    try:
        yield proxy, through
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


# -- 7: messages in the user's terms ---------------------------------------------------------


def test_condition_errors_are_in_the_users_terms(store: str, tmp_path: Path) -> None:
    fails_with(
        cli(
            "send",
            "--sender",
            "s",
            "--condition",
            "{type: destination, name: q, pickup_within_ms: -5000}",
            "--db-url",
            store,
        ),
        2,
        "pickup_within must be positive, got -5000 ms",
    )
    fails_with(
        cli("send", "--sender", "s", "--condition", "", "--db-url", store),
        2,
        "--condition is empty",
    )
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 10_000)
    fails_with(
        cli("send", "--sender", "s", "--condition", str(deep), "--db-url", store),
        2,
        "nested too deeply (a tree has at most 32 levels)",
    )


def test_send_on_an_empty_database_names_the_sender_schema(empty: str, amqp_url: str) -> None:
    line = fails_with(
        cli(
            "send",
            "--sender",
            "s",
            "--condition",
            "{type: destination, name: q, pickup_within_ms: 5000}",
            "--db-url",
            empty,
            "--amqp-url",
            amqp_url,
        ),
        2,
        "the sender store",
        "no condmsg schema",
        "condmsg db upgrade --store sender",
    )
    assert "outbox store" not in line


def test_outbox_ids_that_are_not_parked_are_named(store: str) -> None:
    result = cli("outbox", "requeue", "--ids", "999", "--db-url", store)
    assert result.stdout.strip() == "requeued nothing"
    fails_with(result, 1, "1 of the rows named is not parked (no such row: 999)")
    result = cli("outbox", "purge", "--ids", "7", "8", "--yes", "--db-url", store)
    fails_with(result, 1, "2 of the rows named are not parked (no such row: 7, 8)")


def test_status_of_an_unknown_id_hints_at_retention(store: str) -> None:
    fails_with(cli("status", "gone", "--db-url", store), 1, "'gone'", "retention may have")


def test_export_into_a_directory_with_content_asks_for_overwrite(
    store: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    fails_with(cli("export", "--out", str(out), "--db-url", store), 2, "--overwrite")
    assert (out / "notes.txt").read_text() == "mine"
    done = cli("export", "--out", str(out), "--overwrite", "--db-url", store)
    assert done.returncode == 0, done.stderr
    assert (out / "_manifest.json").exists()


# -- 9: the evaluator's summary line ---------------------------------------------------------


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
