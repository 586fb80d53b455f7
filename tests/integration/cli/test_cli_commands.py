"""The ``condmsg`` commands against the real RabbitMQ and PostgreSQL, run as a person runs
them (a subprocess): send, consume, outcomes and outbox do their work, and every way they
can fail says so in one line, with no traceback, and the documented exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import outbox
from condmsg import tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.condition_codec import condition_from_json
from condmsg.core.conditions import Destination
from condmsg.runtime import migrate
from condmsg.runtime.db import make_engine
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.condmsg_helpers import acks_in
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]
SECRET = "cli-test-secret-2c6f0a9e8b7d1345"
COMMAND = (sys.executable, "-m", "condmsg.cli")
#: A condition given on the command line.
INLINE = "{type: destination, name: q, pickup_within_ms: 5}"
#: Settings the commands must not pick up from the environment the tests run in.
_OURS = ("CONDMSG_DB_URL", "CONDMSG_AMQP_URL", "CONDMSG_SECRET")


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 90,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*COMMAND, *args],
        cwd=ROOT,
        env=cli_env(env),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def send(
    sender: str, condition: str | Path, db_url: str, amqp_url: str, *extra: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """``condmsg send`` as ``sender`` under ``condition`` (a file or a document)."""
    urls = ("--db-url", db_url, "--amqp-url", amqp_url)
    return cli("send", "--sender", sender, "--condition", str(condition), *urls, *extra, **kw)


def consume(
    unique_name: str, store: Path, amqp_url: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``condmsg consume`` of the test's queue ``<unique_name>.q`` with its own invalid
    queue and a SQLite receiver store at ``store``."""
    return cli(
        "consume",
        f"{unique_name}.q",
        "--invalid-queue",
        f"{unique_name}.invalid",
        "--db-url",
        f"sqlite:///{store}",
        "--amqp-url",
        amqp_url,
        "--create-schema",
        *extra,
    )


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _OURS}
    return base | {"PYTHONPATH": str(ROOT), "CONDMSG_SECRET": SECRET} | (env or {})


def fails_with(result: subprocess.CompletedProcess[str], code: int, *said: str) -> str:
    """Exit ``code`` and exactly one line on stderr, no traceback, containing ``said``
    (besides the line a blocking command says what it waits for with)."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if not _waiting(line)]
    assert len(lines) == 1, result.stderr
    for text in said:
        assert text in lines[0], lines[0]
    return lines[0]


def _waiting(line: str) -> bool:
    return line.startswith("condmsg ") and ": waiting for " in line


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def sender(unique_name: str, pg_url: str) -> str:
    """A sender name whose queues the shared fixtures delete after the test; its store is
    created first, as an operator does with ``condmsg db upgrade``."""
    engine = make_engine(pg_url)
    try:
        migrate.upgrade(engine, "sender")
    finally:
        engine.dispose()
    return unique_name.replace(".", "-")


@pytest.fixture
def yaml_condition(tmp_path: Path, unique_name: str) -> Path:
    path = tmp_path / "condition.yaml"
    path.write_text(
        f"# the paper's Example 2, shortened\ntype: destination\nname: {unique_name}.q\n"
        "pickup_within_ms: 20000\nevaluation_timeout_ms: 21000\n"
    )
    return path


def publish_outbox(db_url: str, amqp_url: str) -> None:
    """What `condmsg relay` does for the store, until nothing is left to publish."""
    engine = make_engine(db_url)
    try:
        outbox.Relay(engine, outbox.RelayConfig(amqp_url=amqp_url)).run_until_idle(30)
    finally:
        engine.dispose()


def queue_exists(amqp_url: str, queue: str) -> bool:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        connection.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if connection.is_open:
            connection.close()


@pytest.fixture
def evaluator(pg_url: str, amqp_url: str, sender: str) -> Iterator[Evaluator]:
    """The evaluator of ``sender`` (with its relay, which publishes the sender's store)."""
    service = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=sender,
            db_url=pg_url,
            secret=SECRET.encode(),
            ack_grace=timedelta(milliseconds=100),
            sweep_interval_s=0.1,
        )
    ).start()
    try:
        yield service
    finally:
        service.stop()
        service.engine.dispose()


# -- send ---------------------------------------------------------------------------------


def test_send_records_a_cm_under_a_yaml_condition_with_the_payload_from_stdin(
    pg_url: str, amqp_url: str, sender: str, unique_name: str, yaml_condition: Path
) -> None:
    sent = send(
        sender, yaml_condition, pg_url, amqp_url, "--payload", "-", stdin=b"flight LH400 inbound"
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == ""
    (cm_id,) = sent.stdout.split()
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            cm = conn.execute(sa.select(tables.cms).where(tables.cms.c.cm_id == cm_id)).one()
    finally:
        engine.dispose()
    assert cm.sender == sender
    assert condition_from_json(cm.condition_json) == Destination(
        f"{unique_name}.q",
        pickup_within=timedelta(seconds=20),
        evaluation_timeout=timedelta(seconds=21),
    )
    publish_outbox(pg_url, amqp_url)
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        method, _props, body = connection.channel().basic_get(f"{unique_name}.q", auto_ack=True)
    finally:
        connection.close()
    assert method is not None and body == b"flight LH400 inbound"


def test_send_takes_an_inline_json_condition_and_the_urls_from_the_environment(
    pg_url: str, amqp_url: str, sender: str, unique_name: str
) -> None:
    document = {
        "schema": 1,
        "condition": {"type": "destination", "name": f"{unique_name}.q", "pickup_within_ms": 5000},
    }
    sent = cli(
        "send",
        "--sender",
        sender,
        "--condition",
        json.dumps(document),
        env={"CONDMSG_DB_URL": pg_url, "CONDMSG_AMQP_URL": amqp_url},
    )
    assert sent.returncode == 0, sent.stderr
    assert len(sent.stdout.split()) == 1


def test_send_wait_prints_the_outcome_and_outcomes_lists_it(
    pg_url: str,
    amqp_url: str,
    sender: str,
    unique_name: str,
    yaml_condition: Path,
    tmp_path: Path,
    evaluator: Evaluator,
) -> None:
    urls = ("--db-url", pg_url, "--amqp-url", amqp_url)
    waits = ("--wait", "60", *urls)
    waiting = subprocess.Popen(
        [*COMMAND, "send", "--sender", sender, "--condition", str(yaml_condition), *waits],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The sender declares the destination queue as it sends.
        wait_for(lambda: queue_exists(amqp_url, f"{unique_name}.q"), timeout=60)
        read = consume(
            unique_name,
            tmp_path / "rx.db",
            amqp_url,
            *("--recipient", "controller-7", "--count", "1", "--timeout", "30"),
        )
        assert read.returncode == 0, read.stderr
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0, err
    cm_id, outcome_line = out.splitlines()
    outcome = json.loads(outcome_line)
    assert (outcome["cm_id"], outcome["verdict"]) == (cm_id, "satisfied")
    assert json_lines(read.stdout)[0]["cm_id"] == cm_id

    listed = cli("outcomes", "--sender", sender, *urls)
    assert listed.returncode == 0, listed.stderr
    assert [(o["cm_id"], o["verdict"]) for o in json_lines(listed.stdout)] == [(cm_id, "satisfied")]
    later = cli("outcomes", "--sender", sender, "--since", "2999-01-01T00:00:00", *urls)
    assert later.returncode == 0 and later.stdout == ""

    followed = cli("outcomes", "--sender", sender, "--follow", "--timeout", "2", *urls)
    assert followed.returncode == 0, followed.stderr
    assert [o["cm_id"] for o in json_lines(followed.stdout)] == [cm_id]


def test_send_wait_exits_1_when_the_condition_is_violated(
    pg_url: str, amqp_url: str, sender: str, unique_name: str, evaluator: Evaluator
) -> None:
    condition = f"{{type: destination, name: {unique_name}.q, pickup_within_ms: 300}}"
    sent = send(sender, condition, pg_url, amqp_url, "--wait", "30")
    assert sent.returncode == 1, sent.stderr
    cm_id, line = sent.stdout.splitlines()
    assert json.loads(line)["verdict"] == "violated"
    assert json.loads(line)["cm_id"] == cm_id


def test_send_wait_exits_1_with_one_line_when_nobody_decides(
    pg_url: str, amqp_url: str, sender: str, yaml_condition: Path
) -> None:
    sent = send(sender, yaml_condition, pg_url, amqp_url, "--wait", "0.5")
    fails_with(sent, 1, "not decided within 0.5 s", f"condmsg evaluator --sender {sender}")
    assert len(sent.stdout.split()) == 1  # the CM id was printed before the wait


# -- consume ------------------------------------------------------------------------------


def _sent(pg_url: str, amqp_url: str, sender: str, condition: str, payload: bytes) -> str:
    sent = send(sender, condition, pg_url, amqp_url, "--payload", "-", stdin=payload)
    assert sent.returncode == 0, sent.stderr
    publish_outbox(pg_url, amqp_url)
    return sent.stdout.strip()


def test_consume_prints_json_lines_and_its_read_acks_leave(
    pg_url: str, amqp_url: str, sender: str, unique_name: str, tmp_path: Path, channel: Any
) -> None:
    condition = f"{{type: destination, name: {unique_name}.q, pickup_within_ms: 60000}}"
    text_id = _sent(pg_url, amqp_url, sender, condition, b"hello")
    binary_id = _sent(pg_url, amqp_url, sender, condition, b"\xff\x00")
    read = consume(
        unique_name,
        tmp_path / "rx.db",
        amqp_url,
        *("--recipient", "alice", "--count", "2", "--timeout", "30"),
    )
    assert read.returncode == 0, read.stderr
    (waiting,) = read.stderr.splitlines()
    assert waiting.startswith(f"condmsg consume: waiting for messages on '{unique_name}.q'")
    assert "until 2 messages or 30 s without one; Ctrl-C to stop" in waiting
    first, second = json_lines(read.stdout)
    assert (first["cm_id"], first["kind"], first["payload"]) == (text_id, "original", "hello")
    assert first["destination"] == f"{unique_name}.q"
    assert first["headers"][protocol.H_SENDER] == sender
    assert protocol.H_TOKEN not in first["headers"]
    assert (second["cm_id"], second["payload_base64"]) == (binary_id, "/wA=")
    # The READ acks were relayed before the command exited.
    acks = acks_in(channel, sender)
    assert sorted(a.cm_id for a in acks) == sorted([text_id, binary_id])
    assert {a.kind for a in acks} == {AckKind.READ}


def test_consume_exec_commits_only_when_the_command_succeeds(
    pg_url: str, amqp_url: str, sender: str, unique_name: str, tmp_path: Path, channel: Any
) -> None:
    condition = f"{{type: destination, name: {unique_name}.q, process_within_ms: 60000}}"
    cm_id = _sent(pg_url, amqp_url, sender, condition, b"book room 4.11")
    common = ("--recipient", "bob", "--transactional", "--count", "1", "--timeout", "30")
    store = tmp_path / "rx.db"
    refused = consume(unique_name, store, amqp_url, *common, "--exec", "cat >/dev/null; exit 3")
    fails_with(refused, 1, "exited 3", "rolled back")
    assert acks_in(channel, sender) == []

    out = tmp_path / "handled.txt"
    handled = consume(unique_name, store, amqp_url, *common, "--exec", f"cat > {out}")
    assert handled.returncode == 0, handled.stderr
    assert out.read_bytes() == b"book room 4.11"
    acks = acks_in(channel, sender)
    assert [(a.cm_id, a.kind) for a in acks] == [(cm_id, AckKind.COMMIT)]


def test_consume_refuses_a_queue_that_does_not_exist(
    amqp_url: str, unique_name: str, tmp_path: Path
) -> None:
    missing = f"{unique_name}.none"
    store = tmp_path / "rx.db"
    result = cli(
        "consume",
        missing,
        "--recipient",
        "alice",
        "--db-url",
        f"sqlite:///{store}",
        "--amqp-url",
        amqp_url,
        "--create-schema",
    )
    fails_with(result, 2, repr(missing), "does not exist")
    assert not queue_exists(amqp_url, missing)
    assert not store.exists()


def test_consume_says_when_fewer_messages_came_than_counted(
    amqp_url: str, unique_name: str, tmp_path: Path, channel: Any
) -> None:
    channel.queue_declare(f"{unique_name}.q", durable=True)
    result = consume(
        unique_name,
        tmp_path / "rx.db",
        amqp_url,
        *("--recipient", "alice", "--count", "1", "--timeout", "0.5"),
    )
    fails_with(result, 1, "0 of 1 messages")


# -- outbox -------------------------------------------------------------------------------


def test_outbox_lists_requeues_and_purges_parked_rows(
    pg_url: str, amqp_url: str, unique_name: str
) -> None:
    engine = make_engine(pg_url)
    outbox.create_tables(engine)
    gone = f"{unique_name}.ex"
    with Session(engine) as s, s.begin():
        ids = outbox.enqueue_many(
            s, [outbox.OutboxMessage(exchange=gone, routing_key="k", body=b"x")] * 3
        )
    try:
        outbox.Relay(engine, outbox.RelayConfig(amqp_url=amqp_url)).run_until_idle(30)
        store = outbox.OutboxStore(engine)
        assert store.status().failed == 3

        env = {"CONDMSG_DB_URL": pg_url}  # the environment's store, as --help says
        listed = cli("outbox", "list", env=env)
        assert listed.returncode == 0, listed.stderr
        rows = json_lines(listed.stdout)
        assert [r["id"] for r in rows] == ids
        assert rows[0]["destination"] == f"{gone}/k"
        assert "condmsg outbox requeue" in rows[0]["reason"]
        assert rows[0]["attempts"] >= 1 and rows[0]["created"] and rows[0]["parked"]

        requeued = cli("outbox", "requeue", "--ids", str(ids[0]), env=env)
        assert requeued.returncode == 0, requeued.stderr
        assert requeued.stdout.startswith("requeued 1 parked row;"), requeued.stdout
        assert store.status().pending == 1 and store.status().failed == 2
        fails_with(cli("outbox", "requeue", "--ids", str(ids[0]), env=env), 1, "not parked")

        fails_with(cli("outbox", "purge", "--all", env=env), 2, "--yes")
        fails_with(cli("outbox", "requeue", env=env), 2, "--ids", "--all")
        purged = cli("outbox", "purge", "--all", "--yes", "--db-url", pg_url)
        assert purged.returncode == 0, purged.stderr
        assert purged.stdout.strip() == "deleted 2 parked rows"
        assert store.status().failed == 0 and store.status().pending == 1
    finally:
        engine.dispose()


# -- errors a person can act on -----------------------------------------------------------


def test_a_wrong_broker_password_is_one_line(
    pg_url: str, amqp_url: str, sender: str, yaml_condition: Path
) -> None:
    wrong = amqp_url.replace("guest:guest@", "guest:wrong@")
    result = send(sender, yaml_condition, pg_url, wrong)
    line = fails_with(result, 2, "refused the credentials")
    assert "wrong" not in line


@pytest.mark.parametrize(
    "command",
    [
        ["consume", "q", "--recipient", "r"],
        ["outcomes", "--sender", "s", "--follow", "--timeout", "1"],
    ],
)
def test_a_broker_that_is_not_there_is_one_line(
    command: list[str], sqlite_url: str, tmp_path: Path
) -> None:
    (tmp_path / "condmsg.db").touch()
    result = cli(*command, "--db-url", sqlite_url, "--amqp-url", "amqp://guest:guest@127.0.0.1:1/")
    fails_with(result, 2, "cannot reach RabbitMQ at amqp://127.0.0.1:1/", "is the broker running")


@pytest.mark.parametrize(
    "command",
    [
        ["status", "cm-1"],
        ["outcomes", "--sender", "s"],
        ["outbox", "list"],
        ["db", "upgrade"],
        [
            "send",
            "--sender",
            "s",
            "--condition",
            "{type: destination, name: q, pickup_within_ms: 5}",
        ],
    ],
)
def test_a_database_that_is_not_there_is_one_line(command: list[str], amqp_url: str) -> None:
    down = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/test"
    line = fails_with(
        cli(*command, "--db-url", down, env={"CONDMSG_AMQP_URL": amqp_url}),
        2,
        "cannot use the database at postgresql+psycopg://postgres:***@127.0.0.1:1/test",
        "is PostgreSQL running?",
    )
    assert "hunter2" not in line


def test_a_missing_database_is_one_line(pg_url: str) -> None:
    missing = pg_url.replace("/test", "/no_such_database")
    fails_with(
        cli("outcomes", "--sender", "s", "--db-url", missing),
        2,
        'database "no_such_database" does not exist',
        "create the database",
    )


@pytest.mark.parametrize(
    ("command", "store"),
    [
        (["outcomes", "--sender", "s"], "sender"),
        (["status", "cm-1"], "sender"),
        (["outbox", "list"], "outbox"),
    ],
)
def test_a_store_without_its_schema_is_one_line(
    command: list[str], store: str, pg_url: str
) -> None:
    fails_with(cli(*command, "--db-url", pg_url), 2, f"condmsg db upgrade --store {store}")


def test_files_that_cannot_be_read_are_one_line(
    pg_url: str, amqp_url: str, tmp_path: Path, yaml_condition: Path
) -> None:
    urls = ("--db-url", pg_url, "--amqp-url", amqp_url)
    missing = tmp_path / "nothing.yaml"
    fails_with(
        cli("send", "--sender", "s", "--condition", str(missing), *urls),
        2,
        f"no such file: {missing}",
    )
    fails_with(
        cli("send", "--sender", "s", "--condition", str(yaml_condition), "--payload", "/", *urls),
        2,
        "a directory, not a file: /",
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("type: destination\nname: [unclosed\n")
    fails_with(
        cli("send", "--sender", "s", "--condition", str(bad), *urls),
        2,
        "--condition: condition: neither JSON nor YAML",
    )
    fails_with(
        cli("send", "--sender", "s", "--condition", "-", "--payload", "-", *urls, stdin=b""),
        2,
        "only one of --condition and --payload",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_file_is_one_line(
    pg_url: str, amqp_url: str, tmp_path: Path, yaml_condition: Path
) -> None:
    secret = tmp_path / "payload"
    secret.write_bytes(b"x")
    secret.chmod(0)
    result = cli(
        "send",
        "--sender",
        "s",
        "--condition",
        str(yaml_condition),
        "--payload",
        str(secret),
        "--db-url",
        pg_url,
        "--amqp-url",
        amqp_url,
    )
    fails_with(result, 2, f"permission denied: {secret}")


def test_debug_shows_the_traceback_instead(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.yaml"
    plain = cli("outcomes", "--sender", "s", "--db-url", f"sqlite:///{missing}")
    fails_with(plain, 2, f"no store at {missing}")
    debug = cli("--debug", "outcomes", "--sender", "s", "--db-url", f"sqlite:///{missing}")
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "ConfigError" in debug.stderr
    assert not missing.exists()


def test_no_command_names_a_database_by_itself(tmp_path: Path) -> None:
    for command in (
        [
            "send",
            "--sender",
            "s",
            "--condition",
            "{type: destination, name: q, pickup_within_ms: 5}",
        ],
        ["consume", "q", "--recipient", "r"],
        ["outcomes", "--sender", "s"],
        ["outbox", "list"],
        ["export", "--out", str(tmp_path / "out")],
    ):
        fails_with(cli(*command), 2, "--db-url or CONDMSG_DB_URL")
    assert not (ROOT / "condmsg.db").exists()
    assert list(tmp_path.iterdir()) == []
