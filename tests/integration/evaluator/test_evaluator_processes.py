"""Intake processes (``EvaluatorConfig(intake_processes=N)``) on the real PostgreSQL and RabbitMQ:
the workers take in acks beside the service, report into its metrics, come back when
killed, and stop with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from dataclasses import asdict
from datetime import timedelta
from typing import Any

import pika
import pytest
import sqlalchemy as sa

from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.outcome import Outcome
from condmsg.core.timeutil import utcnow
from condmsg.runtime.topology import declare_service_queue
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from evaluator.workers import WORKER_COMMAND, WorkerConfig
from outbox.table import outbox_table
from tests.integration.condmsg_helpers import SECRET, ack_body
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def _consumers(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.consumer_count)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child that has exited but is not reaped yet still answers: look at its state.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


class Run:
    """A sender with ``n`` CMs to one queue, and a two-process service for its acks."""

    def __init__(self, pg_url: str, unique_name: str, make_sender: Any, amqp_url: str, n: int):
        self.name = unique_name.replace(".", "-")
        self.sender = make_sender(pg_url, self.name, declare_queues=False)
        self.queue = f"{unique_name}.q"
        quick = Destination(self.queue, pickup_within=timedelta(minutes=1))
        self.cms = [self.sender.send(b"x", quick) for _ in range(n)]
        self.service = Evaluator(
            EvaluatorConfig(
                amqp_url=amqp_url,
                sender=self.name,
                db_url=pg_url,  # the workers connect to it
                secret=SECRET,
                relay=False,
                batch_size=10,
                prefetch=20,
                sweep_interval_s=3600,
                instance="ev-main",
                intake_processes=2,
            ),
            engine=self.sender.engine,
        )
        self.connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        self.channel = self.connection.channel()
        self.ack_queue = protocol.ack_queue(self.name)
        declare_service_queue(self.channel, self.ack_queue)

    def publish(self, cm_ids: list[str]) -> None:
        now = utcnow()
        for cm_id in cm_ids:
            body = ack_body(cm_id, self.queue, now, receiver="rx-1")
            self.channel.basic_publish("", self.ack_queue, body)

    def start(self) -> int:
        """Start the service; once it and its worker consume, the worker's pid."""
        self.service.start()
        self.wait_for_consumers(2)  # the service's consumer and its worker's
        return self.worker()

    def worker(self) -> int:
        assert self.service.workers is not None
        (pid,) = self.service.workers.pids()
        return pid

    def wait_for_workers_started(self, count: int) -> None:
        workers = self.service.workers
        wait_for(lambda: workers is not None and workers.started == count, timeout=60)

    def wait_for_consumers(self, count: int) -> None:
        wait_for(lambda: _consumers(self.channel, self.ack_queue) == count, timeout=60)

    def metric(self, name: str, **labels: str) -> float:
        return self.service.registry.get_sample_value(name, labels or None) or 0.0

    def decided(self) -> bool:
        satisfied = "condmsg_evaluator_decisions_total"
        return self.metric(satisfied, verdict="satisfied") == len(self.cms)

    def close(self) -> None:
        self.service.stop()
        self.connection.close()

    def states(self) -> Counter[str]:
        with self.sender.engine.connect() as conn:
            return Counter(r.state for r in conn.execute(sa.select(tables.cms.c.state)))

    def deciders(self) -> Counter[str]:
        with self.sender.engine.connect() as conn:
            return Counter(r.decided_by for r in conn.execute(sa.select(tables.cms.c.decided_by)))

    def outcomes(self) -> Counter[str]:
        outbox = outbox_table()
        with self.sender.engine.connect() as conn:
            rows = conn.execute(
                sa.select(outbox.c.body).where(
                    outbox.c.routing_key == protocol.outcome_queue(self.name)
                )
            )
            return Counter(Outcome.from_json(r.body).cm_id for r in rows)


@pytest.fixture
def run(pg_url: str, unique_name: str, make_sender: Any, amqp_url: str) -> Any:
    made: list[Run] = []

    def factory(n: int) -> Run:
        made.append(Run(pg_url, unique_name, make_sender, amqp_url, n))
        return made[-1]

    yield factory
    for r in made:
        r.close()


def test_a_worker_process_takes_in_acks_beside_the_service(run: Any) -> None:
    r = run(300)
    r.start()
    r.publish(r.cms)
    wait_for(r.decided, timeout=60)
    r.service.stop()
    # Every CM decided once, with one outcome; the worker decided some of them and its
    # batches are in the service's metrics.
    assert r.states() == {"satisfied": 300}
    assert set(r.outcomes()) == set(r.cms) and set(r.outcomes().values()) == {1}
    deciders = r.deciders()
    assert set(deciders) == {"ev-main", "ev-main/1"}, deciders
    assert r.metric("condmsg_evaluator_acks_total") == 300
    assert r.metric("condmsg_evaluator_decision_seconds_count") == 300
    assert r.metric("condmsg_evaluator_anomalies_total", kind="duplicate") == 0


def test_a_killed_worker_is_replaced_and_nothing_is_lost(run: Any) -> None:
    r = run(400)
    pid = r.start()
    r.publish(r.cms[:200])
    wait_for(lambda: r.deciders().get("ev-main/1", 0) > 0, timeout=60)
    os.kill(pid, signal.SIGKILL)
    r.publish(r.cms[200:])
    # Another worker comes; every CM is decided once (the killed worker's unacknowledged
    # deliveries went back to the queue; those it had stored count as duplicates). The
    # store, not the metrics, is the judge: a batch committed just before the kill was
    # never reported.
    r.wait_for_workers_started(2)
    wait_for(lambda: r.states() == {"satisfied": 400}, timeout=60)
    r.wait_for_consumers(2)
    assert r.worker() != pid
    r.service.stop()
    assert set(r.outcomes()) == set(r.cms) and set(r.outcomes().values()) == {1}
    remaining = r.channel.queue_declare(r.ack_queue, passive=True).method.message_count
    assert remaining == 0


def test_workers_stop_with_the_service(run: Any) -> None:
    r = run(1)
    pid = r.start()
    r.service.stop()
    assert not _alive(pid)
    assert _consumers(r.channel, r.ack_queue) == 0


def test_a_worker_told_to_stop_by_a_signal_finishes_and_is_replaced(run: Any) -> None:
    r = run(100)
    pid = r.start()
    os.kill(pid, signal.SIGTERM)  # graceful: it stops consuming and exits
    r.wait_for_workers_started(2)
    r.wait_for_consumers(2)
    r.publish(r.cms)
    wait_for(lambda: r.states() == {"satisfied": 100}, timeout=60)


def test_a_worker_pointed_at_a_database_without_the_store_exits(pg_url: str, amqp_url: str) -> None:
    """Its configuration names a database without the sender's tables: the worker says
    so and exits (it does not create an empty store and take acks into it)."""
    config = WorkerConfig(
        amqp_url=amqp_url,
        db_url=pg_url,  # a fresh schema: no tables in it
        sender="nobody",
        secret_hex=bytes(range(32)).hex(),
        ack_grace_ms=250.0,
        batch_size=10,
        prefetch=20,
        store_threads=1,
        instance="x",
    )
    done = subprocess.run(
        WORKER_COMMAND,
        input=json.dumps(asdict(config)) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "is missing" in done.stderr and "condmsg db upgrade --store sender" in done.stderr
    assert done.stdout == ""
    with sa.create_engine(pg_url).connect() as conn:
        assert not sa.inspect(conn).has_table(tables.cms.name)
