"""Deciding Dependency-Spheres and writing their members' outcome actions.

A sphere is judged (:func:`condmsg.core.sphere_evaluation.judge_sphere`) whenever something that
can decide it happened: a member was decided (:func:`evaluator.decisions.judge` settles the
spheres of the members it decided), or its next check came (the sender committed or
aborted it, or its deadline passed: :func:`sweep_spheres`). The caller holds the sphere's
row lock, so the outcome is recorded once, with each member's verdict as it stands then
(what every later read of the outcome returns), and in the same transaction the outbox
receives the sphere's outcome notification, the notifications of its decided members, and,
for every member, success notices (where asked for) or compensations: the sphere's
verdict, not the member's, chooses.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from condmsg.core.evaluation import Verdict
from condmsg.core.outcome import SphereOutcome
from condmsg.core.sphere_evaluation import judge_sphere
from condmsg.core.store_values import CmState
from condmsg.spheres.store import MemberRow, SphereRow, SphereStore, sphere_facts
from evaluator.actions import Actions, outcome_body_of_row
from evaluator.tracing import sphere_trace


def settle_spheres(
    session: Session,
    held: Sequence[SphereRow],
    *,
    spheres: SphereStore,
    actions: Actions,
    now: datetime,
    ack_grace: timedelta,
    instance: str,
) -> None:
    """Judge the undecided spheres ``held`` (locked by the caller) at ``now - ack_grace``;
    record those decided and collect their actions in ``actions``; the others are looked
    at again when their deadline (plus the grace) passes."""
    if not held:
        return
    members = spheres.members(session, [s.sphere_id for s in held])
    effective = now - ack_grace
    for sphere in held:
        its = members.get(sphere.sphere_id, [])
        judgement = judge_sphere(sphere_facts(sphere, its), effective)
        if not judgement.decided:
            # Looked at again once its deadline has passed by the grace (a commit, an abort
            # or a member's decision brings it back sooner).
            later = sphere.deadline + ack_grace
            if sphere.next_check_at != later:
                spheres.set_next_check(session, sphere.sphere_id, later)
            continue
        assert judgement.effective_at is not None
        outcome = SphereOutcome(
            sphere_id=sphere.sphere_id,
            verdict=judgement.verdict,
            reasons=judgement.reasons,
            decided_at=now,
            effective_at=judgement.effective_at,
            members={m.cm_id: m.state for m in its},
        )
        won = spheres.decide(
            session,
            sphere.sphere_id,
            verdict=outcome.verdict.value,
            effective_at=outcome.effective_at,
            reasons=outcome.reasons,
            members=outcome.members,
            decided_at=now,
            instance=instance,
        )
        if not won:
            continue
        trace = sphere_trace(session, sphere.sender, outcome)
        if trace is not None:  # what the decision releases carries its context
            actions.trace({m.cm_id for m in its}, trace)
        actions.notify_sphere(sphere.sender, outcome, trace)
        _member_actions(actions, its, judgement.verdict)


def _member_actions(actions: Actions, members: Sequence[MemberRow], verdict: Verdict) -> None:
    for member in members:
        if member.state != CmState.PENDING.value:
            actions.notify(member, outcome_body_of_row(member))
        # A member still pending gets its own notification when it is decided (then on
        # its own, since its sphere is decided); its compensation goes out now.
    if verdict is Verdict.SATISFIED:
        actions.succeed(members)
    else:
        actions.compensate(members)
