"""What ``make demo`` runs on: its names, its PostgreSQL schemas and RabbitMQ queues (reset
at the start, queues deleted at the end), and the evaluator process.

Every name derives from a prefix (queues, the sender) and a schema name (stores), so a
second demo, e.g. the test's, runs beside ``make demo`` without touching its resources.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import pika
import pika.exceptions
import sqlalchemy as sa

from condmsg.core import protocol
from condmsg.core.errors import CondmsgError
from condmsg.runtime.amqp import connect
from condmsg.runtime.topology import declare_destination

T = TypeVar("T")

#: Receiver stores: one per Example 1 destination, one shared by Example 2's controllers
#: (competing consumers of one destination share their receiver log).
RX_STORES = ("qr1", "qr2", "qr3", "qr4", "central")
DESTINATIONS = ("qr1", "qr2", "qr3", "qr4", "qcentral")


class DemoError(CondmsgError):
    """Something the demo waited for did not happen in time."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; DemoError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True, slots=True)
class Names:
    """``prefix`` names the sender and the queues; ``schema`` the sender's store (receiver
    stores are ``<schema>_rx_<store>``, the room bookings ``<schema>_facilities``)."""

    prefix: str
    schema: str

    @property
    def sender(self) -> str:
        return self.prefix

    def queue(self, destination: str) -> str:
        return f"{self.prefix}.{destination}"

    @property
    def invalid_queue(self) -> str:
        return f"{self.prefix}.invalid"

    def rx_schema(self, store: str) -> str:
        return f"{self.schema}_rx_{store}"

    @property
    def facilities_schema(self) -> str:
        """The facilities' database, whose room bookings join the demo's spheres."""
        return f"{self.schema}_facilities"

    def schemas(self) -> list[str]:
        return [self.schema, *(self.rx_schema(s) for s in RX_STORES), self.facilities_schema]

    def queues(self) -> list[str]:
        service = [protocol.ack_queue(self.sender), protocol.outcome_queue(self.sender)]
        service.append(protocol.dead_letter_queue(self.sender))
        return [*(self.queue(d) for d in DESTINATIONS), self.invalid_queue, *service]


def schema_url(base_url: str, schema: str) -> str:
    """``base_url`` with its connections' ``search_path`` set to ``schema``."""
    sep = "&" if "?" in base_url else "?"
    return f"{base_url}{sep}options={quote(f'-csearch_path={schema}')}"


def reset_schemas(base_url: str, schemas: list[str], *, recreate: bool = True) -> None:
    """Drop exactly these schemas, with everything in them; then create them afresh
    unless ``recreate`` is false."""
    engine = sa.create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for schema in schemas:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                if recreate:
                    conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    finally:
        engine.dispose()


def delete_queues(amqp_url: str, queues: list[str]) -> None:
    """Delete the queues (a missing one is fine); quorum queues left behind cost the broker
    file handles and slow its start."""
    connection = connect(amqp_url, name="condmsg-demo-cleanup")
    try:
        for queue in queues:
            channel = connection.channel()
            try:
                channel.queue_delete(queue)
                channel.close()
            except pika.exceptions.ChannelClosedByBroker:
                pass  # gone already
    finally:
        connection.close()


def declare_destinations(amqp_url: str, queues: list[str]) -> None:
    connection = connect(amqp_url, name="condmsg-demo-setup")
    try:
        for queue in queues:
            declare_destination(connection, queue)
    finally:
        connection.close()


def queue_depth(amqp_url: str, queue: str) -> int:
    connection = connect(amqp_url, name="condmsg-demo-probe")
    try:
        ok = connection.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    finally:
        connection.close()


def consumers(amqp_url: str, queue: str) -> int:
    connection = connect(amqp_url, name="condmsg-demo-probe")
    try:
        try:
            ok = connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            return 0
        return int(ok.method.consumer_count)
    finally:
        if connection.is_open:
            connection.close()


def service_env(amqp_url: str, db_url: str, secret: str) -> dict[str, str]:
    """The environment of a service process: its store, the broker, the shared secret."""
    return {
        **os.environ,
        "CONDMSG_AMQP_URL": amqp_url,
        "CONDMSG_DB_URL": db_url,
        "CONDMSG_SECRET": secret,
    }


def start_evaluator(
    names: Names, env: dict[str, str], log_dir: Path, *, ack_grace_ms: int, sweep_s: float
) -> subprocess.Popen[bytes]:
    """``python -m evaluator`` for the demo's sender, logging to ``log_dir/evaluator.log``."""
    log = (log_dir / "evaluator.log").open("ab")
    args = ["-m", "evaluator", "--sender", names.sender, "--sweep-interval", str(sweep_s)]
    args += ["--ack-grace-ms", str(ack_grace_ms)]
    return subprocess.Popen([sys.executable, *args], env=env, stdout=log, stderr=log)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM, then SIGKILL if it does not exit in ``timeout`` s; the exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
