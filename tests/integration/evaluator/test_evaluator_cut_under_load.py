"""A running evaluator whose connections to RabbitMQ and PostgreSQL are cut while a stream
of acks flows in: batches in flight at a cut are handed back and redelivered, batches
committed just before a cut come back as duplicates, and the service rides it out.

Each CM needs two acks (one per destination), so an ack lost anywhere would leave its CM
pending; every tenth CM's first ack is published twice. The store is the judge: every CM
decided once, with one outcome row, every ack stored once and counted.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, DestinationSet, tables
from condmsg.core import protocol
from condmsg.core.outcome import Outcome
from condmsg.core.protocol import AckMessage
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import SECRET, ack_body, get_all
from tests.integration.tcp_proxy import TcpProxy
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CMS = 300
#: Every this many CMs gets its first ack published twice.
DUPLICATE_EVERY = 10
#: Acks published per burst, and the pause between bursts (seconds): a stream of about
#: five seconds.
BURST, BURST_PAUSE_S = 10, 0.08
#: (acks stored before the cut, what is cut): each connection several times, once both.
#: The last cut comes with 140 of the 600 acks still to store, so every cut lands while
#: acks flow into the service.
CUTS = (
    (80, "broker"),
    (160, "database"),
    (260, "both"),
    (360, "database"),
    (460, "broker"),
)


@dataclass
class Stream:
    """The ack documents to publish, in order, and the ids of the distinct ones."""

    bodies: list[bytes]
    ack_ids: set[str]
    duplicated: int


def _acks(cm_ids: list[str], queue: str) -> Stream:
    now = utcnow()
    bodies: list[bytes] = []
    for i, cm_id in enumerate(cm_ids):
        first = ack_body(cm_id, f"{queue}.a", now, receiver="rx-1")
        bodies += [first, ack_body(cm_id, f"{queue}.b", now, receiver="rx-2")]
        if i % DUPLICATE_EVERY == 0:
            bodies.append(first)
    ack_ids = {AckMessage.from_json(body).ack_id for body in bodies}
    return Stream(bodies, ack_ids, len(bodies) - len(ack_ids))


@dataclass
class Intake:
    """The test's sender (on PostgreSQL), the queue its CMs go to, its ack queue, and
    forwarders to RabbitMQ (``broker``) and to PostgreSQL (``store``) that the test cuts:
    the evaluator connects through them, the test itself directly."""

    sender: Any
    queue: str
    ack_queue: str
    broker: TcpProxy
    store: TcpProxy
    amqp_url: str
    pg_url: str

    def evaluator(self, *, store_proxied: bool, **options: Any) -> Evaluator:
        """An evaluator of the sender's CMs, reaching RabbitMQ through the proxy (and
        PostgreSQL too if ``store_proxied``), without a relay, whose every decision is
        the intake's (no deadline falls due in a test)."""
        config = EvaluatorConfig(
            amqp_url=self.broker.url(self.amqp_url),
            sender=self.sender.name,
            db_url=self.store.url(self.pg_url) if store_proxied else self.pg_url,
            secret=SECRET,
            relay=False,
            sweep_interval_s=3600,
            **options,
        )
        return Evaluator(config)

    def count(self, table: sa.Table, *where: Any) -> int:
        with self.sender.engine.connect() as conn:
            query = sa.select(sa.func.count()).select_from(table).where(*where)
            return int(conn.execute(query).scalar_one())


@pytest.fixture
def intake(
    pg_url: str,
    pg_engine_url: str,
    amqp_url: str,
    unique_name: str,
    make_sender: Any,
    channel: Any,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[Intake]:
    caplog.set_level(logging.INFO, logger="evaluator")
    sender = make_sender(pg_url, unique_name.replace(".", "-"), declare_queues=False)
    ack_queue = protocol.ack_queue(sender.name)
    declare_service_queue(channel, ack_queue)
    broker, store = TcpProxy(), TcpProxy.to(pg_engine_url)
    broker.up()
    store.up()
    try:
        yield Intake(sender, f"{unique_name}.q", ack_queue, broker, store, amqp_url, pg_url)
    finally:
        broker.close()
        store.close()


class Publisher:
    """Publishes ack documents to a queue in bursts from a thread of its own, straight to
    the broker (not through a proxy); a failure is kept for the test to report."""

    def __init__(self, amqp_url: str, queue: str, bodies: list[bytes]) -> None:
        self._params = pika.URLParameters(amqp_url)
        self._queue = queue
        self._bodies = bodies
        self._done = threading.Event()
        self.failures: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="ack-publisher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with pika.BlockingConnection(self._params) as connection:
                channel = connection.channel()
                for start in range(0, len(self._bodies), BURST):
                    for body in self._bodies[start : start + BURST]:
                        channel.basic_publish("", self._queue, body)
                    # Paces the stream (the load's shape); it synchronises nothing.
                    self._done.wait(BURST_PAUSE_S)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.failures.append(exc)
        finally:
            self._done.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the publisher did not finish"
        assert not self.failures, self.failures


def test_every_ack_counts_once_across_cuts_of_the_broker_and_the_database(
    intake: Intake, channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sender, queue, ack_queue = intake.sender, intake.queue, intake.ack_queue
    both = DestinationSet(
        *(Destination(f"{queue}.{end}", pickup_within=timedelta(minutes=2)) for end in "ab")
    )
    cm_ids = [sender.send(b"x", both) for _ in range(CMS)]
    stream = _acks(cm_ids, queue)
    service = intake.evaluator(
        store_proxied=True,
        # Small batches, two storing threads: several batches are in flight at a cut.
        batch_size=20,
        prefetch=100,
        store_threads=2,
        gauge_interval_s=0.5,  # readiness follows a recovery within half a second
        instance="ev-cut",
    )

    def stored() -> int:
        return intake.count(tables.acks)

    def states() -> Counter[str]:
        with sender.engine.connect() as conn:
            return Counter(conn.scalars(sa.select(tables.cms.c.state)))

    service.start()
    try:
        wait_for(lambda: service.prepared, timeout=30)
        publisher = Publisher(intake.amqp_url, ack_queue, stream.bodies)
        for after, what in CUTS:
            wait_for(lambda n=after: stored() >= n, timeout=60, what=f"{after} acks stored")
            if what in ("broker", "both"):
                intake.broker.cut()
            if what in ("database", "both"):
                intake.store.cut()
        publisher.join(30)
        wait_for(lambda: states() == {"satisfied": CMS}, timeout=60)
        wait_for(lambda: stored() == len(stream.ack_ids), timeout=30)
        # Ready again: it reaches the database and consumes the ack queue.
        wait_for(lambda: service.readiness() is None, timeout=30)
        assert service.running and service.liveness() is None and service.fatal is None
    finally:
        service.stop()
        service.engine.dispose()

    with sender.engine.connect() as conn:
        deciders = Counter(conn.scalars(sa.select(tables.cms.c.decided_by)))
        acks = conn.execute(sa.select(tables.acks.c.ack_id, tables.acks.c.status)).all()
        anomaly = tables.anomalies.c
        anomalies = conn.execute(sa.select(anomaly.kind, anomaly.ack_id)).all()
        outbox = outbox_table()
        rows = conn.execute(sa.select(outbox.c.routing_key, outbox.c.body)).all()
    # Every CM decided once, by this service, with exactly one outcome row.
    assert deciders == {"ev-cut": CMS}
    outcomes = Counter(
        Outcome.from_json(body).cm_id
        for key, body in rows
        if key == protocol.outcome_queue(sender.name)
    )
    assert outcomes == dict.fromkeys(cm_ids, 1)
    # Every ack stored once and counted; the same ack seen again (published twice, or
    # redelivered after a cut) is a duplicate and nothing else. No genuine ack is blamed
    # for a cut: nothing is dead-lettered.
    assert Counter(ack_id for ack_id, _ in acks) == dict.fromkeys(stream.ack_ids, 1)
    assert {status for _, status in acks} == {"counted"}
    assert {kind for kind, _ in anomalies} <= {"duplicate"}
    assert {ack_id for _, ack_id in anomalies} <= stream.ack_ids
    assert len(anomalies) >= stream.duplicated
    assert [key for key, _ in rows if key == protocol.dead_letter_queue(sender.name)] == []
    # What the stop handed back to the queue (a batch still waiting out its backoff) are
    # acks stored already: redeliveries, nothing unstored.
    leftover = {AckMessage.from_json(body).ack_id for _, body in get_all(channel, ack_queue)}
    assert leftover <= {ack_id for ack_id, _ in acks}

    # The log tells of both outages and of the recovery, and blames no ack for them.
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("consuming the ack queue failed:") for line in lines), lines
    assert any(line.startswith("consuming the ack queue works again") for line in lines), lines
    assert any(line.startswith("storing ack batches failed:") for line in lines), lines
    assert any(line.startswith("storing ack batches works again") for line in lines), lines
    assert not any("dead-lettered" in line for line in lines), lines


def test_each_cut_of_the_ack_consumers_connection_is_logged(
    intake: Intake, channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With the default gauge interval (15 s): three outages of the consumer's connection,
    each over once an ack is decided through a new connection, make three lines when they
    start and three when the consumer works again."""
    quick = Destination(intake.queue, pickup_within=timedelta(minutes=2))
    cm_ids = [intake.sender.send(b"x", quick) for _ in range(4)]
    service = intake.evaluator(store_proxied=False)

    def satisfied() -> int:
        return intake.count(tables.cms, tables.cms.c.state == "satisfied")

    try:
        with service:
            for decided, cm_id in enumerate(cm_ids, start=1):
                ack = ack_body(cm_id, intake.queue, utcnow(), receiver="rx")
                channel.basic_publish("", intake.ack_queue, ack)
                wait_for(lambda n=decided: satisfied() == n, timeout=30, what=f"{decided} decided")
                if decided < len(cm_ids):  # the last ack shows the third outage is over
                    intake.broker.cut()
    finally:
        service.engine.dispose()
    lines = [r.getMessage() for r in caplog.records if r.name == "evaluator.service"]
    failed = [line for line in lines if line.startswith("consuming the ack queue failed")]
    again = [line for line in lines if line.startswith("consuming the ack queue works again")]
    assert len(failed) >= 3 and len(again) >= 3, lines
