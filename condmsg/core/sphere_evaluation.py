"""A Dependency-Sphere's verdict, judged from its recorded facts (pure).

The evaluator decides a sphere with :func:`judge_sphere` and the Spark audit re-judges it
with the same rules, so the two cannot disagree on what the rules are:

1. a member decided ``violated`` violates the sphere (the earliest such member names it);
2. an abort violates it;
3. it is ``satisfied`` once it was committed by its deadline and every member was decided
   ``satisfied`` at an effective instant at or before the deadline;
4. otherwise, from the deadline on, it is violated by its timeout;
5. until then it is pending.

The instants compared are the evaluator's effective instants (decision time minus the ack
grace), so a sphere's verdict follows from its members' recorded decisions alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from condmsg.core.evaluation import Verdict
from condmsg.core.protocol import format_instant
from condmsg.core.store_values import CmState, SphereState


class MemberFacts(NamedTuple):
    """What a sphere's judgement needs of one member CM."""

    cm_id: str
    state: str  # a CmState value
    effective_at: datetime | None
    reasons: tuple[str, ...] = ()


class SphereFacts(NamedTuple):
    """A sphere as recorded: its request state, deadline and members."""

    sphere_id: str
    state: str  # a SphereState value
    deadline: datetime
    committed_at: datetime | None
    aborted_at: datetime | None
    abort_reason: str | None
    members: Sequence[MemberFacts]


@dataclass(frozen=True, slots=True)
class SphereJudgement:
    """The verdict at an instant; ``effective_at`` is the instant the facts that decided
    it were in (None while pending)."""

    verdict: Verdict
    reasons: tuple[str, ...]
    effective_at: datetime | None

    @property
    def decided(self) -> bool:
        return self.verdict is not Verdict.PENDING


def judge_sphere(facts: SphereFacts, at: datetime) -> SphereJudgement:
    """The sphere's verdict at the effective instant ``at`` (rules in the module doc)."""
    violated = [
        m for m in facts.members if m.state == CmState.VIOLATED.value and m.effective_at is not None
    ]
    if violated:
        first = min(violated, key=lambda m: (m.effective_at, m.cm_id))
        why = f": {first.reasons[0]}" if first.reasons else ""
        return SphereJudgement(
            Verdict.VIOLATED, (f"member {first.cm_id} violated{why}",), first.effective_at
        )
    if facts.state == SphereState.ABORTED.value or facts.aborted_at is not None:
        reason = facts.abort_reason or "aborted by the sender"
        return SphereJudgement(
            Verdict.VIOLATED, (f"sphere aborted: {reason}",), facts.aborted_at or at
        )
    in_time = [
        m.effective_at
        for m in facts.members
        if m.state == CmState.SATISFIED.value
        and m.effective_at is not None
        and m.effective_at <= facts.deadline
    ]
    committed = facts.committed_at is not None and facts.committed_at <= facts.deadline
    if committed and len(in_time) == len(facts.members):
        assert facts.committed_at is not None
        return SphereJudgement(
            Verdict.SATISFIED,
            (_all_satisfied(len(facts.members)),),
            max([facts.committed_at, *in_time]),
        )
    if at >= facts.deadline:
        waiting = len(facts.members) - len(in_time)
        missing = "not committed" if not committed else f"{_members(waiting)} not satisfied"
        return SphereJudgement(
            Verdict.VIOLATED,
            (f"sphere timeout at {format_instant(facts.deadline)}: {missing}",),
            facts.deadline,
        )
    return SphereJudgement(Verdict.PENDING, (), None)


def _all_satisfied(members: int) -> str:
    """The reason of a sphere committed with every member satisfied in time."""
    if members == 1:
        return "committed with its only member satisfied"
    return f"committed with all {_members(members)} satisfied"


def _members(count: int) -> str:
    """``1 member``, ``2 members``: digits without grouping, as the Spark audit writes them."""
    return f"{count} member" if count == 1 else f"{count} members"
