"""Every ``python`` block of README.md and docs/*.md that is not marked as an excerpt runs
as written (the rule: tests/docs_blocks.py, docs/index.md).

Each block runs alone, as a user would paste it into a file: a fresh interpreter in an
empty directory (its SQLite files land there), with the deployment settings a user would
export (``CONDMSG_AMQP_URL``, ``CONDMSG_DB_URL`` on a fresh PostgreSQL schema,
``CONDMSG_SECRET``). A block checks what it shows with its own ``assert`` statements; a
block passes when it exits 0.

The blocks name their queues as a user would (``qr1``, ``condmsg.meetings.ack``), so they
run in a virtual host of their own, one block at a time, and every queue a block's string
literals could name is deleted before and after it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import pika
import pytest

from condmsg.core import protocol
from condmsg.runtime.amqp import connect
from tests.docs_blocks import Block, names_in, runnable_blocks

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    # One worker runs them all: blocks share queue names (the README example's among them).
    pytest.mark.xdist_group("readme-example"),
]

VHOST = "condmsg-docs"
SECRET = "docs-example-secret-9e4b1d7c3a6f0825"
BLOCK_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def docs_amqp_url(amqp_url: str) -> str:
    """The broker URL with the docs' own virtual host, created (for the URL's user) if
    missing. Without ``rabbitmqctl`` (a broker in a container) the URL's own vhost is used:
    the blocks' queues are deleted by name all the same."""
    url = urlsplit(amqp_url)
    user = unquote(url.username or "guest")

    def ctl(*args: str) -> str:
        return subprocess.run(
            ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=True
        ).stdout

    try:
        if VHOST not in ctl("list_vhosts", "--no-table-headers", "name").split():
            ctl("add_vhost", VHOST)
        ctl("set_permissions", "-p", VHOST, user, ".*", ".*", ".*")
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"docs blocks run in the broker's default vhost: rabbitmqctl failed: {exc}")
        return amqp_url
    return urlunsplit(url._replace(path="/" + quote(VHOST, safe="")))


def _delete_queues(amqp_url: str, names: set[str]) -> None:
    queues = set(names)
    for name in names:
        queues |= {
            protocol.ack_queue(name),
            protocol.outcome_queue(name),
            protocol.dead_letter_queue(name),
        }
    connection = connect(amqp_url, name="docs-blocks-cleanup")
    try:
        channel = connection.channel()
        for queue in sorted(queues):
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                channel.queue_delete(queue)
            if not channel.is_open:
                channel = connection.channel()
        channel.close()
    finally:
        connection.close()


@pytest.fixture
def block_queues(request: pytest.FixtureRequest, docs_amqp_url: str) -> Iterator[None]:
    block: Block = request.node.callspec.params["block"]
    names = names_in(block.source)
    _delete_queues(docs_amqp_url, names)  # what an interrupted run may have left
    yield
    _delete_queues(docs_amqp_url, names)


@pytest.mark.parametrize("block", runnable_blocks(), ids=lambda b: b.id)
def test_the_block_runs_as_written(
    block: Block, docs_amqp_url: str, pg_url: str, tmp_path: Path, block_queues: None
) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.source, encoding="utf-8")
    env = {
        **os.environ,
        "CONDMSG_AMQP_URL": docs_amqp_url,
        "CONDMSG_DB_URL": pg_url,
        "CONDMSG_SECRET": SECRET,
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"the block at {block.id} failed (exit {done.returncode}):\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
