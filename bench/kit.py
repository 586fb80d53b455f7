"""The test kit: the paper's Example 1 in full, in milliseconds (issue 51).

Two stories of Example 1, each in a fresh :class:`~condmsg.testing.Kit` (sender, four
attendees' receivers, the evaluator; SQLite stores, the in-memory broker, the virtual
clock), timed from the send to the last assertion, over ten days of virtual time:

(a) satisfied: cem processes the notice after half a day, ann and bob after one and one
    and a half, dia reads it after 1.9 days; success notices to all four;
(b) violated: cem never processes it; at three days (plus the ack grace) the notice fails,
    and the three attendees' consumers take their compensations.

A third figure times a fresh kit with its four receivers (what a test's fixture costs).
The first kit of a process also compiles SQLAlchemy's statements for its engines; that cold
figure is reported apart. Baseline: the same stories' verdicts from the pure ``evaluate``
alone (what the kit runs around it: stores, receivers, relays, intake, sweeps). Target: each
story under 0.2 s (median).

Run: ``python -m bench.kit [--rounds N]``. No services needed. The last line of stdout is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from bench._common import emit_result, log, row
from condmsg import Ack, AckKind, Verdict, evaluate
from condmsg.core.examples import DAY, example1
from condmsg.testing import Kit
from condmsg.testing.clock import DEFAULT_START

TARGET_S = 0.2
ATTENDEES = {"qr1": "ann", "qr2": "bob", "qr3": "cem", "qr4": "dia"}


def _kit() -> Kit:
    kit = Kit(sender="meetings")
    for name in ATTENDEES.values():
        kit.receiver(name)
    return kit


def satisfied(kit: Kit) -> None:
    cm = kit.send(b"Contract negotiation, 3 Dec", example1(), notify_success=True)
    for day, queue in ((0.5, "qr3"), (1.0, "qr1"), (1.5, "qr2")):
        kit.advance_to(kit.clock.start + day * DAY)
        with kit.receiver(ATTENDEES[queue]).transaction() as tx:
            tx.read(queue)
    kit.advance_to(kit.clock.start + 1.9 * DAY)
    kit.receiver("dia").read("qr4")
    kit.advance(days=8.1)  # to the meeting
    assert kit.verdict(cm) is Verdict.SATISFIED
    assert all(len(kit.queued(queue)) == 1 for queue in ATTENDEES)  # a success notice each


def violated(kit: Kit) -> None:
    cm = kit.send(b"Contract negotiation, 3 Dec", example1(), compensation=b"cancelled")
    for queue in ("qr1", "qr2", "qr4"):
        kit.receiver(ATTENDEES[queue]).consume(queue, lambda message, session: None)
    kit.advance(days=10)
    assert kit.verdict(cm) is Verdict.VIOLATED
    assert all(len(kit.receiver(n).compensations()) == 1 for n in ("ann", "bob", "dia"))


def baseline() -> None:
    """Story (a)'s and (b)'s verdicts from ``evaluate`` alone."""
    condition = example1()
    sent_at = DEFAULT_START
    acks = [
        Ack(
            destination="qr3",
            kind=AckKind.COMMIT,
            read_at=sent_at + 0.5 * DAY,
            committed_at=sent_at + 0.5 * DAY,
        ),
        Ack(
            destination="qr1",
            kind=AckKind.COMMIT,
            read_at=sent_at + DAY,
            committed_at=sent_at + DAY,
        ),
        Ack(
            destination="qr2",
            kind=AckKind.COMMIT,
            read_at=sent_at + 1.5 * DAY,
            committed_at=sent_at + 1.5 * DAY,
        ),
        Ack(destination="qr4", kind=AckKind.READ, read_at=sent_at + 1.9 * DAY),
    ]
    assert evaluate(condition, sent_at, acks, sent_at + 2 * DAY).verdict is Verdict.SATISFIED
    assert evaluate(condition, sent_at, acks[1:], sent_at + 4 * DAY).verdict is Verdict.VIOLATED


def timed(story: Callable[[Kit], None] | None, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        if story is None:
            began = time.perf_counter()
            _kit().close()
            times.append(time.perf_counter() - began)
            continue
        with _kit() as kit:
            began = time.perf_counter()
            story(kit)
            times.append(time.perf_counter() - began)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    cold = timed(satisfied, 1)[0]
    figures: dict[str, float] = {"cold_satisfied_s": cold}
    base = min(timed_call(baseline) for _ in range(20))
    table = []
    for name, story in (("satisfied", satisfied), ("violated", violated), ("new kit", None)):
        times = sorted(timed(story, args.rounds))
        median = statistics.median(times)
        p90 = times[int(0.9 * (len(times) - 1))]
        log(f"{name}: median {median * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms")
        figures[f"{name.replace(' ', '_')}_median_s"] = median
        figures[f"{name.replace(' ', '_')}_p90_s"] = p90
        if story is not None:
            table.append(
                row(f"Example 1 {name}, median (s)", median, "s", baseline=base, lower=TARGET_S)
            )
        else:
            table.append(row("a fresh kit with 4 receivers, median (s)", median, "s"))
    table.append(row("Example 1 satisfied, first kit of a process (s)", cold, "s"))
    emit_result("kit", figures, table)


def timed_call(fn: Callable[[], None]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
