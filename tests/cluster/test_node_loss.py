"""A node lost mid-traffic: 1,000 CMs over the three-node cluster, quorum queues everywhere
(destinations, acks, outcomes), and the node that leads the most queues stopped while
copies, acks and outcomes flow, then started again.

Half the CMs are satisfied (a transactional destination commits); the other half are
violated (both destinations read without a transaction), so compensations flow too.
Afterwards: every CM has exactly one decision, equal to ``evaluate`` over its counted
acks; every copy reached its app exactly once; every ack was counted; every consumed
copy of a violated CM got its compensation, once. The time from the loss to the first
outcome decided after it is printed (bench/RESULTS.md quotes it).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from ackd.receiver import Receiver
from condmsg import Destination, DestinationSet, tables
from condmsg.core.evaluation import evaluate
from evaluator import store
from evaluator.store_setup import decision_store
from tests.running_world import RunningWorld
from tests.waiting import wait_for

from .conftest import Cluster

pytestmark = [
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.xdist_group("rabbitmq-cluster"),
]

CMS = 1000
#: The CMs' processing window: far beyond the run, so only acks decide them.
WINDOW = timedelta(minutes=10)
#: Queues read in a transaction (COMMIT acks) and without one (READ acks).
TRANSACTIONAL = {"q0": True, "q1": False, "q3": False}


@pytest.fixture
def sweep_interval_s() -> float:
    """The evaluator of ``node_loss_world`` sweeps every 0.2 s here: the CMs' window is
    far beyond the run, so a sweep has nothing to decide, and fewer sweeps leave more of
    the machine to the traffic."""
    return 0.2


def test_a_node_lost_mid_traffic(
    nodes: Cluster, node_loss_world: RunningWorld, pg_url: str, unique_name: str
) -> None:
    queue = {short: node_loss_world.queue(short) for short in TRANSACTIONAL}
    sender = node_loss_world.sender
    receivers = {
        short: Receiver(
            amqp_url=nodes.url,
            db_url=pg_url,
            recipient=f"app-{short}",
            invalid_queue=f"{unique_name}.invalid",
            create_schema=True,
        )
        for short in TRANSACTIONAL
    }
    # What each app was handed: (kind, cm id, queue) -> times.
    handed: Counter[tuple[str, str, str]] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    threads = []

    def consumer(short: str) -> None:
        def handle(message: Any, _session: Any) -> None:
            with lock:
                handed[(str(getattr(message.kind, "value", "")), str(message.cm_id), short)] += 1

        receivers[short].consume(
            queue[short], handle, transactional=TRANSACTIONAL[short], prefetch=100, stop=stop
        )

    for short in TRANSACTIONAL:
        receivers[short]._broker.ensure_queue(queue[short])
        threads.append(threading.Thread(target=consumer, args=(short,), daemon=True))
    receiver_relay = receivers["q0"].start_relay()
    for thread in threads:
        thread.start()

    satisfied_ids: list[str] = []
    violated_ids: list[str] = []

    def send_all() -> None:
        for i in range(CMS):
            if i % 2 == 0:
                members = (Destination(queue["q0"]), Destination(queue["q1"]))
                target = satisfied_ids
            else:
                members = (Destination(queue["q1"]), Destination(queue["q3"]))
                target = violated_ids
            condition = DestinationSet(*members, process_within=WINDOW, min_process=1)
            target.append(sender.send(f"cm {i}".encode(), condition))
            if i % 50 == 49:
                time.sleep(0.05)  # a steady stream rather than one burst

    def decided() -> int:
        with sender.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(tables.cms)
                    .where(tables.cms.c.state != "pending")
                ).scalar_one()
            )

    sending = threading.Thread(target=send_all, daemon=True)
    try:
        sending.start()
        wait_for(lambda: decided() >= 150, 90, "outcomes flowing before the loss")
        victim = nodes.leaders().most_common(1)[0][0]
        lost_at = datetime.now(UTC)
        lost_mono = time.monotonic()
        nodes.stop_node(victim)
        print(f"stopped node {victim} (leading the most queues) at {decided()} outcomes")
        sending.join(120)
        assert not sending.is_alive()
        wait_for(lambda: time.monotonic() - lost_mono > 10 or decided() == CMS, 30)
        nodes.start_node(victim)
        wait_for(lambda: decided() == CMS, 150, f"all {CMS} outcomes")
        compensations_due = 2 * len(violated_ids)
        wait_for(
            lambda: (
                sum(n for (k, _c, _q), n in handed.items() if k == "compensation")
                >= compensations_due
            ),
            60,
            "every compensation handed over",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        receiver_relay.stop()
        node_loss_world.stop()  # every decision stored before they are read
        for receiver in receivers.values():
            receiver.close()
            receiver.engine.dispose()

    with Session(sender.engine) as session:
        rows = list(session.execute(sa.select(tables.cms)))
        acks = decision_store(session).counted_acks(session, [r.cm_id for r in rows])
    sender.engine.dispose()
    assert len(rows) == CMS
    after = [r for r in rows if r.decided_at is not None and _utc(r.decided_at) > lost_at]
    first_after = min(_utc(r.decided_at) for r in after)
    # A CM sent after the loss goes the whole way on the surviving nodes: its copies
    # through the relay's new connection, its acks through the receivers' and the
    # evaluator's.
    first_new = min(_utc(r.decided_at) for r in after if _utc(r.sent_at) > lost_at)
    print(
        f"node loss: first outcome after it {(first_after - lost_at).total_seconds():.2f} s, "
        f"first outcome of a CM sent after it {(first_new - lost_at).total_seconds():.2f} s"
    )

    # Exactly one decision per CM, equal to evaluate() over its counted acks.
    for row in rows:
        cm = store.CmRow.of(row)
        assert cm.effective_at is not None
        result = evaluate(cm.condition, cm.sent_at, acks.get(cm.cm_id, ()), cm.effective_at)
        assert result.verdict.value == cm.state, (cm.cm_id, result, cm.state)
    states = Counter(r.state for r in rows)
    assert states == {"satisfied": len(satisfied_ids), "violated": len(violated_ids)}, states
    assert {r.cm_id for r in rows if r.state == "satisfied"} == set(satisfied_ids)
    # No ack lost: a satisfied CM needs q0's commit ack; a violated one both read acks.
    for cm_id in violated_ids:
        assert len(acks.get(cm_id, ())) == 2, cm_id
    # Every copy reached its app once; every compensation once, only where consumed.
    originals = Counter({k: n for k, n in handed.items() if k[0] == "original"})
    assert all(n == 1 for n in originals.values()), "an original was processed twice"
    expected_copies = {("original", c, "q1") for c in satisfied_ids + violated_ids}
    expected_copies |= {("original", c, "q0") for c in satisfied_ids}
    expected_copies |= {("original", c, "q3") for c in violated_ids}
    assert set(originals) == expected_copies
    compensations = {k: n for k, n in handed.items() if k[0] == "compensation"}
    assert set(compensations) == {
        ("compensation", c, q) for c in violated_ids for q in ("q1", "q3")
    }
    assert all(n == 1 for n in compensations.values())


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
