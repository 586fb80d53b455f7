"""Evaluator benchmark (PostgreSQL + RabbitMQ).

(a) Ack intake throughput: N genuine ack documents waiting in the ack queue, taken in by
    :class:`evaluator.service.Evaluator` (decode, verify, store, decide, outbox writes),
    next to a raw baseline measured in the same run on the same acks: a bare pika consumer
    (same prefetch and batch) that decodes the JSON and inserts each batch of acks into a
    copy of ``condmsg_ack``. Target: evaluator / raw >= 0.5. The evaluator runs with one
    intake process per core (``intake_processes``, its workers started inside the timed
    run); the one-process figure is measured and printed too, each with its own raw
    baseline, on its own fresh acks.
(b) Decision latency: a real ``ackd.Receiver`` commits the last needed ack of a CM (its
    own store and relay); latency = the outcome message's arrival at the sender's outcome
    consumer minus the receiver's commit (same machine clock). Target: p99 < 25 ms.
(c) Timeout lateness: CMs nobody reads; lateness = outcome arrival minus (deadline +
    ack_grace), with the service's default sweep interval. Target: p99 < 50 ms.
(d) Sweep scaling: the time of ``Evaluator.sweep()`` for one due batch with 10,000 and with
    1,000,000 pending CMs (bulk-inserted with far-future next checks). Target: ratio < 2.
    And the sweeps' load at 1,000,000 pending with nothing due: the statements and commits
    per second the idle service sends (relay and gauges off), with the (b)/(c) interval.

Run: ``python -m bench.evaluator [--intake N] [--latency N] [--timeouts N] [--large N]``
(env ``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``). The last line of stdout is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from datetime import UTC, timedelta
from typing import Any

import pika
import sqlalchemy as sa

from ackd.receiver import Receiver
from bench._common import emit_result, fresh_pg_schema, log, percentile, row, timed, wait_until
from condmsg import Destination, tables
from condmsg.core import protocol
from condmsg.core.acks import AckKind
from condmsg.core.condition_codec import condition_to_json
from condmsg.core.outcome import SPHERE_OUTCOME_TYPE, Outcome, SphereOutcome
from condmsg.core.timeutil import utcnow
from condmsg.runtime.settings import DEFAULT_ACK_GRACE
from condmsg.sending.sender import Outgoing, Sender
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
SECRET = b"bench-evaluator-secret-9d3f7b1a5c2e"
BATCH, PREFETCH = 500, 1000  # the evaluator's defaults; the raw baseline gets the same
#: The evaluator's intake processes: one per core, as ``docs/evaluator.md`` recommends for
#: ``condmsg evaluator --intake-processes``; the one-process figure is printed too.
INTAKE_PROCESSES = os.cpu_count() or 1
SWEEP_BATCH = 500
TARGET_INTAKE_RATIO = 0.5
TARGET_DECISION_P99_MS = 25.0
TARGET_LATENESS_P99_MS = 50.0
TARGET_SWEEP_RATIO = 2.0
TARGET_INTAKE_1P_RATIO = 0.7


def _send_many(sender: Sender, condition: Any, n: int, chunk: int = 2000) -> list[str]:
    ids: list[str] = []
    while len(ids) < n:
        batch = [Outgoing(payload=b"x", condition=condition)] * min(chunk, n - len(ids))
        ids += sender.send_many(batch)
    return ids


def _ack_bodies(cm_ids: list[str], queue: str) -> list[bytes]:
    now = utcnow()
    return [
        protocol.AckMessage(
            ack_id=uuid.uuid4().hex,
            cm_id=cm_id,
            destination=queue,
            kind=AckKind.READ,
            read_at=now,
            committed_at=None,
            recipient=None,
            receiver="bench",
            token=protocol.copy_token(SECRET, cm_id, queue, None),
        ).to_json()
        for cm_id in cm_ids
    ]


def _publish(channel: Any, queue: str, bodies: list[bytes]) -> None:
    props = pika.BasicProperties(delivery_mode=2)
    for body in bodies:
        channel.basic_publish("", queue, body, props)
    # One round trip after the burst: everything above has reached the broker.
    channel.queue_declare(queue, passive=True)


def _count(engine: Any, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def raw_intake(engine: Any, ack_queue: str, n: int) -> float:
    """Bare pika consume + JSON decode + one executemany INSERT per batch (psycopg sends
    the rows in one pipeline), committed and acked per batch."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE raw_ack (LIKE condmsg_ack INCLUDING ALL)"))
    # The ack table's columns that the ack document fills in, in the table's order; the
    # intake adds ``received_at`` and ``status``.
    from_doc = tuple(c.name for c in tables.acks.columns if c.name in protocol.ACK_FIELDS)
    columns = (*from_doc, "received_at")
    insert = sa.text(
        f"INSERT INTO raw_ack ({', '.join(columns)}, status)"
        f" VALUES ({', '.join(f':{c}' for c in columns)}, 'counted')"
        " ON CONFLICT (ack_id) DO NOTHING"
    )
    done = 0
    batch: list[tuple[int, bytes]] = []
    # Timed from the connection on, as the service is (its start connects and declares).
    with timed() as sw:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=PREFETCH)
        for method, _props, body in channel.consume(ack_queue, inactivity_timeout=0.02):
            if method is not None:
                batch.append((int(method.delivery_tag or 0), body or b""))
            if batch and (method is None or len(batch) >= BATCH):
                now = utcnow()
                rows = []
                for _, raw in batch:
                    doc = json.loads(raw)
                    rows.append({**{k: doc[k] for k in from_doc}, "received_at": now})
                with engine.begin() as conn:
                    conn.execute(insert, rows)
                channel.basic_ack(batch[-1][0], multiple=True)
                done += len(batch)
                batch = []
                if done >= n:
                    break
    channel.cancel()
    connection.close()
    assert _count(engine, "raw_ack") == n
    return sw.seconds


def intake(db_url: str, sender_name: str, queue: str, n: int, processes: int) -> dict[str, float]:
    engine = sa.create_engine(db_url, pool_size=4)
    sender = Sender(
        amqp_url=AMQP_URL, engine=engine, name=sender_name, secret=SECRET, create_schema=True
    )
    log(f"(a) sending {n} CMs ...")
    cm_ids = _send_many(sender, Destination(queue, pickup_within=timedelta(minutes=10)), n)
    bodies = _ack_bodies(cm_ids, queue)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    ack_queue = protocol.ack_queue(sender_name)
    log("(a) raw baseline: pika consume + batched INSERT ...")
    _publish(channel, ack_queue, bodies)
    raw_s = raw_intake(engine, ack_queue, n)
    log(f"(a) evaluator intake, {processes} intake process(es) ...")
    _publish(channel, ack_queue, bodies)
    connection.close()
    service = Evaluator(
        EvaluatorConfig(
            freeze_gc=True,  # as `condmsg evaluator` runs it: a process of its own
            amqp_url=AMQP_URL,
            sender=sender_name,
            db_url=db_url,  # for the intake workers, which connect themselves
            secret=SECRET,
            relay=False,
            batch_size=BATCH,
            prefetch=PREFETCH,
            sweep_interval_s=3600,
            intake_processes=processes,
        ),
        engine=engine,
    )

    def stored() -> float:
        # The service's own counter, bumped after each batch commits (its workers' batches
        # as they report them): polling a count(*) of the ack table instead would load
        # the database being measured.
        return service.registry.get_sample_value("condmsg_evaluator_acks_total") or 0.0

    with timed() as sw:
        service.start()
        ok = wait_until(lambda: stored() >= n, timeout_s=300, poll_s=0.01)
    service.stop()
    assert _count(engine, "condmsg_ack") == n
    assert ok, "the evaluator did not take in every ack"
    with engine.connect() as conn:
        pending = conn.execute(sa.text("SELECT count(*) FROM condmsg_cm WHERE state='pending'"))
        assert pending.scalar_one() == 0
    engine.dispose()
    return {"raw_s": raw_s, "evaluator_s": sw.seconds}


class OutcomeWatcher:
    """Consumes the sender's outcome queue in a thread; arrival time (epoch s) per CM and,
    told apart by the AMQP message type, per Dependency-Sphere."""

    def __init__(self, sender_name: str) -> None:
        self.arrived: dict[str, float] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.spheres: dict[str, float] = {}
        self.sphere_verdicts: dict[str, str] = {}
        self._queue = protocol.outcome_queue(sender_name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = connection.channel()
        for method, props, body in channel.consume(
            self._queue, auto_ack=True, inactivity_timeout=0.05
        ):
            if method is not None and body is not None:
                at = time.time()
                if props is not None and props.type == SPHERE_OUTCOME_TYPE:
                    sphere = SphereOutcome.from_json(body)
                    self.spheres.setdefault(sphere.sphere_id, at)
                    self.sphere_verdicts[sphere.sphere_id] = sphere.verdict.value
                else:
                    outcome = Outcome.from_json(body)
                    self.arrived.setdefault(outcome.cm_id, at)
                    self.outcomes[outcome.cm_id] = outcome
            if self._stop.is_set():
                break
        channel.cancel()
        connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def latencies(
    db_url: str,
    rx_url: str,
    sender_name: str,
    queue: str,
    n_latency: int,
    n_timeouts: int,
    sweep_interval_s: float,
) -> dict[str, Any]:
    engine = sa.create_engine(db_url, pool_size=8)
    sender = Sender(
        amqp_url=AMQP_URL, engine=engine, name=sender_name, secret=SECRET, create_schema=True
    )
    watcher = OutcomeWatcher(sender_name)
    service = Evaluator(
        EvaluatorConfig(
            freeze_gc=True,  # as `condmsg evaluator` runs it: a process of its own
            amqp_url=AMQP_URL,
            sender=sender_name,
            secret=SECRET,
            sweep_interval_s=sweep_interval_s,
        ),
        engine=engine,
    ).start()
    receiver = Receiver(amqp_url=AMQP_URL, db_url=rx_url, recipient="bench", create_schema=True)
    rx_relay = receiver.start_relay()
    decision_ms: list[float] = []
    lateness_ms: list[float] = []
    try:
        log(f"(b) decision latency over {n_latency} CMs ...")
        condition = Destination(queue, process_within=timedelta(minutes=10))
        for i in range(n_latency + 5):
            cm_id = sender.send(b"x", condition)
            with receiver.transaction() as tx:
                message = tx.read(queue, timeout=30)
                assert message is not None and message.cm_id == cm_id
            committed = time.time()
            assert wait_until(
                lambda c=cm_id: c in watcher.arrived,  # type: ignore[misc]
                timeout_s=30,
                poll_s=0.002,
            )
            if i >= 5:  # warm-up excluded
                decision_ms.append((watcher.arrived[cm_id] - committed) * 1000)
        log(f"(c) timeout lateness over {n_timeouts} CMs ...")
        window = timedelta(seconds=1)
        timeout_q = f"{queue}.none"
        late = Destination(timeout_q, pickup_within=window)
        ids = []
        for _ in range(n_timeouts):
            ids.append(sender.send(b"x", late))
            time.sleep(0.01)  # deadlines spread over the sweeps
        assert wait_until(lambda: all(c in watcher.arrived for c in ids), timeout_s=120)
        with engine.connect() as conn:
            query = sa.select(tables.cms.c.cm_id, tables.cms.c.sent_at)
            sent = {r.cm_id: r.sent_at for r in conn.execute(query)}
        for cm_id in ids:
            assert watcher.outcomes[cm_id].verdict.value == "violated"
            sent_at = sent[cm_id]
            sent_at = sent_at if sent_at.tzinfo else sent_at.replace(tzinfo=UTC)
            due = (sent_at + window + service.config.ack_grace).timestamp()
            lateness_ms.append((watcher.arrived[cm_id] - due) * 1000)
    finally:
        rx_relay.stop()
        receiver.close()
        receiver.engine.dispose()
        service.stop()
        watcher.stop()
        with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
            connection.channel().queue_delete(f"{queue}.none")
        engine.dispose()
    return {"decision_ms": decision_ms, "lateness_ms": lateness_ms}


def sweep_time(db_url: str, sender_name: str, queue: str, pending: int, rounds: int) -> float:
    """Median seconds of one ``sweep()`` deciding a due batch among ``pending`` CMs."""
    engine = sa.create_engine(db_url, pool_size=4)
    Sender(
        amqp_url=AMQP_URL,
        engine=engine,
        name=sender_name,
        secret=SECRET,
        declare_queues=False,
        create_schema=True,
    )
    condition = Destination(queue, pickup_within=timedelta(seconds=1))
    log(f"(d) bulk-inserting {pending:,} pending CMs ...")
    with timed() as sw, engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO condmsg_cm (cm_id, sender, sent_at, condition_json,"
                " evaluation_deadline, payload_size, notify_success, state, next_check_at)"
                " SELECT md5(g::text)::uuid::text, :sender, now(), :cond,"
                " now() + interval '100 days', 1, false, 'pending',"
                " now() + interval '100 days' + g * interval '1 ms'"
                " FROM generate_series(1, :n) AS g"
            ),
            {"sender": sender_name, "cond": condition_to_json(condition), "n": pending},
        )
    log(f"    inserted in {sw.seconds:.1f} s; ANALYZE ...")
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE condmsg_cm"))
    past = utcnow() - timedelta(seconds=30)
    due_sender = Sender(
        amqp_url=AMQP_URL,
        engine=engine,
        name=sender_name,
        secret=SECRET,
        declare_queues=False,
        clock=lambda: past,
    )
    service = Evaluator(
        EvaluatorConfig(
            freeze_gc=True,  # as `condmsg evaluator` runs it: a process of its own
            amqp_url=AMQP_URL,
            sender=sender_name,
            secret=SECRET,
            relay=False,
            sweep_batch=SWEEP_BATCH,
        ),
        engine=engine,
    )
    times = []
    for _ in range(rounds + 1):
        _send_many(due_sender, condition, SWEEP_BATCH)
        with timed() as sw:
            decided = service.sweep()
        assert decided == SWEEP_BATCH, decided
        times.append(sw.seconds)
    engine.dispose()
    return statistics.median(times[1:])  # the first round warms caches up


def sweep_load(db_url: str, sender_name: str, sweep_interval_s: float, period_s: float) -> Any:
    """The idle service's database load over ``period_s`` seconds, in the store of
    :func:`sweep_time` (its pending CMs due in 100 days): the statements and commits the
    service sends per second, counted on its engine. Nothing is due and the relay and the
    gauges are off, so what is counted is what the deadline sweeps cost with nothing to do.
    """
    engine = sa.create_engine(db_url, pool_size=4)
    counts = {"statements": 0, "commits": 0}

    def statement(*_: Any) -> None:
        counts["statements"] += 1

    def commit(*_: Any) -> None:
        counts["commits"] += 1

    sa.event.listen(engine, "before_cursor_execute", statement)
    sa.event.listen(engine, "commit", commit)
    service = Evaluator(
        EvaluatorConfig(
            freeze_gc=True,
            amqp_url=AMQP_URL,
            sender=sender_name,
            secret=SECRET,
            relay=False,
            sweep_interval_s=sweep_interval_s,
            gauge_interval_s=3600,  # its first refresh runs at start, before the count
            summary_interval_s=0,
        ),
        engine=engine,
    ).start()
    try:
        # Counted from the second interval on: the start-up's own statements are not the
        # sweep's.
        time.sleep(max(2.0, 2 * sweep_interval_s))
        before = dict(counts)
        with timed() as sw:
            time.sleep(period_s)
        after = dict(counts)
    finally:
        service.stop()
        engine.dispose()
    return {k: (after[k] - before[k]) / sw.seconds for k in counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intake", type=int, default=30_000, help="acks for (a)")
    parser.add_argument("--latency", type=int, default=200, help="CMs for (b)")
    parser.add_argument("--timeouts", type=int, default=200, help="CMs for (c)")
    parser.add_argument(
        "--sweep-interval", type=float, default=1.0, help="seconds, (b)-(d): the service's default"
    )
    parser.add_argument("--small", type=int, default=10_000, help="pending CMs, (d)")
    parser.add_argument("--large", type=int, default=1_000_000, help="pending CMs, (d)")
    parser.add_argument("--rounds", type=int, default=3, help="timed sweeps per size")
    parser.add_argument(
        "--load-period", type=float, default=10.0, help="seconds the idle load is counted, (d)"
    )
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    sender_name, queue = f"bench-eval-{tag}", f"bench.eval.{tag}.q"
    try:
        runs: dict[int, dict[str, float]] = {}
        for processes in sorted({1, INTAKE_PROCESSES}):
            with fresh_pg_schema(PG_URL, "bench_eval") as db_url:
                runs[processes] = intake(db_url, sender_name, queue, args.intake, processes)
        with (
            fresh_pg_schema(PG_URL, "bench_eval") as db_url,
            fresh_pg_schema(PG_URL, "bench_rx") as rx_url,
        ):
            lat = latencies(
                db_url,
                rx_url,
                sender_name,
                queue,
                args.latency,
                args.timeouts,
                args.sweep_interval,
            )
        sweeps = {}
        for size in (args.small, args.large):
            with fresh_pg_schema(PG_URL, "bench_eval") as db_url:
                sweeps[size] = sweep_time(db_url, sender_name, queue, size, args.rounds)
                if size == args.large:
                    log(f"(d) idle load at {size:,} pending over {args.load_period:g} s ...")
                    load = sweep_load(db_url, sender_name, args.sweep_interval, args.load_period)
    finally:
        with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
            channel = connection.channel()
            for name in (
                queue,
                *(f"condmsg.{sender_name}.{k}" for k in ("ack", "outcome", "dead")),
            ):
                channel.queue_delete(name)
    rates = {
        k: (args.intake / run["evaluator_s"], args.intake / run["raw_s"]) for k, run in runs.items()
    }
    intake_rate, raw_rate = rates[INTAKE_PROCESSES]
    intake_ratio = intake_rate / raw_rate
    one_rate, one_raw = rates[1]
    d, late = lat["decision_ms"], lat["lateness_ms"]
    sweep_ratio = sweeps[args.large] / sweeps[args.small]
    print(
        f"intake: evaluator {intake_rate:,.0f} acks/s with {INTAKE_PROCESSES} intake "
        f"process(es), raw {raw_rate:,.0f} acks/s, ratio {intake_ratio:.2f} "
        f"(target >= {TARGET_INTAKE_RATIO}); one process: {one_rate:,.0f} acks/s, raw "
        f"{one_raw:,.0f} acks/s, ratio {one_rate / one_raw:.2f}"
    )
    print(
        f"decision latency: p50 {percentile(d, 50):.1f} ms, p99 {percentile(d, 99):.1f} ms "
        f"(target p99 < {TARGET_DECISION_P99_MS:g} ms)"
    )
    print(
        f"timeout lateness: p50 {percentile(late, 50):.1f} ms, p99 {percentile(late, 99):.1f} ms"
        f" (target p99 < {TARGET_LATENESS_P99_MS:g} ms)"
    )
    print(
        f"sweep load at {args.large:,} pending, idle: {load['statements']:.1f} statements/s, "
        f"{load['commits']:.1f} commits/s (sweep interval {args.sweep_interval:g} s)"
    )
    print(
        f"sweep of {SWEEP_BATCH} due: {sweeps[args.small] * 1000:.1f} ms at {args.small:,} "
        f"pending, {sweeps[args.large] * 1000:.1f} ms at {args.large:,} pending, ratio "
        f"{sweep_ratio:.2f} (target < {TARGET_SWEEP_RATIO:g})"
    )
    emit_result(
        "evaluator",
        {
            "intake_acks": args.intake,
            "intake_acks_per_s": round(intake_rate, 1),
            "raw_intake_acks_per_s": round(raw_rate, 1),
            "intake_ratio": round(intake_ratio, 3),
            "intake_ratio_target": TARGET_INTAKE_RATIO,
            "intake_processes": INTAKE_PROCESSES,
            "intake_1p_acks_per_s": round(one_rate, 1),
            "intake_1p_raw_acks_per_s": round(one_raw, 1),
            "intake_1p_ratio": round(one_rate / one_raw, 3),
            "intake_ok": intake_ratio >= TARGET_INTAKE_RATIO,
            "decision_cms": len(d),
            "decision_p50_ms": round(percentile(d, 50), 2),
            "decision_p99_ms": round(percentile(d, 99), 2),
            "decision_p99_target_ms": TARGET_DECISION_P99_MS,
            "decision_ok": percentile(d, 99) < TARGET_DECISION_P99_MS,
            "timeout_cms": len(late),
            "sweep_interval_s": args.sweep_interval,
            "ack_grace_ms": DEFAULT_ACK_GRACE.total_seconds() * 1000,
            "lateness_p50_ms": round(percentile(late, 50), 2),
            "lateness_p99_ms": round(percentile(late, 99), 2),
            "lateness_p99_target_ms": TARGET_LATENESS_P99_MS,
            "lateness_ok": percentile(late, 99) < TARGET_LATENESS_P99_MS,
            "sweep_batch": SWEEP_BATCH,
            "sweep_small_pending": args.small,
            "sweep_small_ms": round(sweeps[args.small] * 1000, 2),
            "sweep_large_pending": args.large,
            "sweep_large_ms": round(sweeps[args.large] * 1000, 2),
            "sweep_ratio": round(sweep_ratio, 3),
            "sweep_ratio_target": TARGET_SWEEP_RATIO,
            "sweep_ok": sweep_ratio < TARGET_SWEEP_RATIO,
            "sweep_idle_statements_per_s": round(load["statements"], 2),
            "sweep_idle_commits_per_s": round(load["commits"], 2),
        },
        [
            row(
                "intake, one intake process per core",
                intake_rate,
                "acks/s",
                baseline=raw_rate,
                ratio_at_least=TARGET_INTAKE_RATIO,
            ),
            row(
                "intake, one process",
                one_rate,
                "acks/s",
                baseline=one_raw,
                ratio_at_least=TARGET_INTAKE_1P_RATIO,
            ),
            row("decision latency p99", percentile(d, 99), "ms", lower=TARGET_DECISION_P99_MS),
            row("timeout lateness p99", percentile(late, 99), "ms", lower=TARGET_LATENESS_P99_MS),
            row(
                f"sweep of 500 due at {args.large:,} pending",
                sweeps[args.large] * 1000,
                "ms",
                baseline=sweeps[args.small] * 1000,
            ),
            row(
                f"sweep time at {args.large:,} / at {args.small:,} pending",
                sweep_ratio,
                lower=TARGET_SWEEP_RATIO,
            ),
            row("sweep statements/s at rest", load["statements"], "1/s"),
        ],
    )


if __name__ == "__main__":
    main()
