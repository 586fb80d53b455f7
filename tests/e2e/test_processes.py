"""End to end with separate processes: ``python -m evaluator`` and receiver processes
(``tests.e2e.rx``) on the real RabbitMQ and PostgreSQL, with the paper's examples scaled
(a day becomes two seconds); two evaluator instances on one ack queue; an evaluator killed
with SIGKILL and restarted."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from condmsg import Destination, Verdict, tables
from condmsg.core import protocol
from condmsg.core.evaluation import evaluate
from condmsg.core.outcome import Outcome
from evaluator import store
from evaluator.store_setup import decision_store
from tests.waiting import wait_for

from .conftest import Procs, ack_consumers, publish_acks, records

pytestmark = [pytest.mark.slow, pytest.mark.rabbitmq, pytest.mark.postgres]

DAY = timedelta(seconds=2)


def _names(procs: Procs) -> Callable[[str], str]:
    def q(suffix: str) -> str:
        return f"{procs.unique_name}.{suffix}"

    return q


def _kinds(out: Path) -> list[str | None]:
    return [r["kind"] for r in records(out) if "kind" in r]


def _stats(out: Path) -> dict[str, int]:
    return next(r["stats"] for r in records(out) if "stats" in r)


def test_example1_success_across_processes(procs: Procs, make_sender: Any, example1: Any) -> None:
    q = _names(procs)
    sender = make_sender(procs.pg_url, procs.sender)
    evaluator = procs.evaluator()
    modes = {"qr1": "commit", "qr2": "read", "qr3": "commit", "qr4": "commit"}
    outs = {name: procs.receiver(q(name), "alice", mode) for name, mode in modes.items()}
    procs.wait_ready(list(outs.values()), consumers=1)
    cm_id = sender.send(b"meeting", example1(q, DAY), notify_success=True)
    outcome = sender.outcome(cm_id, timeout=30)
    assert outcome is not None and outcome.verdict is Verdict.SATISFIED, outcome
    # Decided on the last needed ack, before the evaluation deadline (7 "days").
    with sender.engine.connect() as conn:
        sent_at = conn.execute(sa.select(tables.cms.c.sent_at)).scalar_one()
    assert outcome.decided_at < sent_at + 7 * DAY
    assert outcome.decided_at - outcome.effective_at == timedelta(milliseconds=100)
    for out in outs.values():
        wait_for(
            lambda out=out: _kinds(out) == ["original", "success"],  # type: ignore[misc]
            timeout=30,
        )
    pushed = wait_for(lambda: list(sender.outcomes(timeout=1)), timeout=30)
    assert [(o.cm_id, o.verdict) for o in pushed] == [(cm_id, Verdict.SATISFIED)]
    codes = procs.stop_all()
    assert set(codes.values()) == {0}, codes
    assert evaluator.returncode == 0


def test_example1_fails_on_the_processing_constraint_across_processes(
    procs: Procs, make_sender: Any, example1: Any
) -> None:
    q = _names(procs)
    sender = make_sender(procs.pg_url, procs.sender)
    procs.evaluator()
    go = procs.tmp_path / "qr2-go"
    # qr3 reads but never processes (non-transactional read); qr2 reads only after the
    # decision, so its original and compensation cancel out.
    outs = {
        "qr1": procs.receiver(q("qr1"), "alice", "commit"),
        "qr3": procs.receiver(q("qr3"), "alice", "read"),
        "qr4": procs.receiver(q("qr4"), "alice", "commit"),
        "qr2": procs.receiver(q("qr2"), "alice", "commit", go_file=go),
    }
    procs.wait_ready(list(outs.values()), consumers=1)
    cm_id = sender.send(b"meeting", example1(q, DAY), compensation=b"meeting cancelled")
    outcome = sender.outcome(cm_id, timeout=40)
    assert outcome is not None and outcome.verdict is Verdict.VIOLATED, outcome
    assert any("'" + q("qr3") + "'" in r and "never processed" in r for r in outcome.reasons)
    for name in ("qr1", "qr3", "qr4"):
        wait_for(
            lambda n=name: _kinds(outs[n]) == ["original", "compensation"],  # type: ignore[misc]
            timeout=30,
        )
        comp = [r for r in records(outs[name]) if r.get("kind") == "compensation"]
        assert [r["payload"] for r in comp] == ["meeting cancelled"]
        assert comp[0]["cm_id"] == cm_id
    # qr2's original and its compensation both wait in its queue before qr2 reads.
    wait_for(lambda: _queue_depth(procs.amqp_url, q("qr2")) == 2, timeout=30)
    go.touch()
    codes: dict[int, int] = {}
    try:
        # Both the compensation and the original wait in qr2's queue: the receiver drops
        # them (cancelled + discard) and hands nothing to its app.
        wait_for(lambda: _queue_depth(procs.amqp_url, q("qr2")) == 0, timeout=30)
    finally:
        codes = procs.stop_all()
    assert set(codes.values()) == {0}, codes
    assert _kinds(outs["qr2"]) == []
    assert _stats(outs["qr2"]) == {"cancelled": 1, "discards": 1}
    for name in ("qr1", "qr3", "qr4"):
        assert _kinds(outs[name]) == ["original", "compensation"]


def _queue_depth(amqp_url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ok = connection.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count)
    finally:
        connection.close()


def test_example2_three_competing_controller_processes(procs: Procs, make_sender: Any) -> None:
    queue = f"{procs.unique_name}.qcentral"
    sender = make_sender(procs.pg_url, procs.sender)
    procs.evaluator()
    outs = [procs.receiver(queue, f"controller-{i}", "commit") for i in range(3)]
    procs.wait_ready(outs, consumers=1)
    condition = Destination(
        queue, pickup_within=timedelta(seconds=30), evaluation_timeout=timedelta(seconds=31)
    )
    cm_ids = [sender.send(f"flight {i}".encode(), condition) for i in range(6)]
    outcomes = [sender.outcome(cm_id, timeout=30) for cm_id in cm_ids]
    assert [o.verdict if o else None for o in outcomes] == [Verdict.SATISFIED] * 6
    codes = procs.stop_all()
    assert set(codes.values()) == {0}, codes
    got = [r["cm_id"] for out in outs for r in records(out) if "cm_id" in r]
    assert sorted(got) == sorted(cm_ids)  # each flight handled by exactly one controller


# -- many CMs, several instances, a crash --------------------------------------------


def _send_many(sender: Any, queue: str, n: int, window: timedelta) -> list[str]:
    """``n`` CMs to ``queue`` in one transaction (fast), each needing a pickup in ``window``."""
    condition = Destination(queue, pickup_within=window)
    with Session(sender.engine) as session, session.begin():
        return [sender.send(b"x", condition, session=session) for _ in range(n)]


def _drain_outcomes(amqp_url: str, sender: str, expected: int, timeout: float) -> list[bytes]:
    """Every outcome message: waits for ``expected`` distinct CMs, then for stragglers."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    bodies: list[bytes] = []
    seen: set[str] = set()
    try:
        channel = connection.channel()

        def take(quiet_s: float) -> bool:
            for method, _props, body in channel.consume(
                protocol.outcome_queue(sender), auto_ack=True, inactivity_timeout=quiet_s
            ):
                if method is None or body is None:
                    break
                bodies.append(body)
                seen.add(Outcome.from_json(body).cm_id)
                if len(seen) >= expected and quiet_s < 1:
                    break
            channel.cancel()
            return len(seen) >= expected

        wait_for(lambda: take(0.5), timeout=timeout, interval=0)
        take(1.0)  # anything more would be a duplicate
    finally:
        connection.close()
    return bodies


def _states(engine: Any) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(tables.cms.c.state, sa.func.count()).group_by(tables.cms.c.state)
        )
        return {state: int(n) for state, n in rows}


def test_two_evaluator_processes_decide_2000_cms_exactly_once(
    procs: Procs, make_sender: Any
) -> None:
    n = 2000
    queue = f"{procs.unique_name}.q"
    sender = make_sender(procs.pg_url, procs.sender)
    cm_ids = _send_many(sender, queue, n, timedelta(seconds=60))
    first, second = procs.evaluator(), procs.evaluator()
    procs.wait_ready([], consumers=2)
    publish_acks(procs.amqp_url, procs.sender, [(c, queue) for c in cm_ids])
    wait_for(lambda: _states(sender.engine) == {"satisfied": n}, timeout=60)
    bodies = _drain_outcomes(procs.amqp_url, procs.sender, n, timeout=60)
    outcome_ids = [Outcome.from_json(b).cm_id for b in bodies]
    assert len(outcome_ids) == n and set(outcome_ids) == set(cm_ids)
    with sender.engine.connect() as conn:
        query = sa.select(tables.cms.c.decided_by, sa.func.count()).group_by(
            tables.cms.c.decided_by
        )
        by = {instance: int(count) for instance, count in conn.execute(query)}
    assert len(by) == 2 and all(by.values()), by  # both instances decided some
    codes = procs.stop_all()
    assert codes == {first.pid: 0, second.pid: 0}


@pytest.mark.parametrize("processes", [1, 2])
def test_evaluator_killed_mid_stream_and_restarted(
    procs: Procs, make_sender: Any, processes: int
) -> None:
    """Also with ``--intake-processes 2``: the killed service's worker sees its leash
    (stdin) end, finishes its batch and exits; the restarted service starts its own."""
    n = 1000
    queue = f"{procs.unique_name}.q"
    sender = make_sender(procs.pg_url, procs.sender)
    # Two in three CMs get an ack (a minute to arrive); the rest never do, and a sweep
    # decides them (violated) after their 5 s pickup deadline.
    acked = _send_many(sender, queue, 2 * n // 3, timedelta(seconds=60))
    unacked = _send_many(sender, queue, n - len(acked), timedelta(seconds=5))
    cm_ids = acked + unacked
    half = len(acked) // 2
    # The outbox relay runs apart (`condmsg relay`): a relay killed with its claims in
    # flight would hold them for its lease (a minute) before they are published again.
    procs.relay()
    options = ("--batch-size", "10", "--no-relay", "--intake-processes", str(processes))
    victim = procs.evaluator(*options)
    procs.wait_ready([], consumers=processes)
    publish_acks(procs.amqp_url, procs.sender, [(c, queue) for c in acked[:half]])
    wait_for(lambda: _states(sender.engine).get("satisfied", 0) >= 50, timeout=30)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    # Nothing of it goes on consuming (a worker left behind would).
    wait_for(lambda: ack_consumers(procs.amqp_url, procs.sender) == 0, timeout=30)
    states = _states(sender.engine)
    assert states.get("pending", 0) >= len(acked) - half, states  # killed mid-stream
    publish_acks(procs.amqp_url, procs.sender, [(c, queue) for c in acked[half:]])
    restarted = procs.evaluator(*options)
    wait_for(lambda: _states(sender.engine).get("pending", 0) == 0, timeout=60)
    assert _states(sender.engine) == {"satisfied": len(acked), "violated": len(unacked)}
    bodies = _drain_outcomes(procs.amqp_url, procs.sender, n, timeout=60)
    # One decision per CM, so one outcome message per CM.
    by_cm = {Outcome.from_json(body).cm_id: body for body in bodies}
    assert len(bodies) == n and set(by_cm) == set(cm_ids)
    # Every stored verdict is evaluate() over the stored counted acks at effective_at.
    with Session(sender.engine) as session:
        rows = list(session.execute(sa.select(tables.cms)))
        acks = decision_store(session).counted_acks(session, [r.cm_id for r in rows])
    for row in rows:
        cm = store.CmRow.of(row)
        assert cm.effective_at is not None
        result = evaluate(cm.condition, cm.sent_at, acks.get(cm.cm_id, ()), cm.effective_at)
        assert result.verdict.value == cm.state, (cm.cm_id, result, cm.state)
        message = json.loads(by_cm[cm.cm_id])
        assert message["verdict"] == cm.state
    assert {r.cm_id for r in rows if r.state == "satisfied"} == set(acked)
    assert procs.stop(restarted) == 0
    codes = procs.stop_all()
    assert set(codes.values()) == {0, -signal.SIGKILL}, codes
