"""Deciding CMs and writing their outcome actions, in the caller's transaction.

A CM is judged with the pure ``evaluate`` at the *effective* instant ``now - ack_grace``
(never before the CM's ``sent_at``: no deadline lies before it, so the verdict is the
same, but a decision never claims to take effect before its CM existed): an ack made in
time but still in a receiver's relay is not misjudged at a deadline. The
verdict is recorded exactly once (a conditional UPDATE), and in the same transaction the
outbox receives the outcome notification, the success notices (if asked for) or the
compensations. A CM still pending gets its next check time, shifted by the grace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from condmsg.core.acks import Ack
from condmsg.core.evaluation import Verdict, evaluate
from condmsg.core.outcome import Outcome, SphereOutcome
from condmsg.spheres.store import SPHERES, SphereStore
from evaluator.actions import Actions, instants_json, outcome_body
from evaluator.spheres import settle_spheres
from evaluator.store import CmRow, CopyRow, DecisionStore
from evaluator.tracing import decision_traces


@dataclass(slots=True)
class Decided:
    outcomes: list[Outcome] = field(default_factory=list)
    rescheduled: int = 0
    spheres: list[SphereOutcome] = field(default_factory=list)


def judge(
    session: Session,
    cms: Mapping[str, CmRow],
    *,
    store: DecisionStore,
    now: datetime,
    ack_grace: timedelta,
    instance: str,
    secret: bytes,
    acks: Mapping[str, Sequence[Ack]] | None = None,
    copies: Mapping[str, Mapping[str, CopyRow]] | None = None,
    spheres: SphereStore = SPHERES,
) -> Decided:
    """Evaluate the pending CMs among ``cms`` and decide those whose verdict is final, in
    ``store`` (``secret`` signs the compensations and success notices).

    ``acks`` (the counted acks per CM) and ``copies`` (per CM, by destination) spare the
    queries when the caller has them already (the ack intake does); else they are read.
    A member of a Dependency-Sphere is decided like any CM, but its outcome actions wait
    for the sphere's outcome, which is judged here as soon as a member's decision allows.
    """
    pending = {cm_id: cm for cm_id, cm in cms.items() if cm.state == "pending"}
    if acks is None:
        acks = store.counted_acks(session, pending)
    effective = now - ack_grace
    reschedule: list[tuple[str, datetime | None]] = []
    verdicts: dict[str, tuple[Outcome, bytes]] = {}
    rows: list[dict[str, Any]] = []
    instants = instants_json(now, effective)  # shared by the outcomes of the call
    for cm_id, cm in pending.items():
        at, at_json = (effective, instants)
        if cm.sent_at > effective:  # sent less than a grace ago
            at, at_json = cm.sent_at, instants_json(now, cm.sent_at)
        result = evaluate(cm.condition, cm.sent_at, acks.get(cm_id, ()), at)
        if not result.decided:
            next_at = result.next_check_at + ack_grace if result.next_check_at else None
            reschedule.append((cm_id, next_at))
            continue
        outcome = Outcome.from_result(cm_id, result, decided_at=now, effective_at=at)
        reasons_json = json.dumps(list(outcome.reasons))
        facts_json = json.dumps(list(outcome.facts))
        verdicts[cm_id] = (outcome, outcome_body(outcome, reasons_json, facts_json, at_json))
        rows.append(
            {
                "cm_id": cm_id,
                "state": result.verdict.value,
                "effective_at": at,
                "reasons_json": reasons_json,
                "facts_json": facts_json,
            }
        )
    store.set_next_checks(session, reschedule)
    # One statement per kind for the whole batch, not per CM (round trips dominate).
    won = store.decide_many(session, rows, instance=instance, decided_at=now)
    decided = [pending[cm_id] for cm_id in verdicts if cm_id in won]
    # A sphere's members take no outcome action of their own while it is undecided; its
    # row is locked before their actions are chosen, so a sphere decided meanwhile by
    # another transaction is seen decided here (CM rows first, then spheres: one order).
    held = spheres.lock(session, {cm.sphere_id for cm in decided if cm.sphere_id})
    own = [cm for cm in decided if cm.sphere_id not in held]
    after_sphere = [cm for cm in decided if cm.sphere_id in held and held[cm.sphere_id].decided]
    traces = decision_traces(session, decided, verdicts)
    actions = Actions(session, store, now, secret=secret, copies=copies, traces=traces)
    for cm in own + after_sphere:
        actions.notify(cm, verdicts[cm.cm_id][1])
    actions.succeed([cm for cm in own if verdicts[cm.cm_id][0].verdict is Verdict.SATISFIED])
    actions.compensate([cm for cm in own if verdicts[cm.cm_id][0].verdict is Verdict.VIOLATED])
    settle_spheres(
        session,
        [sphere for sphere in held.values() if not sphere.decided],
        spheres=spheres,
        actions=actions,
        now=now,
        ack_grace=ack_grace,
        instance=instance,
    )
    spheres_decided = actions.flush()
    outcomes = [verdicts[cm.cm_id][0] for cm in decided]
    return Decided(outcomes=outcomes, rescheduled=len(reschedule), spheres=spheres_decided)
