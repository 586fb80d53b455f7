"""The commands as a new user meets them: a mistyped sender, a URL or a path that cannot
be used, a store without its schema, a stopped pipe, a condition or an id that is wrong;
each says what is wrong in the user's own terms, in one line (the traceback only with
``--debug``), and creates nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine
from tests.integration.cli.test_cli_commands import (
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
