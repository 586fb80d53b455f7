"""The whole pipeline, send to outcome, next to a raw chain doing the same hops.

condmsg: ``Sender.send_many`` in batches of ``--batch`` → the sender's relay (a ``condmsg
relay`` process) → RabbitMQ → a transactional receiver (a ``condmsg consume
--transactional`` process, with its in-process relay for the COMMIT acks) → the evaluator
(a ``condmsg evaluator`` process with its own relay) → the outcome notification, read by
``Sender.outcomes()`` in the benchmark's process. Each CM goes to one destination with a
processing deadline, so its COMMIT ack decides it at once.

Raw chain, the same hops with pika and psycopg and nothing else: the sender inserts a
batch of rows in one transaction and publishes the batch with publisher confirms; a
receiver process consumes each message, inserts its row and commits, publishes an ack and
acks the delivery; an evaluator process consumes each ack, updates the CM's row and
commits, publishes the outcome and acks; the benchmark's process reads the outcomes.
Messages are persistent and queues durable on both sides.

Two measurements per side, alternating sides, ``--rounds`` times (medians):

- **burst**: ``--cms`` CMs sent as fast as one thread can; CMs/s from the first send to
  the last outcome;
- **steady**: ``--rate`` CMs/s for ``--seconds``, well below either side's capacity so
  that no queue builds up; send→outcome latency p50/p99 (from the send's commit to the
  outcome's arrival). The burst's latencies are printed too: there they are mostly the
  time a CM waits behind the ones sent before it.

CPU per CM for each stage from ``/proc``: the sender (this process: sending and reading
outcomes), the sender's relay, the receiver, the evaluator, RabbitMQ (its ``beam.smp``) and
PostgreSQL (every ``postgres`` process: other sessions on the machine count too).

Target: condmsg burst CMs/s at least 0.5 of the raw chain's.

Run: ``python -m bench.pipeline [--cms 3000] [--rate 50] [--seconds 10] [--rounds 2]``
(env ``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``). The last line of stdout is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import psycopg

from bench._common import emit_result, fresh_pg_schema, log, percentile, psycopg_conninfo, row

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TARGET_RATIO = 0.5
STAGES = ("sender", "relay", "receiver", "evaluator", "rabbitmq", "postgres")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- CPU accounting ----------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children, 0 for a process that is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLK_TCK


def _with_descendants(pid: int) -> list[int]:
    """``pid`` and every live process below it (the evaluator's intake workers, say)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except OSError:
                continue
    found, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found.extend(frontier)
    return found


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@dataclass
class CpuMeter:
    """CPU seconds each stage spends between :meth:`start` and :meth:`stop`."""

    stages: dict[str, Callable[[], list[int]]]
    before: dict[str, float] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=dict)

    def _read(self) -> dict[str, float]:
        return {k: sum(_cpu_seconds(p) for p in pids()) for k, pids in self.stages.items()}

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> None:
        after = self._read()
        self.spent = {k: after[k] - self.before[k] for k in self.stages}


def _stage_pids(procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, Callable[[], list[int]]]:
    stages: dict[str, Callable[[], list[int]]] = {"sender": lambda: [os.getpid()]}
    for name, proc in procs.items():
        stages[name] = lambda proc=proc: _with_descendants(proc.pid)  # type: ignore[misc]
    stages["rabbitmq"] = lambda: _pids_named("beam.smp")
    stages["postgres"] = lambda: _pids_named("postgres")
    return stages


# --- shared plumbing ---------------------------------------------------------------------


@dataclass
class Run:
    """One measurement: send times by id, outcome arrival times by id.

    ``done`` counts the sent CMs whose outcome arrived, kept as they come so that waiting
    for the last outcome costs the benchmark's process (the sender stage) nothing per CM.
    """

    sent: dict[str, float] = field(default_factory=dict)
    arrived: dict[str, float] = field(default_factory=dict)
    done: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def mark_sent(self, ids: list[str]) -> None:
        now = time.perf_counter()
        with self.changed:
            for i in ids:
                self.sent[i] = now
                # An outcome may be read before send_many returned its ids.
                self.done += i in self.arrived
            self.changed.notify_all()

    def mark_arrived(self, cm_id: str) -> None:
        with self.changed:
            if cm_id not in self.arrived:
                self.arrived[cm_id] = time.perf_counter()
                self.done += cm_id in self.sent
                self.changed.notify_all()

    def latencies_ms(self) -> list[float]:
        with self.changed:
            return [(self.arrived[i] - t) * 1000 for i, t in self.sent.items() if i in self.arrived]

    def wait_all(self, expected: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while self.done < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        f"only {self.done} of {expected} outcomes arrived in {timeout_s} s"
                    )
                self.changed.wait(left)


def _pace(total: int, batch: int, rate: float | None, send: Callable[[int], None]) -> None:
    """Call ``send(n)`` for batches adding up to ``total``; at ``rate`` CMs/s if given."""
    started = time.perf_counter()
    done = 0
    while done < total:
        n = min(batch, total - done)
        if rate is not None:
            due = started + done / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        send(n)
        done += n


def _consumers(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        return int(channel.queue_declare(queue, passive=True).method.consumer_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if connection.is_open:
            connection.close()


def _wait_consumer(queue: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while _consumers(queue) < 1:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} ended with {proc.returncode} before consuming")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no consumer on {queue} after {timeout_s} s")
        time.sleep(0.05)


def _delete_queues(queues: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        for queue in queues:
            channel = connection.channel()
            channel.queue_delete(queue)
            channel.close()
    finally:
        connection.close()


@contextmanager
def _processes(commands: dict[str, list[str]]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    env = {**os.environ, "CONDMSG_LOG_LEVEL": "WARNING"}
    procs = {
        name: subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        for name, cmd in commands.items()
    }
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Figures:
    cms_per_s: float
    p50_ms: float
    p99_ms: float
    burst_p50_ms: float
    burst_p99_ms: float
    cpu_ms_per_cm: dict[str, float]


# --- condmsg -----------------------------------------------------------------------------


def condmsg_pass(cms: int, rate: float, seconds: float, batch: int) -> Figures:
    from condmsg import Destination, Outgoing, Sender

    run_id = uuid.uuid4().hex[:8]
    name, queue = f"bench-pipe-{run_id}", f"bench.pipe.{run_id}"
    cli = [sys.executable, "-m", "condmsg.cli"]
    with fresh_pg_schema(PG_URL, "bps") as sender_db, fresh_pg_schema(PG_URL, "bpr") as rx_db:
        sender = Sender(amqp_url=AMQP_URL, db_url=sender_db, name=name, create_schema=True)
        condition = Destination(queue, process_within=timedelta(seconds=120))
        sender.send(b"warm-up", condition)  # declares the destination queue
        me = [sys.executable, "-m", "bench.pipeline", "--stage"]
        commands = {
            "relay": [*cli, "relay", "--db-url", sender_db, "--amqp-url", AMQP_URL],
            "receiver": [*me, "receiver", rx_db, queue, f"{queue}.invalid"],
            "evaluator": [
                *(*cli, "evaluator", "--sender", name, "--db-url", sender_db),
                *("--amqp-url", AMQP_URL, "--ack-grace-ms", "100"),
            ],
        }
        try:
            with _processes(commands) as procs:
                _wait_consumer(queue, procs["receiver"])
                _wait_consumer(f"condmsg.{name}.ack", procs["evaluator"])
                if sender.outcome(sender.send(b"ready", condition), timeout=60) is None:
                    raise RuntimeError("the pipeline decided no warm-up CM in 60 s")

                def send(run: Run) -> Callable[[int], None]:
                    def one_batch(n: int) -> None:
                        run.mark_sent(
                            sender.send_many(
                                Outgoing(payload=b"x" * 64, condition=condition) for _ in range(n)
                            )
                        )

                    return one_batch

                return _measure(
                    procs,
                    send,
                    lambda run, stop: _read_outcomes(sender, run, stop),
                    cms,
                    rate,
                    seconds,
                    batch,
                )
        finally:
            sender.engine.dispose()
            _delete_queues(
                [queue, f"{queue}.invalid"]
                + [f"condmsg.{name}.{k}" for k in ("ack", "outcome", "dead")]
            )


def _read_outcomes(sender: Any, run: Run, stop: threading.Event) -> None:
    while not stop.is_set():
        for outcome in sender.outcomes(timeout=0.5):
            run.mark_arrived(outcome.cm_id)
            if stop.is_set():
                return


def cm_receiver(db_url: str, queue: str, invalid_queue: str) -> None:
    """The transactional receiver as its own process: one app row per message, written in
    the receiver's transaction (as the raw receiver writes its row), until SIGTERM."""
    import sqlalchemy as sa

    from ackd import Receiver

    receiver = Receiver(
        amqp_url=AMQP_URL,
        db_url=db_url,
        recipient="bench",
        invalid_queue=invalid_queue,
        create_schema=True,
    )
    with receiver.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE app_rx (id text PRIMARY KEY, body bytea NOT NULL)"))
    insert = sa.text("INSERT INTO app_rx (id, body) VALUES (:id, :body)")
    relay = receiver.start_relay()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def handle(message: Any, session: Any) -> None:
        session.execute(insert, {"id": message.cm_id, "body": message.body})

    try:
        receiver.consume(queue, handle, transactional=True, prefetch=100, stop=stop)
    finally:
        relay.stop()
        receiver.close()


# --- the measurement both sides share ----------------------------------------------------


def _measure(
    procs: dict[str, subprocess.Popen[bytes]],
    send: Callable[[Run], Callable[[int], None]],
    read: Callable[[Run, threading.Event], None],
    cms: int,
    rate: float,
    seconds: float,
    batch: int,
) -> Figures:
    meter = CpuMeter(_stage_pids(procs))
    results: dict[str, Run] = {}
    burst_rate = 0.0
    for mode, total, pace in (("burst", cms, None), ("steady", int(rate * seconds), rate)):
        run = Run()
        stop = threading.Event()
        reader = threading.Thread(target=read, args=(run, stop), daemon=True)
        reader.start()
        if mode == "burst":
            meter.start()
        started = time.perf_counter()
        _pace(total, batch if pace is None else max(1, int(pace // 20)), pace, send(run))
        run.wait_all(total, 300)
        elapsed = time.perf_counter() - started
        if mode == "burst":
            meter.stop()
            burst_rate = total / elapsed
        stop.set()
        reader.join(10)
        results[mode] = run
    latencies, burst = results["steady"].latencies_ms(), results["burst"].latencies_ms()
    return Figures(
        cms_per_s=burst_rate,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        burst_p50_ms=percentile(burst, 50),
        burst_p99_ms=percentile(burst, 99),
        cpu_ms_per_cm={k: v * 1000 / cms for k, v in meter.spent.items()},
    )


# --- the raw chain -----------------------------------------------------------------------


def raw_pass(cms: int, rate: float, seconds: float, batch: int) -> Figures:
    run_id = uuid.uuid4().hex[:8]
    queues = {k: f"bench.raw.{run_id}.{k}" for k in ("copy", "ack", "outcome")}
    with fresh_pg_schema(PG_URL, "brs") as sender_db, fresh_pg_schema(PG_URL, "brr") as rx_db:
        sender_dsn, rx_dsn = psycopg_conninfo(sender_db), psycopg_conninfo(rx_db)
        with psycopg.connect(sender_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE raw_cm (id text PRIMARY KEY, state text NOT NULL)")
        with psycopg.connect(rx_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE raw_rx (id text PRIMARY KEY, body bytea NOT NULL)")
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = connection.channel()
        for queue in queues.values():
            channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        me = [sys.executable, "-m", "bench.pipeline", "--stage"]
        commands = {
            "receiver": [*me, "raw-receiver", rx_dsn, queues["copy"], queues["ack"]],
            "evaluator": [*me, "raw-evaluator", sender_dsn, queues["ack"], queues["outcome"]],
        }
        db = psycopg.connect(sender_dsn)
        try:
            with _processes(commands) as procs:
                _wait_consumer(queues["copy"], procs["receiver"])
                _wait_consumer(queues["ack"], procs["evaluator"])
                persistent = pika.BasicProperties(delivery_mode=2, content_type="text/plain")

                def send(run: Run) -> Callable[[int], None]:
                    def one_batch(n: int) -> None:
                        ids = [uuid.uuid4().hex for _ in range(n)]
                        with db.cursor() as cur:
                            cur.executemany(
                                "INSERT INTO raw_cm (id, state) VALUES (%s, 'pending')",
                                [(i,) for i in ids],
                            )
                        db.commit()
                        run.mark_sent(ids)
                        for i in ids:
                            channel.basic_publish(
                                "", queues["copy"], i.encode(), persistent, mandatory=False
                            )

                    return one_batch

                return _measure(
                    procs,
                    send,
                    lambda run, stop: _read_raw_outcomes(queues["outcome"], run, stop),
                    cms,
                    rate,
                    seconds,
                    batch,
                )
        finally:
            db.close()
            for queue in queues.values():
                channel.queue_delete(queue)
            connection.close()


def _read_raw_outcomes(queue: str, run: Run, stop: threading.Event) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    try:
        for method, _props, body in channel.consume(queue, inactivity_timeout=0.2):
            if stop.is_set():
                return
            if method is not None and body is not None:
                run.mark_arrived(body.decode())
                channel.basic_ack(method.delivery_tag or 0)
    finally:
        connection.close()


def raw_stage(stage: str, dsn: str, source: str, target: str) -> None:
    """One raw stage as its own process: consume ``source``, write, publish to ``target``."""
    db = psycopg.connect(dsn)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    persistent = pika.BasicProperties(delivery_mode=2, content_type="application/json")
    sql = (
        "INSERT INTO raw_rx (id, body) VALUES (%s, %s)"
        if stage == "receiver"
        else "UPDATE raw_cm SET state = 'satisfied' WHERE id = %s AND state = 'pending'"
    )

    def handle(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        cm_id = body.decode() if stage == "receiver" else json.loads(body)["cm_id"]
        with db.cursor() as cur:
            cur.execute(sql, (cm_id, body) if stage == "receiver" else (cm_id,))
        db.commit()
        if stage == "receiver":
            out = json.dumps({"cm_id": cm_id, "kind": "commit"}).encode()
        else:
            out = cm_id.encode()
        ch.basic_publish("", target, out, persistent)
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(source, handle)
    signal.signal(signal.SIGTERM, lambda *_: channel.stop_consuming())
    try:
        channel.start_consuming()
    finally:
        connection.close()
        db.close()


# --- report ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cms", type=int, default=3000, help="CMs in the burst")
    parser.add_argument("--rate", type=float, default=50.0, help="CMs/s of the steady run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the steady run")
    parser.add_argument("--batch", type=int, default=100, help="CMs per send_many in the burst")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stage", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        stage, *rest = args.stage
        if stage == "receiver":
            cm_receiver(*rest)
        else:
            raw_stage(stage.removeprefix("raw-"), *rest)
        return
    samples: dict[str, list[Figures]] = {"condmsg": [], "raw": []}
    for r in range(args.rounds):
        for side, one_pass in (("raw", raw_pass), ("condmsg", condmsg_pass)):
            figures = one_pass(args.cms, args.rate, args.seconds, args.batch)
            samples[side].append(figures)
            log(
                f"round {r + 1} {side}: {figures.cms_per_s:,.0f} CMs/s, steady p50 "
                f"{figures.p50_ms:.1f} ms p99 {figures.p99_ms:.1f} ms, CPU ms/CM "
                + ", ".join(f"{k} {v:.2f}" for k, v in figures.cpu_ms_per_cm.items())
            )
    report(args, samples)


def _median(figures: list[Figures]) -> dict[str, Any]:
    return {
        "cms_per_s": round(statistics.median(f.cms_per_s for f in figures), 1),
        "p50_ms": round(statistics.median(f.p50_ms for f in figures), 2),
        "p99_ms": round(statistics.median(f.p99_ms for f in figures), 2),
        "burst_p50_ms": round(statistics.median(f.burst_p50_ms for f in figures), 2),
        "burst_p99_ms": round(statistics.median(f.burst_p99_ms for f in figures), 2),
        "cpu_ms_per_cm": {
            k: round(statistics.median(f.cpu_ms_per_cm.get(k, 0.0) for f in figures), 3)
            for k in STAGES
        },
    }


def report(args: argparse.Namespace, samples: dict[str, list[Figures]]) -> None:
    cm, raw = _median(samples["condmsg"]), _median(samples["raw"])
    ratio = cm["cms_per_s"] / raw["cms_per_s"]
    print(
        f"pipeline burst ({args.cms} CMs, batches of {args.batch}), median of {args.rounds}: "
        f"condmsg {cm['cms_per_s']:,.0f} CMs/s, raw chain {raw['cms_per_s']:,.0f} CMs/s, "
        f"ratio {ratio:.2f} (target >= {TARGET_RATIO})"
    )
    print(
        f"steady {args.rate:.0f} CMs/s for {args.seconds:.0f} s, send→outcome: condmsg p50 "
        f"{cm['p50_ms']:.1f} ms p99 {cm['p99_ms']:.1f} ms; raw p50 {raw['p50_ms']:.1f} ms "
        f"p99 {raw['p99_ms']:.1f} ms"
    )
    print(
        f"burst, send→outcome: condmsg p50 {cm['burst_p50_ms']:.0f} ms p99 "
        f"{cm['burst_p99_ms']:.0f} ms; raw p50 {raw['burst_p50_ms']:.0f} ms p99 "
        f"{raw['burst_p99_ms']:.0f} ms"
    )
    print(f"{'CPU ms per CM':<14}{'condmsg':>10}{'raw':>10}")
    for stage in STAGES:
        print(f"{stage:<14}{cm['cpu_ms_per_cm'][stage]:>10.2f}{raw['cpu_ms_per_cm'][stage]:>10.2f}")
    print(
        f"{'total':<14}{sum(cm['cpu_ms_per_cm'].values()):>10.2f}"
        f"{sum(raw['cpu_ms_per_cm'].values()):>10.2f}"
    )
    emit_result(
        "pipeline",
        {
            "cms": args.cms,
            "rounds": args.rounds,
            "steady_rate": args.rate,
            "condmsg": cm,
            "raw": raw,
            "ratio": round(ratio, 3),
            "ratio_target": TARGET_RATIO,
            "ratio_ok": ratio >= TARGET_RATIO,
        },
        [
            row(
                "pipeline burst, send→outcome",
                cm["cms_per_s"],
                "CMs/s",
                baseline=raw["cms_per_s"],
                ratio_at_least=TARGET_RATIO,
            ),
            row("pipeline steady, send→outcome p50", cm["p50_ms"], "ms", baseline=raw["p50_ms"]),
            row("pipeline steady, send→outcome p99", cm["p99_ms"], "ms", baseline=raw["p99_ms"]),
            row(
                "pipeline CPU per CM, all stages",
                sum(cm["cpu_ms_per_cm"].values()),
                "ms",
                baseline=sum(raw["cpu_ms_per_cm"].values()),
            ),
        ],
    )


if __name__ == "__main__":
    main()
