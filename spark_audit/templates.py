"""Condition templates for the synthetic log generator (pure; no Spark).

Each template is a condition plus the behaviour of its receivers: how likely a copy is
acked, whether the read is transactional, and the mean latencies (ms). Five are shapes the
re-evaluation handles natively, two (the paper's Example 1 and a topic with counts) go
through ``condmsg.evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from condmsg.core.conditions import Condition, Destination, DestinationSet
from condmsg.core.examples import example1, example2
from condmsg.core.protocol import Requirement

s = timedelta(seconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Template:
    name: str
    condition: Condition
    weight: float
    p_ack: float
    p_commit: float
    pickup_mean_ms: float
    work_mean_ms: float
    #: Extra consumers per topic destination (recipient identities).
    recipients: tuple[str, ...] = ()

    def slots(self) -> list[tuple[str, str | None, bool]]:
        """``(destination, recipient, is_topic)`` for every consumption the CM can get."""
        found: list[tuple[str, str | None, bool]] = []
        for leaf in self.condition.destinations():
            if leaf.is_topic:
                found.extend((leaf.name, r, True) for r in self.recipients)
            else:
                found.append((leaf.name, leaf.recipient, False))
        return found

    def requires(self) -> dict[str, str]:
        processing = self.condition.requires_processing()
        return {
            name: (Requirement.PROCESS if needs else Requirement.PICKUP).value
            for name, needs in processing.items()
        }


def default_templates() -> tuple[Template, ...]:
    return (
        Template(
            name="flight",
            condition=example2(),
            weight=0.25,
            p_ack=0.97,
            p_commit=0.2,
            pickup_mean_ms=4000,
            work_mean_ms=300,
        ),
        Template(
            name="billing",
            condition=Destination("billing", process_within=5 * s),
            weight=0.20,
            p_ack=0.97,
            p_commit=0.92,
            pickup_mean_ms=800,
            work_mean_ms=1500,
        ),
        Template(
            name="all-read",
            condition=DestinationSet(
                Destination("qa"), Destination("qb"), Destination("qc"), pickup_within=10 * s
            ),
            weight=0.20,
            p_ack=0.97,
            p_commit=0.3,
            pickup_mean_ms=2000,
            work_mean_ms=400,
        ),
        Template(
            name="quorum",
            condition=DestinationSet(
                *(Destination(f"w{i}") for i in range(1, 5)),
                process_within=30 * s,
                min_process=2,
            ),
            weight=0.15,
            p_ack=0.9,
            p_commit=0.9,
            pickup_mean_ms=3000,
            work_mean_ms=5000,
        ),
        Template(
            name="bounded",
            condition=DestinationSet(
                Destination("s1"),
                Destination("s2"),
                Destination("s3", recipient="desk-3"),
                pickup_within=10 * s,
                min_pickup=1,
                max_pickup=2,
            ),
            weight=0.15,
            p_ack=0.6,
            p_commit=0.1,
            pickup_mean_ms=3000,
            work_mean_ms=300,
        ),
        Template(
            name="meeting",
            condition=example1(day=s),
            weight=0.03,
            p_ack=0.95,
            p_commit=0.9,
            pickup_mean_ms=700,
            work_mean_ms=1500,
        ),
        Template(
            name="news",
            condition=Destination("news", exchange="ex.news", pickup_within=5 * s, min_pickup=2),
            weight=0.02,
            p_ack=0.7,
            p_commit=0.1,
            pickup_mean_ms=1500,
            work_mean_ms=300,
            recipients=("r1", "r2", "r3"),
        ),
    )
