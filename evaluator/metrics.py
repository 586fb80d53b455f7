"""Prometheus metrics of one evaluator instance (its own registry, no globals)."""

from __future__ import annotations

from collections import Counter as CountOf
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from condmsg.core.outcome import Outcome, SphereOutcome
from evaluator.intake import Intake
from evaluator.retention import Archived


class EvaluatorMetrics:
    """The metric objects of one evaluator, registered in ``registry``; the table of
    names, types and meanings is in docs/operations.md."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.acks = Counter(
            "condmsg_evaluator_acks_total", "Acks stored (counted or late)", registry=registry
        )
        self.dead = Counter(
            "condmsg_evaluator_dead_letters_total",
            "Ack bodies dead-lettered (malformed, or failing alone where their batch failed)",
            registry=registry,
        )
        self.anomalies = Counter(
            "condmsg_evaluator_anomalies_total",
            "Acks that did not count, by kind",
            ["kind"],
            registry=registry,
        )
        self.contradicted = Counter(
            "condmsg_evaluator_contradicted_decisions_total",
            "Decided CMs whose late acks, judged together with the counted ones at the "
            "decision's effective instant, give another verdict (the ack grace was too short)",
            registry=registry,
        )
        self.decisions = Counter(
            "condmsg_evaluator_decisions_total",
            "CMs decided, by verdict",
            ["verdict"],
            registry=registry,
        )
        self.sphere_decisions = Counter(
            "condmsg_evaluator_sphere_decisions_total",
            "Dependency-Spheres decided, by verdict",
            ["verdict"],
            registry=registry,
        )
        self.lateness = Histogram(
            "condmsg_evaluator_decision_seconds",
            "From the effective instant to the decision (seconds): the ack grace plus lag",
            registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        )
        self.retained = Counter(
            "condmsg_evaluator_retention_rows_total",
            "Rows archived to Parquet and then deleted by retention, by layout table",
            ["table"],
            registry=registry,
        )
        self.archives = Counter(
            "condmsg_evaluator_retention_archives_total",
            "Retention archives written (each one's rows deleted in the same transaction)",
            registry=registry,
        )
        self.parked = Counter(
            "condmsg_evaluator_parked_cms_total",
            "Due CMs a sweep could not judge (their stored condition or acks fail to load or "
            "evaluate); each is looked at again later without holding back the others",
            registry=registry,
        )
        self.retention_failures = Counter(
            "condmsg_evaluator_retention_failures_total",
            "Retention batches that failed (nothing of them was deleted)",
            registry=registry,
        )
        self.sweep_failures = Counter(
            "condmsg_evaluator_sweep_failures_total",
            "Deadline sweeps that failed (each retried at the next run)",
            registry=registry,
        )
        self.pending_cms = Gauge(
            "condmsg_evaluator_pending_cms",
            "CMs of the sender not decided yet (refreshed every gauge interval)",
            registry=registry,
        )
        self.overdue_cms = Gauge(
            "condmsg_evaluator_overdue_cms",
            "Pending CMs whose next check is due since longer than one sweep interval "
            "(the sweeps are behind or failing)",
            registry=registry,
        )
        self.ack_backlog = Gauge(
            "condmsg_evaluator_ack_queue_messages",
            "Messages ready in the sender's ack queue, not yet delivered to an evaluator",
            registry=registry,
        )
        self.refresh_failures = Counter(
            "condmsg_evaluator_gauge_refresh_failures_total",
            "Refreshes of the store or ack-queue gauges that failed, by source",
            ["source"],
            registry=registry,
        )

    def observe_decisions(
        self, outcomes: Iterable[Outcome], spheres: Iterable[SphereOutcome] = ()
    ) -> None:
        """Decisions a deadline sweep took: CMs and the spheres they decided."""
        self.observe_report(decisions_report(outcomes, spheres))

    def observe_spheres(self, outcomes: Iterable[SphereOutcome]) -> None:
        """Spheres a sphere sweep decided."""
        self.observe_report(decisions_report((), outcomes))

    def observe_report(self, report: dict[str, Any]) -> None:
        """What one batch did (:func:`batch_report`): this process's own batches, and
        those its intake workers report (:mod:`evaluator.workers`)."""
        self.acks.inc(int(report.get("acks", 0)))
        self.dead.inc(int(report.get("dead", 0)))
        self.contradicted.inc(int(report.get("contradicted", 0)))
        for kind, count in dict(report.get("anomalies", {})).items():
            self.anomalies.labels(kind=str(kind)).inc(int(count))
        for verdict, count in dict(report.get("decisions", {})).items():
            self.decisions.labels(verdict=str(verdict)).inc(int(count))
        for verdict, count in dict(report.get("spheres", {})).items():
            self.sphere_decisions.labels(verdict=str(verdict)).inc(int(count))
        for seconds, count in report.get("lateness_s", ()):
            for _ in range(int(count)):
                self.lateness.observe(float(seconds))

    def observe_archived(self, archived: Archived) -> None:
        self.archives.inc()
        for table, count in archived.rows.items():
            self.retained.labels(table=table).inc(count)


def batch_report(
    intake: Intake, outcomes: Iterable[Outcome], spheres: Iterable[SphereOutcome] = ()
) -> dict[str, Any]:
    """What one batch did, as a JSON document: counted by
    :meth:`EvaluatorMetrics.observe_report`, in this process or, from an intake worker,
    in its service's (:mod:`evaluator.workers`)."""
    return {
        "acks": intake.stored,
        "dead": intake.dead,
        "anomalies": dict(intake.anomalies),
        "contradicted": intake.contradicted,
        **decisions_report(outcomes, spheres),
    }


def decisions_report(
    outcomes: Iterable[Outcome], spheres: Iterable[SphereOutcome] = ()
) -> dict[str, Any]:
    """The decisions part of :func:`batch_report`: counts by verdict, each decision's
    lateness as ``[seconds, decisions]`` pairs (a batch's decisions share their instants),
    and the spheres decided, by verdict."""
    verdicts: CountOf[str] = CountOf()
    lateness: CountOf[float] = CountOf()
    for outcome in outcomes:
        verdicts[outcome.verdict.value] += 1
        lateness[(outcome.decided_at - outcome.effective_at).total_seconds()] += 1
    report: dict[str, Any] = {"decisions": dict(verdicts), "lateness_s": sorted(lateness.items())}
    sphere_verdicts = CountOf(outcome.verdict.value for outcome in spheres)
    if sphere_verdicts:
        report["spheres"] = dict(sphere_verdicts)
    return report
