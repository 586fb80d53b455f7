"""Prometheus metrics of one evaluator instance (its own registry, no globals)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from condmsg.outcome import Outcome
from evaluator.intake import Intake


class EvaluatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.acks = Counter(
            "condmsg_evaluator_acks_total", "Acks stored (counted or late)", registry=registry
        )
        self.dead = Counter(
            "condmsg_evaluator_dead_letters_total",
            "Malformed ack bodies dead-lettered",
            registry=registry,
        )
        self.anomalies = Counter(
            "condmsg_evaluator_anomalies_total",
            "Acks that did not count, by kind",
            ["kind"],
            registry=registry,
        )
        self.decisions = Counter(
            "condmsg_evaluator_decisions_total",
            "CMs decided, by verdict",
            ["verdict"],
            registry=registry,
        )
        self.lateness = Histogram(
            "condmsg_evaluator_decision_seconds",
            "From the effective instant to the decision (seconds): the ack grace plus lag",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        )

    def observe_intake(self, intake: Intake) -> None:
        self.acks.inc(intake.stored)
        self.dead.inc(intake.dead)
        for kind, count in intake.anomalies.items():
            self.anomalies.labels(kind=kind).inc(count)

    def observe_decisions(self, outcomes: Iterable[Outcome]) -> None:
        for outcome in outcomes:
            self.decisions.labels(verdict=outcome.verdict.value).inc()
            self.lateness.observe((outcome.decided_at - outcome.effective_at).total_seconds())
