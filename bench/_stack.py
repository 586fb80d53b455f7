"""The whole condmsg pipeline as separate processes, for the benchmarks that run it for long
or with several competing consumers (``bench.soak``, ``bench.store_size``,
``bench.scale_out``).

What runs: the benchmark's process is the sender app (``Sender.send_many``, and
``Sender.outcomes()`` in a thread); a ``condmsg relay`` process publishes the sender
store's outbox; ``receivers`` transactional receivers (this module's ``receiver`` stage,
each its own process) compete for one destination queue and write one app row per CM in
their transaction; ``evaluators`` ``condmsg evaluator`` processes, each with its own
in-process relay, compete for the sender's ack queue. Each service is a process of its
own so that its CPU and memory are its own (a thread's memory cannot be told apart from
its process's).

A CM is ``ok`` (processed within two minutes: satisfied at its COMMIT ack) or ``late``
(processed within one millisecond: its COMMIT ack is always late, so it is violated when
that ack arrives and its compensation goes to the destination, whose receiver deletes the
app row the original wrote; a compensation that overtakes its original cancels it, and
the app gets neither).

Run one receiver stage by hand: ``python -m bench._stack receiver DB_URL QUEUE INVALID``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from bench._common import fresh_pg_schema
from bench.pipeline import AMQP_URL, _delete_queues, _processes, _wait_consumer

APP_TABLE = "bench_app_rx"


@dataclass
class Stack:
    """A running pipeline: the sender, the two conditions, the services by name."""

    sender: Any
    name: str
    queue: str
    sender_db: str
    rx_db: str
    ok: Any
    late: Any
    procs: dict[str, Any]

    def outgoing(self, n: int, violate_every: int = 0, start: int = 0) -> list[Any]:
        """``n`` CMs of 64 bytes; the ``violate_every``-th of the running count (from
        ``start``) under the late condition (0: none)."""
        from condmsg import Outgoing

        return [
            Outgoing(
                payload=b"x" * 64,
                condition=self.late
                if violate_every and (start + i) % violate_every == violate_every - 1
                else self.ok,
            )
            for i in range(n)
        ]

    def queues(self) -> dict[str, str]:
        """The broker queues the pipeline uses, by role."""
        return {
            "destination": self.queue,
            "invalid": f"{self.queue}.invalid",
            **{k: f"condmsg.{self.name}.{k}" for k in ("ack", "outcome", "dead")},
        }

    def schemas(self) -> dict[str, str]:
        """The sender's and the receivers' schema names (from their URLs' search_path)."""
        return {"sender": _schema_of(self.sender_db), "receiver": _schema_of(self.rx_db)}


def _schema_of(url: str) -> str:
    return url.rsplit("search_path%3D", 1)[1]


@contextmanager
def condmsg_stack(
    pg_url: str,
    *,
    receivers: int = 1,
    evaluators: int = 1,
    prepare: Callable[[str, str], None] | None = None,
) -> Iterator[Stack]:
    """Start the pipeline on fresh schemas of ``pg_url`` and yield it once a warm-up CM
    has been decided; stop every service and drop the schemas and queues afterwards.

    ``prepare(sender_db, rx_db)`` runs on the created stores before any service starts
    (``bench.store_size`` fills them there, ``bench.soak`` sets their tables' options).
    """
    from condmsg import Destination, Sender
    from condmsg.runtime.migrate import upgrade

    run_id = uuid.uuid4().hex[:8]
    name, queue = f"bench-stack-{run_id}", f"bench.stack.{run_id}"
    cli = [sys.executable, "-m", "condmsg.cli"]
    with fresh_pg_schema(pg_url, "bks") as sender_db, fresh_pg_schema(pg_url, "bkr") as rx_db:
        # The stores are created here, once, so that competing services do not race to.
        rx_engine = sa.create_engine(rx_db)
        upgrade(rx_engine, "receiver")
        with rx_engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {APP_TABLE} (id text PRIMARY KEY, body bytea)"))
        rx_engine.dispose()
        sender = Sender(amqp_url=AMQP_URL, db_url=sender_db, name=name, create_schema=True)
        if prepare is not None:
            prepare(sender_db, rx_db)
        ok = Destination(queue, process_within=timedelta(seconds=120))
        late = Destination(queue, process_within=timedelta(milliseconds=1))
        stage = [sys.executable, "-m", "bench._stack", "receiver"]
        commands = {"relay": [*cli, "relay", "--db-url", sender_db, "--amqp-url", AMQP_URL]}
        for i in range(receivers):
            commands[f"receiver{i + 1}"] = [*stage, rx_db, queue, f"{queue}.invalid"]
        for i in range(evaluators):
            commands[f"evaluator{i + 1}"] = [
                *(*cli, "evaluator", "--sender", name, "--db-url", sender_db),
                *("--amqp-url", AMQP_URL, "--ack-grace-ms", "100"),
            ]
        stack = Stack(sender, name, queue, sender_db, rx_db, ok, late, {})
        try:
            sender.send(b"warm-up", ok)  # declares the destination queue
            with _processes(commands) as procs:
                stack.procs = procs
                for key, proc in procs.items():
                    if key.startswith("receiver"):
                        _wait_until_consumers(queue, proc, int(key.removeprefix("receiver")))
                    elif key.startswith("evaluator"):
                        n = int(key.removeprefix("evaluator"))
                        _wait_until_consumers(f"condmsg.{name}.ack", proc, n)
                if sender.outcome(sender.send(b"ready", ok), timeout=60) is None:
                    raise RuntimeError("the pipeline decided no warm-up CM in 60 s")
                yield stack
        finally:
            sender.engine.dispose()
            _delete_queues(list(stack.queues().values()))


def exit_on_sigterm() -> None:
    """Make SIGTERM (a timeout, a stopped CI job) unwind like Ctrl-C, so that the services
    are stopped and the schemas, databases and queues dropped."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def _wait_until_consumers(queue: str, proc: Any, n: int) -> None:
    """Wait for the ``n``-th consumer of ``queue`` (``proc`` is the one expected)."""
    from bench.pipeline import _consumers

    _wait_consumer(queue, proc)
    deadline = time.monotonic() + 60
    while _consumers(queue) < n:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r}: no consumer number {n} on {queue}")
        time.sleep(0.05)


# --- what the benchmark's process measures ----------------------------------------------


@dataclass
class Tracker:
    """Send and outcome times of CMs in flight; each latency is handed to ``arrived`` with
    the CM's send time, and the CM forgotten, so that an hour's run holds only what is in
    flight (plus what the caller keeps)."""

    arrived: Callable[[float, float], None]
    sent: dict[str, float] = field(default_factory=dict)
    early: dict[str, float] = field(default_factory=dict)
    done: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    lock: threading.Condition = field(default_factory=threading.Condition)

    def mark_sent(self, ids: list[str]) -> None:
        now = time.perf_counter()
        with self.lock:
            for i in ids:
                came = self.early.pop(i, None)
                if came is None:
                    self.sent[i] = now
                else:  # the outcome was read before send_many returned the ids
                    self._finish(now, came)

    def mark_arrived(self, cm_id: str, verdict: str = "") -> None:
        now = time.perf_counter()
        with self.lock:
            self.verdicts[verdict] += 1
            sent = self.sent.pop(cm_id, None)
            if sent is None:
                self.early[cm_id] = now
            else:
                self._finish(sent, now)

    def _finish(self, sent: float, came: float) -> None:
        self.done += 1
        self.arrived(sent, (came - sent) * 1000)
        self.lock.notify_all()

    def wait_done(self, expected: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while self.done < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"only {self.done} of {expected} outcomes in {timeout_s} s")
                self.lock.wait(left)


@contextmanager
def reading_outcomes(sender: Any, tracker: Tracker) -> Iterator[None]:
    """Read the sender's outcomes into ``tracker`` in a thread while the block runs."""
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            for outcome in sender.outcomes(timeout=0.5):
                tracker.mark_arrived(outcome.cm_id, str(outcome.verdict))
                if stop.is_set():
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def burst(stack: Stack, cms: int, batch: int = 100, violate_every: int = 0) -> float:
    """Send ``cms`` CMs as fast as one thread can; CMs/s from the first send to the last
    outcome."""
    tracker = Tracker(lambda _sent, _ms: None)
    with reading_outcomes(stack.sender, tracker):
        started = time.perf_counter()
        for start in range(0, cms, batch):
            n = min(batch, cms - start)
            tracker.mark_sent(stack.sender.send_many(stack.outgoing(n, violate_every, start)))
        tracker.wait_done(cms, 600)
        return cms / (time.perf_counter() - started)


# --- the receiver stage ------------------------------------------------------------------


def receiver_stage(db_url: str, queue: str, invalid_queue: str) -> None:
    """A transactional receiver as its own process until SIGTERM: an original writes one
    app row in the receiver's transaction, its compensation deletes it."""
    from ackd import Receiver
    from condmsg.core.protocol import MessageKind

    receiver = Receiver(
        amqp_url=AMQP_URL, db_url=db_url, recipient="bench", invalid_queue=invalid_queue
    )
    insert = sa.text(f"INSERT INTO {APP_TABLE} (id, body) VALUES (:id, :body)")
    delete = sa.text(f"DELETE FROM {APP_TABLE} WHERE id = :id")
    relay = receiver.start_relay()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def handle(message: Any, session: Any) -> None:
        if message.kind is MessageKind.ORIGINAL:
            session.execute(insert, {"id": message.cm_id, "body": message.body})
        elif message.kind is MessageKind.COMPENSATION:
            session.execute(delete, {"id": message.cm_id})

    try:
        receiver.consume(queue, handle, transactional=True, prefetch=100, stop=stop)
    finally:
        relay.stop()
        receiver.close()


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "receiver":
        sys.exit("usage: python -m bench._stack receiver DB_URL QUEUE INVALID_QUEUE")
    receiver_stage(*sys.argv[2:])
