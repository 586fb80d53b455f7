"""What an operator meets first: an evaluator on a store without its schema, a first start
for a new sender, typos in a sender name or a SQLite path (refused in one line, creating
nothing), a broken JSON condition, and an outcome queue that nobody reads (bounded)."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from condmsg import Destination
from condmsg.core import protocol
from condmsg.core.errors import ConfigError
from condmsg.runtime.db import make_engine
from condmsg.runtime.migrate import SchemaError
from condmsg.runtime.topology import OUTCOME_TTL, declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.consume import refuse_unknown_sender
from evaluator.service import Evaluator
from tests.integration.cli import test_cli_error_messages
from tests.integration.cli.test_cli_commands import cli, fails_with, queue_exists
from tests.integration.condmsg_helpers import SECRET
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

SERVICE_QUEUES = ("ack", "outcome", "dead")
#: A SQLite sender store made as an operator makes one (``condmsg db upgrade``).
store = test_cli_error_messages.store


def _sender_with_a_cm(make_sender: Any, db_url: str, unique_name: str) -> str:
    """A sender that sent one CM (its queues not declared): the store knows its name."""
    name = unique_name.replace(".", "-")
    make_sender(db_url, name, declare_queues=False).send(
        b"x", Destination(f"{unique_name}.q", pickup_within=timedelta(minutes=1))
    )
    return name


def _config(
    amqp_url: str, db_url: str, sender: str, gauge_interval_s: float = 15.0
) -> EvaluatorConfig:
    return EvaluatorConfig(
        amqp_url=amqp_url,
        db_url=db_url,
        sender=sender,
        secret=SECRET,
        relay=False,
        sweep_interval_s=3600.0,
        gauge_interval_s=gauge_interval_s,
    )


def test_with_evaluator_on_a_store_without_schema_raises_on_entry(
    tmp_path: Path, amqp_url: str, unique_name: str
) -> None:
    (tmp_path / "empty.db").touch()
    sender = unique_name.replace(".", "-")
    service = Evaluator(_config(amqp_url, f"sqlite:///{tmp_path / 'empty.db'}", sender))
    with pytest.raises(SchemaError, match="condmsg db upgrade --store sender"), service:
        pytest.fail("the block ran on a store without its schema")
    assert not service.running
    for kind in SERVICE_QUEUES:
        assert not queue_exists(amqp_url, f"condmsg.{sender}.{kind}")


def test_a_new_senders_evaluator_without_relay_is_ready_at_once_and_quiet(
    store: str, amqp_url: str, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its first start declares the queues; /readyz does not wait a gauge interval for
    it, and the gauges' look at a queue not declared yet is not logged."""
    caplog.set_level(logging.INFO)
    sender = unique_name.replace(".", "-")
    service = Evaluator(_config(amqp_url, store, sender, gauge_interval_s=600.0))
    with service:
        wait_for(lambda: service.readiness() is None, timeout=10, what="the evaluator ready")
    assert queue_exists(amqp_url, protocol.ack_queue(sender))
    # pika's own lines are off in the services (condmsg.runtime.logging_setup).
    noisy = [
        r for r in caplog.records if r.levelno >= logging.WARNING and not r.name.startswith("pika")
    ]
    assert not noisy, [r.getMessage() for r in noisy]


def test_an_evaluator_with_a_mistyped_sender_is_refused_and_creates_no_queue(
    pg_url: str, amqp_url: str, unique_name: str, make_sender: Any
) -> None:
    real = _sender_with_a_cm(make_sender, pg_url, unique_name)
    typo = f"{real}-typo"
    line = fails_with(
        cli("evaluator", "--sender", typo, "--db-url", pg_url, "--amqp-url", amqp_url),
        2,
        f"no sender {typo!r}",
        f"holds CMs of {real!r}",
        "check --sender",
    )
    assert "started" not in line
    for kind in SERVICE_QUEUES:
        assert not queue_exists(amqp_url, f"condmsg.{typo}.{kind}")
    # The sender whose CMs the store holds starts, its queues not declared yet.
    engine = make_engine(pg_url)
    refuse_unknown_sender(_config(amqp_url, pg_url, real), engine)
    with Evaluator(_config(amqp_url, pg_url, real)):
        wait_for(lambda: queue_exists(amqp_url, protocol.ack_queue(real)), timeout=10)
    # So does one never seen, once its queues exist (its application's Sender made them).
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        declare_service_queue(connection.channel(), protocol.ack_queue(typo))
    refuse_unknown_sender(_config(amqp_url, pg_url, typo), engine)
    engine.dispose()


def test_a_sender_name_with_spaces_is_refused(store: str, amqp_url: str, make_sender: Any) -> None:
    with pytest.raises(ConfigError, match="bad sender name 'a b'"):
        make_sender(store, "a b")
    with pytest.raises(ConfigError, match=r"bad sender name 'a\\tb'"):
        _config(amqp_url, store, "a\tb")
    for command in ("evaluator", "outcomes", "send"):
        args = [command, "--sender", "a b", "--db-url", store, "--amqp-url", amqp_url]
        if command == "outcomes":
            args.append("--follow")
        if command == "send":
            args += ["--condition", "{type: destination, name: q, pickup_within_ms: 5}"]
        fails_with(cli(*args), 2, "bad sender name 'a b'", "no spaces")
    for kind in SERVICE_QUEUES:
        assert not queue_exists(amqp_url, f"condmsg.a b.{kind}")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["db", "current"], 2),
        (["db", "check"], 1),
        (["check-services"], 2),
        (["relay", "--status"], 2),
        (["evaluator", "--sender", "s"], 2),
        (["consume", "q", "--recipient", "r"], 2),
        (["outcomes", "--sender", "s"], 2),
    ],
    ids=lambda a: a[0] if isinstance(a, list) else str(a),
)
def test_a_mistyped_sqlite_path_is_refused_and_not_created(
    args: list[str], code: int, tmp_path: Path, amqp_url: str
) -> None:
    missing = tmp_path / "stroe.db"
    db = f"sqlite:///{missing}"
    broker = [] if args[0] == "db" or "--status" in args else ["--amqp-url", amqp_url]
    fails_with(cli(*args, "--db-url", db, *broker), code, f"no store at {missing}")
    assert list(tmp_path.iterdir()) == []


def test_a_broken_json_condition_is_reported_as_json(store: str) -> None:
    fails_with(
        cli("send", "--sender", "s", "--condition", '{"name": }', "--db-url", store),
        2,
        "not valid JSON (Expecting value at line 1, column 10)",
    )


def test_outcomes_of_a_sender_the_store_does_not_know_is_refused(
    pg_url: str, amqp_url: str, unique_name: str, make_sender: Any
) -> None:
    real = _sender_with_a_cm(make_sender, pg_url, unique_name)
    fails_with(
        cli("outcomes", "--sender", "typo", "--db-url", pg_url),
        2,
        "no CMs of sender 'typo'",
        f"holds CMs of {real!r}",
    )
    known = cli("outcomes", "--sender", real, "--db-url", pg_url)
    assert known.returncode == 0 and known.stdout == "", known.stderr


def test_the_outcome_queue_is_bounded_and_an_older_one_is_used_as_it_is(
    store: str,
    amqp_url: str,
    unique_name: str,
    make_sender: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender = unique_name.replace(".", "-")
    queue = protocol.outcome_queue(sender)
    make_sender(store, sender)
    ttl = int(OUTCOME_TTL.total_seconds() * 1000)
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as connection:
        # The queue has the TTL: declaring it without is refused for that argument.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match=f"'{ttl}'"):
            declare_service_queue(connection.channel(), queue)
        # An outcome queue an earlier release declared (no TTL) keeps working, with a
        # warning that says how to bound it.
        connection.channel().queue_delete(queue)
        declare_service_queue(connection.channel(), queue)
    caplog.set_level(logging.WARNING, logger="condmsg.runtime.topology")
    make_sender(store, sender)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "condmsg.runtime.topology"]
    assert queue in warning
    assert "no message TTL" in warning and "set_policy" in warning
