"""The intake workers' reports and settings, without a process: a batch report counts as
the batch itself, several intake processes need PostgreSQL, and the workers' configuration
keeps its secrets out of its repr. The supervisor with real processes:
tests/integration/evaluator/test_intake_workers.py."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from condmsg.core.errors import ConfigError
from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import Outcome
from evaluator.config import EvaluatorConfig
from evaluator.intake import Intake
from evaluator.metrics import EvaluatorMetrics, batch_report
from evaluator.workers import WorkerConfig

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


def test_the_configuration_keeps_its_secrets_out_of_its_repr() -> None:
    text = repr(dataclasses.replace(CONFIG, secret_hex="5ec2e75ec2e7"))
    assert "unused" not in text and "5ec2e7" not in text and "host:1" in text
