"""Dependency-Sphere outcome latency (PostgreSQL + RabbitMQ).

Latency of a sphere: the arrival of its outcome notification at a consumer of the sender's
outcome queue minus the decision of the last of its members (``decided_at`` of its
``condmsg_cm`` row; the evaluator and the consumer share this machine's clock). Baseline,
measured in the same run the same way: single CMs outside any sphere, their decision to the
arrival of their own outcome notification. Target: sphere p99 < 200 ms; the ratio is the
sphere's p99 over the single CM's.

Spheres of 2 and 3 members (alternately), one at a time, in two series:

(a) committed before their members are decided: the decision of the last member decides
    the sphere in the same transaction. This is the figure the target is for.
(b) committed after every member is decided: the commit is the last fact, and the
    evaluator's sphere sweep (every ``--sweep-interval`` s) decides the sphere. Its latency
    is measured from the commit (``committed_at``), since the members' decisions precede
    it by however long the application waits before committing.

Members are decided by genuine READ acks (valid tokens) published to the sender's ack
queue; each member asks for a pickup within 10 minutes, so its ack decides it at once.

Run: ``python -m bench.spheres [--spheres N] [--singles N] [--sweep-interval S]`` (env
``CONDMSG_BENCH_PG_URL``, ``CONDMSG_AMQP_URL``). The last line of stdout is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import sqlalchemy as sa

from bench._common import emit_result, fresh_pg_schema, log, percentile, row, wait_until
from bench.evaluator import SECRET, OutcomeWatcher, _ack_bodies, _publish
from condmsg import Destination, Outgoing, Sender, tables
from condmsg.core import protocol
from condmsg.runtime.settings import DEFAULT_ACK_GRACE
from evaluator.config import EvaluatorConfig
from evaluator.service import Evaluator

PG_URL = os.environ.get("CONDMSG_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("CONDMSG_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TARGET_SPHERE_P99_MS = 200.0
WARM_UP = 5  # spheres or CMs per series left out of the figures
#: How long a sphere may stay open: far beyond any figure measured here.
SPHERE_TIMEOUT = timedelta(minutes=10)


class AckPublisher:
    """Publishes a genuine READ ack for each CM given, as a receiver of ``queue`` would
    (the documents of :mod:`bench.evaluator`, signed with its secret)."""

    def __init__(self, sender_name: str, queue: str) -> None:
        self._connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self._channel = self._connection.channel()
        self._ack_queue = protocol.ack_queue(sender_name)
        self._queue = queue

    def ack(self, cm_ids: list[str]) -> None:
        _publish(self._channel, self._ack_queue, _ack_bodies(cm_ids, self._queue))

    def close(self) -> None:
        self._connection.close()


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _decided_at(engine: sa.Engine, cm_ids: list[str]) -> dict[str, float]:
    cms = tables.cms
    with engine.connect() as conn:
        rows = conn.execute(sa.select(cms.c.cm_id, cms.c.decided_at).where(cms.c.cm_id.in_(cm_ids)))
        return {r.cm_id: _utc(r.decided_at).timestamp() for r in rows if r.decided_at}


def _sphere_rows(engine: sa.Engine, sphere_ids: list[str]) -> dict[str, Any]:
    s = tables.spheres
    with engine.connect() as conn:
        rows = conn.execute(sa.select(s).where(s.c.sphere_id.in_(sphere_ids)))
        return {r.sphere_id: r for r in rows}


def _members_decided(engine: sa.Engine, cm_ids: list[str]) -> bool:
    cms = tables.cms
    with engine.connect() as conn:
        pending = conn.execute(
            sa.select(sa.func.count())
            .select_from(cms)
            .where(cms.c.cm_id.in_(cm_ids), cms.c.state == "pending")
        ).scalar_one()
    return pending == 0


def singles(
    sender: Sender, acks: AckPublisher, watcher: OutcomeWatcher, queue: str, n: int
) -> list[float]:
    """The baseline: one CM at a time, acked; its decision to its notification (ms)."""
    condition = Destination(queue, pickup_within=timedelta(minutes=10))
    ids = []
    for _ in range(n + WARM_UP):
        cm_id = sender.send(b"x", condition)
        acks.ack([cm_id])
        assert wait_until(lambda c=cm_id: c in watcher.arrived, timeout_s=30, poll_s=0.002)  # type: ignore[misc]
        ids.append(cm_id)
    ids = ids[WARM_UP:]
    decided = _decided_at(sender.engine, ids)
    return [(watcher.arrived[c] - decided[c]) * 1000 for c in ids]


def spheres(
    sender: Sender,
    acks: AckPublisher,
    watcher: OutcomeWatcher,
    queue: str,
    n: int,
    *,
    commit_first: bool,
) -> dict[str, list[float]]:
    """``n`` spheres one at a time; latencies (ms) from the last member's decision and
    from the commit to the sphere's notification."""
    condition = Destination(queue, pickup_within=timedelta(minutes=10))
    members: dict[str, list[str]] = {}
    for i in range(n + WARM_UP):
        ds = sender.begin_sphere(timeout=SPHERE_TIMEOUT)
        size = 2 + i % 2
        ids = ds.send_many([Outgoing(payload=b"x", condition=condition)] * size)
        if commit_first:
            ds.commit()
            acks.ack(ids)
        else:
            acks.ack(ids)
            ok = wait_until(lambda m=ids: _members_decided(sender.engine, m), 30, poll_s=0.005)  # type: ignore[misc]
            assert ok, "the members were not decided"
            ds.commit()
        assert wait_until(
            lambda s=ds.sphere_id: s in watcher.spheres,  # type: ignore[misc]
            timeout_s=30,
            poll_s=0.002,
        ), "no sphere outcome"
        members[ds.sphere_id] = ids
    kept = list(members)[WARM_UP:]
    decided = _decided_at(sender.engine, [c for s in kept for c in members[s]])
    rows = _sphere_rows(sender.engine, kept)
    from_member, from_commit = [], []
    for sphere_id in kept:
        assert watcher.sphere_verdicts[sphere_id] == "satisfied", watcher.sphere_verdicts[sphere_id]
        arrived = watcher.spheres[sphere_id]
        last = max(decided[c] for c in members[sphere_id])
        from_member.append((arrived - last) * 1000)
        from_commit.append((arrived - _utc(rows[sphere_id].committed_at).timestamp()) * 1000)
    return {"from_member": from_member, "from_commit": from_commit}


def run(db_url: str, sender_name: str, queue: str, args: argparse.Namespace) -> dict[str, Any]:
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
            sweep_interval_s=args.sweep_interval,
        ),
        engine=engine,
    ).start()
    acks = AckPublisher(sender_name, queue)
    try:
        # Interleaved in slices, so that a burst of load from elsewhere on the machine
        # falls on every series alike rather than on one of them.
        single: list[float] = []
        first: dict[str, list[float]] = {"from_member": [], "from_commit": []}
        after: dict[str, list[float]] = {"from_member": [], "from_commit": []}
        slices = max(1, args.slices)
        for k in range(slices):
            log(f"slice {k + 1}/{slices}: single CMs, (a) commit first, (b) commit after ...")
            single += singles(sender, acks, watcher, queue, args.singles // slices)
            for key, values in spheres(
                sender, acks, watcher, queue, args.spheres // slices, commit_first=True
            ).items():
                first[key] += values
            for key, values in spheres(
                sender, acks, watcher, queue, args.spheres // slices, commit_first=False
            ).items():
                after[key] += values
    finally:
        acks.close()
        service.stop()
        watcher.stop()
        engine.dispose()
    return {"single": single, "first": first, "after": after}


def _ms(values: list[float], p: float) -> float:
    return round(percentile(values, p), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spheres", type=int, default=300, help="spheres per series")
    parser.add_argument("--singles", type=int, default=300, help="single CMs (baseline)")
    parser.add_argument("--slices", type=int, default=3, help="interleaved slices")
    parser.add_argument("--sweep-interval", type=float, default=0.1, help="seconds")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:8]
    sender_name, queue = f"bench-sph-{tag}", f"bench.sph.{tag}.q"
    try:
        with fresh_pg_schema(PG_URL, "bench_sph") as db_url:
            figures = run(db_url, sender_name, queue, args)
    finally:
        with pika.BlockingConnection(pika.URLParameters(AMQP_URL)) as connection:
            channel = connection.channel()
            for name in (
                queue,
                *(f"condmsg.{sender_name}.{k}" for k in ("ack", "outcome", "dead")),
            ):
                channel.queue_delete(name)
    single, a, b = figures["single"], figures["first"]["from_member"], figures["after"]
    ratio_p99 = percentile(a, 99) / percentile(single, 99)
    ratio_p50 = percentile(a, 50) / percentile(single, 50)
    print(
        f"single CM, decision -> outcome notification: p50 {_ms(single, 50)} ms, "
        f"p99 {_ms(single, 99)} ms ({len(single)} CMs)"
    )
    print(
        f"(a) sphere committed first, last member's decision -> sphere notification: "
        f"p50 {_ms(a, 50)} ms, p99 {_ms(a, 99)} ms ({len(a)} spheres of 2-3 members; "
        f"target p99 < {TARGET_SPHERE_P99_MS:g} ms); ratio to the single CM: p50 "
        f"{ratio_p50:.2f}, p99 {ratio_p99:.2f}"
    )
    print(
        f"(b) sphere committed after its members' decisions, commit -> sphere notification: "
        f"p50 {_ms(b['from_commit'], 50)} ms, p99 {_ms(b['from_commit'], 99)} ms "
        f"(sweep every {args.sweep_interval:g} s)"
    )
    emit_result(
        "spheres",
        {
            "single_cms": len(single),
            "single_p50_ms": _ms(single, 50),
            "single_p99_ms": _ms(single, 99),
            "spheres_per_series": len(a),
            "sphere_members": "2-3",
            "sphere_p50_ms": _ms(a, 50),
            "sphere_p99_ms": _ms(a, 99),
            "sphere_p99_target_ms": TARGET_SPHERE_P99_MS,
            "sphere_ok": percentile(a, 99) < TARGET_SPHERE_P99_MS,
            "ratio_p50": round(ratio_p50, 3),
            "ratio_p99": round(ratio_p99, 3),
            "commit_after_p50_ms": _ms(b["from_commit"], 50),
            "commit_after_p99_ms": _ms(b["from_commit"], 99),
            "commit_after_ok": percentile(b["from_commit"], 99) < TARGET_SPHERE_P99_MS,
            "sweep_interval_s": args.sweep_interval,
            "ack_grace_ms": DEFAULT_ACK_GRACE.total_seconds() * 1000,
        },
        [
            row(
                "sphere: last member decided → notification p99",
                percentile(a, 99),
                "ms",
                baseline=percentile(single, 99),
                lower=TARGET_SPHERE_P99_MS,
            ),
            row(
                "sphere: commit after members → notification p99",
                percentile(b["from_commit"], 99),
                "ms",
                lower=TARGET_SPHERE_P99_MS,
            ),
        ],
    )


if __name__ == "__main__":
    main()
