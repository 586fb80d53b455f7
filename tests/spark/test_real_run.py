"""The audit over the logs of a real run: sender, receivers, relays and the evaluator on the
real RabbitMQ and PostgreSQL, exported with ``condmsg export``; the independent
re-evaluation must agree with every decision the evaluator took."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ackd.receiver import Receiver
from condmsg import Destination, DestinationSet, Verdict
from condmsg.cli import main as condmsg_main
from spark_audit.cli import main as audit_main
from tests.running_world import RunningWorld
from tests.spark.conftest import SPARK_MARKS

pytestmark = [*SPARK_MARKS, pytest.mark.rabbitmq, pytest.mark.postgres]


def test_the_audit_of_a_real_run_finds_no_discrepancy(
    spark: Any, amqp_url: str, running_world: RunningWorld, tmp_path: Path
) -> None:
    pg_url, sender = running_world.pg_url, running_world.sender
    q = [running_world.queue(f"q{i}") for i in range(4)]
    receiver = Receiver(amqp_url=amqp_url, db_url=pg_url, recipient="alice", create_schema=True)
    try:
        second = timedelta(seconds=1)
        satisfied = sender.send(b"a", Destination(q[0], pickup_within=30 * second))
        never_processed = sender.send(b"b", Destination(q[1], process_within=30 * second))
        timed_out = sender.send(
            b"c",
            Destination(
                q[2],
                pickup_within=timedelta(milliseconds=300),
                evaluation_timeout=timedelta(milliseconds=400),
            ),
        )
        two_of_set = sender.send(
            b"d",
            DestinationSet(
                Destination(q[3]), Destination(q[0]), process_within=30 * second, min_process=1
            ),
        )
        with receiver.relay():
            assert receiver.read(q[0], timeout=10) is not None  # READ: picks `satisfied` up
            assert receiver.read(q[1], timeout=10) is not None  # READ: never processed
            with receiver.transaction() as tx:
                assert tx.read(q[3], timeout=10) is not None  # COMMIT for the set
            verdicts = {
                cm: sender.outcome(cm, timeout=20)
                for cm in (satisfied, never_processed, timed_out, two_of_set)
            }
        assert {cm: o.verdict if o else None for cm, o in verdicts.items()} == {
            satisfied: Verdict.SATISFIED,
            never_processed: Verdict.VIOLATED,
            timed_out: Verdict.VIOLATED,
            two_of_set: Verdict.SATISFIED,
        }
        # The copy of `two_of_set` still queued in q[0] is read late: an ack after the
        # decision, which the audit must report without calling it a discrepancy.
        with receiver.relay():
            assert receiver.read(q[0], timeout=10) is not None
    finally:
        running_world.stop()  # every decision stored before the export
        receiver.close()

    store, audit = tmp_path / "store", tmp_path / "audit"
    assert condmsg_main(["export", "--db-url", pg_url, "--out", str(store)]) == 0
    code = audit_main(["--parquet", str(store), "--out", str(audit), "--quiet"])
    summary = json.loads((audit / "summary.json").read_text())
    assert summary["totals"]["cms"] == 4
    assert summary["metrics"]["discrepancies"] == 0
    assert summary["status"] != "fail", [c for c in summary["checks"] if not c["passed"]]
    assert code == 0
    assert (audit / "report.html").exists()
