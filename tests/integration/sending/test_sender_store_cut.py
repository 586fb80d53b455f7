"""A sender whose database link is cut while it sends: one ``send()`` per request from
several threads (each one statement in autocommit on PostgreSQL), and ``send_many``
batches beside them. A send that returns has its CM, its copy and its outbox row; a send
cut in flight raises a database error and has all of them or none (its commit may have
happened before the link went); the next send works again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

from condmsg import Destination
from condmsg.sending.outgoing import Outgoing
from outbox import DEFAULT_TABLE_NAME
from tests.integration.condmsg_helpers import sender_name
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres]

#: Sends that return between two cuts.
BETWEEN_CUTS = 60
CUTS = 4


def test_every_send_across_database_cuts_is_whole_or_absent(
    pg_url: str, store_proxy: TcpProxy, unique_name: str, make_sender: object
) -> None:
    sender = make_sender(  # type: ignore[operator]
        store_proxy.url(pg_url), sender_name(unique_name), declare_queues=False
    )
    condition = Destination(f"{unique_name}.q", pickup_within=timedelta(minutes=5))
    returned: list[str] = []
    failed: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def sending(send: Callable[[], list[str]]) -> None:
        while not stop.is_set():
            try:
                ids = send()
            except Exception as exc:
                with lock:
                    failed.append(exc)
                continue
            with lock:
                returned.extend(ids)

    def one() -> list[str]:
        return [sender.send(b"x", condition)]

    def batch() -> list[str]:
        return sender.send_many([Outgoing(payload=b"y", condition=condition)] * 5)

    threads = [threading.Thread(target=sending, args=(f,)) for f in (one, one, batch)]
    for thread in threads:
        thread.start()
    try:
        for n in range(1, CUTS + 1):
            wait_for(lambda n=n: len(returned) >= n * BETWEEN_CUTS, timeout=60)
            store_proxy.cut()
        wait_for(lambda: len(returned) >= (CUTS + 1) * BETWEEN_CUTS, timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)

    assert failed, "no send was cut in flight"
    # A cut send says so with the database's error, as SQLAlchemy raises it.
    assert all(isinstance(exc, sa.exc.DBAPIError) for exc in failed), failed
    assert sender.send(b"after", condition)  # the sender works again

    direct = sa.create_engine(pg_url)
    try:
        with direct.connect() as conn:
            cms = set(conn.execute(sa.text("SELECT cm_id FROM condmsg_cm")).scalars())
            copies = dict(conn.execute(sa.text("SELECT message_id, cm_id FROM condmsg_copy")).all())
            outbox_ids = list(
                conn.execute(sa.text(f"SELECT message_id FROM {DEFAULT_TABLE_NAME}")).scalars()
            )
    finally:
        direct.dispose()
    assert set(returned) <= cms
    # Nothing half-written: each CM has its one copy, each copy its one outbox row.
    assert sorted(copies.values()) == sorted(cms)
    assert sorted(outbox_ids) == sorted(copies)
