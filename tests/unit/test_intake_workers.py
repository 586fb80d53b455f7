"""The intake workers' supervisor and reports, with stand-in worker programs (no broker,
no database): reports reach the service's metrics, a worker that exits is started again,
and stopping ends the workers."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from condmsg.core.errors import ConfigError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import Outcome
from evaluator import workers
from evaluator.config import EvaluatorConfig
from evaluator.intake import Intake
from evaluator.metrics import EvaluatorMetrics, batch_report
from evaluator.workers import IntakeWorkers, WorkerConfig
from tests.waiting import wait_for

CONFIG = WorkerConfig(
    amqp_url="amqp://unused",
    db_url="postgresql+psycopg://unused",
    sender="s",
    secret_hex="00",
    ack_grace_ms=250.0,
    batch_size=10,
    prefetch=20,
    store_threads=1,
    instance="host:1",
)


def _program(body: str) -> tuple[str, ...]:
    return (sys.executable, "-c", body)


def test_reports_reach_the_service_and_an_exited_worker_is_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "FIRST_RESTART_DELAY_S", 0.05)
    # Reads its configuration, reports one batch, writes a stray line, exits.
    program = _program(
        "import json, sys; c = json.loads(sys.stdin.readline()); "
        "print(json.dumps({'acks': 2, 'instance': c['instance']})); print('not json'); "
        "sys.stdout.flush()"
    )
    reports: list[dict[str, Any]] = []
    pool = IntakeWorkers(1, CONFIG, reports.append, command=program)
    pool.start()
    try:
        wait_for(lambda: len(reports) >= 2, timeout=20)
    finally:
        pool.stop()
    assert pool.started >= 2
    assert {r["instance"] for r in reports} == {"host:1/1"}
    assert all(r["acks"] == 2 for r in reports)


def test_stop_closes_the_leash_and_kills_what_does_not_listen() -> None:
    # The first worker exits when its stdin closes; the second never reads it again and
    # is killed once the stop's timeout has passed.
    obedient = _program("import sys; sys.stdin.readline(); sys.stdin.read()")
    deaf = _program("import sys, time; sys.stdin.readline(); time.sleep(60)")
    for program, within in ((obedient, 5.0), (deaf, 8.0)):
        pool = IntakeWorkers(2, CONFIG, lambda _r: None, command=program)
        pool.start()
        wait_for(lambda pool=pool: len(pool.pids()) == 2, timeout=20)  # type: ignore[misc]
        began = time.monotonic()
        pool.stop(timeout_s=1.0)
        assert time.monotonic() - began < within
        assert pool.pids() == []
        assert pool.started == 2  # nothing started again while stopping


def test_a_batch_report_counts_as_the_batch_itself() -> None:
    intake = Intake(stored=7, dead=1, anomalies=Counter({"duplicate": 2, "bad_token": 1}))
    decided = datetime(2026, 1, 1, tzinfo=UTC)
    outcomes = [
        Outcome(
            cm_id=f"cm-{i}",
            verdict=verdict,
            reasons=(),
            decided_at=decided,
            effective_at=decided - timedelta(milliseconds=250 + i),
            facts=(),
        )
        for i, verdict in enumerate([Verdict.SATISFIED, Verdict.SATISFIED, Verdict.VIOLATED])
    ]
    reported = CollectorRegistry()
    EvaluatorMetrics(reported).observe_report(batch_report(intake, outcomes))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in reported.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }
    assert samples[("condmsg_evaluator_acks_total", ())] == 7
    assert samples[("condmsg_evaluator_dead_letters_total", ())] == 1
    assert samples[("condmsg_evaluator_anomalies_total", (("kind", "duplicate"),))] == 2
    assert samples[("condmsg_evaluator_decisions_total", (("verdict", "satisfied"),))] == 2
    assert samples[("condmsg_evaluator_decisions_total", (("verdict", "violated"),))] == 1
    assert samples[("condmsg_evaluator_decision_seconds_count", ())] == 3
    assert batch_report(intake, outcomes)["lateness_s"] == [(0.25, 1), (0.251, 1), (0.252, 1)]
    assert samples[("condmsg_evaluator_decision_seconds_sum", ())] == pytest.approx(0.753)


def test_several_intake_processes_need_postgresql_and_a_url(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(ConfigError, match="PostgreSQL"):
        EvaluatorConfig(amqp_url="amqp://unused", sender="s", db_url=url, intake_processes=2)
    with pytest.raises(ConfigError, match="need db_url"):
        EvaluatorConfig(amqp_url="amqp://unused", sender="s", intake_processes=2)
    with pytest.raises(ConfigError, match="at least 1"):
        EvaluatorConfig(amqp_url="amqp://unused", sender="s", db_url=url, intake_processes=0)


def test_a_worker_with_a_bad_configuration_line_exits_at_once() -> None:
    done = subprocess.run(
        workers.WORKER_COMMAND, input="not json\n", capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "JSONDecodeError" in done.stderr
    # No line at all: the service went away before configuring it; a clean exit.
    done = subprocess.run(
        workers.WORKER_COMMAND, input="", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0


def test_the_configuration_keeps_its_secrets_out_of_its_repr() -> None:
    text = repr(dataclasses.replace(CONFIG, secret_hex="5ec2e75ec2e7"))
    assert "unused" not in text and "5ec2e7" not in text and "host:1" in text
