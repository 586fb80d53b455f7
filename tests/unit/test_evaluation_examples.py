"""The paper's Example 1 and Example 2 as normative vectors (DESIGN section 5).

Every vector gives the acks received so far, the instant ``now`` and the expected verdict;
every PENDING vector also gives the exact ``next_check_at``. Processing deadlines are missed
at ``D + 1 us`` (``condmsg.core.timeutil.RESOLUTION``); the verdict is final from the
evaluation deadline ``E`` on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from condmsg import (
    Ack,
    Destination,
    DestinationSet,
    Verdict,
    evaluate,
    evaluation_deadline,
)
from tests.unit.strategies import SENT_AT
from tests.unit.vectors import DAY, EXAMPLE_1, HOUR, SEC, US, commit, read, t

SATISFIED, VIOLATED, PENDING = Verdict.SATISFIED, Verdict.VIOLATED, Verdict.PENDING


@dataclass(frozen=True)
class Vector:
    acks: tuple[Ack, ...]
    now: timedelta
    verdict: Verdict
    next_check: timedelta | None = None
    reasons: tuple[str, ...] = field(default=())  # fragments that must appear in the reasons
    timeout: bool = False  # an "evaluation timeout" reason comes first

    def __str__(self) -> str:
        return f"{len(self.acks)} acks at {self.now}: {self.verdict}"


def check(condition, vector: Vector) -> None:  # type: ignore[no-untyped-def]
    result = evaluate(condition, SENT_AT, vector.acks, t(vector.now))
    assert result.verdict is vector.verdict, result.reasons
    if vector.verdict is PENDING:
        assert vector.next_check is not None, "every PENDING vector states its next check"
        assert result.next_check_at == t(vector.next_check)
        assert all(r.startswith("waiting: ") for r in result.reasons)
    else:
        assert result.next_check_at is None
    text = "\n".join(result.reasons)
    for fragment in vector.reasons:
        assert fragment in text, text
    assert result.reasons[0].startswith("evaluation timeout") is vector.timeout, text


# -- Example 1: the meeting notice ------------------------------------------------------
#
# Meeting at sent_at + 10 days. All four must read within 2 days; qr3 must process within
# 3 days; at least two of qr1, qr2, qr4 must process within 7 days. The evaluation deadline
# defaults to the latest deadline: 7 days. (EXAMPLE_1, from tests.unit.vectors.)

QR3_OK = commit("qr3", 1 * HOUR, 2 * HOUR)
QR1_OK = commit("qr1", 3 * HOUR, 4 * HOUR)
QR2_OK = commit("qr2", 5 * HOUR, 1 * DAY)
QR4_READ = read("qr4", 6 * HOUR)
EVERYONE = (QR3_OK, QR1_OK, QR2_OK, QR4_READ)

QR3_DEADLINE_MISSED = 3 * DAY + US
EXAMPLE_1_END = 7 * DAY

EXAMPLE_1_VECTORS = {
    # Nothing has come in: the first instant that can decide is qr3's processing deadline.
    "just sent": Vector((), timedelta(0), PENDING, QR3_DEADLINE_MISSED),
    "nothing after 1 day": Vector((), DAY, PENDING, QR3_DEADLINE_MISSED),
    "nothing exactly at qr3's deadline": Vector((), 3 * DAY, PENDING, QR3_DEADLINE_MISSED),
    "nothing 1us after qr3's deadline": Vector(
        (), QR3_DEADLINE_MISSED, VIOLATED, reasons=("root[0] 'qr3': process",)
    ),
    # Success the moment the last needed ack is in (qr2 committed at 1 day).
    "three of four in, 1us before the last": Vector(
        (QR3_OK, QR1_OK, QR4_READ), DAY - US, PENDING, EXAMPLE_1_END
    ),
    "the last needed ack is in": Vector(EVERYONE, DAY, SATISFIED, reasons=("root[0] 'qr3'",)),
    "acks are judged by their timestamps, not their arrival": Vector(EVERYONE, 6 * DAY, SATISFIED),
    "satisfied stays satisfied after the evaluation deadline": Vector(
        EVERYONE, 30 * DAY, SATISFIED
    ),
    # qr3 not committed by 3 days.
    "qr3 silent, others done, at 2 days": Vector(
        (QR1_OK, QR2_OK, QR4_READ), 2 * DAY, PENDING, QR3_DEADLINE_MISSED
    ),
    "qr3 silent, others done, at 3 days - 1us": Vector(
        (QR1_OK, QR2_OK, QR4_READ), 3 * DAY - US, PENDING, QR3_DEADLINE_MISSED
    ),
    "qr3 silent, others done, at 3 days": Vector(
        (QR1_OK, QR2_OK, QR4_READ), 3 * DAY, PENDING, QR3_DEADLINE_MISSED
    ),
    "qr3 silent, others done, at 3 days + 1us": Vector(
        (QR1_OK, QR2_OK, QR4_READ),
        QR3_DEADLINE_MISSED,
        VIOLATED,
        reasons=("root[0] 'qr3': process", "no commit ack"),
    ),
    "qr3 commits exactly at its deadline": Vector(
        (commit("qr3", DAY, 3 * DAY), QR1_OK, QR2_OK, QR4_READ), 3 * DAY, SATISFIED
    ),
    "qr3 commits 1us after its deadline": Vector(
        (commit("qr3", DAY, 3 * DAY + US), QR1_OK, QR2_OK, QR4_READ),
        3 * DAY + US,
        VIOLATED,
        reasons=("root[0] 'qr3': process", "committed late"),
    ),
    # A non-transactional read by qr3 can never count as processing: fails at once.
    "qr3 reads without a transaction": Vector(
        (read("qr3", HOUR),),
        HOUR,
        VIOLATED,
        reasons=("root[0] 'qr3': process", "READ ack"),
    ),
    "qr3 reads without a transaction, others fine": Vector(
        (read("qr3", HOUR), QR1_OK, QR2_OK, QR4_READ), DAY, VIOLATED, reasons=("'qr3'",)
    ),
    # qr3 read late (its commit is in time, its read is not): the pickup fails on arrival.
    "qr3's read is 1us late": Vector(
        (commit("qr3", 2 * DAY + US, 2 * DAY + HOUR), QR1_OK, QR2_OK, QR4_READ),
        2 * DAY + HOUR,
        VIOLATED,
        reasons=("root set{qr3,set{qr1,qr2,qr4}}: pickup", "failed: qr3"),
    ),
    # destSet1: at least two of qr1, qr2, qr4 must process within 7 days.
    "destSet1: 2 of 3 read without a transaction": Vector(
        (read("qr1", HOUR), read("qr2", 2 * HOUR)),
        2 * HOUR,
        VIOLATED,
        reasons=("root[1] set{qr1,qr2,qr4}: process", "at least 2 of 3 members"),
    ),
    "destSet1: 2 of 3 commit late": Vector(
        (QR3_OK, commit("qr1", HOUR, 7 * DAY + US), commit("qr2", HOUR, 8 * DAY), QR4_READ),
        8 * DAY,
        VIOLATED,
        reasons=("root[1] set{qr1,qr2,qr4}: process",),
    ),
    "destSet1: 1 of 3 fails, the others may still process": Vector(
        (QR3_OK, read("qr1", HOUR)), 3 * HOUR, PENDING, EXAMPLE_1_END
    ),
    "destSet1: qr2 fails, qr1 and qr4 process": Vector(
        (QR3_OK, QR1_OK, read("qr2", HOUR), commit("qr4", 2 * HOUR, 2 * DAY)),
        2 * DAY,
        SATISFIED,
    ),
    "destSet1: second commit exactly at 7 days": Vector(
        (QR3_OK, QR1_OK, commit("qr2", DAY, 7 * DAY), QR4_READ), 7 * DAY, SATISFIED
    ),
    "destSet1: second commit 1us after 7 days": Vector(
        (QR3_OK, QR1_OK, commit("qr2", DAY, 7 * DAY + US), QR4_READ),
        7 * DAY + US,
        VIOLATED,
        reasons=("root[1] set{qr1,qr2,qr4}: process",),
    ),
    "destSet1: waiting for a second commit 1us before 7 days": Vector(
        (QR3_OK, QR1_OK, QR4_READ), 7 * DAY - US, PENDING, EXAMPLE_1_END
    ),
    # The root's pickup covers the optional members too.
    "qr4 reads 1us late": Vector(
        (QR3_OK, QR1_OK, QR2_OK, read("qr4", 2 * DAY + US)),
        2 * DAY + US,
        VIOLATED,
        reasons=("root set{qr3,set{qr1,qr2,qr4}}: pickup",),
    ),
    "everybody reads exactly at 2 days": Vector(
        (
            commit("qr3", 2 * DAY, 2 * DAY + HOUR),
            commit("qr1", 2 * DAY, 2 * DAY + HOUR),
            commit("qr2", 2 * DAY, 3 * DAY),
            read("qr4", 2 * DAY),
        ),
        3 * DAY,
        SATISFIED,
    ),
    # A missing pickup fails only at the evaluation deadline (a transactional reader may
    # still commit and report an early read_at until then).
    "qr4 silent, others done, at 2 days + 1us": Vector(
        (QR3_OK, QR1_OK, QR2_OK), 2 * DAY + US, PENDING, EXAMPLE_1_END
    ),
    "qr4 silent, others done, at 6 days": Vector(
        (QR3_OK, QR1_OK, QR2_OK), 6 * DAY, PENDING, EXAMPLE_1_END
    ),
    "qr4 silent, others done, 1us before the evaluation deadline": Vector(
        (QR3_OK, QR1_OK, QR2_OK), EXAMPLE_1_END - US, PENDING, EXAMPLE_1_END
    ),
    "qr4 silent, others done, at the evaluation deadline": Vector(
        (QR3_OK, QR1_OK, QR2_OK),
        EXAMPLE_1_END,
        VIOLATED,
        reasons=("root set{qr3,set{qr1,qr2,qr4}}: pickup",),
        timeout=True,
    ),
    "qr4's transactional read reports an early read_at late": Vector(
        (QR3_OK, QR1_OK, QR2_OK, commit("qr4", DAY, 6 * DAY)), 6 * DAY, SATISFIED
    ),
}


@pytest.mark.parametrize("vector", EXAMPLE_1_VECTORS.values(), ids=EXAMPLE_1_VECTORS.keys())
def test_example_1(vector: Vector) -> None:
    check(EXAMPLE_1, vector)


def test_example_1_evaluation_deadline_defaults_to_the_latest_deadline() -> None:
    assert evaluation_deadline(EXAMPLE_1, SENT_AT) == t(7 * DAY)
    result = evaluate(EXAMPLE_1, SENT_AT, (), t(DAY))
    assert result.evaluation_deadline == t(7 * DAY)
    assert not result.final
    assert evaluate(EXAMPLE_1, SENT_AT, (), t(7 * DAY)).final


def test_example_1_constraints_and_facts_when_satisfied() -> None:
    result = evaluate(EXAMPLE_1, SENT_AT, EVERYONE, t(DAY))
    judged = {(c.path, str(c.kind)): (c.deadline, c.value.value) for c in result.constraints}
    assert judged == {
        ("root", "pickup"): (t(2 * DAY), "true"),
        ("root[0]", "process"): (t(3 * DAY), "true"),
        ("root[1]", "process"): (t(7 * DAY), "true"),
    }
    facts = {f.name: f for f in result.destinations}
    assert [f.path for f in result.destinations] == [
        "root[0]",
        "root[1][0]",
        "root[1][1]",
        "root[1][2]",
    ]
    assert facts["qr3"].required
    assert not facts["qr1"].required and not facts["qr4"].required
    assert facts["qr2"].first_read_at == t(5 * HOUR)
    assert facts["qr2"].first_committed_at == t(DAY)
    assert facts["qr4"].first_committed_at is None
    assert facts["qr4"].acks == 1


# With the meeting as the evaluation timeout, a missing pickup waits until the meeting.
EXAMPLE_1_UNTIL_MEETING = DestinationSet(
    *EXAMPLE_1.members, pickup_within=2 * DAY, evaluation_timeout=10 * DAY
)


@pytest.mark.parametrize(
    "vector",
    [
        Vector((QR3_OK, QR1_OK, QR2_OK), 7 * DAY, PENDING, 10 * DAY),
        Vector((QR3_OK, QR1_OK, QR2_OK), 7 * DAY + US, PENDING, 10 * DAY),
        Vector((QR3_OK, QR1_OK, QR2_OK), 10 * DAY - US, PENDING, 10 * DAY),
        Vector((QR3_OK, QR1_OK, QR2_OK), 10 * DAY, VIOLATED, timeout=True),
        Vector((QR3_OK, QR1_OK, QR2_OK, read("qr4", DAY)), 9 * DAY, SATISFIED),
        # Nothing at all: qr3's processing deadline still decides first.
        Vector((), DAY, PENDING, QR3_DEADLINE_MISSED),
        # qr3 done, nobody else: destSet1 closes at 7 days + 1us with no commit.
        Vector((QR3_OK,), 4 * DAY, PENDING, 7 * DAY + US),
        Vector((QR3_OK,), 7 * DAY + US, VIOLATED, reasons=("root[1]",)),
    ],
    ids=str,
)
def test_example_1_with_the_meeting_as_evaluation_timeout(vector: Vector) -> None:
    check(EXAMPLE_1_UNTIL_MEETING, vector)


# -- Example 2: the incoming flight -------------------------------------------------------
#
# One shared queue read by competing controllers; some controller must read the message
# within 20 s; the evaluation timeout is 21 s.

EXAMPLE_2 = Destination("qcentral", pickup_within=20 * SEC, evaluation_timeout=21 * SEC)
E2 = 21 * SEC
MS = timedelta(milliseconds=1)

EXAMPLE_2_VECTORS = {
    "just sent": Vector((), timedelta(0), PENDING, E2),
    "nothing at 10 s": Vector((), 10 * SEC, PENDING, E2),
    "nothing at the pickup deadline": Vector((), 20 * SEC, PENDING, E2),
    "nothing at 20.5 s": Vector((), 20_500 * MS, PENDING, E2),
    "nothing 1us before the evaluation timeout": Vector((), E2 - US, PENDING, E2),
    "nothing at the evaluation timeout": Vector(
        (), E2, VIOLATED, reasons=("root 'qcentral': pickup",), timeout=True
    ),
    "nothing long after the evaluation timeout": Vector((), 60 * SEC, VIOLATED, timeout=True),
    "read at 5 s": Vector((read("qcentral", 5 * SEC),), 5 * SEC, SATISFIED),
    "read exactly at 20 s": Vector((read("qcentral", 20 * SEC),), 20 * SEC, SATISFIED),
    "read 1us late fails on arrival": Vector(
        (read("qcentral", 20 * SEC + US),),
        20 * SEC + US,
        VIOLATED,
        reasons=("root 'qcentral': pickup", "read late"),
    ),
    "read at 20.4 s, known at 20.5 s": Vector(
        (read("qcentral", 20_400 * MS),), 20_500 * MS, VIOLATED, reasons=("read late",)
    ),
    # A transactional read at 19 s whose commit (and so its ack) comes at 20.7 s.
    "commit ack read at 19 s, committed 20.7 s": Vector(
        (commit("qcentral", 19 * SEC, 20_700 * MS),), 20_700 * MS, SATISFIED
    ),
    "the same ack judged at the evaluation timeout": Vector(
        (commit("qcentral", 19 * SEC, 20_700 * MS),), E2, SATISFIED
    ),
    "the same ack judged much later": Vector(
        (commit("qcentral", 19 * SEC, 20_700 * MS),), 90 * SEC, SATISFIED
    ),
    "a commit ack whose read was late": Vector(
        (commit("qcentral", 20_001 * MS, 20_002 * MS),),
        20_500 * MS,
        VIOLATED,
        reasons=("read late",),
    ),
}


@pytest.mark.parametrize("vector", EXAMPLE_2_VECTORS.values(), ids=EXAMPLE_2_VECTORS.keys())
def test_example_2(vector: Vector) -> None:
    check(EXAMPLE_2, vector)


def test_example_2_evaluation_deadline_is_21_seconds() -> None:
    assert evaluation_deadline(EXAMPLE_2, SENT_AT) == t(21 * SEC)
    assert not evaluate(EXAMPLE_2, SENT_AT, (), t(E2 - US)).final
    assert evaluate(EXAMPLE_2, SENT_AT, (), t(E2)).final


CONTROLLER_A = commit("qcentral", 3 * SEC, 4 * SEC, recipient="ctl-a")
CONTROLLER_B = read("qcentral", 25 * SEC, recipient="ctl-b")
CONTROLLER_C = commit("qcentral", 22 * SEC, 23 * SEC, recipient="ctl-c")


@pytest.mark.parametrize(
    ("acks", "now"),
    [
        ((CONTROLLER_A,), 4 * SEC),
        ((CONTROLLER_A, CONTROLLER_B), 25 * SEC),
        ((CONTROLLER_C, CONTROLLER_A, CONTROLLER_B), 25 * SEC),
        ((CONTROLLER_A, read("qcentral", 8 * SEC, recipient="ctl-b")), 8 * SEC),
    ],
)
def test_example_2_first_controller_satisfies_and_others_are_harmless(
    acks: tuple[Ack, ...], now: timedelta
) -> None:
    result = evaluate(EXAMPLE_2, SENT_AT, acks, t(now))
    assert result.verdict is SATISFIED
    (facts,) = result.destinations
    assert facts.recipients == tuple(sorted(a.recipient or "" for a in acks))
    assert facts.first_read_at == t(3 * SEC)


def test_example_2_competing_controllers_before_anyone_acks() -> None:
    # Controllers that read and rolled back emit nothing: still waiting for one of them.
    result = evaluate(EXAMPLE_2, SENT_AT, (), t(15 * SEC))
    assert result.verdict is PENDING
    assert result.next_check_at == t(E2)


# Without an explicit timeout, Example 2 closes at its own pickup deadline.
EXAMPLE_2_DEFAULT_TIMEOUT = Destination("qcentral", pickup_within=20 * SEC)


@pytest.mark.parametrize(
    "vector",
    [
        Vector((), 19 * SEC, PENDING, 20 * SEC),
        Vector((), 20 * SEC - US, PENDING, 20 * SEC),
        Vector((), 20 * SEC, VIOLATED, timeout=True),
        Vector((read("qcentral", 20 * SEC),), 20 * SEC, SATISFIED),
    ],
    ids=str,
)
def test_example_2_with_the_default_evaluation_timeout(vector: Vector) -> None:
    assert evaluation_deadline(EXAMPLE_2_DEFAULT_TIMEOUT, SENT_AT) == t(20 * SEC)
    check(EXAMPLE_2_DEFAULT_TIMEOUT, vector)


# -- counts that resolve only at a deadline ---------------------------------------------

AT_MOST_ONE_PICKUP = DestinationSet(
    Destination("a"), Destination("b"), Destination("c"), pickup_within=10 * SEC, max_pickup=1
)

AT_MOST_ONE_VECTORS = {
    "nobody yet": Vector((), SEC, PENDING, 10 * SEC),
    "one in time: may still be exceeded": Vector((read("a", 2 * SEC),), 3 * SEC, PENDING, 10 * SEC),
    "one in time, 1us before the deadline": Vector(
        (read("a", 2 * SEC),), 10 * SEC - US, PENDING, 10 * SEC
    ),
    "one in time, at the evaluation deadline": Vector(
        (read("a", 2 * SEC),), 10 * SEC, SATISFIED, reasons=("at most 1",)
    ),
    "nobody, at the evaluation deadline": Vector((), 10 * SEC, SATISFIED),
    "two in time: exceeded at once": Vector(
        (read("a", 2 * SEC), commit("b", 3 * SEC, 4 * SEC)),
        4 * SEC,
        VIOLATED,
        reasons=("root set{a,b,c}: pickup", "at most 1 of 3 members"),
    ),
    "a late second read does not count": Vector(
        (read("a", 2 * SEC), read("b", 10 * SEC + US)), 11 * SEC, SATISFIED
    ),
}


@pytest.mark.parametrize("vector", AT_MOST_ONE_VECTORS.values(), ids=AT_MOST_ONE_VECTORS.keys())
def test_max_pickup_resolves_at_the_evaluation_deadline(vector: Vector) -> None:
    check(AT_MOST_ONE_PICKUP, vector)


# A processing count closes at its own deadline, before the evaluation timeout.
AT_MOST_ONE_PROCESS = DestinationSet(
    Destination("a"),
    Destination("b"),
    Destination("c"),
    process_within=5 * SEC,
    max_process=1,
    evaluation_timeout=10 * SEC,
)


@pytest.mark.parametrize(
    "vector",
    [
        Vector((), SEC, PENDING, 5 * SEC + US),
        Vector((commit("a", SEC, 2 * SEC),), 3 * SEC, PENDING, 5 * SEC + US),
        Vector((commit("a", SEC, 2 * SEC),), 5 * SEC, PENDING, 5 * SEC + US),
        Vector((commit("a", SEC, 2 * SEC),), 5 * SEC + US, SATISFIED),
        Vector((commit("a", SEC, 2 * SEC), commit("b", SEC, 6 * SEC)), 6 * SEC, SATISFIED),
        Vector((commit("a", SEC, 2 * SEC), commit("b", SEC, 5 * SEC)), 5 * SEC, VIOLATED),
    ],
    ids=str,
)
def test_max_process_resolves_at_its_deadline(vector: Vector) -> None:
    check(AT_MOST_ONE_PROCESS, vector)


BETWEEN_ONE_AND_TWO = DestinationSet(
    Destination("a"),
    Destination("b"),
    Destination("c"),
    pickup_within=10 * SEC,
    min_pickup=1,
    max_pickup=2,
    evaluation_timeout=12 * SEC,
)


@pytest.mark.parametrize(
    "vector",
    [
        Vector((), SEC, PENDING, 12 * SEC),
        Vector((read("a", SEC),), 2 * SEC, PENDING, 12 * SEC),
        Vector((read("a", SEC), read("b", SEC)), 11 * SEC, PENDING, 12 * SEC),
        Vector((read("a", SEC), read("b", SEC)), 12 * SEC, SATISFIED),
        Vector((read("a", SEC), read("b", SEC), read("c", 9 * SEC)), 9 * SEC, VIOLATED),
        Vector((), 12 * SEC, VIOLATED, reasons=("at least 1",), timeout=True),
    ],
    ids=str,
)
def test_min_and_max_on_one_set(vector: Vector) -> None:
    check(BETWEEN_ONE_AND_TWO, vector)
