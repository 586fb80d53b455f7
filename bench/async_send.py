"""Async sends from one event loop (PostgreSQL + RabbitMQ).

``--sends`` (1,000) concurrent ``AsyncSender.send`` calls from one event loop, each CM in a
transaction of its own, against two baselines measured in the same run on the same
database: the sync ``Sender`` with 4 threads (each CM in its own transaction; target: the
async throughput at least 0.8 of it), and a raw async insert of one outbox row per send
with psycopg's ``AsyncConnection`` over as many connections as the async sender's pool
holds (the floor of what any async send can cost; no target). While the async sends run,
every callback the loop runs (a step of a task) is timed: the longest is the longest stall of
the event loop (target: at most 5 ms). A task that sleeps 1 ms at a time also records how
late it wakes (no target: with a thousand sends ready at once, it waits its turn behind
them, which is no stall).

Run: ``python -m bench.async_send [--sends N]`` (env ``CONDMSG_BENCH_PG_URL``,
``CONDMSG_AMQP_URL``). The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg

from bench._common import delete_queues, emit_result, fresh_pg_schema, log, psycopg_conninfo, row
from condmsg import AsyncSender, Destination, Sender

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
SECRET = b"bench-async-send-secret-0123456789abcdef"
THREADS = 4
#: Connections of the async sender's pool (SQLAlchemy's default 5 + 10 overflow) and of
#: the raw baseline.
CONNECTIONS = 15
TARGET_RATIO = 0.8
#: Sends started between two turns of the loop (all of them run concurrently).
LAUNCH_BATCH = 50
TARGET_STALL_MS = 5.0


def sync_rate(db_url: str, sender_name: str, queue: str, sends: int) -> float:
    """CMs per second of the sync sender with :data:`THREADS` threads."""
    sender = Sender(
        amqp_url=AMQP_URL, db_url=db_url, name=sender_name, secret=SECRET, create_schema=True
    )
    condition = Destination(queue, pickup_within=timedelta(minutes=10))
    sender.send({"warm": True}, condition)

    def some(n: int) -> None:
        for i in range(n):
            sender.send({"i": i}, condition)

    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(some, [sends // THREADS] * THREADS))
        return (sends // THREADS * THREADS) / (time.perf_counter() - started)
    finally:
        sender.engine.dispose()


class LongestCallback:
    """Times every callback the event loop runs (a step of a task, an I/O callback) and
    keeps the longest: the longest the loop was held by one piece of code."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._run = asyncio.events.Handle._run

    def __enter__(self) -> LongestCallback:
        run = self._run

        def timed(handle: asyncio.events.Handle) -> None:
            started = time.perf_counter()
            run(handle)
            self.longest_s = max(self.longest_s, time.perf_counter() - started)

        asyncio.events.Handle._run = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.events.Handle._run = self._run  # type: ignore[method-assign]


async def async_rate(
    db_url: str, sender_name: str, queue: str, sends: int
) -> tuple[float, float, float]:
    """(CMs per second, the longest callback in ms, the longest a 1 ms sleeper overslept
    in ms) of concurrent async sends."""
    condition = Destination(queue, pickup_within=timedelta(minutes=10))
    async with AsyncSender(
        amqp_url=AMQP_URL, db_url=db_url, name=sender_name, secret=SECRET
    ) as sender:
        await asyncio.gather(*(sender.send({"warm": i}, condition) for i in range(CONNECTIONS)))
        late: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                before = time.perf_counter()
                await asyncio.sleep(0.001)
                late.append(time.perf_counter() - before - 0.001)

        # What the process holds after its start is no garbage: left to the collector, a
        # full collection of it would land in some send's step (as in any long-lived app
        # that does not freeze its start-up objects).
        gc.collect()
        gc.freeze()
        watcher = asyncio.create_task(probe())
        with LongestCallback() as callbacks:
            started = time.perf_counter()
            tasks = []
            for i in range(sends):
                tasks.append(asyncio.create_task(sender.send({"i": i}, condition)))
                if i % LAUNCH_BATCH == LAUNCH_BATCH - 1:
                    await asyncio.sleep(0)  # the launcher's own work is no stall of condmsg
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
        done.set()
        await watcher
    return sends / elapsed, callbacks.longest_s * 1000, max(late) * 1000


async def raw_rate(db_url: str, queue: str, sends: int) -> float:
    """Outbox rows per second inserted with psycopg's AsyncConnection, one per statement
    (autocommit), over :data:`CONNECTIONS` connections."""
    conninfo = psycopg_conninfo(db_url)
    connections = [
        await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(CONNECTIONS)
    ]
    sql = (
        "INSERT INTO condmsg_outbox (created_at, state, exchange, routing_key, body, "
        "persistent, mandatory, attempts) VALUES (now(), 'done', '', %s, %s, true, true, 0)"
    )
    counter = iter(range(sends))

    async def worker(conn: psycopg.AsyncConnection[Any]) -> None:
        for i in counter:
            await conn.execute(sql, (queue, b'{"i":%d}' % i))

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in connections))
        return sends / (time.perf_counter() - started)
    finally:
        for conn in connections:
            await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sends", type=int, default=1000, help="CMs per series")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    sender_name, queue = f"bench-async-{tag}", f"bench.async.{tag}.q"
    try:
        with fresh_pg_schema(PG_URL, "bench_async") as db_url:
            sync = sync_rate(db_url, sender_name, queue, args.sends)
            log(f"sync sender, {THREADS} threads: {sync:,.0f} CMs/s")
            measured = asyncio.run(async_rate(db_url, sender_name, queue, args.sends))
            rate, stall_ms, late_ms = measured
            log(f"async sender, one loop: {rate:,.0f} CMs/s, longest stall {stall_ms:.1f} ms")
            raw = asyncio.run(raw_rate(db_url, queue, args.sends))
            log(f"raw async outbox insert: {raw:,.0f} rows/s")
    finally:
        delete_queues(AMQP_URL, queue, sender_name)
    print(
        f"{args.sends} concurrent async sends: {rate:,.0f} CMs/s; sync sender with {THREADS} "
        f"threads {sync:,.0f} CMs/s (ratio {rate / sync:.2f}, target >= {TARGET_RATIO}); raw "
        f"async outbox insert {raw:,.0f} rows/s (ratio {rate / raw:.2f}); longest event-loop "
        f"stall (one callback) {stall_ms:.1f} ms (target <= {TARGET_STALL_MS:g} ms); a task "
        f"sleeping 1 ms at a time woke up to {late_ms:.1f} ms late (the loop's queue of "
        f"{args.sends} ready sends, not one stall)"
    )
    emit_result(
        "async_send",
        {
            "sends": args.sends,
            "async_cms_per_s": round(rate, 1),
            "sync_4_threads_cms_per_s": round(sync, 1),
            "raw_async_outbox_rows_per_s": round(raw, 1),
            "ratio_to_sync": round(rate / sync, 3),
            "ratio_to_sync_target": TARGET_RATIO,
            "ratio_to_raw": round(rate / raw, 3),
            "max_stall_ms": round(stall_ms, 2),
            "max_stall_ok": stall_ms <= TARGET_STALL_MS,
            "max_sleeper_late_ms": round(late_ms, 2),
        },
        [
            row(
                "async sends vs sync sender, 4 threads",
                rate,
                "CMs/s",
                baseline=sync,
                ratio_at_least=TARGET_RATIO,
            ),
            row("async sends vs raw async outbox insert", rate, "CMs/s", baseline=raw),
            row("longest event-loop stall during the sends", stall_ms, "ms", lower=TARGET_STALL_MS),
        ],
    )


if __name__ == "__main__":
    main()
