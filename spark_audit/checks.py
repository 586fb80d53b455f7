"""Checks: a metric, a threshold and a severity. An error fails the audit (exit code 1),
a warning is reported and the audit still passes (exit code 0)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    WARN = "warn"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """Fails when ``metric > threshold``."""

    name: str
    metric: str
    severity: Severity
    threshold: float
    description: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    spec: CheckSpec
    observed: float | None
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "severity": self.spec.severity.value,
            "metric": self.spec.metric,
            "threshold": self.spec.threshold,
            "observed": self.observed,
            "passed": self.passed,
            "description": self.spec.description,
        }


E, W = Severity.ERROR, Severity.WARN

DEFAULT_CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "verdicts_reproducible",
        "discrepancies",
        E,
        0,
        "every decided CM's stored verdict equals evaluate() over its counted acks",
    ),
    CheckSpec(
        "sphere_verdicts_reproducible",
        "sphere_discrepancies",
        E,
        0,
        "every decided sphere's stored verdict equals the sphere rules over its members",
    ),
    CheckSpec(
        "sphere_members_complete",
        "sphere_member_mismatches",
        E,
        0,
        "every decided sphere's recorded member count equals its members found in the log",
    ),
    CheckSpec(
        "no_compensation_before_sphere_decision",
        "sphere_early_releases",
        E,
        0,
        "no sphere member's compensation was released before its sphere was decided",
    ),
    CheckSpec(
        "conditions_decode",
        "invalid_conditions",
        E,
        0,
        "every stored condition decodes and validates",
    ),
    CheckSpec(
        "acks_well_formed",
        "malformed_acks",
        E,
        0,
        "every stored ack is one condmsg.Ack accepts, with a known status",
    ),
    CheckSpec(
        "no_ack_counted_after_decision",
        "counted_after_decision",
        E,
        0,
        "no ack labelled counted was received after its CM's decision",
    ),
    CheckSpec(
        "no_uncounted_ack_while_pending",
        "not_counted_while_pending",
        E,
        0,
        "acks of undecided CMs are all counted",
    ),
    CheckSpec(
        "uncounted_before_decision",
        "not_counted_before_decision",
        W,
        0,
        "acks received before the decision but not counted (evaluator race)",
    ),
    CheckSpec(
        "ack_grace_sufficient",
        "late_acks_changing_verdict",
        W,
        0,
        "no ack received after a decision would have changed it (ack_grace too short)",
    ),
    CheckSpec(
        "late_ack_flags_agree",
        "late_ack_flag_mismatches",
        W,
        0,
        "the evaluator's changes_verdict labels agree with the audit's finding",
    ),
    CheckSpec("no_orphan_acks", "orphan_acks", W, 0, "no ack for a CM the store does not know"),
    CheckSpec(
        "duplicate_ack_rate",
        "duplicate_ack_rate",
        W,
        0.01,
        "share of acks redelivered under the same ack id",
    ),
    CheckSpec(
        "single_consumption",
        "multiple_consumptions",
        W,
        0,
        "every copy is acknowledged at most once per consumer",
    ),
    CheckSpec(
        "no_stale_pending",
        "stale_pending",
        W,
        0,
        "no CM still pending well after its evaluation deadline",
    ),
    CheckSpec(
        "deadline_miss_rate",
        "deadline_miss_rate",
        W,
        0.05,
        "share of final copies that missed a pickup or processing deadline",
    ),
    CheckSpec(
        "clock_skew",
        "max_proven_skew_ms",
        W,
        1000.0,
        "largest receiver clock offset proven by the acks (ms)",
    ),
    CheckSpec(
        "relay_lag",
        "relay_p99_ms",
        W,
        5000.0,
        "p99 of the time from an ack's event to its receipt (ms)",
    ),
)


def with_thresholds(
    specs: tuple[CheckSpec, ...], overrides: Mapping[str, float]
) -> tuple[CheckSpec, ...]:
    """``specs`` with thresholds replaced by name; an unknown name raises ``KeyError``."""
    known = {s.name for s in specs}
    unknown = set(overrides) - known
    if unknown:
        raise KeyError(f"unknown check(s) {sorted(unknown)}; known: {sorted(known)}")
    return tuple(
        CheckSpec(s.name, s.metric, s.severity, overrides.get(s.name, s.threshold), s.description)
        for s in specs
    )


def run_checks(
    metrics: Mapping[str, float | int | None], specs: tuple[CheckSpec, ...] = DEFAULT_CHECKS
) -> list[CheckResult]:
    """Judge every check; a metric that could not be computed (None) passes as unknown."""
    results = []
    for spec in specs:
        value = metrics.get(spec.metric)
        observed = None if value is None else float(value)
        results.append(CheckResult(spec, observed, observed is None or observed <= spec.threshold))
    return results


def status(results: list[CheckResult]) -> str:
    """``fail`` (an error failed), ``warn`` (a warning failed) or ``pass``."""
    failed = [r for r in results if not r.passed]
    if any(r.spec.severity is Severity.ERROR for r in failed):
        return "fail"
    return "warn" if failed else "pass"
