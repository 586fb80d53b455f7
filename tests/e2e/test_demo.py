"""``make demo`` as a check: ``python -m condmsg.demo`` in a process of its own, on names of
its own (queue prefix, schema), so it can run beside a ``make demo``; it must pass every
expectation of the paper's examples, of the spheres and of the audit, and leave nothing on the
broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest
import sqlalchemy as sa

from condmsg.demo.setup import Names

from .conftest import ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.rabbitmq,
    pytest.mark.postgres,
    pytest.mark.spark,
    pytest.mark.xdist_group("spark"),
]

KEY_LINES = (
    "-- Example 1, run 1: success.",
    "-- Example 1, run 2: failure on a READ ack.",
    "-- Example 1, run 3: failure at a deadline.",
    "outcome of the meeting notice arrived: SATISFIED",
    "outcome of the meeting notice arrived: VIOLATED",
    "outcome of the flight LH401 arrived: SATISFIED",
    "outcome of the flight LH400 arrived: VIOLATED",
    "took the meeting notice in a transaction; still processing it, not committed",
    "got the success notice",
    "got the compensation 'Meeting on 3 December cancelled'",
    "qr3/carol's commit ack came after the decision: kept, not counted",
    "receiver log: compensation cancelled (1) and original discarded (1); the app got neither",
    "-- Dependency-Sphere 1: committed, everyone processes in time.",
    "-- Dependency-Sphere 2: aborted after the notice succeeded.",
    "outcome of the sphere arrived: SATISFIED",
    "outcome of the sphere arrived: VIOLATED",
    "sphere aborted: the client postponed the signing",
    "got the compensation 'Contract signing on 10 December cancelled'",
    "✓ after the commit the booking is prepared, not visible",
    "✓ release_room ran 1 time(s)",
    "-- Dependency-Sphere 2: condmsg status",
    "-- Example 2: three competing controllers read qcentral.",
    "✓ all 6 flights satisfied",
    "✓ each flight handled by exactly one controller",
    "✓ decided by the evaluation timeout",
    "verdict: violated",
    "✓ zero discrepancies: every verdict reproduced",
    "condmsg demo passed:",
)


def _missing_queues(amqp_url: str, queues: list[str]) -> list[str]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    gone = []
    try:
        for queue in queues:
            channel = connection.channel()
            try:
                channel.queue_declare(queue, passive=True)
                channel.close()
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code == 404:
                    gone.append(queue)
    finally:
        connection.close()
    return gone


@pytest.mark.timeout(600)
def test_the_demo_runs_both_examples_and_the_audit(
    amqp_url: str, pg_engine_url: str, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex[:8]
    names = Names(f"condmsg-demo-t{token}", f"condmsg_demo_t{token}")
    out = tmp_path / "out"
    env = {**os.environ, "CONDMSG_AMQP_URL": amqp_url, "CONDMSG_TEST_PG_URL": pg_engine_url}
    env.pop("CONDMSG_DB_URL", None)
    args = ["--prefix", names.prefix, "--schema", names.schema, "--out", str(out)]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "condmsg.demo", *args, "--drop-schemas"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
    finally:
        engine = sa.create_engine(pg_engine_url)
        with engine.connect() as conn:
            left = conn.execute(
                sa.text("SELECT nspname FROM pg_namespace WHERE nspname LIKE :p"),
                {"p": f"{names.schema}%"},
            ).all()
        engine.dispose()
    story = result.stdout
    assert result.returncode == 0, story[-4000:] + result.stderr[-4000:]
    missing = [line for line in KEY_LINES if line not in story]
    assert not missing, (missing, story[-4000:])
    failed_checks = [line for line in story.splitlines() if line.startswith("  ✗")]
    assert not failed_checks
    summary = json.loads((out / "audit" / "summary.json").read_text())
    assert summary["metrics"]["discrepancies"] == 0
    assert summary["totals"]["cms"] == 12 and summary["totals"]["pending"] == 0
    assert (out / "audit" / "report.html").exists()
    assert str((out / "audit" / "report.html").resolve()) in story
    # Nothing left behind: the queues are deleted, the schemas dropped (--drop-schemas).
    assert sorted(_missing_queues(amqp_url, names.queues())) == sorted(names.queues())
    assert left == []
