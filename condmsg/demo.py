"""``make demo``: the paper's two examples, evaluated over scripted ack timelines.

Run with ``python -m condmsg.demo``.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta

from condmsg.demo_timelines import SENT_AT, Scenario, run, scenarios


def _offset(at: datetime | timedelta) -> str:
    delta = at - SENT_AT if isinstance(at, datetime) else at
    seconds = delta.total_seconds()
    if seconds >= 86_400:
        return f"+{seconds / 86_400:.2f}d"
    if seconds >= 3600:
        return f"+{seconds / 3600:.1f}h"
    return f"+{seconds:.1f}s"


def show(scenario: Scenario) -> str:
    print(f"\n== {scenario.title}")
    print(f"   condition: {scenario.condition!r}")
    final = "pending"
    for step, result in run(scenario):
        nxt = _offset(result.next_check_at) if result.next_check_at else "-"
        when, verdict = _offset(step.at), result.verdict.value
        print(f"   {when:>9}  {step.note:<48} -> {verdict:<9} next check {nxt}")
        for reason in result.reasons:
            print(f"{'':16}{reason}")
        final = verdict
    return final


def main() -> int:
    print("condmsg demo: pure evaluation of the paper's examples (sent_at = +0)")
    outcomes = [show(s) for s in scenarios()]
    print("\nverdicts:", ", ".join(outcomes))
    expected = ["satisfied", "violated", "satisfied", "violated"]
    return 0 if outcomes == expected else 1


if __name__ == "__main__":
    sys.exit(main())
