"""The paper's two examples as scripted ack timelines, evaluated step by step
(``python -m condmsg.demo --timelines``: pure evaluation, no services).

Each scenario is a condition plus a list of steps; a step is either an ack that arrives or
a moment at which the clock is looked at. At every step the pure ``evaluate`` judges the
acks received so far, so the output shows how the verdict, its reasons and the next check
time evolve, and that success or failure is declared as early as the facts allow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from condmsg.core.acks import Ack, AckKind
from condmsg.core.conditions import Condition
from condmsg.core.evaluation import EvaluationResult, evaluate
from condmsg.core.examples import DAY, example1, example2

SENT_AT = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Step:
    at: timedelta
    ack: Ack | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    title: str
    condition: Condition
    steps: tuple[Step, ...]


def _read(dest: str, at: timedelta, recipient: str | None = None) -> Step:
    ack = Ack(destination=dest, kind=AckKind.READ, read_at=SENT_AT + at, recipient=recipient)
    return Step(at, ack, f"{dest} read (non-transactional)")


def _commit(dest: str, read: timedelta, commit: timedelta) -> Step:
    ack = Ack(
        destination=dest,
        kind=AckKind.COMMIT,
        read_at=SENT_AT + read,
        committed_at=SENT_AT + commit,
    )
    return Step(commit, ack, f"{dest} read and committed")


def scenarios() -> tuple[Scenario, ...]:
    hours = timedelta(hours=1)
    return (
        Scenario(
            "Example 1, success: everyone reads within 2 days, qr3 and two others process",
            example1(),
            (
                Step(timedelta(0), note="sent"),
                _commit("qr3", 2 * hours, 5 * hours),
                _commit("qr1", 20 * hours, 22 * hours),
                _read("qr2", 30 * hours),
                _commit("qr4", 40 * hours, 2 * DAY + 4 * hours),
            ),
        ),
        Scenario(
            "Example 1, failure: qr3 reads in time but never commits within 3 days",
            example1(),
            (
                Step(timedelta(0), note="sent"),
                _read("qr1", 3 * hours),
                _commit("qr2", 4 * hours, 6 * hours),
                _commit("qr4", 5 * hours, 9 * hours),
                Step(36 * hours, note="qr3 is reading inside a long transaction"),
                Step(3 * DAY + timedelta(minutes=1), note="qr3's processing deadline passed"),
            ),
        ),
        Scenario(
            "Example 2, success: controller-2 of three competing controllers picks it up",
            example2(),
            (
                Step(timedelta(0), note="sent"),
                Step(timedelta(seconds=5), note="nobody yet"),
                _read("qcentral", timedelta(seconds=12), recipient="controller-2"),
            ),
        ),
        Scenario(
            "Example 2, failure: no controller picks it up",
            example2(),
            (
                Step(timedelta(0), note="sent"),
                Step(timedelta(seconds=20, milliseconds=500), note="pickup deadline passed"),
                Step(timedelta(seconds=21), note="evaluation timeout"),
            ),
        ),
    )


def run(scenario: Scenario) -> Iterator[tuple[Step, EvaluationResult]]:
    """Evaluate after each step; stop once the verdict is decided."""
    acks: list[Ack] = []
    for step in scenario.steps:
        if step.ack is not None:
            acks.append(step.ack)
        result = evaluate(scenario.condition, SENT_AT, acks, SENT_AT + step.at)
        yield step, result
        if result.decided:
            return


def _offset(at: datetime | timedelta) -> str:
    delta = at - SENT_AT if isinstance(at, datetime) else at
    seconds = delta.total_seconds()
    if seconds >= 86_400:
        return f"+{seconds / 86_400:.2f}d"
    if seconds >= 3600:
        return f"+{seconds / 3600:.1f}h"
    return f"+{seconds:.1f}s"


def show(scenario: Scenario) -> str:
    """Print the scenario step by step; returns its final verdict."""
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
