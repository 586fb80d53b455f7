"""Rule-level tests of DESIGN section 5: facts, set rules, counts, topics, recipients,
optional destinations and ``next_check_at``.

Member states in the count tables: ``T`` read in time, ``F`` read late (the copy's only
consumption), ``U`` no ack yet.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from condmsg import (
    Ack,
    Condition,
    Destination,
    DestinationSet,
    EvaluationResult,
    Truth,
    Verdict,
    evaluate,
)
from tests.unit.strategies import SENT_AT
from tests.unit.vectors import SEC, US, commit, read, t

T, F, U = Truth.TRUE, Truth.FALSE, Truth.UNKNOWN
SATISFIED, VIOLATED, PENDING = Verdict.SATISFIED, Verdict.VIOLATED, Verdict.PENDING


def judge(
    condition: Condition, acks: list[Ack] | tuple[Ack, ...], now: timedelta
) -> EvaluationResult:
    return evaluate(condition, SENT_AT, acks, t(now))


def value(result: EvaluationResult, path: str, kind: str) -> Truth:
    (found,) = [c for c in result.constraints if c.path == path and c.kind == kind]
    return found.value


def expect(result: EvaluationResult, verdict: Verdict, next_check: timedelta | None = None) -> None:
    assert result.verdict is verdict, result.reasons
    if verdict is PENDING:
        assert next_check is not None, "every PENDING case states its next check"
        assert result.next_check_at == t(next_check)
    else:
        assert next_check is None
        assert result.next_check_at is None


# -- the pickup fact ------------------------------------------------------------------

PICKUP = Destination("q", pickup_within=10 * SEC, evaluation_timeout=15 * SEC)


@pytest.mark.parametrize(
    ("acks", "now", "fact", "verdict", "next_check"),
    [
        ([], 5 * SEC, U, PENDING, 15 * SEC),
        # A missing read does not fail at D: a transactional reader may still report one.
        ([], 10 * SEC + US, U, PENDING, 15 * SEC),
        ([], 15 * SEC - US, U, PENDING, 15 * SEC),
        ([], 15 * SEC, F, VIOLATED, None),
        ([read("q", 10 * SEC)], 10 * SEC, T, SATISFIED, None),
        ([read("q", 10 * SEC + US)], 10 * SEC + US, F, VIOLATED, None),
        ([commit("q", 10 * SEC, 14 * SEC)], 14 * SEC, T, SATISFIED, None),
        ([commit("q", 10 * SEC + US, 10 * SEC + 2 * US)], 11 * SEC, F, VIOLATED, None),
        # Out of order, or a duplicate consumption: an in-time read is enough.
        ([read("q", 12 * SEC), read("q", 3 * SEC)], 12 * SEC, T, SATISFIED, None),
    ],
)
def test_pickup_fact(
    acks: list[Ack], now: timedelta, fact: Truth, verdict: Verdict, next_check: timedelta | None
) -> None:
    result = judge(PICKUP, acks, now)
    assert value(result, "root", "pickup") is fact
    expect(result, verdict, next_check)


# -- the processing fact --------------------------------------------------------------

PROCESS = Destination("q", process_within=10 * SEC, evaluation_timeout=15 * SEC)


@pytest.mark.parametrize(
    ("acks", "now", "fact", "verdict", "next_check"),
    [
        ([], 5 * SEC, U, PENDING, 10 * SEC + US),
        ([], 10 * SEC, U, PENDING, 10 * SEC + US),
        # Missed at D + 1 us, well before the evaluation deadline.
        ([], 10 * SEC + US, F, VIOLATED, None),
        ([commit("q", SEC, 10 * SEC)], 10 * SEC, T, SATISFIED, None),
        ([commit("q", SEC, 10 * SEC + US)], 10 * SEC + US, F, VIOLATED, None),
        # A non-transactional read can never be acknowledged as processed: FALSE at once.
        ([read("q", SEC)], SEC, F, VIOLATED, None),
        # A transactional read still open (no ack yet) keeps it open until D.
        ([], 9 * SEC, U, PENDING, 10 * SEC + US),
        ([read("q", SEC), commit("q", SEC, 2 * SEC)], 2 * SEC, T, SATISFIED, None),
    ],
)
def test_processing_fact(
    acks: list[Ack], now: timedelta, fact: Truth, verdict: Verdict, next_check: timedelta | None
) -> None:
    result = judge(PROCESS, acks, now)
    assert value(result, "root", "process") is fact
    expect(result, verdict, next_check)


def test_pickup_and_processing_are_separate_facts_of_one_ack() -> None:
    both = Destination("q", pickup_within=5 * SEC, process_within=10 * SEC)
    late_read = judge(both, [commit("q", 5 * SEC + US, 6 * SEC)], 6 * SEC)
    assert value(late_read, "root", "pickup") is F
    assert value(late_read, "root", "process") is T
    expect(late_read, VIOLATED)
    in_time_read = judge(both, [read("q", 2 * SEC)], 2 * SEC)
    assert value(in_time_read, "root", "pickup") is T
    assert value(in_time_read, "root", "process") is F
    expect(in_time_read, VIOLATED)
    expect(judge(both, [commit("q", 5 * SEC, 10 * SEC)], 10 * SEC), SATISFIED)


# -- sets without counts: every member, three-valued AND --------------------------------

PAIR = DestinationSet(
    Destination("a"), Destination("b"), pickup_within=10 * SEC, evaluation_timeout=15 * SEC
)


@pytest.mark.parametrize(
    ("acks", "fact", "verdict", "next_check"),
    [
        ([read("a", SEC), read("b", 2 * SEC)], T, SATISFIED, None),
        ([read("a", SEC)], U, PENDING, 15 * SEC),
        ([read("a", SEC), read("b", 11 * SEC)], F, VIOLATED, None),
        ([read("a", 11 * SEC)], F, VIOLATED, None),  # FALSE beats UNKNOWN
        ([], U, PENDING, 15 * SEC),
    ],
)
def test_set_without_counts_needs_every_member(
    acks: list[Ack], fact: Truth, verdict: Verdict, next_check: timedelta | None
) -> None:
    result = judge(PAIR, acks, 12 * SEC)
    assert value(result, "root", "pickup") is fact
    expect(result, verdict, next_check)


# -- counts on a set --------------------------------------------------------------------


def _member_acks(states: str) -> list[Ack]:
    acks = []
    for name, state in zip("abcd", states, strict=True):
        if state == "T":
            acks.append(read(name, SEC))
        elif state == "F":
            acks.append(read(name, 11 * SEC))
    return acks


def _four(low: int | None, high: int | None) -> DestinationSet:
    return DestinationSet(
        *(Destination(n) for n in "abcd"),
        pickup_within=10 * SEC,
        min_pickup=low,
        max_pickup=high,
        evaluation_timeout=20 * SEC,
    )


@pytest.mark.parametrize(
    ("states", "low", "high", "expected"),
    [
        # min holds if t >= min, fails if t + u < min, else unknown
        ("TTUU", 2, None, T),
        ("TFUU", 2, None, U),
        ("TFFU", 2, None, U),
        ("TFFF", 2, None, F),
        ("FFUU", 2, None, U),
        ("FFFU", 2, None, F),
        ("TTTT", 4, None, T),
        ("TTTU", 4, None, U),
        ("TTTF", 4, None, F),
        ("FFFF", 0, None, T),
        # max fails if t > max, holds if t + u <= max, else unknown
        ("TUUU", None, 1, U),
        ("TFFF", None, 1, T),
        ("TTFF", None, 1, F),
        ("FFFU", None, 1, T),
        ("FFUU", None, 1, U),
        ("UUUU", None, 1, U),
        ("FFFF", None, 0, T),
        ("UFFF", None, 0, U),
        ("TFFF", None, 0, F),
        # both
        ("TTFF", 1, 2, T),
        ("TUFF", 1, 2, T),
        ("TTUF", 1, 2, U),
        ("TTTF", 1, 2, F),
        ("FFFF", 1, 2, F),
        ("UUUU", 1, 2, U),
    ],
)
def test_count_rule(states: str, low: int | None, high: int | None, expected: Truth) -> None:
    result = judge(_four(low, high), _member_acks(states), 12 * SEC)
    assert value(result, "root", "pickup") is expected
    verdict = {T: SATISFIED, F: VIOLATED, U: PENDING}[expected]
    expect(result, verdict, 20 * SEC if expected is U else None)


@pytest.mark.parametrize(
    ("states", "low", "high", "expected"),
    [
        ("TUUU", 2, None, F),
        ("TTUU", 2, None, T),
        ("TUUU", None, 1, T),
        ("TTUU", 1, 2, T),
        ("UUUU", 1, None, F),
        ("UUUU", None, 0, T),
    ],
)
def test_count_rule_at_the_evaluation_deadline(
    states: str, low: int | None, high: int | None, expected: Truth
) -> None:
    # Every UNKNOWN becomes FALSE: the count is then decided either way.
    result = judge(_four(low, high), _member_acks(states), 20 * SEC)
    assert value(result, "root", "pickup") is expected
    assert result.final


# -- nested sets: a member set by its own rule, at the enclosing deadline ---------------

NESTED_COUNT = DestinationSet(
    DestinationSet(Destination("a"), Destination("b"), Destination("c"), min_pickup=2),
    Destination("d"),
    pickup_within=10 * SEC,
)


@pytest.mark.parametrize(
    ("acks", "now", "verdict", "next_check"),
    [
        ([read("a", SEC), read("b", SEC), read("d", SEC)], SEC, SATISFIED, None),
        (
            [read("a", SEC), read("d", SEC), read("b", 11 * SEC), read("c", 11 * SEC)],
            11 * SEC,
            VIOLATED,
            None,
        ),
        ([read("a", SEC), read("d", SEC)], 5 * SEC, PENDING, 10 * SEC),
        ([read("a", SEC), read("d", SEC)], 10 * SEC, VIOLATED, None),
    ],
)
def test_nested_set_is_judged_by_its_own_count(
    acks: list[Ack], now: timedelta, verdict: Verdict, next_check: timedelta | None
) -> None:
    result = judge(NESTED_COUNT, acks, now)
    # The inner set has a count but no deadline of its own: one constraint, on the root.
    assert [(c.path, str(c.kind)) for c in result.constraints] == [("root", "pickup")]
    expect(result, verdict, next_check)


def test_counts_over_member_sets() -> None:
    condition = DestinationSet(
        DestinationSet(Destination("a"), Destination("b")),
        DestinationSet(Destination("c"), Destination("d")),
        pickup_within=10 * SEC,
        min_pickup=1,
    )
    expect(judge(condition, [read("a", SEC), read("b", SEC)], SEC), SATISFIED)
    expect(judge(condition, [read("a", SEC), read("c", SEC)], SEC), PENDING, 10 * SEC)
    late = [read("a", SEC), read("b", 11 * SEC), read("c", SEC), read("d", 11 * SEC)]
    expect(judge(condition, late, 11 * SEC), VIOLATED)


def test_a_member_with_its_own_deadline_is_judged_at_each_deadline() -> None:
    condition = DestinationSet(
        Destination("a", pickup_within=5 * SEC), Destination("b"), pickup_within=10 * SEC
    )
    result = judge(condition, [read("a", 7 * SEC), read("b", SEC)], 7 * SEC)
    assert value(result, "root[0]", "pickup") is F  # late for its own 5 s
    assert value(result, "root", "pickup") is T  # in time for the set's 10 s
    expect(result, VIOLATED)
    assert any("root[0] 'a': pickup" in r for r in result.reasons)
    assert not any(r.startswith("root set") for r in result.reasons)


def test_a_member_set_with_its_own_deadline_and_count() -> None:
    condition = DestinationSet(
        DestinationSet(Destination("a"), Destination("b"), process_within=5 * SEC, min_process=1),
        Destination("c"),
        process_within=10 * SEC,
    )
    acks = [commit("a", SEC, 7 * SEC), commit("c", SEC, SEC)]
    early = judge(condition, acks[1:], 3 * SEC)
    expect(early, PENDING, 5 * SEC + US)
    result = judge(condition, acks, 7 * SEC)
    assert value(result, "root[0]", "process") is F  # nobody processed within 5 s
    assert value(result, "root", "process") is T  # a processed within 10 s: inner min holds
    expect(result, VIOLATED)


# -- topics: anonymous recipients, counted by distinct identity -------------------------


def topic(**options: object) -> Destination:
    return Destination("news", exchange="events", evaluation_timeout=15 * SEC, **options)  # type: ignore[arg-type]


AT_LEAST_TWO_READERS = topic(pickup_within=10 * SEC, min_pickup=2)


@pytest.mark.parametrize(
    ("acks", "now", "verdict", "next_check"),
    [
        ([read("news", SEC, "r1")], SEC, PENDING, 15 * SEC),
        (
            [read("news", SEC, "r1"), commit("news", 2 * SEC, 3 * SEC, "r2")],
            3 * SEC,
            SATISFIED,
            None,
        ),
        # The same recipient twice counts once.
        ([read("news", SEC, "r1"), read("news", SEC, "r1")], 2 * SEC, PENDING, 15 * SEC),
        ([read("news", SEC, "r1"), read("news", 2 * SEC, "r1")], 2 * SEC, PENDING, 15 * SEC),
        # A late subscriber does not fail the topic: others may still read in time.
        ([read("news", SEC, "r1"), read("news", 11 * SEC, "r2")], 11 * SEC, PENDING, 15 * SEC),
        ([read("news", SEC, "r1"), read("news", SEC, "r1")], 15 * SEC, VIOLATED, None),
        ([read("news", SEC, "r1"), read("news", 10 * SEC, "r3")], 15 * SEC, SATISFIED, None),
    ],
)
def test_topic_min_pickup_counts_distinct_recipients(
    acks: list[Ack], now: timedelta, verdict: Verdict, next_check: timedelta | None
) -> None:
    expect(judge(AT_LEAST_TWO_READERS, acks, now), verdict, next_check)


AT_MOST_TWO_READERS = topic(pickup_within=10 * SEC, max_pickup=2)


@pytest.mark.parametrize(
    ("acks", "now", "verdict", "next_check"),
    [
        ([read("news", SEC, "r1"), read("news", SEC, "r2")], 5 * SEC, PENDING, 15 * SEC),
        ([read("news", SEC, "r1"), read("news", SEC, "r2")], 15 * SEC, SATISFIED, None),
        ([read("news", SEC, r) for r in ("r1", "r2", "r3")], SEC, VIOLATED, None),
        ([read("news", SEC, r) for r in ("r1", "r1", "r2")], SEC, PENDING, 15 * SEC),
        (
            [read("news", SEC, "r1"), read("news", SEC, "r2"), read("news", 11 * SEC, "r3")],
            15 * SEC,
            SATISFIED,
            None,
        ),
    ],
)
def test_topic_max_pickup(
    acks: list[Ack], now: timedelta, verdict: Verdict, next_check: timedelta | None
) -> None:
    expect(judge(AT_MOST_TWO_READERS, acks, now), verdict, next_check)


def test_topic_processing_counts_close_at_the_processing_deadline() -> None:
    at_least = topic(process_within=10 * SEC, min_process=2)
    partial = [commit("news", SEC, 2 * SEC, "r1"), read("news", SEC, "r2")]
    expect(judge(at_least, partial, 3 * SEC), PENDING, 10 * SEC + US)
    expect(judge(at_least, partial, 10 * SEC + US), VIOLATED)
    both = [commit("news", SEC, 2 * SEC, "r1"), commit("news", SEC, 10 * SEC, "r2")]
    expect(judge(at_least, both, 10 * SEC), SATISFIED)

    at_most = topic(process_within=10 * SEC, max_process=1)
    one = [commit("news", SEC, 2 * SEC, "r1"), read("news", SEC, "r2")]
    expect(judge(at_most, one, 3 * SEC), PENDING, 10 * SEC + US)
    expect(judge(at_most, one, 10 * SEC + US), SATISFIED)
    two = [*one, commit("news", SEC, 4 * SEC, "r3")]
    expect(judge(at_most, two, 4 * SEC), VIOLATED)


def test_topic_without_counts_needs_any_one_recipient() -> None:
    anyone = topic(pickup_within=10 * SEC)
    expect(judge(anyone, [read("news", 3 * SEC, "r4")], 3 * SEC), SATISFIED)
    expect(judge(anyone, [read("news", 11 * SEC, "r4")], 11 * SEC), PENDING, 15 * SEC)
    expect(judge(anyone, [read("news", 11 * SEC, "r4")], 15 * SEC), VIOLATED)


def test_topic_facts_list_distinct_recipients() -> None:
    acks = [read("news", SEC, "r2"), read("news", SEC, "r1"), read("news", SEC, "r2")]
    (facts,) = judge(AT_LEAST_TWO_READERS, acks, 2 * SEC).destinations
    assert facts.recipients == ("r1", "r2")
    assert facts.acks == 3


# -- a destination naming a recipient counts only that recipient's acks -----------------

ALICE = Destination("inbox", recipient="alice", pickup_within=10 * SEC, evaluation_timeout=15 * SEC)


@pytest.mark.parametrize(
    ("acks", "verdict", "next_check"),
    [
        ([read("inbox", SEC, "bob")], PENDING, 15 * SEC),
        ([read("inbox", SEC)], PENDING, 15 * SEC),
        # Someone else's late ack must not fail alice's destination.
        ([read("inbox", 11 * SEC, "bob")], PENDING, 15 * SEC),
        ([read("inbox", SEC, "alice")], SATISFIED, None),
        ([read("inbox", 11 * SEC, "bob"), read("inbox", SEC, "alice")], SATISFIED, None),
        ([read("inbox", SEC, "bob"), read("inbox", 11 * SEC, "alice")], VIOLATED, None),
    ],
)
def test_named_recipient_only_counts_its_own_acks(
    acks: list[Ack], verdict: Verdict, next_check: timedelta | None
) -> None:
    result = judge(ALICE, acks, 12 * SEC)
    expect(result, verdict, next_check)
    (facts,) = result.destinations
    assert facts.acks == sum(a.recipient == "alice" for a in acks)


# -- acks for destinations not in the tree are ignored ----------------------------------


def test_acks_for_unknown_destinations_are_ignored() -> None:
    strays = [read("elsewhere", SEC), commit("q2", SEC, 2 * SEC), read("Q", 11 * SEC)]
    alone = judge(PICKUP, strays, 12 * SEC)
    expect(alone, PENDING, 15 * SEC)
    assert [f.name for f in alone.destinations] == ["q"]
    assert alone.destinations[0].acks == 0
    expect(judge(PICKUP, [*strays, read("q", SEC)], 12 * SEC), SATISFIED)


# -- optional destinations -------------------------------------------------------------


def test_an_optional_destination_outside_any_constraint_does_not_matter() -> None:
    condition = DestinationSet(Destination("a", pickup_within=5 * SEC), Destination("b"))
    expect(judge(condition, [read("a", SEC)], SEC), SATISFIED)
    expect(judge(condition, [read("a", SEC), read("b", 60 * SEC)], 60 * SEC), SATISFIED)
    expect(judge(condition, [], SEC), PENDING, 5 * SEC)
    required = {f.name: f.required for f in judge(condition, [], SEC).destinations}
    assert required == {"a": True, "b": False}


def test_optional_destinations_count_for_the_set_above_them() -> None:
    condition = DestinationSet(
        Destination("a", pickup_within=5 * SEC),
        Destination("b"),
        Destination("c"),
        process_within=10 * SEC,
        min_process=1,
        evaluation_timeout=20 * SEC,
    )
    only_a = [read("a", SEC)]
    expect(judge(condition, only_a, SEC), PENDING, 10 * SEC + US)
    expect(judge(condition, only_a, 10 * SEC + US), VIOLATED)
    # b processes: the set's count holds although a (required) never could.
    expect(judge(condition, [*only_a, commit("b", SEC, 2 * SEC)], 2 * SEC), SATISFIED)
    # c never acks, which is fine for an optional destination once the count holds.
    expect(judge(condition, [*only_a, commit("b", SEC, 2 * SEC)], 60 * SEC), SATISFIED)


# -- next_check_at ---------------------------------------------------------------------


def test_next_check_is_the_first_deadline_that_can_decide() -> None:
    two = DestinationSet(
        Destination("a", process_within=5 * SEC),
        Destination("b", process_within=8 * SEC),
        evaluation_timeout=20 * SEC,
    )
    expect(judge(two, [], SEC), PENDING, 5 * SEC + US)
    # a is done: its deadline passing cannot change anything, b's can.
    expect(judge(two, [commit("a", SEC, 2 * SEC)], 2 * SEC), PENDING, 8 * SEC + US)
    expect(judge(two, [commit("a", SEC, 2 * SEC)], 8 * SEC + US), VIOLATED)


def test_next_check_skips_deadlines_that_cannot_change_the_verdict() -> None:
    condition = DestinationSet(
        Destination("a", process_within=5 * SEC),
        Destination("b", pickup_within=8 * SEC),
        evaluation_timeout=20 * SEC,
    )
    expect(judge(condition, [commit("a", SEC, 2 * SEC)], 2 * SEC), PENDING, 20 * SEC)
    expect(judge(condition, [commit("a", SEC, 2 * SEC)], 19 * SEC), PENDING, 20 * SEC)


def test_the_evaluation_deadline_comes_before_a_processing_deadline_at_the_same_instant() -> None:
    # Default timeout = latest deadline = 8 s: at 8 s no more acks are awaited, so the
    # check is at 8 s, not at 8 s + 1 us.
    two = DestinationSet(
        Destination("a", process_within=5 * SEC), Destination("b", process_within=8 * SEC)
    )
    result = judge(two, [commit("a", SEC, 2 * SEC)], 2 * SEC)
    expect(result, PENDING, 8 * SEC)
    assert result.evaluation_deadline == t(8 * SEC)
    late = judge(two, [commit("a", SEC, 2 * SEC)], 8 * SEC)
    expect(late, VIOLATED)
    assert late.reasons[0].startswith("evaluation timeout")


def test_next_check_before_sent_at() -> None:
    # A clock behind the sender's: nothing is due before the first deadline.
    expect(judge(PROCESS, [], -5 * SEC), PENDING, 10 * SEC + US)


# -- reasons ---------------------------------------------------------------------------


def test_reasons_name_the_deciding_nodes() -> None:
    condition = DestinationSet(
        Destination("a", process_within=5 * SEC),
        Destination("b", pickup_within=8 * SEC),
        evaluation_timeout=20 * SEC,
    )
    pending = judge(condition, [commit("a", SEC, 2 * SEC)], 2 * SEC)
    assert len(pending.reasons) == 1
    assert pending.reasons[0].startswith("waiting: root[1] 'b': pickup")

    violated = judge(condition, [read("a", SEC), read("b", 2 * SEC)], 2 * SEC)
    assert len(violated.reasons) == 1
    assert violated.reasons[0].startswith("root[0] 'a': process")

    satisfied = judge(condition, [commit("a", SEC, 2 * SEC), read("b", 2 * SEC)], 2 * SEC)
    assert [r.split(":")[0] for r in satisfied.reasons] == ["root[0] 'a'", "root[1] 'b'"]
