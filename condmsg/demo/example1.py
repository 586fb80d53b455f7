"""The paper's Example 1, the meeting notice, on the real services: a success and two
failures, with the paper's days scaled to ``Stage.day_s`` seconds.

The condition: all four attendees (queues qr1..qr4) read the notice within 2 days; qr3
processes it (reads it in a committed transaction) within 3 days; at least two of qr1, qr2,
qr4 process it within 7 days. The meeting is 10 days out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta

from condmsg.core import examples
from condmsg.core.conditions import Condition
from condmsg.core.evaluation import Verdict
from condmsg.demo.agents import pause
from condmsg.demo.setup import Names, queue_depth, wait_for
from condmsg.demo.stage import Stage, sleep_until
from condmsg.demo.story import Clock
from condmsg.tables import AckStatus

NOTICE = b"Meeting on 3 December, 10:00, room 4.12: please confirm"
CANCELLED = "Meeting on 3 December cancelled"
RECIPIENTS = {"qr1": "alice", "qr2": "bob", "qr3": "carol", "qr4": "dave"}


def condition(names: Names, day_s: float) -> Condition:
    """Example 1 on the demo's queues, with a day lasting ``day_s`` seconds."""
    return examples.example1(names.queue, timedelta(seconds=day_s))


@dataclass(frozen=True, slots=True)
class Read:
    """At ``at`` days after the send, ``dest``'s attendee starts reading: in a transaction
    that stays open ``hold`` days (processing the notice), or without one."""

    at: float
    dest: str
    transactional: bool = True
    hold: float = 0.05


@dataclass(frozen=True, slots=True)
class Run:
    title: str
    plot: str
    reads: tuple[Read, ...]
    verdict: Verdict
    #: Words the outcome's reasons must contain (``{qr3}`` is qr3's queue).
    reason: tuple[str, ...]
    #: The decision (decided_at) must fall in [after, before) days.
    after: float
    before: float
    #: What each attendee's app gets: kinds of message, in order.
    gets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: An attendee away until after the decision (its original and compensation cancel out).
    away: str | None = None
    #: An attendee whose ack arrives only after the decision.
    late: str | None = None


RUNS = (
    Run(
        "success",
        "everyone reads within 2 days; carol (qr3), alice (qr1) and dave (qr4) process it",
        (
            Read(0.2, "qr3"),
            Read(0.4, "qr1"),
            Read(0.6, "qr2", transactional=False),
            Read(1.0, "qr4"),
        ),
        Verdict.SATISFIED,
        ("{qr3}", "processed, committed at"),
        after=1.0,
        before=7.0,
        gets=dict.fromkeys(RECIPIENTS, ("original", "success")),
    ),
    Run(
        "failure on a READ ack",
        "carol (qr3) reads without a transaction, so she can never be said to have processed "
        "it; bob (qr2) is away until after the decision",
        (Read(0.2, "qr1"), Read(0.4, "qr4"), Read(0.6, "qr3", transactional=False)),
        Verdict.VIOLATED,
        ("{qr3}", "never processed"),
        after=0.6,
        before=3.0,
        gets={
            "qr1": ("original", "compensation"),
            "qr2": (),
            "qr3": ("original", "compensation"),
            "qr4": ("original", "compensation"),
        },
        away="qr2",
    ),
    Run(
        "failure at a deadline",
        "carol (qr3) takes the notice in a transaction at once but commits only after her "
        "3-day processing deadline",
        (
            Read(0.2, "qr3", hold=3.8),
            Read(0.4, "qr1"),
            Read(0.6, "qr2", transactional=False),
            Read(0.8, "qr4"),
        ),
        Verdict.VIOLATED,
        ("{qr3}", "no commit ack by the deadline"),
        after=3.0,
        before=4.0,
        gets=dict.fromkeys(RECIPIENTS, ("original", "compensation")),
        late="qr3",
    ),
)


def run(stage: Stage, number: int, spec: Run) -> str:
    """Send the notice, follow the script, check the outcome and the deliveries."""
    story, names, day = stage.story, stage.names, stage.day_s
    story.say(f"\n-- Example 1, run {number}: {spec.title}. {spec.plot}.")
    pause(stage.receivers.values())
    start = time.monotonic()
    cm_id = stage.sender.send(
        NOTICE, condition(names, day), compensation=CANCELLED, notify_success=True
    )
    sent_at = stage.sent_at(cm_id)
    story.register(cm_id, Clock(sent_at, day, "d", "meeting notice"))
    story.line(
        "+0.00d",
        "sender",
        f"sent the meeting notice, CM {cm_id[:8]}, to qr1..qr4",
        (f"compensation on failure: {CANCELLED!r}; success notices on success",),
    )
    for read in sorted(spec.reads, key=lambda r: r.at):
        sleep_until(start, read.at * day)
        stage.receivers[read.dest].start_reading(
            transactional=read.transactional,
            hold_s=read.hold * day if read.transactional else 0,
            announce=read.hold >= 1,  # a transaction held open for days is worth a line
        )
    outcome = stage.wait_outcome(cm_id, timeout=8 * day + 20)
    if spec.away is not None:
        _come_back(stage, spec.away, cm_id)
    expected = {stage.receivers[d].label: list(kinds) for d, kinds in spec.gets.items()}

    def delivered() -> dict[str, list[str]]:
        return {stage.receivers[d].label: stage.receivers[d].got(cm_id) for d in spec.gets}

    stage.settle(lambda: delivered() == expected, timeout=10 + 2 * day)
    if spec.late is not None:
        _late_ack(stage, spec.late, cm_id)

    checks = stage.checks
    checks.expect(outcome.verdict is spec.verdict, f"verdict {outcome.verdict.value}")
    words = [w.format(qr3=f"'{names.queue('qr3')}'") for w in spec.reason]
    checks.expect(
        all(any(w in r for r in outcome.reasons) for w in words),
        "the reasons name " + " / ".join(words),
    )
    at = (outcome.decided_at - sent_at).total_seconds() / day
    checks.expect(
        spec.after <= at < spec.before,
        f"decided at {at:+.2f}d (expected between +{spec.after:g}d and +{spec.before:g}d)",
    )
    got = delivered()
    for label, kinds in expected.items():
        checks.expect(got[label] == kinds, f"{label}'s app got {', '.join(kinds) or 'nothing'}")
    comp = [p for d in spec.gets for p in stage.receivers[d].payloads(cm_id, "compensation")]
    if spec.verdict is Verdict.VIOLATED:
        checks.expect(set(comp) == {CANCELLED}, f"each compensation read {CANCELLED!r}")
    return cm_id


def _come_back(stage: Stage, dest: str, cm_id: str) -> None:
    rx, queue = stage.receivers[dest], stage.names.queue(dest)
    wait_for(lambda: queue_depth(stage.amqp_url, queue) == 2, 20, f"two messages in {queue}")
    stage.story.line(
        stage.story.when(cm_id), rx.label, "back: the notice and its compensation wait in the queue"
    )
    before = rx.stats
    rx.start_reading()
    stage.settle(lambda: queue_depth(stage.amqp_url, queue) == 0, timeout=20)
    stage.settle(lambda: rx.stats.get("discards", 0) > before.get("discards", 0), timeout=10)
    stats = rx.stats
    cancelled = stats.get("cancelled", 0) - before.get("cancelled", 0)
    discards = stats.get("discards", 0) - before.get("discards", 0)
    stage.checks.expect(
        (cancelled, discards) == (1, 1),
        f"{rx.label}: compensation cancelled and original discarded (got {cancelled}, {discards})",
    )


def _late_ack(stage: Stage, dest: str, cm_id: str) -> None:
    queue = stage.names.queue(dest)
    found = stage.settle(lambda: stage.ack_statuses(cm_id, queue), timeout=20)
    statuses = stage.ack_statuses(cm_id, queue) if found else []
    late = statuses == [AckStatus.AFTER_DECISION.value]
    if late:
        text = (
            f"{stage.receivers[dest].label}'s commit ack came after the decision: kept, not counted"
        )
        stage.story.line(stage.story.when(cm_id), "evaluator", text)
    stage.checks.expect(late, f"{queue}'s ack was filed after_decision (found {statuses})")
