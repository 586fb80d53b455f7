"""Send→outcome throughput on a three-node RabbitMQ cluster with quorum queues, next to one
node with classic destination queues, in the same run.

One pass per setup: a sender sends ``--cms`` CMs (one copy each, ``pickup_within`` 60 s)
as fast as one thread can; one receiver consumes them (non-transactional reads) with its
relay; one evaluator decides them and its relay publishes the copies and outcomes. The
figure is CMs decided per second from the first send to the last decision. The baseline
is the same pipeline on the main broker (``CONDMSG_AMQP_URL``, one node) with classic
destination queues; the subject is the cluster of ``.ci/rabbitmq-cluster`` (started for
the run if it is not running, and stopped again), every queue a quorum queue and every
component given all three addresses.

Run: ``python -m bench.cluster [--cms 2000] [--rounds 3]`` (env ``CONDMSG_BENCH_PG_URL``,
``CONDMSG_AMQP_URL``). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import sqlalchemy as sa

from ackd.receiver import Receiver
from bench._common import emit_result, fresh_pg_schema, log, row, timed, wait_until
from condmsg import Destination, tables
from condmsg.sending.sender import Sender
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "rabbitmq-cluster"
SECRET = b"bench-cluster-secret-6a2e8c4f0b7d13"
PICKUP = timedelta(seconds=60)


def _cluster(*args: str) -> str:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=300, check=True
    ).stdout


def _cluster_running(urls: list[str]) -> bool:
    try:
        for url in urls:
            pika.BlockingConnection(pika.URLParameters(url)).close()
    except pika.exceptions.AMQPError:
        return False
    return True


def _decided(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(tables.cms)
                .where(tables.cms.c.state != "pending")
            ).scalar_one()
        )


def one_pass(amqp_url: str, queue_type: str, cms: int) -> float:
    """CMs decided per second through the whole pipeline on ``amqp_url``."""
    run = uuid.uuid4().hex[:8]
    name, queue = f"bench-cluster-{run}", f"bench.cluster.{run}"
    os.environ["CONDMSG_DESTINATION_QUEUE_TYPE"] = queue_type  # what the receiver reads
    with fresh_pg_schema(PG_URL, "bcs") as sender_db, fresh_pg_schema(PG_URL, "bcr") as rx_db:
        sender = Sender(
            amqp_url=amqp_url,
            db_url=sender_db,
            name=name,
            secret=SECRET,
            create_schema=True,
            destination_queue_type=queue_type,
        )
        evaluator = Evaluator(
            EvaluatorConfig(
                amqp_url=amqp_url,
                sender=name,
                db_url=sender_db,
                secret=SECRET,
                ack_grace=timedelta(milliseconds=100),
            )
        ).start()
        receiver = Receiver(
            amqp_url=amqp_url,
            db_url=rx_db,
            recipient="bench",
            invalid_queue=f"{queue}.invalid",
            create_schema=True,
        )
        receiver._broker.ensure_queue(queue)
        rx_relay = receiver.start_relay()
        stop = threading.Event()
        consumer = threading.Thread(
            target=receiver.consume,
            args=(queue, lambda _m, _s: None),
            kwargs={"transactional": False, "prefetch": 200, "stop": stop},
            daemon=True,
        )
        consumer.start()
        try:
            condition = Destination(queue, pickup_within=PICKUP)
            with timed() as sw:
                for i in range(cms):
                    sender.send(f"cm {i}".encode(), condition)
                if not wait_until(lambda: _decided(sender.engine) >= cms, 300, 0.05):
                    raise RuntimeError(f"only {_decided(sender.engine)} of {cms} CMs decided")
        finally:
            stop.set()
            consumer.join(30)
            rx_relay.stop()
            evaluator.stop()
            evaluator.engine.dispose()
            receiver.close()
            receiver.engine.dispose()
            sender.engine.dispose()
            _delete_queues(amqp_url, [queue, f"{queue}.invalid"], name)
    return cms / sw.seconds


def _delete_queues(amqp_url: str, queues: list[str], sender: str) -> None:
    from condmsg.runtime.amqp import connect

    connection = connect(amqp_url)
    try:
        for q in [*queues, *(f"condmsg.{sender}.{k}" for k in ("ack", "outcome", "dead"))]:
            channel = connection.channel()
            channel.queue_delete(q)
            channel.close()
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cms", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    urls = _cluster("urls").strip().split(",")
    started = False
    if not _cluster_running(urls):
        log("starting the three-node cluster (.ci/rabbitmq-cluster start)")
        _cluster("stop")
        _cluster("start")
        started = True
    samples: dict[str, list[float]] = {"single_classic": [], "cluster_quorum": []}
    try:
        for r in range(args.rounds):
            # Alternate, so that a slow moment of the shared machine hits both sides.
            samples["single_classic"].append(one_pass(AMQP_URL, "classic", args.cms))
            samples["cluster_quorum"].append(one_pass(",".join(urls), "quorum", args.cms))
            log(
                f"round {r + 1}: single node classic {samples['single_classic'][-1]:,.0f} "
                f"CMs/s, cluster quorum {samples['cluster_quorum'][-1]:,.0f} CMs/s"
            )
    finally:
        if started:
            _cluster("stop")
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = med["cluster_quorum"] / med["single_classic"]
    print(
        f"send→outcome, {args.cms} CMs, median of {args.rounds}: three-node cluster with "
        f"quorum queues {med['cluster_quorum']:,.0f} CMs/s; baseline one node with classic "
        f"queues {med['single_classic']:,.0f} CMs/s; ratio {ratio:.2f}"
    )
    figures: dict[str, Any] = {
        "cms": args.cms,
        "rounds": args.rounds,
        "cluster_quorum_cms_per_s": round(med["cluster_quorum"], 1),
        "single_classic_cms_per_s": round(med["single_classic"], 1),
        "ratio": round(ratio, 3),
        "samples": {k: [round(x, 1) for x in v] for k, v in samples.items()},
    }
    emit_result(
        "cluster",
        figures,
        [
            row(
                "send→outcome, 3 nodes, quorum queues",
                med["cluster_quorum"],
                "CMs/s",
                baseline=med["single_classic"],
            )
        ],
    )


if __name__ == "__main__":
    main()
