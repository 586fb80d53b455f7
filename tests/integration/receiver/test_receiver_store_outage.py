"""Transactional receivers whose store goes away and comes back (DESIGN invariant 8).

Two competing receivers consume one queue with a prefetch window each; their store is
reached through a TCP proxy that the test cuts several times while originals and
compensations flow. An outage is not the messages' fault: consumption pauses and resumes,
every message reaches the app exactly once (or, cancelled out, not at all) and nothing
stays unacknowledged.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd import Message, StoreUnavailable
from ackd.tables import RlogState, rlog
from condmsg.core.protocol import MessageKind
from tests.integration.condmsg_helpers import (
    SECRET,
    publish_compensation,
    publish_original,
    receiver_queue,
)
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

CMS = 240
#: Every this many CMs gets a compensation too (some overtake their original).
COMPENSATE_EVERY = 4
PREFETCH = 20
#: How long each cut keeps the store unreachable (seconds).
CUT_S = 2.0

app_rows = sa.Table(
    "t_app_rows",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cm_id", sa.String(36), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("consumer", sa.String(8), nullable=False),
)


def _publish_originals(channel: Any, queue: str, cm_ids: list[str]) -> None:
    """One original per CM id to ``queue``, each read within five minutes."""
    for cm_id in cm_ids:
        publish_original(channel, queue, cm_id, pickup_within=timedelta(minutes=5))


def _handler(name: str, seen: Counter[str]) -> Any:
    def handle(message: Message, session: Session | None) -> None:
        assert session is not None
        session.execute(
            sa.insert(app_rows).values(
                cm_id=message.cm_id, kind=str(message.kind.value), consumer=name
            )
        )
        time.sleep(0.003)  # the app's own work
        seen[name] += 1

    return handle


def test_competing_transactional_receivers_ride_out_store_cuts(
    pg_url: str,
    store_proxy: TcpProxy,
    unique_name: str,
    make_either_receiver: Any,
    channel: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ackd")
    direct = sa.create_engine(pg_url)
    app_rows.metadata.create_all(direct)
    proxied = store_proxy.url(pg_url)
    receivers = [make_either_receiver(proxied, receiver_id=f"rx{i}") for i in range(2)]
    queue = receiver_queue(receivers[0], unique_name)

    cm_ids = [str(uuid.uuid4()) for _ in range(CMS)]
    compensated = set(cm_ids[::COMPENSATE_EVERY])
    _publish_originals(channel, queue, cm_ids)

    stop = threading.Event()
    seen: Counter[str] = Counter()
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            receivers[index].consume(
                queue, _handler(f"rx{index}", seen), prefetch=PREFETCH, stop=stop
            )
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()

    def rows() -> int:
        with direct.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(app_rows)).scalar_one())

    # Three cuts while the originals flow; the compensations go out around the second.
    for cut, after_rows in enumerate((20, 70, 130)):
        wait_for(lambda n=after_rows: rows() >= n or None, timeout=60)
        store_proxy.down()
        if cut == 1:
            for cm_id in sorted(compensated):
                publish_compensation(
                    channel, queue=queue, cm_id=cm_id, destination=queue, sender="s", body=b"undo"
                )
        time.sleep(CUT_S)  # the outage itself: nothing to wait for
        store_proxy.up()

    def settled() -> bool:
        with direct.connect() as conn:
            states = dict(conn.execute(sa.select(rlog.c.cm_id, rlog.c.state)).all())
            kinds = Counter(
                (row.cm_id, row.kind) for row in conn.execute(sa.select(app_rows)).all()
            )
        if len(states) < CMS:
            return False
        return all(
            (cm_id, MessageKind.COMPENSATION.value) in kinds
            for cm_id in compensated
            if states[cm_id] == RlogState.CONSUMED
        )

    def pauses() -> tuple[list[str], list[str]]:
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("ackd")]
        return (
            [line for line in lines if " paused: the receiver store cannot be reached" in line],
            [line for line in lines if " resumes: the receiver store answers again" in line],
        )

    try:
        wait_for(lambda: settled() or None, timeout=90)
        # Nothing left behind: the queue empties once the last deliveries are acked.
        wait_for(
            lambda: channel.queue_declare(queue, passive=True).method.message_count == 0 or None,
            timeout=30,
        )
        # A receiver that finds its kept connection dead only after the last cut pauses
        # then, and resumes at its first probe: let it, before stopping.
        wait_for(lambda: len(pauses()[1]) == len(pauses()[0]) or None, timeout=30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)
    # Stopped consumers give back whatever they still held: nothing may be there.
    assert channel.queue_declare(queue, passive=True).method.message_count == 0

    with direct.connect() as conn:
        states = dict(conn.execute(sa.select(rlog.c.cm_id, rlog.c.state)).all())
        kinds = Counter((row.cm_id, row.kind) for row in conn.execute(sa.select(app_rows)).all())
    original, compensation = MessageKind.ORIGINAL.value, MessageKind.COMPENSATION.value
    for cm_id in cm_ids:
        if states[cm_id] == RlogState.CONSUMED:
            assert kinds[(cm_id, original)] == 1, cm_id
            assert kinds[(cm_id, compensation)] == (1 if cm_id in compensated else 0), cm_id
        else:  # cancelled out: the app got neither
            assert cm_id in compensated
            assert kinds[(cm_id, original)] == kinds[(cm_id, compensation)] == 0, cm_id
    assert all(count == 1 for count in kinds.values())
    # Both receivers worked, and no message was charged with the outage: nothing was
    # dead-lettered as poison.
    assert seen["rx0"] > 0 and seen["rx1"] > 0
    assert channel.queue_declare(f"{unique_name}.invalid", passive=True).method.message_count == 0
    # The log tells of each outage once per receiver, not once per message.
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ackd")]
    paused, resumed = pauses()
    assert 1 <= len(paused) <= 2 * 3 * 2, lines
    assert len(resumed) == len(paused), lines
    assert not [r for r in caplog.records if r.name.startswith("ackd") and r.exc_info], lines
    direct.dispose()


def test_a_non_transactional_consumer_rides_out_a_store_cut(
    pg_url: str, store_proxy: TcpProxy, unique_name: str, make_either_receiver: Any, channel: Any
) -> None:
    receiver = make_either_receiver(store_proxy.url(pg_url))
    queue = receiver_queue(receiver, unique_name)
    cm_ids = [str(uuid.uuid4()) for _ in range(60)]
    _publish_originals(channel, queue, cm_ids)
    got: list[str] = []
    stop = threading.Event()

    def handle(message: Message, session: Session | None) -> None:
        assert session is None
        got.append(str(message.cm_id))
        time.sleep(0.005)  # the app's own work
        if len(got) == 20:
            store_proxy.down()
            threading.Timer(CUT_S, store_proxy.up).start()

    failures: list[BaseException] = []

    def run() -> None:
        try:
            receiver.consume(queue, handle, transactional=False, prefetch=PREFETCH, stop=stop)
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(set(got)) == len(cm_ids) or None, timeout=60)
    finally:
        stop.set()
        thread.join(15)
    assert not failures, failures
    assert sorted(got) == sorted(cm_ids)  # each once: a READ ack's RLOG row commits first
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_a_transaction_that_cannot_reach_the_store_says_so(
    pg_url: str, store_proxy: TcpProxy, make_receiver: Any
) -> None:
    receiver = make_receiver(store_proxy.url(pg_url))
    store_proxy.down()

    def select_one() -> None:
        with receiver.transaction() as tx:
            tx.session.execute(sa.text("SELECT 1"))

    # A connection lost under the transaction, then one that cannot be opened.
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match="cannot be reached"):
            select_one()
    store_proxy.up()
    with receiver.transaction() as tx:
        assert tx.session.execute(sa.text("SELECT 1")).scalar_one() == 1


def test_condmsg_consume_pauses_through_a_store_cut(
    pg_url: str,
    store_proxy: TcpProxy,
    unique_name: str,
    amqp_url: str,
    channel: Any,
    tmp_path: Path,
) -> None:
    """``condmsg consume --transactional`` reads on through a cut of its store: it says
    once that it paused and once that it resumed, and every message is printed once."""
    from tests.integration.cli.test_cli_commands import COMMAND, ROOT, cli_env, json_lines

    queue = f"{unique_name}.q"
    channel.queue_declare(queue, durable=True, arguments={"x-max-priority": 10})
    cm_ids = [str(uuid.uuid4()) for _ in range(40)]
    _publish_originals(channel, queue, cm_ids)
    # Until idle: a message printed just before its commit was lost counts as printed, so a
    # count could stop one message short when the commit had in fact failed.
    args = ["consume", queue, "--recipient", "r", "--transactional", "--timeout", "3"]
    args += ["--invalid-queue", f"{unique_name}.invalid", "--create-schema"]
    args += ["--db-url", store_proxy.url(pg_url), "--amqp-url", amqp_url]
    proc = subprocess.Popen(
        [*COMMAND, *args],
        cwd=ROOT,
        # The copies are signed with the integration tests' secret.
        env=cli_env({"CONDMSG_SECRET": SECRET.decode()}),
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr").open("wb"),
    )
    printed: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: printed.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(printed) >= 10 or None, timeout=60)
        store_proxy.down()
        time.sleep(CUT_S)  # the outage itself: nothing to wait for
        store_proxy.up()
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    said = (tmp_path / "stderr").read_text()
    assert proc.returncode == 0, said
    # Printing is not part of the transaction: a message printed just before the cut is
    # printed again when its rolled-back transaction is redone; each committed once.
    assert {m["cm_id"] for m in json_lines(b"".join(printed).decode())} == set(cm_ids)
    direct = sa.create_engine(pg_url)
    with direct.connect() as conn:
        states = conn.execute(sa.select(rlog.c.cm_id, rlog.c.state)).all()
    direct.dispose()
    assert sorted(states) == sorted((cm_id, RlogState.CONSUMED.value) for cm_id in cm_ids)
    assert "Traceback" not in said
    assert said.count("paused: the receiver store cannot be reached") == 1, said
    assert said.count("resumes: the receiver store answers again") == 1, said
    assert channel.queue_declare(queue, passive=True).method.message_count == 0
