"""The test kit decides as the services do (issue 51): random scripted scenarios played in
the kit and on the real services give the same outcomes, notices and compensations.

The real side is one world: a sender on PostgreSQL with its relay, the evaluator, and a
pool of receivers sharing one PostgreSQL receiver store with one relay, on the real
RabbitMQ. The scenarios run there at once, each started a moment after the one before
and played in real time with one unit every 1.5 s (``CONDMSG_KIT_UNIT_S``); each uses
queues of its own while it runs (names are reused once a scenario is over: RabbitMQ
should not hold a thousand queues for a test). The kit plays the same scripts on its
virtual clock. :mod:`tests.integration.kit_scenarios` says what a scenario is and why
its events lie half a unit from any deadline: so that the real side's few milliseconds of
lateness cannot change an outcome. The real side's lateness is measured: a scenario whose
events ran later than the margin and that came out differently is not held against the
kit (the machine was busy), and the test still wants ``COUNT`` scenarios the same.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from ackd.receiver import Receiver
from condmsg.core.timeutil import utcnow
from condmsg.runtime.amqp import connect
from condmsg.runtime.db import make_engine
from condmsg.sending.sender import Sender
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator
from tests.integration.kit_scenarios import (
    ACK_GRACE,
    DRAIN_AT,
    RETRY,
    Plan,
    Result,
    Scenario,
    normal_reasons,
    play_in_kit,
    scaled,
    scenarios,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres, pytest.mark.slow]

COUNT = int(os.environ.get("CONDMSG_KIT_SCENARIOS", "1000"))
SEED = int(os.environ.get("CONDMSG_KIT_SEED", "51"))
UNIT_S = float(os.environ.get("CONDMSG_KIT_UNIT_S", "1.5"))
#: Seconds between the starts of two scenarios on the real side.
SPACING_S = float(os.environ.get("CONDMSG_KIT_SPACING_S", "0.055"))
#: Receivers (each with a thread, a connection and a kept database connection): enough for
#: the transactions that stay open at once (about 15 at one unit per 1.5 s), and the rest.
WORKERS = 32
SECRET = b"kit-fidelity-secret-7c1e5a9b3d2f4068aa"
#: How late (in units) a real event may start before its outcome could differ.
MARGIN_UNITS = 0.3
#: Scenarios played beyond ``COUNT``: one whose real events ran too late (a busy machine)
#: is not counted, and ``COUNT`` must still be the same in both.
SPARE = int(os.environ.get("CONDMSG_KIT_SPARE", "50"))


@pytest.fixture
def receiver_db(pg_engine_url: str) -> Iterator[str]:
    """A second fresh PostgreSQL schema: the receivers' store."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_engine_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in pg_engine_url else "?"
    try:
        yield f"{pg_engine_url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class _RolledBack(Exception):
    pass


@dataclass(order=True)
class _Job:
    at: float
    seq: int
    #: What the worker does, with its receiver.
    work: Callable[[Receiver], None] = field(compare=False)
    #: A transaction that stays open: its first job reserves a worker, its last job goes
    #: to that worker and frees it.
    key: tuple[int, str] | None = field(compare=False, default=None)
    reserve: bool = field(compare=False, default=False)
    release: bool = field(compare=False, default=False)
    scenario: int = field(compare=False, default=-1)


class RealWorld:
    """The services, a pool of receiver threads, and a clock-driven dispatcher."""

    def __init__(self, amqp_url: str, sender_url: str, receiver_url: str, prefix: str) -> None:
        """``prefix`` (the test's ``unique_name``) starts every queue name: the test run
        deletes what a failed test leaves behind by it."""
        name = self.name = prefix.replace(".", "-")  # a sender name: no dots
        self.unit = timedelta(seconds=UNIT_S)
        self.sender = Sender(
            amqp_url=amqp_url, db_url=sender_url, name=name, secret=SECRET, create_schema=True
        )
        self.evaluator = Evaluator(
            EvaluatorConfig(
                amqp_url=amqp_url, sender=name, secret=SECRET, ack_grace=ACK_GRACE, create=True
            ),
            engine=self.sender.engine,
        )
        self.engine = make_engine(
            receiver_url, pool_size=WORKERS + 4, max_overflow=8, pool_pre_ping=False
        )
        self.receivers = [
            Receiver(
                recipient=f"w{i}",
                engine=self.engine,
                amqp_url=amqp_url,
                secret=SECRET,
                create_schema=i == 0,
                **RETRY,
            )
            for i in range(WORKERS)
        ]
        self._relays: list[Any] = []
        self._heap: list[_Job] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._inboxes: list[queue.Queue[_Job | None]] = [queue.Queue() for _ in range(WORKERS)]
        self._reserved: set[int] = set()
        self._next_free = itertools.cycle(range(WORKERS))
        self._open: dict[tuple[int, str], Any] = {}
        self._holders: dict[tuple[int, str], int] = {}
        self._free_queues: list[str] = []
        self._queue_names = (f"{prefix}.p{n}" for n in itertools.count())
        self.queues: dict[tuple[int, str], str] = {}
        self.cm_ids: dict[int, str] = {}
        self.sent_at: dict[int, datetime] = {}
        self.got: dict[tuple[int, str], list[str]] = {}
        self.errors: list[str] = []
        self.lateness: list[float] = []
        #: Per scenario, how late its latest-starting event started (seconds).
        self.late: dict[int, float] = {}
        self._pending = 0

    # -- running ----------------------------------------------------------------------------

    def play(self, batch: list[Scenario]) -> dict[int, Result]:
        self._relays = [self.sender.start_relay(), self.receivers[0].start_relay()]
        threads = [
            threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(WORKERS)
        ]
        sends: queue.Queue[tuple[float, Scenario] | None] = queue.Queue()
        sender = threading.Thread(target=self._sending, args=(sends,), daemon=True)
        try:
            with self.evaluator:
                for thread in (*threads, sender):
                    thread.start()
                start = time.monotonic() + 1.0
                for i, s in enumerate(batch):
                    sends.put((start + i * SPACING_S, s))
                    self._pending += 1
                sends.put(None)
                self._dispatch()
                sender.join()
        finally:
            for inbox in self._inboxes:
                inbox.put(None)
            for thread in threads:
                thread.join()
            for relay in self._relays:
                relay.stop()
        return {s.index: self._result(s) for s in batch}

    def close(self) -> None:
        """Close the receivers and delete the queues the scenarios used (a few hundred:
        RabbitMQ should not hold them for the rest of the test run)."""
        for receiver in self.receivers:
            receiver.close()
        used = set(self.queues.values())
        connection = connect(self.sender.amqp_url, name="kit-fidelity-cleanup")
        try:
            channel = connection.channel()
            for q in sorted(used):
                channel.queue_delete(q)
        finally:
            connection.close()
        self.engine.dispose()
        self.sender.engine.dispose()

    def _sending(self, sends: queue.Queue[tuple[float, Scenario] | None]) -> None:
        while (item := sends.get()) is not None:
            at, s = item
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                self._send(s)
            except Exception as exc:
                self.errors.append(f"sending scenario {s.index}: {exc!r}")
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _send(self, s: Scenario) -> None:
        with self._cond:
            for name in s.destinations:
                self.queues[(s.index, name)] = (
                    self._free_queues.pop() if self._free_queues else next(self._queue_names)
                )
        names = {name: self.queues[(s.index, name)] for name in s.destinations}
        condition = scaled(s.condition_for(lambda d: names[d]), self.unit)
        base = time.monotonic()  # sent_at lies just after it
        self.sent_at[s.index] = utcnow()
        self.cm_ids[s.index] = self.sender.send(
            b"payload", condition, compensation=s.compensation, notify_success=s.notify_success
        )
        jobs = []
        for name, plan in zip(s.destinations, s.plans, strict=True):
            self.got[(s.index, name)] = []
            for step, at in enumerate(plan.times):
                jobs.append(self._job(base + at * UNIT_S, s.index, name, plan, step))
        drain = _Job(base + DRAIN_AT * UNIT_S, next(self._seq), lambda rx: self._drain(rx, s))
        drain.scenario = s.index
        jobs.append(drain)
        with self._cond:
            for job in jobs:
                heapq.heappush(self._heap, job)
            self._cond.notify_all()

    def _job(self, at: float, index: int, name: str, plan: Plan, step: int) -> _Job:
        key = (index, name)
        q = self.queues[key]

        def record(message: Any) -> None:
            if message is not None:
                self.got[key].append(str(message.kind))

        def commit(rx: Receiver) -> None:
            with rx.transaction() as tx:
                record(tx.read(q, 0.2))

        def read(rx: Receiver) -> None:
            record(rx.read(q, 0.2))

        def rollback(rx: Receiver) -> None:
            with contextlib.suppress(_RolledBack), rx.transaction() as tx:
                record(tx.read(q, 0.2))
                raise _RolledBack

        def begin(rx: Receiver) -> None:
            scope = rx.transaction()
            tx = scope.__enter__()
            record(tx.read(q, 0.2))
            self._open[key] = scope

        def end(rx: Receiver) -> None:
            self._open.pop(key).__exit__(None, None, None)

        def crash(rx: Receiver) -> None:
            scope = self._open.pop(key)
            rx._broker.drop_connection()  # the process goes: RabbitMQ takes the message back
            scope.__exit__(_RolledBack, _RolledBack(), None)

        kind = plan.kind
        seq = next(self._seq)
        if kind == "read":
            return _Job(at, seq, read, scenario=index)
        if kind == "commit" or (kind in ("rollback", "crash") and step == len(plan.times) - 1):
            return _Job(at, seq, commit, scenario=index)
        if kind == "rollback":
            return _Job(at, seq, rollback, scenario=index)
        if step == 0:
            return _Job(at, seq, begin, key=key, reserve=True, scenario=index)
        work = end if kind == "slow" else crash
        return _Job(at, seq, work, key=key, release=True, scenario=index)

    def _drain(self, rx: Receiver, s: Scenario) -> None:
        for name in s.destinations:
            q = self.queues[(s.index, name)]
            while True:
                with rx.transaction() as tx:
                    message = tx.read(q, 0.0)
                if message is None:
                    break
                self.got[(s.index, name)].append(str(message.kind))
        with self._cond:
            self._free_queues += [self.queues[(s.index, name)] for name in s.destinations]
            self._pending -= 1
            self._cond.notify_all()

    def _dispatch(self) -> None:
        with self._cond:
            while self._pending > 0 or self._heap:
                if not self._heap:
                    self._cond.wait(0.5)
                    continue
                wait = self._heap[0].at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                job = heapq.heappop(self._heap)
                self._assign(job)

    def _assign(self, job: _Job) -> None:
        if job.release and job.key is not None:
            worker = self._holders.pop(job.key)
            self._reserved.discard(worker)
        else:
            if len(self._reserved) == WORKERS:
                raise RuntimeError(f"all {WORKERS} receivers hold a transaction: raise WORKERS")
            worker = next(w for w in self._next_free if w not in self._reserved)
        if job.reserve and job.key is not None:
            self._reserved.add(worker)
            self._holders[job.key] = worker
        self._inboxes[worker].put(job)

    def _worker(self, index: int) -> None:
        rx = self.receivers[index]
        inbox = self._inboxes[index]
        while (job := inbox.get()) is not None:
            lateness = time.monotonic() - job.at
            self.lateness.append(lateness)
            self.late[job.scenario] = max(lateness, self.late.get(job.scenario, 0.0))
            try:
                job.work(rx)
            except Exception as exc:
                self.errors.append(f"worker {index}: {exc!r}")

    def _result(self, s: Scenario) -> Result:
        outcome = self.sender.outcome(self.cm_ids[s.index], timeout=2.0)
        names = {self.queues[(s.index, n)]: n for n in s.destinations}
        rename = lambda d: next((q for q, n in names.items() if n == d), d)  # noqa: E731
        if outcome is None:
            result = Result("pending", ())
        else:
            result = Result(outcome.verdict.value, normal_reasons(outcome.reasons, rename))
            result.decided_after = (outcome.decided_at - self.sent_at[s.index]) / self.unit
        for name in s.destinations:
            result.got[name] = self.got[(s.index, name)]
        return result


def test_the_kit_decides_as_the_services_do(
    amqp_url: str, pg_url: str, receiver_db: str, unique_name: str
) -> None:
    batch = scenarios(SEED, COUNT + SPARE)
    began = time.monotonic()
    in_kit = dict(play_in_kit(batch))
    kit_s = time.monotonic() - began
    world = RealWorld(amqp_url, pg_url, receiver_db, unique_name)
    try:
        began = time.monotonic()
        real = world.play(batch)
        real_s = time.monotonic() - began
    finally:
        world.close()
    assert not world.errors, world.errors[:5]
    late = sorted(world.lateness)

    def lateness(s: Scenario, kit: Result, services: Result) -> float:
        """How late (units) the real side was: its latest event, or its decision."""
        events = world.late.get(s.index, 0.0) / UNIT_S
        if kit.decided_after is None or services.decided_after is None:
            return events
        return max(events, services.decided_after - kit.decided_after)

    same = [s for s in batch if in_kit[s.index] == real[s.index]]
    differ = [s for s in batch if in_kit[s.index] != real[s.index]]
    # A scenario whose real events ran later than the margin, or whose real decision came
    # that much later than the kit's, proves nothing either way (a busy machine).
    excused = [s for s in differ if lateness(s, in_kit[s.index], real[s.index]) > MARGIN_UNITS]
    print(
        f"{len(batch)} scenarios: kit {kit_s:.1f} s, services {real_s:.1f} s; real events "
        f"late by {late[len(late) // 2] * 1000:.0f} ms (median), {late[-1] * 1000:.0f} ms "
        f"(worst); {len(same)} the same, {len(excused)} differ after running late"
    )
    unexcused = [
        f"scenario {s.index} {s.plans} {s.condition} "
        f"(late by {lateness(s, in_kit[s.index], real[s.index]):.2f} units):"
        f"\n  kit   {in_kit[s.index]}\n  real  {real[s.index]}"
        for s in differ
        if s not in excused
    ]
    assert not unexcused, f"{len(unexcused)} of {len(batch)} differ:\n" + "\n".join(unexcused[:10])
    assert len(same) >= COUNT, (
        f"only {len(same)} scenarios compared ({len(excused)} ran too late on a busy machine)"
    )
