"""Outbox relay benchmark (PostgreSQL + RabbitMQ).

(a) Throughput: a 100,000-row backlog drained by :class:`outbox.Relay`, next to a raw
    baseline measured in the same run on the same rows: plain psycopg keyset SELECTs feeding
    a bare pika SelectConnection publisher with the same confirm window (no claims, no
    deletes). Target: relay / raw >= 0.6.
(b) Latency: a producer commits one row per transaction at a steady 500 rows/s for 10 s
    with a relay running in the background; latency = a consumer's delivery time minus
    the producer's commit time (same process, same clock). Target: p99 < 50 ms.

Run: ``python -m bench.outbox_relay`` (env ``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``;
``CONDMSG_BENCH_RELAY_PUBLISHING=frames|pika`` picks the relay's publishing, default frames).
The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import quote

import pika
import psycopg
import sqlalchemy as sa
from pika.adapters.select_connection import SelectConnection
from sqlalchemy.orm import Session

import outbox
from bench._common import emit_result, log, percentile, row, timed

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
BACKLOG = 100_000
BODY = b"b" * 256
BATCH, IN_FLIGHT = 500, 4  # the relay's defaults; the raw baseline gets the same window
RATE, DURATION_S = 500, 10.0
PRODUCERS = 4
TARGET_RATIO, TARGET_P50_MS, TARGET_P99_MS = 0.6, 5.0, 20.0
#: How the relay under test puts messages on the channel (RelayConfig.publishing).
RELAY_PUBLISHING = os.environ.get("CONDMSG_BENCH_RELAY_PUBLISHING", "frames")


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a new schema, dropped afterwards."""
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_URL}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def fill(engine: sa.Engine, queue: str, n: int) -> None:
    for start in range(0, n, 5000):
        with Session(engine) as session, session.begin():
            outbox.enqueue_many(
                session,
                (
                    outbox.OutboxMessage(
                        exchange="", routing_key=queue, body=BODY, message_id=str(i)
                    )
                    for i in range(start, min(n, start + 5000))
                ),
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"VACUUM ANALYZE {outbox.DEFAULT_TABLE_NAME}"))


def raw_publish(db_url: str, n: int) -> float:
    """Read the rows with plain SQL, publish with windowed confirms; return seconds."""
    conninfo = sa.make_url(db_url).set(drivername="postgresql").render_as_string(False)
    db = psycopg.connect(conninfo, autocommit=True)
    window = BATCH * IN_FLIGHT
    st: dict[str, Any] = {"last": 0, "rows": [], "sent": 0, "acked": 0}

    def pump() -> None:
        while st["sent"] - st["acked"] < window and st["sent"] < n:
            if not st["rows"]:
                st["rows"] = db.execute(
                    f"SELECT id, exchange, routing_key, body, message_id FROM "
                    f"{outbox.DEFAULT_TABLE_NAME} WHERE id > %s ORDER BY id LIMIT {BATCH}",
                    (st["last"],),
                ).fetchall()
                st["rows"].reverse()
            row = st["rows"].pop()
            st["last"] = row[0]
            props = pika.BasicProperties(
                delivery_mode=2, message_id=row[4], headers={"x-outbox-id": row[0]}
            )
            st["channel"].basic_publish(row[1], row[2], bytes(row[3]), props, True)
            st["sent"] += 1

    def on_confirm(frame: Any) -> None:
        m = frame.method
        st["acked"] = m.delivery_tag if m.multiple else st["acked"] + 1
        if st["acked"] >= n:
            st["conn"].close()
        else:
            pump()

    def on_channel(channel: Any) -> None:
        st["channel"] = channel
        channel.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: pump())

    with timed() as sw:
        conn = SelectConnection(
            pika.URLParameters(AMQP_URL),
            on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
            on_close_callback=lambda c, _e: c.ioloop.stop(),
        )
        st["conn"] = conn
        conn.ioloop.start()
    db.close()
    return sw.seconds


class Consumer(threading.Thread):
    """Records the arrival time (time.time()) of every message by its outbox row id."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.arrivals: dict[int, float] = {}
        self.ready = threading.Event()
        self._conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))

    def run(self) -> None:
        channel = self._conn.channel()
        channel.basic_qos(prefetch_count=1000)

        def on_message(ch: Any, method: Any, props: Any, _body: bytes) -> None:
            self.arrivals[int(props.headers[outbox.ROW_ID_HEADER])] = time.time()
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(self.queue, on_message)
        self.ready.set()
        with suppress(Exception):  # closed by stop()
            channel.start_consuming()

    def stop(self) -> None:
        self._conn.add_callback_threadsafe(self._conn.close)
        self.join(5)


def _produce(
    engine: sa.Engine, queue: str, k: int, total: int, t0: float, commits: dict[int, float]
) -> None:
    """Producer ``k`` commits rows k, k+P, k+2P, ... each at its due time t0 + i/RATE."""
    for i in range(k, total, PRODUCERS):
        pause = t0 + i / RATE - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        with Session(engine) as session, session.begin():
            row_id = outbox.enqueue(session, exchange="", routing_key=queue, body=BODY)
        commits[row_id] = time.time()


def latency(db_url: str, queue: str) -> dict[str, float]:
    engine = sa.create_engine(db_url, pool_size=8)
    consumer = Consumer(queue)
    consumer.start()
    consumer.ready.wait(10)
    commits: dict[int, float] = {}
    config = outbox.RelayConfig(amqp_url=AMQP_URL, publishing=RELAY_PUBLISHING)
    relay = outbox.Relay(engine, config).start()
    try:
        time.sleep(0.5)  # let the relay connect and LISTEN before the clock starts
        total = int(RATE * DURATION_S)
        # A commit waits for its fsync; several producers share the steady rate.
        t0 = time.monotonic()
        threads = [
            threading.Thread(target=_produce, args=(engine, queue, k, total, t0, commits))
            for k in range(PRODUCERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        achieved = total / (time.monotonic() - t0)
        deadline = time.monotonic() + 30
        while len(consumer.arrivals) < total and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay.stop()
        consumer.stop()
        engine.dispose()
    lat_ms = [
        (consumer.arrivals[i] - t) * 1000 for i, t in commits.items() if i in consumer.arrivals
    ]
    return {
        "rows": float(len(commits)),
        "delivered": float(len(lat_ms)),
        "rate_achieved": achieved,
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "max_ms": max(lat_ms) if lat_ms else float("nan"),
    }


def main() -> None:
    outbox.RelayConfig(amqp_url=AMQP_URL, publishing=RELAY_PUBLISHING)  # a bad name fails now
    queue = f"bench.outbox.{uuid.uuid4().hex[:8]}"
    admin = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = admin.channel()
    channel.queue_declare(queue, durable=True)
    try:
        with fresh_schema() as db_url:
            engine = sa.create_engine(db_url, pool_size=IN_FLIGHT + 2)
            outbox.create_tables(engine)
            log(f"filling {BACKLOG} rows ...")
            fill(engine, queue, BACKLOG)
            log("raw baseline: plain SELECTs + pika windowed confirms ...")
            raw_s = raw_publish(db_url, BACKLOG)
            channel.queue_purge(queue)
            log(f"outbox relay ({RELAY_PUBLISHING}) draining the backlog ...")
            relay = outbox.Relay(
                engine,
                outbox.RelayConfig(
                    amqp_url=AMQP_URL,
                    batch_size=BATCH,
                    max_batches_in_flight=IN_FLIGHT,
                    publishing=RELAY_PUBLISHING,
                ),
            )
            with timed() as sw:
                stats = relay.run_until_idle(timeout_s=300)
            assert stats.published == BACKLOG, stats
            channel.queue_purge(queue)
            engine.dispose()
            raw_rate, relay_rate = BACKLOG / raw_s, BACKLOG / sw.seconds
            log(f"latency at {RATE} rows/s for {DURATION_S:g} s ...")
            lat = latency(db_url, queue)
    finally:
        channel.queue_delete(queue)
        admin.close()
    ratio = relay_rate / raw_rate
    print(
        f"throughput: relay ({RELAY_PUBLISHING}) {relay_rate:,.0f} msg/s, "
        f"raw {raw_rate:,.0f} msg/s, ratio {ratio:.2f} (target >= {TARGET_RATIO})"
    )
    print(
        f"latency at {lat['rate_achieved']:.0f} rows/s: p50 {lat['p50_ms']:.1f} ms, "
        f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms "
        f"(target p50 < {TARGET_P50_MS:g} ms, p99 < {TARGET_P99_MS:g} ms); "
        f"delivered {lat['delivered']:.0f}/{lat['rows']:.0f}"
    )
    emit_result(
        "outbox_relay",
        {
            "backlog_rows": BACKLOG,
            "relay_publishing": RELAY_PUBLISHING,
            "relay_msgs_per_s": round(relay_rate, 1),
            "raw_msgs_per_s": round(raw_rate, 1),
            "throughput_ratio": round(ratio, 3),
            "throughput_ratio_target": TARGET_RATIO,
            "throughput_ok": ratio >= TARGET_RATIO,
            "latency_rate_rows_per_s": round(lat["rate_achieved"], 1),
            "latency_rows": int(lat["rows"]),
            "latency_delivered": int(lat["delivered"]),
            "latency_p50_ms": round(lat["p50_ms"], 2),
            "latency_p99_ms": round(lat["p99_ms"], 2),
            "latency_max_ms": round(lat["max_ms"], 2),
            "latency_p99_target_ms": TARGET_P99_MS,
            "latency_p50_target_ms": TARGET_P50_MS,
            "latency_ok": lat["p99_ms"] < TARGET_P99_MS and lat["p50_ms"] < TARGET_P50_MS,
        },
        [
            row(
                "relay throughput (backlog)",
                relay_rate,
                "msg/s",
                baseline=raw_rate,
                ratio_at_least=TARGET_RATIO,
            ),
            row(
                f"relay commit→broker p50 at {RATE} rows/s",
                lat["p50_ms"],
                "ms",
                lower=TARGET_P50_MS,
            ),
            row(
                f"relay commit→broker p99 at {RATE} rows/s",
                lat["p99_ms"],
                "ms",
                lower=TARGET_P99_MS,
            ),
        ],
    )


if __name__ == "__main__":
    main()
