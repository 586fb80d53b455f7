"""The paper's Example 2, incoming flights, on the real services: three competing
controllers read ``qcentral``; each flight must be picked up within 20 s, and the
evaluation timeout is 21 s. The demo runs these times ten times faster (2 s and 2.1 s).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from condmsg.core.conditions import Condition, Destination
from condmsg.core.evaluation import Verdict
from condmsg.demo.agents import pause
from condmsg.demo.setup import Names, queue_depth, wait_for
from condmsg.demo.stage import Stage, sleep_until
from condmsg.demo.story import Clock

#: Example 2's seconds pass this many times faster in the demo.
SPEEDUP = 10
FLIGHTS = ("LH401", "BA902", "AF1234", "KL1767", "UA960", "LX318")
UNATTENDED = "LH400"
#: How long a controller takes over a handover (its receiver transaction), seconds.
HANDOVER_S = 0.3


def condition(names: Names) -> Condition:
    return Destination(
        names.queue("qcentral"),
        pickup_within=timedelta(seconds=20 / SPEEDUP),
        evaluation_timeout=timedelta(seconds=21 / SPEEDUP),
    )


def _send(stage: Stage, flight: str, since: datetime | None = None) -> tuple[str, datetime]:
    """Send one flight; the story times it from ``since`` (default: its own send)."""
    cm_id = stage.sender.send(
        f"flight {flight} inbound".encode(),
        condition(stage.names),
        compensation=f"flight {flight} handover cancelled",
    )
    sent_at = stage.sent_at(cm_id)
    clock = Clock(since or sent_at, 1.0, "s", f"flight {flight}")
    stage.story.register(cm_id, clock)
    stage.story.line(
        clock.offset(sent_at), "scheduler", f"sent flight {flight} inbound to qcentral"
    )
    return cm_id, sent_at


def run(stage: Stage) -> str:
    """Six flights shared by the controllers, then one nobody picks up; returns its CM."""
    story = stage.story
    story.say(
        f"\n-- Example 2: three competing controllers read qcentral. Pickup within 20 s, "
        f"evaluation timeout 21 s (run {SPEEDUP}x faster: {20 / SPEEDUP:g} s and "
        f"{21 / SPEEDUP:g} s). A handover takes a controller {HANDOVER_S:g} s."
    )
    for controller in stage.controllers:
        controller.start_reading(transactional=True, hold_s=HANDOVER_S)
    start = time.monotonic()
    sent: dict[str, str] = {}
    first: datetime | None = None
    for index, flight in enumerate(FLIGHTS):
        sleep_until(start, 0.15 * index)
        sent[flight], sent_at = _send(stage, flight, first)
        first = first or sent_at
    outcomes = {f: stage.wait_outcome(cm, timeout=30) for f, cm in sent.items()}
    checks = stage.checks
    checks.expect(
        all(o.verdict is Verdict.SATISFIED for o in outcomes.values()),
        f"all {len(FLIGHTS)} flights satisfied",
    )
    takers = {f: [c.label for c in stage.controllers if c.got(cm)] for f, cm in sent.items()}
    checks.expect(
        all(len(t) == 1 for t in takers.values()),
        "each flight handled by exactly one controller: "
        + ", ".join(f"{f} {'/'.join(t) or 'nobody'}" for f, t in takers.items()),
    )
    return _unattended(stage)


def _unattended(stage: Stage) -> str:
    story, checks = stage.story, stage.checks
    story.say(f"\n   The controllers go on a break; flight {UNATTENDED} comes in.")
    pause(stage.controllers)
    cm_id, sent_at = _send(stage, UNATTENDED)
    outcome = stage.wait_outcome(cm_id, timeout=30)
    checks.expect(outcome.verdict is Verdict.VIOLATED, f"verdict {outcome.verdict.value}")
    checks.expect(
        any("evaluation timeout" in r for r in outcome.reasons), "decided by the evaluation timeout"
    )
    at = (outcome.effective_at - sent_at).total_seconds()
    checks.expect(at >= 21 / SPEEDUP, f"evaluated at {at:+.2f}s, not before the timeout")
    queue = stage.names.queue("qcentral")
    wait_for(lambda: queue_depth(stage.amqp_url, queue) == 2, 20, f"two messages in {queue}")
    story.line(
        story.when(cm_id),
        "controllers",
        "back from the break: the flight and its compensation wait in qcentral",
    )
    for controller in stage.controllers:
        controller.start_reading(transactional=True, hold_s=HANDOVER_S)
    stage.settle(lambda: queue_depth(stage.amqp_url, queue) == 0, timeout=20)

    def got() -> list[str]:
        return sorted(kind for c in stage.controllers for kind in c.got(cm_id))

    def cancelled_out() -> bool:
        stats = [c.stats for c in stage.controllers]
        cancelled = sum(s.get("cancelled", 0) for s in stats)
        return cancelled == 1 == sum(s.get("discards", 0) for s in stats)

    # Either interleaving keeps invariant 3: the shared receiver log cancels the pair out,
    # or (a controller took the original first) the app gets both.
    both = ["compensation", "original"]
    stage.settle(lambda: cancelled_out() or got() == both, 10)
    kinds = got()
    checks.expect(
        (not kinds and cancelled_out()) or kinds == both,
        f"flight {UNATTENDED}: no app got it nor its compensation"
        if not kinds
        else f"flight {UNATTENDED}: a controller's app got it and its compensation",
    )
    pause(stage.controllers)
    return cm_id
