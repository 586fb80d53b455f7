"""A sender store filled by real sends for the console's tests: a Sender, an in-process
Evaluator (whose relay publishes the store's outbox), a Receiver, and the console served
by uvicorn on a free port of 127.0.0.1. Deadlines are seconds (a day becomes a second).

``python -m tests.integration.console_world DIR`` fills such a store, opens each page in
headless Chromium and writes the screenshots docs/console.md shows into ``DIR``.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pika
import sqlalchemy as sa

from ackd.receiver import Receiver
from condmsg import Destination, DestinationSet, tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.timeutil import utcnow
from condmsg.runtime.settings import Settings
from condmsg.sending.sender import Sender
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.waiting import wait_for

SECRET = b"console-test-secret-7a3e91c4d2b05f68"
TOKEN = "console-test-token-0123456789"
DAY = timedelta(seconds=1)


@dataclass
class ConsoleWorld:
    base: str  # http://127.0.0.1:PORT
    name: str
    sender: Sender
    db_url: str
    amqp_url: str
    #: CM ids by role: satisfied, violated, pending, contradicted, parked.
    cms: dict[str, str] = field(default_factory=dict)
    sphere_id: str = ""
    xss_destination: str = ""
    missing_exchange: str = ""
    parked_ids: list[int] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def schema(pg_url: str) -> Iterator[str]:
    name = f"t_console_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def in_schema(pg_url: str, name: str) -> str:
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}options={quote(f'-csearch_path={name}')}"


@contextmanager
def serve(
    db_url: str, amqp_url: str, token: str | None, db_timeout_s: float = 5.0, **config: Any
) -> Iterator[str]:
    """The console over ``db_url`` on a free port (``config``: more ConsoleConfig fields);
    yields its base URL."""
    import uvicorn

    import outbox
    from condmsg.console import ConsoleConfig, Store, create_app
    from condmsg.console.deadline import console_engine

    engine = console_engine(db_url, db_timeout_s)
    app = create_app(
        ConsoleConfig(
            stores=[Store("sender store", engine, outbox.outbox_table())],
            settings=Settings(ack_grace=timedelta(milliseconds=100)),
            amqp_url=amqp_url,
            token=token,
            refresh_s=1.0,
            db_timeout_s=db_timeout_s,
            **config,
        )
    )
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        engine.dispose()


#: CMs and a sphere that ``seed`` writes straight into a store (no evaluator runs there).
UNDECODABLE_CM = "cm-with-an-undecodable-condition"
OVERDUE_CM = "cm-pending-and-overdue"
SEEDED_SPHERE = "sphere-open-seeded"
#: Names as long as a store takes, without a place to break a line.
LONG_DESTINATION = "seeded." + "d" * 248
LONG_SENDER = "s" * 255


def seed(url: str) -> str:
    """Migrate the sender store at ``url`` and write into it, as if an evaluator had
    stopped an hour ago: a CM whose stored condition cannot be decoded, a pending CM whose
    deadline and next check passed an hour ago (overdue; its acks, none, already decide
    it), and an open sphere. Returns ``url``."""
    from condmsg.core.condition_codec import condition_to_json
    from condmsg.runtime.migrate import upgrade

    engine = sa.create_engine(url)
    upgrade(engine, "sender")
    now = utcnow()
    hour = timedelta(hours=1)
    condition = condition_to_json(Destination(LONG_DESTINATION, pickup_within=timedelta(seconds=1)))
    common = {"sender": LONG_SENDER, "payload_size": 0, "notify_success": False, "state": "pending"}
    with engine.begin() as conn:
        conn.execute(
            tables.cms.insert(),
            [
                {
                    **common,
                    "cm_id": UNDECODABLE_CM,
                    "sent_at": now,
                    "condition_json": '{"kind": "nonsense"',
                    "evaluation_deadline": now + hour,
                    "next_check_at": now + hour,
                },
                {
                    **common,
                    "cm_id": OVERDUE_CM,
                    "sent_at": now - hour,
                    "condition_json": condition,
                    "evaluation_deadline": now - hour + timedelta(seconds=1),
                    "next_check_at": now - hour + timedelta(seconds=1),
                },
            ],
        )
        conn.execute(
            tables.copies.insert().values(
                cm_id=OVERDUE_CM,
                destination=LONG_DESTINATION,
                message_id="seeded-copy-1",
                exchange="",
                routing_key=LONG_DESTINATION,
                requires="pickup",
                parts=1,
            )
        )
        conn.execute(
            tables.spheres.insert().values(
                sphere_id=SEEDED_SPHERE,
                sender=LONG_SENDER,
                begun_at=now,
                deadline=now + hour,
                members=0,
                state="open",
            )
        )
    engine.dispose()
    return url


@contextmanager
def seeded(kind: str, pg_url: str, directory: Any) -> Iterator[str]:
    """A seeded store, SQLite (a file in ``directory``) or PostgreSQL (a schema of
    ``pg_url``), as a URL."""
    if kind == "sqlite":
        yield seed(f"sqlite:///{directory / 'store.db'}")
        return
    with schema(pg_url) as name:
        yield seed(in_schema(pg_url, name))


def _forged_ack(cm_id: str, destination: str, read_at: Any, token: bytes = SECRET) -> bytes:
    return protocol.AckMessage(
        ack_id=uuid.uuid4().hex,
        cm_id=cm_id,
        destination=destination,
        kind=AckKind.READ,
        read_at=read_at,
        committed_at=None,
        recipient=None,
        receiver="late-rx",
        token=protocol.copy_token(token, cm_id, destination, None),
    ).to_json()


def fill(db_url: str, amqp_url: str, name: str, world: ConsoleWorld) -> Evaluator:
    """Send the CMs every page shows and wait until each is where the tests want it."""
    sender_name = name.replace(".", "-")
    sender = Sender(
        amqp_url=amqp_url, db_url=db_url, name=sender_name, secret=SECRET, create_schema=True
    )
    world.sender = sender
    evaluator = Evaluator(
        EvaluatorConfig(
            amqp_url=amqp_url,
            sender=sender_name,
            db_url=db_url,
            secret=SECRET,
            ack_grace=timedelta(milliseconds=100),
            sweep_interval_s=0.1,
        )
    ).start()
    q = lambda short: f"{name}.{short}"  # noqa: E731
    world.xss_destination = f"{name}.<script>document.title='pwned'</script>"
    world.missing_exchange = f"{name}.ex"
    cms = world.cms
    cms["satisfied"] = sender.send(b"order 1", Destination(q("q1"), pickup_within=3 * DAY))
    cms["violated"] = sender.send(
        b"order 2",
        DestinationSet(Destination(q("q2"), process_within=DAY), Destination(q("q3"))),
        compensation=b"order 2 cancelled",
    )
    cms["pending"] = sender.send(
        b"<b>bold</b> payload", Destination(world.xss_destination, pickup_within=timedelta(hours=1))
    )
    cms["contradicted"] = sender.send(b"order 4", Destination(q("qa"), pickup_within=DAY))
    cms["parked"] = sender.send(
        b"to nowhere",
        Destination(
            "topic",
            exchange=world.missing_exchange,
            routing_key="orders",
            pickup_within=timedelta(hours=1),
        ),
    )
    sender.register_handler("release_stock", lambda session, **args: None)
    with sender.sphere(timeout=timedelta(hours=1)) as sphere:
        cms["member"] = sphere.send(b"sphere member", Destination(q("q4"), pickup_within=DAY))
        sphere.on_failure("release_stock", order=7)
    world.sphere_id = sphere.sphere_id

    receiver = Receiver(
        amqp_url=amqp_url,
        db_url=db_url,
        recipient="alice",
        invalid_queue=q("invalid"),
        create_schema=True,
    )
    try:
        with receiver.relay():
            assert receiver.read(q("q1"), timeout=10) is not None
            assert receiver.read(q("q2"), timeout=10) is not None  # read, never processed
            assert sender.outcome(cms["satisfied"], timeout=15) is not None
            assert sender.outcome(cms["violated"], timeout=15) is not None
    finally:
        receiver.close()
        receiver.engine.dispose()
    contradicted = sender.outcome(cms["contradicted"], timeout=15)
    assert contradicted is not None
    # A late ack that would have satisfied it (read in time, arrived after the decision),
    # a forged one that does not count, and a body that is no ack at all.
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    ack_queue = protocol.ack_queue(sender_name)
    in_time = contradicted.effective_at - timedelta(milliseconds=900)
    channel.basic_publish("", ack_queue, _forged_ack(cms["contradicted"], q("qa"), in_time))
    channel.basic_publish(
        "", ack_queue, _forged_ack(cms["pending"], world.xss_destination, utcnow(), b"wrong")
    )
    channel.basic_publish("", ack_queue, b"<script>not an ack</script>")
    connection.close()

    acks, anomalies = tables.acks, tables.anomalies
    outbox_rows = sa.text("SELECT id FROM condmsg_outbox WHERE state = 'failed' ORDER BY id")
    with sender.engine.connect() as conn:

        def settled() -> bool:
            late = conn.scalar(
                sa.select(sa.func.count()).where(
                    acks.c.status == tables.AckStatus.CHANGES_VERDICT.value
                )
            )
            bad = conn.scalar(sa.select(sa.func.count()).where(anomalies.c.kind == "bad_token"))
            world.parked_ids = list(conn.scalars(outbox_rows))
            conn.rollback()
            return bool(late and bad and world.parked_ids)

        wait_for(settled, timeout=20)
    wait_for(lambda: _dead_letters(amqp_url, sender_name) >= 1, timeout=20)
    return evaluator


def _dead_letters(amqp_url: str, sender_name: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        queue = protocol.dead_letter_queue(sender_name)
        return int(channel.queue_declare(queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if connection.is_open:
            connection.close()


def delete_queues(amqp_url: str, world: ConsoleWorld) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = connection.channel()
    for short in ("q1", "q2", "q3", "q4", "qa", "invalid"):
        channel.queue_delete(f"{world.name}.{short}")
    channel.queue_delete(world.xss_destination)
    channel.exchange_delete(world.missing_exchange)
    sender_name = world.name.replace(".", "-")
    for kind in ("ack", "outcome", "dead"):
        channel.queue_delete(f"condmsg.{sender_name}.{kind}")
    connection.close()


@contextmanager
def console_world(pg_url: str, amqp_url: str, name: str) -> Iterator[ConsoleWorld]:
    with schema(pg_url) as schema_name:
        db_url = in_schema(pg_url, schema_name)
        world = ConsoleWorld(base="", name=name, sender=None, db_url=db_url, amqp_url=amqp_url)  # type: ignore[arg-type]
        evaluator = None
        try:
            evaluator = fill(db_url, amqp_url, name, world)
            with serve(db_url, amqp_url, TOKEN) as base:
                world.base = base
                yield world
        finally:
            if evaluator is not None:
                evaluator.stop()
                evaluator.engine.dispose()
            if world.sender is not None:
                world.sender.engine.dispose()
            delete_queues(amqp_url, world)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    from pathlib import Path

    from tests.integration.console_browser import browser, screenshot

    parser = argparse.ArgumentParser(description="screenshots of the console's pages")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    pg = os.environ.get("CONDMSG_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    amqp = os.environ.get("CONDMSG_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
    with console_world(pg, amqp, f"t.docs.{uuid.uuid4().hex[:6]}") as w, browser() as driver:
        pages = {
            "console-overview.png": "/",
            "console-cms.png": "/cms",
            "console-cm.png": f"/cms/{w.cms['violated']}",
            "console-spheres.png": "/spheres",
            "console-sphere.png": f"/spheres/{w.sphere_id}",
            "console-outbox.png": "/outbox",
        }
        for file, path in pages.items():
            driver.get(w.base + path)
            screenshot(driver, args.out / file)
            print(args.out / file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
