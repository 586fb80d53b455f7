"""The README's send/receive example runs as written: the sender and the receiver on
stores of their own (the sender's on PostgreSQL, the receiver's a SQLite file), each with
its relay, and the evaluator deciding the CM satisfied from the receiver's READ ack."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pika
import pytest

from condmsg.core import protocol
from condmsg.runtime.amqp import connect
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[3]
SECRET = "readme-example-secret-0d5a8c3f6e2b9147"
QUEUES = (
    "qcentral",
    protocol.ack_queue("scheduler"),
    protocol.outcome_queue("scheduler"),
    protocol.dead_letter_queue("scheduler"),
)


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Sending and receiving") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def _delete_queues(amqp_url: str) -> None:
    connection = connect(amqp_url, name="readme-example-cleanup")
    try:
        for queue in QUEUES:
            channel = connection.channel()
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                channel.queue_delete(queue)
            if channel.is_open:
                channel.close()
    finally:
        connection.close()


@pytest.fixture
def clean_queues(amqp_url: str) -> Iterator[None]:
    _delete_queues(amqp_url)
    yield
    _delete_queues(amqp_url)


@pytest.mark.xdist_group("readme-example")  # its queue names are the README's, not unique
def test_the_readme_send_receive_example_runs_as_written(
    pg_url: str, amqp_url: str, tmp_path: Path, clean_queues: None
) -> None:
    from condmsg.sending.sender import Sender

    # The evaluator serves the sender's store, which the example creates: made first here so
    # that the evaluator consumes the ack queue before the example's ack arrives.
    Sender(
        amqp_url=amqp_url,
        db_url=pg_url,
        name="scheduler",
        create_schema=True,
        secret=SECRET.encode(),
    ).engine.dispose()
    evaluator = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender="scheduler",
            db_url=pg_url,
            secret=SECRET.encode(),
            ack_grace=timedelta(milliseconds=100),
            sweep_interval_s=0.1,
        )
    ).start()
    env = {
        **os.environ,
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_AMQP_URL": amqp_url,
        "CONDMSG_SECRET": SECRET,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", readme_example()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        evaluator.stop()
        evaluator.engine.dispose()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "satisfied"
    assert (tmp_path / "controller-7.db").exists()  # the receiver's own store
